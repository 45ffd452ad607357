"""Deterministic random checkpoints: ``config.json`` + ``model.safetensors`` from a seed.

`verify` runs the hybrid model on such weights when no real checkpoint is mounted, and the tests
load the same directory into clef and into upstream ``transformers`` (``Qwen3_5ForCausalLM``).

Each tensor is drawn from its own generator, seeded from (seed, tensor name), in float32 on the
CPU, then cast: the same seed gives the same bits on every machine, and a tensor does not change
when another one's shape does.

Scales are chosen so that activations neither vanish nor explode through the stack and greedy
decoding is not degenerate:

* projections ~ N(0, 1/fan_in): unit-RMS inputs (every block input is RMS-normalised) give
  unit-RMS outputs; the ones that write into the residual stream (``out_proj``, ``o_proj``,
  ``down_proj``) are further scaled by 1/sqrt(2·layers), so the stack is well conditioned (see
  ``_RESIDUAL_WRITERS``);
* the embedding ~ N(0, 0.5²) when untied keeps the current token visible in the residual stream;
  tied, it is N(0, 0.02²) (a large tied table makes every token predict itself); an untied
  output head ~ N(0, 1/hidden);
* the GDN conv ~ N(0, 1/W); ``A_log = log(U(0.01, 16))`` and ``dt_bias ≈ 1`` as upstream
  initialises them, which mixes heads that forget within a token with heads that remember
  hundreds of tokens;
* norms sit near their neutral value but not on it (zero-centred norms w ~ N(0, 0.1); the gated
  norm w ~ 1 + N(0, 0.1)), so a wrong norm convention (``w`` vs ``1 + w``) changes the output.
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import torch
from safetensors.torch import save_file

from clef_runtime.model.config import MULTIMODAL_MODEL_TYPE, ModelConfig
from clef_runtime.model.weights import MULTIMODAL_PREFIX, TEXT_PREFIX, expected_tensors

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _generator(seed: int, name: str) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)


# Projections that write into the residual stream: each block's output is scaled by
# 1/sqrt(2 * layers), so the stream is the embedding plus a sum of small updates rather than a
# random walk of O(1) steps.  Without it a random stack is chaotic: a relative perturbation of
# 3e-3 in one GDN output changed the logits by ~50% after 32 layers, and the `model` suite of
# `verify` could not tell rounding from a bug.  With it (and a visible embedding, below) the
# whole stack run in bf16 instead of f32 moves the logits by ~3%.
_RESIDUAL_WRITERS = ("out_proj.weight", "o_proj.weight", "down_proj.weight")


def _init(name: str, shape: tuple[int, ...], gen: torch.Generator, config: ModelConfig) -> torch.Tensor:
    def normal(std: float, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean

    leaf = name.rsplit(".", 2)
    kind = leaf[-2] if name.endswith(".weight") else leaf[-1]
    if name == "model.embed_tokens.weight":
        # Untied: the embedding carries the token into a stream the blocks only nudge.  Tied: the
        # same table scores the output, and a large one makes every token predict itself, so
        # it stays small there.
        return normal(0.02 if config.tie_word_embeddings else 0.5)
    if kind == "A_log":
        return torch.empty(shape, dtype=torch.float32).uniform_(0.01, 16.0, generator=gen).log()
    if kind == "dt_bias":
        return normal(0.1, mean=1.0)
    if kind == "conv1d":
        return normal(1.0 / math.sqrt(shape[-1]))
    if name.endswith("linear_attn.norm.weight"):
        return normal(0.1, mean=1.0)  # gated norm: applied as w
    if len(shape) == 1:
        return normal(0.1)  # zero-centred norms: applied as (1 + w)
    std = 1.0 / math.sqrt(shape[1])  # projections [out, in]: unit-RMS in, unit-RMS out
    if name.endswith(_RESIDUAL_WRITERS):
        std /= math.sqrt(2 * config.num_hidden_layers)
    return normal(std)


def random_weights(config: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """float32 weights by canonical name (the ones `write_random_checkpoint` stores)."""
    return {
        name: _init(name, e.shape, _generator(seed, name), config)
        for name, e in expected_tensors(config).items()
    }


def write_random_checkpoint(
    directory: str | Path,
    config: ModelConfig,
    seed: int,
    dtype: torch.dtype = torch.float32,
    *,
    multimodal: bool = False,
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` into ``directory`` (created if needed).

    The default text-only layout loads in clef and in upstream ``Qwen3_5ForCausalLM``.  With
    ``multimodal`` the config is a ``qwen3_5`` one with the decoder under ``text_config`` and the
    tensors are named ``model.language_model.*`` (as in Qwen3.5's released checkpoints; there is
    no vision tower, so only clef loads it).  Returns the directory."""
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"dtype {dtype} is not supported: use float32, bfloat16 or float16")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    weights = random_weights(config, seed)
    text = config.to_hf_dict()
    text["dtype"] = _DTYPE_NAMES[dtype]
    if multimodal:
        raw = {
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": MULTIMODAL_MODEL_TYPE,
            "tie_word_embeddings": config.tie_word_embeddings,
            "text_config": {k: v for k, v in text.items() if k != "architectures"},
            "dtype": _DTYPE_NAMES[dtype],
        }

        def rename(n: str) -> str:
            return MULTIMODAL_PREFIX + n[len(TEXT_PREFIX) :] if n.startswith(TEXT_PREFIX) else n
    else:
        raw = text

        def rename(n: str) -> str:
            return n

    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    tensors = {rename(n): t.to(dtype).contiguous() for n, t in weights.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
