"""The hybrid Qwen3.5 decoder: embeddings, the layer stack, final norm, output head, greedy decoding.

    model = HybridModel.from_checkpoint(ckpt_dir, opset=get_opset("reference"), dtype=torch.float32)
    stats = GDNStats()
    with model.recording(stats):  # optional: per-GDN-layer statistics
        new_ids = model.generate_greedy(prompt_ids, max_new_tokens=32)

Dtype policy: ``dtype`` is the compute dtype of the embeddings, every projection, attention and
the residual stream.  The decoder norms' weights, ``A_log`` and ``dt_bias`` stay float32, every
norm computes in float32, and the GDN recurrent state is float32 whatever ``dtype`` is.  Logits
are returned as float32.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from clef_runtime.dtypes import torch_dtypes
from clef_runtime.model.cache import GDNState, HybridCache, KVState
from clef_runtime.model.config import LINEAR, ModelConfig
from clef_runtime.model.layers import DecoderLayer, Embedding, GatedDeltaNet, RMSNorm, rope_cos_sin
from clef_runtime.model.stats import GDNStats
from clef_runtime.model.weights import check_weights, load_weights
from clef_runtime.opset import OpSet, get_opset

# Small parameters kept in float32 whatever the compute dtype: the zero-centred norm weights are
# applied in float32, and A_log/dt_bias feed exp/softplus (upstream does the same with A_log).
_FLOAT32_SUFFIXES = ("layernorm.weight", "q_norm.weight", "k_norm.weight", "A_log", "dt_bias")


def _param_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    if name == "model.norm.weight" or name.endswith(_FLOAT32_SUFFIXES):
        return torch.float32
    return dtype


class HybridModel(nn.Module):
    """Qwen3.5 hybrid decoder on a chosen op set (``get_opset("reference" | "triton")``)."""

    def __init__(
        self,
        config: ModelConfig,
        weights: Mapping[str, torch.Tensor],
        *,
        opset: OpSet | None = None,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device | None = None,
    ) -> None:
        """``weights`` by canonical name (see `clef_runtime.model.weights`), e.g. from
        `load_weights`.  They are cast to the dtype policy above and moved to ``device``
        (default: where the embedding already is)."""
        super().__init__()
        if dtype not in torch_dtypes().values():
            raise ValueError(f"dtype {dtype} is not supported: use float32, bfloat16 or float16")
        weights = dict(weights)
        if config.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        check_weights(weights, config)
        self.config = config
        self.opset: OpSet = opset if opset is not None else get_opset("reference")
        self.dtype = dtype
        dev = torch.device(device) if device is not None else weights["model.embed_tokens.weight"].device

        with torch.device("meta"):
            self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
            self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
            self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.lm_head = (
                None
                if config.tie_word_embeddings
                else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            )

        # Our module names are the checkpoint names without the leading "model.".  Popping as we
        # go drops each source tensor (when the caller holds no other reference) once it is cast.
        state = {}
        for name in list(weights):
            t = weights.pop(name)
            state[name.removeprefix("model.")] = t.to(device=dev, dtype=_param_dtype(name, dtype))
        self.load_state_dict(state, strict=True, assign=True)
        self.requires_grad_(False)
        self.eval()

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        *,
        config: ModelConfig | None = None,
        opset: OpSet | None = None,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> HybridModel:
        """Load ``config.json`` and the safetensors of a checkpoint directory."""
        config = config if config is not None else ModelConfig.from_json(path)
        # Read to (memory-mapped) host memory and let the constructor move one tensor at a time,
        # so the device never holds the stored-dtype copy and the cast copy of the whole model.
        weights = load_weights(path, config, device="cpu")
        return cls(config, weights, opset=opset, dtype=dtype, device=device)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    # ---- caches -----------------------------------------------------------------------------

    def new_cache(self, batch_size: int) -> HybridCache:
        layers: list[GDNState | KVState] = [
            GDNState() if kind == LINEAR else KVState() for kind in self.config.layer_types
        ]
        return HybridCache(layers=layers, seq_len=0, batch_size=batch_size)

    # ---- statistics -------------------------------------------------------------------------

    @contextmanager
    def recording(self, stats: GDNStats) -> Iterator[GDNStats]:
        """Within the block every GDN layer adds its statistics to ``stats`` (on the device, no
        host sync); outside it the layers record nothing."""
        gdn = [m for m in self.modules() if isinstance(m, GatedDeltaNet)]
        before = [m.stats for m in gdn]
        for m in gdn:
            m.stats = stats
        try:
            yield stats
        finally:
            for m, old in zip(gdn, before, strict=True):
                m.stats = old

    # ---- forward ----------------------------------------------------------------------------

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(h, w).float()

    def _run(
        self,
        input_ids: torch.Tensor,
        cache: HybridCache | None,
        *,
        decode: bool,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        cu_seqlens: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        cos, sin = rope_cos_sin(positions, self.config.rotary_dim, self.config.rope_theta)
        x = self.embed_tokens(input_ids)
        for i, layer in enumerate(self.layers):
            x = layer(
                x,
                ops=self.opset,
                state=None if cache is None else cache.layers[i],
                decode=decode,
                cos=cos,
                sin=sin,
                mask=mask,
                cu_seqlens=cu_seqlens,
            )
        x = self.norm(x)
        if last_only:
            x = x[:, -1:]
        if cache is not None:
            cache.seq_len += input_ids.shape[1]
        return self._logits(x)

    def _check_ids(self, ids: torch.Tensor, what: str) -> torch.Tensor:
        if ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"{what}: token ids must be an integer tensor, got {ids.dtype}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            raise ValueError(f"{what}: token ids must be in [0, {self.config.vocab_size})")
        return ids.to(device=self.device, dtype=torch.long)

    def _causal_mask(self, past: int, T: int) -> torch.Tensor | None:
        if T == 1:
            return None  # one new token may read every cached one
        q = torch.arange(past, past + T, device=self.device)
        k = torch.arange(past + T, device=self.device)
        return k[None, :] <= q[:, None]

    def prefill(
        self,
        input_ids: torch.Tensor,
        cache: HybridCache | None = None,
        *,
        last_only: bool = False,
    ) -> tuple[torch.Tensor, HybridCache]:
        """Run a prompt batch ``[B, T]`` (equal lengths) with the prefill ops.  Returns float32
        logits ``[B, T, vocab]`` (``[B, 1, vocab]`` with ``last_only``) and the cache, which is
        ``cache`` advanced when one is given (chunked prefill) or a new one."""
        with torch.inference_mode():
            ids = self._check_ids(input_ids, "prefill")
            if ids.dim() != 2 or ids.shape[1] == 0:
                raise ValueError(
                    f"prefill: input_ids must be [batch, tokens] with tokens ≥ 1, got {list(ids.shape)}"
                )
            B, T = ids.shape
            cache = self.new_cache(B) if cache is None else cache
            if cache.batch_size != B:
                raise ValueError(f"prefill: the cache holds {cache.batch_size} sequences, input_ids {B}")
            past = cache.seq_len
            positions = torch.arange(past, past + T, device=self.device)
            logits = self._run(
                ids,
                cache,
                decode=False,
                positions=positions,
                mask=self._causal_mask(past, T),
                last_only=last_only,
            )
            return logits, cache

    def decode_step(self, token_ids: torch.Tensor, cache: HybridCache) -> torch.Tensor:
        """Feed one token per sequence (``[B]``), or a few (``[B, T]``), through the decode ops,
        updating ``cache`` in place.  Returns float32 logits ``[B, vocab]`` (``[B, T, vocab]``)."""
        with torch.inference_mode():
            ids = self._check_ids(token_ids, "decode_step")
            single = ids.dim() == 1
            ids = ids[:, None] if single else ids
            B, T = ids.shape
            if cache.seq_len == 0:
                raise ValueError("decode_step: the cache is empty: run prefill first")
            if cache.batch_size != B:
                raise ValueError(
                    f"decode_step: the cache holds {cache.batch_size} sequences, got {B} tokens rows"
                )
            past = cache.seq_len
            positions = torch.arange(past, past + T, device=self.device)
            logits = self._run(ids, cache, decode=True, positions=positions, mask=self._causal_mask(past, T))
            return logits[:, 0] if single else logits

    def generate_greedy(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy decoding of a prompt batch ``[B, T]``: prefill, then one decode step per token.
        Returns only the new token ids ``[B, max_new_tokens]`` (int64); no early stop at EOS,
        so two runs always yield comparable lengths."""
        ids, _ = self._greedy(input_ids, max_new_tokens, keep_logits=False)
        return ids

    def generate_greedy_with_logits(
        self, input_ids: torch.Tensor, max_new_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`generate_greedy` that also returns the float32 logits each new token was picked from,
        ``[B, max_new_tokens, vocab]`` (to compare steps or to measure top-1/top-2 margins)."""
        ids, logits = self._greedy(input_ids, max_new_tokens, keep_logits=True)
        assert logits is not None
        return ids, logits

    def _greedy(
        self, input_ids: torch.Tensor, max_new_tokens: int, *, keep_logits: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens ({max_new_tokens}) must be at least 1")
        logits, cache = self.prefill(input_ids, last_only=True)
        step = logits[:, -1]
        kept = [step] if keep_logits else []
        tokens = [step.argmax(-1)]
        for _ in range(max_new_tokens - 1):
            step = self.decode_step(tokens[-1], cache)
            if keep_logits:
                kept.append(step)
            tokens.append(step.argmax(-1))
        return torch.stack(tokens, dim=1), (torch.stack(kept, dim=1) if keep_logits else None)

    def forward_packed(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """Several sequences of different lengths packed back to back (``[T_total]`` or
        ``[1, T_total]``, boundaries in ``cu_seqlens`` int32 ``[N + 1]``): the GDN ops see the
        varlen layout, attention a block-diagonal causal mask.  Returns logits ``[1, T_total,
        vocab]``; no cache (use `prefill` per batch of equal lengths to decode)."""
        with torch.inference_mode():
            ids = self._check_ids(input_ids, "forward_packed")
            ids = ids[None] if ids.dim() == 1 else ids
            if ids.dim() != 2 or ids.shape[0] != 1:
                raise ValueError(
                    f"forward_packed: input_ids must be [T] or [1, T], got {list(input_ids.shape)}"
                )
            T = ids.shape[1]
            cu = cu_seqlens.to(device=self.device, dtype=torch.int32)
            bounds = [int(c) for c in cu.tolist()]
            if bounds[0] != 0 or bounds[-1] != T or any(b < a for a, b in itertools.pairwise(bounds)):
                raise ValueError(
                    f"forward_packed: cu_seqlens {bounds} must start at 0, not decrease, end at {T}"
                )
            seq = torch.repeat_interleave(
                torch.arange(len(bounds) - 1, device=self.device),
                torch.tensor([b - a for a, b in itertools.pairwise(bounds)], device=self.device),
            )
            starts = torch.tensor(bounds[:-1], device=self.device)[seq]
            idx = torch.arange(T, device=self.device)
            positions = idx - starts
            mask = (idx[None, :] <= idx[:, None]) & (seq[None, :] == seq[:, None])
            return self._run(ids, None, decode=False, positions=positions, mask=mask, cu_seqlens=cu)
