"""Per-GDN-layer statistics that `verify` reports side by side for two op sets.

They are the numbers that exposed the zeroed-key-band incident by hand (docs/verification.md): the sum of
beta, the absmax of the delta-rule output and of the gated-norm output, and the absmax of each
conv output band (q, k, v).  A zeroed key band shows up as ``conv_absmax["k"] == 0``.

Values accumulate on the device (no host sync per step) over every forward pass made while the
collector is attached (`HybridModel.recording`): a prefill and all decode steps of a generation.
Read them with `GDNStats.as_dict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

BANDS = ("q", "k", "v")


@dataclass
class GDNLayerStats:
    layer: int
    tokens: int = 0
    beta_sum: torch.Tensor | None = None  # float64 scalar
    delta_absmax: torch.Tensor | None = None
    gated_norm_absmax: torch.Tensor | None = None
    conv_absmax: dict[str, torch.Tensor] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "tokens": self.tokens,
            "beta_sum": _item(self.beta_sum),
            "delta_rule_absmax": _item(self.delta_absmax),
            "gated_norm_absmax": _item(self.gated_norm_absmax),
            "conv_absmax": {b: _item(self.conv_absmax.get(b)) for b in BANDS},
        }


def _item(t: torch.Tensor | None) -> float:
    return float("nan") if t is None else float(t)


def _max(acc: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    m = x.detach().abs().amax().to(torch.float64) if x.numel() else x.new_zeros((), dtype=torch.float64)
    return m if acc is None else torch.maximum(acc, m)


class GDNStats:
    """Collects `GDNLayerStats` per GDN layer: ``with model.recording(stats): ...``."""

    def __init__(self) -> None:
        self.layers: dict[int, GDNLayerStats] = {}

    def _layer(self, i: int) -> GDNLayerStats:
        if i not in self.layers:
            self.layers[i] = GDNLayerStats(layer=i)
        return self.layers[i]

    def record(
        self,
        layer: int,
        *,
        conv_out: torch.Tensor,
        qkv_split: tuple[int, int, int],
        beta: torch.Tensor,
        delta_out: torch.Tensor,
        gated_norm_out: torch.Tensor,
    ) -> None:
        s = self._layer(layer)
        s.tokens += int(beta.shape[0] * beta.shape[1])
        b = beta.detach().to(torch.float64).sum()
        s.beta_sum = b if s.beta_sum is None else s.beta_sum + b
        s.delta_absmax = _max(s.delta_absmax, delta_out)
        s.gated_norm_absmax = _max(s.gated_norm_absmax, gated_norm_out)
        for band, part in zip(BANDS, torch.split(conv_out, list(qkv_split), dim=-1), strict=True):
            s.conv_absmax[band] = _max(s.conv_absmax.get(band), part)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: per layer (in layer order) and totals over all GDN layers."""
        layers = [self.layers[i].as_dict() for i in sorted(self.layers)]
        return {"layers": layers, "totals": self.totals()}

    def totals(self) -> dict[str, float]:
        rows = [self.layers[i].as_dict() for i in sorted(self.layers)]
        if not rows:
            return {}
        return {
            "beta_sum": sum(r["beta_sum"] for r in rows),
            "delta_rule_absmax": max(r["delta_rule_absmax"] for r in rows),
            "gated_norm_absmax": max(r["gated_norm_absmax"] for r in rows),
            **{f"conv_{b}_absmax": max(r["conv_absmax"][b] for r in rows) for b in BANDS},
        }
