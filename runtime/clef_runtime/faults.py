"""The fault catalogue: `CLEF_RUNTIME_FAULT=<name>` makes clef's own Triton kernels fail in a
known way, so that tests (and users) can prove `verify` catches each class of silent bug.

Faults only ever touch the Triton op set; the references never read this variable.  An unknown
name is an error, never a silent no-op: a typo must not turn a fault drill into a pass.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from clef_contract.command import FAULT_ENV as ENV_VAR


@dataclass(frozen=True)
class Fault:
    name: str
    op: str
    description: str


CATALOGUE: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "conv_key_band_zero",
            "causal_conv1d",
            "the conv output's key channel band [H*K, 2*H*K) is written as zero (the incident "
            "in docs/verification.md: with k = 0 the delta rule never writes its state)",
        ),
        Fault(
            "conv_state_not_advanced",
            "causal_conv1d_update",
            "decode reads the conv state but never shifts the new token into it",
        ),
        Fault(
            "beta_no_sigmoid",
            "gdn_gating",
            "beta is returned as the raw logit b instead of sigmoid(b)",
        ),
        Fault(
            "decay_sign_flipped",
            "gdn_gating",
            "g = +exp(A_log)*softplus(a + dt_bias): the state grows instead of decaying",
        ),
        Fault(
            "gated_norm_no_gate",
            "gated_rmsnorm",
            "the silu(z) gate is dropped: RMSNorm(x)*w",
        ),
        Fault(
            "fp16_state_overflow",
            "chunk_gated_delta_rule",
            "the recurrent state is held in the input dtype instead of float32; with f16 "
            "inputs a long context overflows it (inf/nan)",
        ),
    )
}


class UnknownFaultError(ValueError):
    pass


def active_fault() -> str | None:
    """The fault named by CLEF_RUNTIME_FAULT, or None.  Raises on an unknown name."""
    name = os.environ.get(ENV_VAR, "").strip()
    if not name:
        return None
    if name not in CATALOGUE:
        known = ", ".join(sorted(CATALOGUE))
        raise UnknownFaultError(f"{ENV_VAR}={name!r} is not in the fault catalogue; known faults: {known}")
    return name
