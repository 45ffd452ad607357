"""Plain-PyTorch references for every runtime op, written from the math and computed in float64.

They define what the Triton kernels must compute; `verify` and the tests compare against them.
"""

from __future__ import annotations

from types import SimpleNamespace

from clef_runtime.reference.conv import causal_conv1d, causal_conv1d_update
from clef_runtime.reference.delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from clef_runtime.reference.gating import gdn_gating, l2norm
from clef_runtime.reference.norm import gated_rmsnorm

__all__ = [
    "REFERENCE_OPS",
    "causal_conv1d",
    "causal_conv1d_update",
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "gated_rmsnorm",
    "gdn_gating",
    "l2norm",
]

REFERENCE_OPS = SimpleNamespace(
    name="reference",
    causal_conv1d=causal_conv1d,
    causal_conv1d_update=causal_conv1d_update,
    gdn_gating=gdn_gating,
    l2norm=l2norm,
    chunk_gated_delta_rule=chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule=fused_recurrent_gated_delta_rule,
    gated_rmsnorm=gated_rmsnorm,
)
