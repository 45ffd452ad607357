"""The hybrid decoder's layers, plain PyTorch modules.

Module and parameter names follow the upstream checkpoint names (`clef_runtime.model.weights`),
so a state dict loads without renaming.  Every GDN computation goes through an `OpSet`, so the
same layer runs on clef's Triton kernels or on the float64 references; attention, the MLP and the
norms are ordinary torch and identical on both sides.

Norm conventions (upstream Qwen3.5, and easy to get wrong):

* decoder norms (``input_layernorm``, ``post_attention_layernorm``, ``model.norm``) and the
  attention ``q_norm``/``k_norm`` are zero-centred: ``x / rms(x) * (1 + w)``, in float32;
* the GDN output norm (``linear_attn.norm``) scales by ``w`` itself: ``x / rms(x) * w * silu(z)``
  (the op set's ``gated_rmsnorm``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from clef_runtime.model.cache import GDNState, KVState
from clef_runtime.model.config import LINEAR, ModelConfig
from clef_runtime.model.stats import GDNStats
from clef_runtime.opset import OpSet


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm, ``x / rms(x) * (1 + w)``, computed in float32 (weight kept in f32)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


class Embedding(nn.Module):
    """Token embedding table ``[vocab, hidden]``.  (Not ``nn.Embedding``: its random init on the
    meta device, where the model is first built, pulls in torch._dynamo, seconds of import.)"""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, hidden))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _DepthwiseConvWeight(nn.Module):
    """Holds ``conv1d.weight`` in the checkpoint's ``[D, 1, W]`` layout; the op set takes ``[D, W]``."""

    def __init__(self, channels: int, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(channels, 1, width))


