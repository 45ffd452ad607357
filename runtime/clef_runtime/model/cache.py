"""Per-sequence decoding state of the hybrid decoder.

A GDN layer carries a fixed-size state whatever the context length: the conv state
``[B, conv_dim, W - 1]`` (the last ``W - 1`` pre-activation conv inputs, in the model dtype) and
the recurrent state ``[B, Hv, K, V]`` (always float32: f16 overflows on long contexts).  An
attention layer carries a KV cache that grows by one entry per token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class GDNState:
    conv: torch.Tensor | None = None  # [B, conv_dim, W - 1], model dtype
    recurrent: torch.Tensor | None = None  # [B, Hv, K, V], float32


@dataclass
class KVState:
    k: torch.Tensor | None = None  # [B, kv_heads, S, head_dim], after q/k norm and rope
    v: torch.Tensor | None = None  # [B, kv_heads, S, head_dim]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


@dataclass
class HybridCache:
    """One state per layer, in layer order, and how many tokens each sequence has seen."""

    layers: list[GDNState | KVState] = field(default_factory=list)
    seq_len: int = 0
    batch_size: int = 0
