"""clef's Triton kernels, one module per op family (see `clef_runtime.opset` for the contract).

`TRITON_OPS` is the healthy op set; `clef_runtime.opset.get_opset` builds it with a fault of the
catalogue when one is set (`clef_runtime.ops.faulty`) and with the launch configuration forced
when one is asked for (`with_tensor_cores`).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

from clef_runtime.interpreter import interpreting, patch_language_once_per_launch, round_bf16_like_gpus
from clef_runtime.ops.conv import causal_conv1d
from clef_runtime.ops.conv_update import causal_conv1d_update
from clef_runtime.ops.delta_rule_chunk import chunk_gated_delta_rule
from clef_runtime.ops.delta_rule_recurrent import fused_recurrent_gated_delta_rule
from clef_runtime.ops.gating import gdn_gating, l2norm
from clef_runtime.ops.norm import gated_rmsnorm

if interpreting():
    round_bf16_like_gpus()  # before any kernel runs: bf16 outputs round as on a GPU
    patch_language_once_per_launch()  # helper calls inside a kernel skip re-patching triton.language

__all__ = [
    "TRITON_OPS",
    "causal_conv1d",
    "causal_conv1d_update",
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "gated_rmsnorm",
    "gdn_gating",
    "l2norm",
    "with_tensor_cores",
]

TRITON_OPS = SimpleNamespace(
    name="triton",
    causal_conv1d=causal_conv1d,
    causal_conv1d_update=causal_conv1d_update,
    gdn_gating=gdn_gating,
    l2norm=l2norm,
    chunk_gated_delta_rule=chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule=fused_recurrent_gated_delta_rule,
    gated_rmsnorm=gated_rmsnorm,
)


def with_tensor_cores(ops: SimpleNamespace, tensor_cores: bool) -> SimpleNamespace:
    """`ops` with the chunked delta rule's launch configuration forced (`clef_runtime.kernel_config`):
    tensor cores, or the FMA path of the V100.  The other ops launch the same way on every GPU."""
    chunk = functools.partial(ops.chunk_gated_delta_rule, tensor_cores=tensor_cores)
    return SimpleNamespace(**{**vars(ops), "chunk_gated_delta_rule": chunk})
