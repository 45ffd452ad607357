"""flash-linear-attention (FLA) 0.6.0 as the peer being measured: its entry points, and how clef's
layouts (`clef_runtime.opset`) map onto them.  FLA is only ever *called* here.

Layout mapping (docs/performance.md, "FLA adapters"):

* delta rule (``fla.ops.gated_delta_rule``): FLA takes the same ``[B, T, H, K]`` q/k,
  ``[B, T, HV, V]`` v, ``[B, T, HV]`` g (log decay) and beta, and supports grouped value heads
  (``HV % H == 0``, value head i reads key head ``i // (HV / H)``) natively: no repeat of q/k, no
  transpose.  The state is ``[N, HV, K, V]`` float32 (``state_v_first=False``, FLA's non-default
  layout, which is clef's).  ``fused_recurrent_gated_delta_rule`` does not update the state in
  place: it reads ``initial_state`` and writes a new ``final_state`` (the same bytes).
* conv (``fla.modules.causal_conv1d``): x ``[B, T, D]`` and weight ``[D, W]`` as clef, but FLA's
  conv state is ``[N, D, W]`` holding the last ``W`` inputs, clef's ``[N, D, W - 1]`` the last
  ``W - 1``: clef's state is FLA's ``[..., 1:]``.  The FLA cache for the decode rows is built from
  clef's state outside the timed region; the decode kernel reads ``W - 1`` columns and writes
  ``W`` (one column more than the byte floor counts).
* gated RMSNorm (``fla.modules.norm.fused_norm_gate.rms_norm_gated``, swish gate): same
  ``[..., V]`` rows; it also writes a float32 rstd per row.
* gating: FLA's ``fused_gdn_gate`` computes g only; beta is FLA's ``fused_beta_sigmoid``, a
  second launch.
* l2norm (``fla.modules.norm.l2norm.l2norm``): same rows; it also writes a float32 rstd per row.

FlashQLA (``flash_qla.chunk_gated_delta_rule``, Qwen's TileLang kernels) is a second peer for the
chunked rows only: it takes FLA's arguments and layouts.  FLA 0.6.0 hands its own chunked call to
FlashQLA when ``flash_qla`` is importable, unless ``FLA_DISABLE_BACKEND_DISPATCH=1`` was set
before FLA was imported: ``clef-runtime bench`` sets it (unless the caller set it either way) so
that the FLA column stays FLA's Triton kernels, and `fla_chunk_backend` says which backend FLA's column is.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# (attribute on FlaPeer, module, name)
ENTRY_POINTS: tuple[tuple[str, str, str], ...] = (
    ("chunk", "fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
    ("recurrent", "fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule"),
    ("conv", "fla.modules.causal_conv1d", "causal_conv1d"),
    ("conv_update", "fla.modules.causal_conv1d", "causal_conv1d_update"),
    ("rms_norm_gated", "fla.modules.norm.fused_norm_gate", "rms_norm_gated"),
    ("l2norm", "fla.modules.norm.l2norm", "l2norm"),
    ("gdn_gate", "fla.ops.gated_delta_rule.gate", "fused_gdn_gate"),
    ("beta_sigmoid", "fla.ops.common.gate", "fused_beta_sigmoid"),
)


@dataclass
class FlaPeer:
    """FLA's entry points that imported, and why the others did not."""

    version: str
    functions: dict[str, Callable[..., Any]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> Callable[..., Any]:
        return self.functions[name]

    def why_missing(self, *names: str) -> str | None:
        """None when every named entry point is there, else the first reason."""
        for n in names:
            if n not in self.functions:
                return self.missing.get(n, f"FLA has no {n}")
        return None


def load_fla() -> tuple[FlaPeer | None, str]:
    """Import FLA.  Returns ``(peer, version)`` or ``(None, reason)``."""
    try:
        fla = importlib.import_module("fla")
    except Exception as e:  # any import failure means "no FLA in this run", with the reason
        return None, f"flash-linear-attention is not importable ({type(e).__name__}: {e})"
    version = str(getattr(fla, "__version__", "unknown"))
    peer = FlaPeer(version=version)
    for attr, module, name in ENTRY_POINTS:
        try:
            peer.functions[attr] = getattr(importlib.import_module(module), name)
        except Exception as e:
            peer.missing[attr] = f"FLA {version} has no {module}.{name} ({type(e).__name__}: {e})"
    return peer, version


DISPATCH_ENV = "FLA_DISABLE_BACKEND_DISPATCH"


def load_flashqla() -> tuple[Callable[..., Any] | None, str]:
    """Import FlashQLA.  Returns ``(chunk_gated_delta_rule, version)`` or ``(None, reason)``."""
    try:
        mod = importlib.import_module("flash_qla")
        fn = mod.chunk_gated_delta_rule
    except Exception as e:  # any import failure means "no FlashQLA in this run", with the reason
        return None, f"flash-qla is not importable ({type(e).__name__}: {e})"
    return fn, str(getattr(mod, "__version__", "unknown"))


def fla_chunk_backend(flashqla_importable: bool) -> str:
    """Which backend FLA's chunked call runs in this process (FLA reads the switch at import)."""
    if os.environ.get(DISPATCH_ENV) == "1":
        return f"FLA's Triton kernels ({DISPATCH_ENV}=1)"
    if flashqla_importable:
        return "FlashQLA, through FLA's backend dispatch (flash_qla importable, dispatch not disabled)"
    return "FLA's Triton kernels (flash_qla not importable)"


def fla_environment() -> dict[str, str]:
    """FLA environment switches that change which kernels run (recorded with the results)."""
    return {k: v for k, v in os.environ.items() if k.startswith("FLA_")}