class _GatedNormWeight(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class GatedDeltaNet(nn.Module):
    """A GDN (linear attention) layer: in_proj_qkv → causal conv (silu) → q/k/v heads → gating →
    gated delta rule (q, k L2-normalised) → gated RMSNorm with z → out_proj."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        c = config
        self.layer_idx = layer_idx
        self.num_k_heads, self.num_v_heads = c.linear_num_key_heads, c.linear_num_value_heads
        self.k_dim, self.v_dim = c.linear_key_head_dim, c.linear_value_head_dim
        self.qkv_split = c.qkv_split
        self.eps = c.rms_norm_eps
        self.in_proj_qkv = nn.Linear(c.hidden_size, c.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(c.hidden_size, c.linear_value_dim, bias=False)
        self.in_proj_b = nn.Linear(c.hidden_size, c.linear_num_value_heads, bias=False)
        self.in_proj_a = nn.Linear(c.hidden_size, c.linear_num_value_heads, bias=False)
        self.conv1d = _DepthwiseConvWeight(c.conv_dim, c.linear_conv_kernel_dim)
        self.dt_bias = nn.Parameter(torch.ones(c.linear_num_value_heads))
        self.A_log = nn.Parameter(torch.zeros(c.linear_num_value_heads))
        self.norm = _GatedNormWeight(c.linear_value_head_dim)
        self.out_proj = nn.Linear(c.linear_value_dim, c.hidden_size, bias=False)
        # Where this layer's statistics go while `HybridModel.recording` is active (None: nowhere).
        self.stats: GDNStats | None = None

    def forward(
        self,
        x: torch.Tensor,
        ops: OpSet,
        state: GDNState | None,
        *,
        decode: bool,
        cu_seqlens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` [B, T, hidden].  ``decode`` uses the in-place decode ops on ``state`` (which
        must hold a prefill's state); otherwise the prefill ops run, starting from ``state`` when
        it holds one and leaving the final state in it."""
        B, T, _ = x.shape
        mixed = self.in_proj_qkv(x)  # [B, T, conv_dim], channels [q | k | v]
        z = self.in_proj_z(x).view(B, T, self.num_v_heads, self.v_dim)
        b = self.in_proj_b(x)
        a = self.in_proj_a(x)
        w = self.conv1d.weight.squeeze(1)  # [conv_dim, W]

        if decode:
            if state is None or state.conv is None or state.recurrent is None:
                raise ValueError(f"layer {self.layer_idx}: decode needs the state of a prefill")
            conv = ops.causal_conv1d_update(mixed, state.conv, w, activation="silu")
        else:
            conv, conv_final = ops.causal_conv1d(
                mixed,
                w,
                initial_state=None if state is None else state.conv,
                output_final_state=state is not None,
                cu_seqlens=cu_seqlens,
                activation="silu",
            )
            if state is not None:
                state.conv = conv_final

        q, k, v = torch.split(conv, list(self.qkv_split), dim=-1)
        q = q.reshape(B, T, self.num_k_heads, self.k_dim).contiguous()
        k = k.reshape(B, T, self.num_k_heads, self.k_dim).contiguous()
        v = v.reshape(B, T, self.num_v_heads, self.v_dim).contiguous()
        g, beta = ops.gdn_gating(a, b, self.A_log, self.dt_bias)

        if decode:
            assert state is not None and state.recurrent is not None
            o = ops.fused_recurrent_gated_delta_rule(
                q, k, v, g, beta, state=state.recurrent, use_qk_l2norm=True
            )
        else:
            o, final = ops.chunk_gated_delta_rule(
                q,
                k,
                v,
                g,
                beta,
                initial_state=None if state is None else state.recurrent,
                output_final_state=state is not None,
                cu_seqlens=cu_seqlens,
                use_qk_l2norm=True,
            )
            if state is not None:
                state.recurrent = final

        normed = ops.gated_rmsnorm(o, z, self.norm.weight, self.eps)
        if self.stats is not None:
            self.stats.record(
                self.layer_idx,
                conv_out=conv,
                qkv_split=self.qkv_split,
                beta=beta,
                delta_out=o,
                gated_norm_out=normed,
            )
        return self.out_proj(normed.reshape(B, T, self.num_v_heads * self.v_dim))


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``[T, rotary_dim]`` (float32) for integer positions ``[T]``: the two halves of the
    rotary channels share frequencies ``theta ** (-2i / rotary_dim)``."""
    inv_freq = theta ** (
        -torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=positions.device) / rotary_dim
    )
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` channels of ``x`` [B, heads, T, head_dim] (partial rotary:
    the rest pass through).  Pairs are (i, i + rotary_dim/2), as upstream's rotate_half."""
    rd = cos.shape[-1]
    rot, rest = x[..., :rd].float(), x[..., rd:]
    half = rd // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    out = rot * cos + rotated * sin
    return torch.cat([out.to(x.dtype), rest], dim=-1)


class GatedAttention(nn.Module):
    """Full attention with q/k RMSNorm, partial rotary, GQA and a sigmoid output gate.

    ``q_proj`` produces, per head, ``head_dim`` query channels followed by ``head_dim`` gate
    channels; the attention output is multiplied by ``sigmoid(gate)`` before ``o_proj``."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        c = config
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
        )
        self.output_gate = c.attn_output_gate
        q_out = c.num_attention_heads * c.head_dim * (2 if c.attn_output_gate else 1)
        self.q_proj = nn.Linear(c.hidden_size, q_out, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        state: KVState | None,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """``x`` [B, T, hidden]; ``mask`` [T, S] bool (True = may attend) or None for "all"."""
        B, T, _ = x.shape
        hd = self.head_dim
        q = self.q_proj(x).view(B, T, self.num_heads, -1)
        gate = None
        if self.output_gate:
            q, gate = q[..., :hd], q[..., hd:].reshape(B, T, self.num_heads * hd)
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.num_kv_heads, hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if state is not None:
            k, v = state.append(k, v)
        group = self.num_heads // self.num_kv_heads
        if group > 1:  # query head h reads kv head h // group
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=hd**-0.5)
        o = o.transpose(1, 2).reshape(B, T, self.num_heads * hd)
        if gate is not None:
            o = o * torch.sigmoid(gate)
        return self.o_proj(o)


class DecoderLayer(nn.Module):
    """Pre-norm residual block: token mixer (GDN or attention), then the MLP."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.is_linear = config.layer_types[layer_idx] == LINEAR
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(config, layer_idx)
        else:
            self.self_attn = GatedAttention(config, layer_idx)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        *,
        ops: OpSet,
        state: GDNState | KVState | None,
        decode: bool,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        cu_seqlens: torch.Tensor | None,
    ) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.is_linear:
            assert state is None or isinstance(state, GDNState)
            h = self.linear_attn(h, ops, state, decode=decode, cu_seqlens=cu_seqlens)
        else:
            assert state is None or isinstance(state, KVState)
            h = self.self_attn(h, cos, sin, state, mask)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))
