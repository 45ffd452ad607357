"""The Triton op set with one fault of the catalogue (`clef_runtime.faults`) built in.

`clef_runtime.opset.get_opset` reads the fault once, when it builds the op set; no op reads the
environment.  A fault that only changes what an op hands back is applied around the healthy
kernel, which carries no trace of it.  The two that must act inside a kernel are compile-time
flags there, set here through a keyword that only this module passes:

* ``fp16_state_overflow``: the delta rule's state is rounded to the input dtype after every chunk
  (prefill) or token (decode), inside the recurrence loop;
* ``gated_norm_no_gate``: the gate is dropped before the norm's output is rounded, once, to its
  dtype (no product outside the kernel gives the same bits).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import torch

from clef_runtime.ops import conv, conv_update, delta_rule_chunk, delta_rule_recurrent, gating, norm


def key_band(qkv_split: tuple[int, int, int] | None) -> tuple[int, int]:
    """The key band ``[lo, hi)`` of the GDN conv channels ``[q | k | v]``."""
    if qkv_split is None:
        raise ValueError(
            "fault conv_key_band_zero needs qkv_split to locate the key band; "
            "pass get_opset('triton', qkv_split=(q, k, v) channel counts)"
        )
    if len(qkv_split) != 3 or any(int(s) < 0 for s in qkv_split):
        raise ValueError(f"qkv_split {qkv_split} must be three non-negative band sizes (q, k, v)")
    return int(qkv_split[0]), int(qkv_split[0]) + int(qkv_split[1])


def _conv_key_band_zero(qkv_split: tuple[int, int, int] | None) -> dict[str, object]:
    lo, hi = key_band(qkv_split)
    channels = sum(qkv_split or ())

    def causal_conv1d(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, **kw: object
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if x.dim() == 3 and x.shape[-1] != channels:
            raise ValueError(
                f"causal_conv1d: qkv_split {qkv_split} must add up to the channel count {x.shape[-1]}"
            )
        y, final = conv.causal_conv1d(x, weight, bias, **kw)  # type: ignore[arg-type]
        y[..., lo:hi] = 0  # the output only: the final state holds the (healthy) inputs
        return y, final

    return {"causal_conv1d": causal_conv1d}


def _conv_state_not_advanced() -> dict[str, object]:
    def causal_conv1d_update(
        x: torch.Tensor,
        conv_state: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        **kw: object,
    ) -> torch.Tensor:
        before = conv_state.clone()
        y = conv_update.causal_conv1d_update(x, conv_state, weight, bias, **kw)  # type: ignore[arg-type]
        conv_state.copy_(before)  # read, never shifted
        return y

    return {"causal_conv1d_update": causal_conv1d_update}


def _gating(fault: str) -> dict[str, object]:
    def gdn_gating(
        a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        g, beta = gating.gdn_gating(a, b, A_log, dt_bias)
        if fault == "beta_no_sigmoid":
            return g, b.to(torch.float32, copy=True)  # the raw logit (the kernel has checked b)
        return g.neg_(), beta  # decay_sign_flipped: +exp(A_log)·softplus(a + dt_bias), exact

    return {"gdn_gating": gdn_gating}


def with_fault(ops: SimpleNamespace, fault: str, qkv_split: tuple[int, int, int] | None) -> SimpleNamespace:
    """`ops` (the healthy Triton op set) with `fault` built in.  ``qkv_split`` is read by
    ``conv_key_band_zero`` only (the key band is where the fault writes zeros)."""
    changes: dict[str, object]
    if fault == "conv_key_band_zero":
        changes = _conv_key_band_zero(qkv_split)
    elif fault == "conv_state_not_advanced":
        changes = _conv_state_not_advanced()
    elif fault in ("beta_no_sigmoid", "decay_sign_flipped"):
        changes = _gating(fault)
    elif fault == "gated_norm_no_gate":
        changes = {"gated_rmsnorm": functools.partial(norm.gated_rmsnorm, fault_no_gate=True)}
    elif fault == "fp16_state_overflow":
        changes = {
            "chunk_gated_delta_rule": functools.partial(
                delta_rule_chunk.chunk_gated_delta_rule, fault_state_in_io_dtype=True
            ),
            "fused_recurrent_gated_delta_rule": functools.partial(
                delta_rule_recurrent.fused_recurrent_gated_delta_rule, fault_state_in_io_dtype=True
            ),
        }
    else:
        raise KeyError(f"fault {fault!r} has no implementation in the Triton op set")
    return SimpleNamespace(**{**vars(ops), **changes})
