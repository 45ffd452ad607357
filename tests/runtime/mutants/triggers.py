"""The triggering case of each mutant: a small scenario, written independently of verify's cases,
that calls one op the way a GDN layer does, twice (two layers), and returns what the caller holds
afterwards: the first call's results, the in-place states and the inputs.  A mutant does real
damage when one of these differs from the reference op set's run of the same scenario beyond
the op's tolerance (`test_verify_mutants.test_each_mutant_does_real_damage`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from clef_runtime.inputs import gdn_inputs

from .catalogue import Shape

SHAPE = Shape(key_heads=2, value_heads=4, key_dim=16, value_dim=16)
WIDTH = 4  # conv width


@dataclass(frozen=True)
class Seen:
    """One tensor the caller holds after the scenario, and how to judge it."""

    tensor: torch.Tensor
    op: str
    groups: tuple[int, ...]  # dims whose every index is judged on its own (heads, blocks)


Scenario = Callable[[SimpleNamespace, torch.Generator, torch.device, torch.dtype], dict[str, Seen]]


def _randn(
    gen: torch.Generator, dev: torch.device, dt: torch.dtype, *shape: int, scale: float = 1.0
) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(device=dev, dtype=dt)


def _cu(lengths: tuple[int, ...], dev: torch.device) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=dev)


def _conv_dim() -> int:
    return 2 * SHAPE.key_heads * SHAPE.key_dim + SHAPE.value_heads * SHAPE.value_dim


def _conv(lengths: tuple[int, ...] | None) -> Scenario:
    def run(
        ops: SimpleNamespace, gen: torch.Generator, dev: torch.device, dt: torch.dtype
    ) -> dict[str, Seen]:
        D = _conv_dim()
        B, T = (2, 40) if lengths is None else (1, sum(lengths))
        N = B if lengths is None else len(lengths)
        seen: dict[str, Seen] = {}
        for layer in (0, 1):
            x = _randn(gen, dev, dt, B, T, D)
            w = _randn(gen, dev, dt, D, WIDTH, scale=0.5)
            init = _randn(gen, dev, dt, N, D, WIDTH - 1)
            kw = {"initial_state": init, "output_final_state": True}
            if lengths is not None:
                kw["cu_seqlens"] = _cu(lengths, dev)
            y, fin = ops.causal_conv1d(x, w, **kw)
            if layer == 0:
                seen = {
                    "y": Seen(y, "causal_conv1d", (2,)),
                    "final state": Seen(fin, "causal_conv1d", (0, 1)),
                    "x after": Seen(x, "causal_conv1d", (2,)),
                    "initial state after": Seen(init, "causal_conv1d", (0, 1)),
                }
        return seen

    return run


def conv_decode(
    ops: SimpleNamespace, gen: torch.Generator, dev: torch.device, dt: torch.dtype
) -> dict[str, Seen]:
    """Two rows and a padding row through a pool of four slots: 2 tokens, 2 more, then 1."""
    D = _conv_dim()
    state = _randn(gen, dev, dt, 4, D, WIDTH - 1)
    w = _randn(gen, dev, dt, D, WIDTH, scale=0.5)
    idx = torch.tensor([3, 1, -1], dtype=torch.int32, device=dev)
    y2 = ops.causal_conv1d_update(_randn(gen, dev, dt, 3, 2, D), state, w, state_indices=idx)
    ops.causal_conv1d_update(_randn(gen, dev, dt, 3, 2, D), state, w, state_indices=idx)
    y1 = ops.causal_conv1d_update(_randn(gen, dev, dt, 3, 1, D), state, w, state_indices=idx)
    op = "causal_conv1d_update"
    return {"y (T=2)": Seen(y2, op, (0, 2)), "y (T=1)": Seen(y1, op, (0, 2)),
            "state pool": Seen(state, op, (0, 1))}  # fmt: skip


def _gating(grid: bool) -> Scenario:
    """Pre-activations as a model's (a ~ N(0, 1), dt_bias from -6 to -2), or from -30 to 30
    through the branch points of softplus (`grid`)."""

    def run(
        ops: SimpleNamespace, gen: torch.Generator, dev: torch.device, dt: torch.dtype
    ) -> dict[str, Seen]:
        return _gating_run(ops, gen, dev, dt, grid)

    return run


def _gating_run(
    ops: SimpleNamespace, gen: torch.Generator, dev: torch.device, dt: torch.dtype, grid: bool
) -> dict[str, Seen]:
    HV = SHAPE.value_heads
    A_log = torch.log(torch.linspace(1.0, 16.0, HV)).to(dev)
    dt_bias = torch.linspace(-6.0, -2.0, HV).to(dev)
    x = torch.cat([torch.linspace(-30, 30, 121), torch.tensor([-2.2, -2.0, -0.1, 0.1, 1.0, 2.0, 2.2])])
    seen: dict[str, Seen] = {}
    for layer in (0, 1):
        if grid:
            a = (x[:, None] - dt_bias.cpu() + 0.01 * layer).to(device=dev, dtype=dt)
        else:
            a = _randn(gen, dev, dt, 128, HV)
        b = _randn(gen, dev, dt, a.shape[0], HV, scale=3.0)
        g, beta = ops.gdn_gating(a, b, A_log, dt_bias)
        if layer == 0:
            seen = {"g": Seen(g, "gdn_gating", (1,)), "beta": Seen(beta, "gdn_gating", (1,)),
                    "a after": Seen(a, "gdn_gating", (1,))}  # fmt: skip
    return seen


def _small_rows(gen: torch.Generator, dev: torch.device, dt: torch.dtype, *shape: int) -> torch.Tensor:
    x = torch.randn(*shape, generator=gen)
    x[:, ::5] *= torch.tensor([0.0, 1e-4, 1e-3])[torch.arange(x[:, ::5].shape[1]) % 3][None, :, None, None]
    return x.to(device=dev, dtype=dt)


def l2norm(ops: SimpleNamespace, gen: torch.Generator, dev: torch.device, dt: torch.dtype) -> dict[str, Seen]:
    x = _small_rows(gen, dev, dt, 2, 30, SHAPE.key_heads, SHAPE.key_dim)
    y = ops.l2norm(x)
    return {"y": Seen(y, "l2norm", (0, 1, 2)), "x after": Seen(x, "l2norm", (2,))}


def gated_norm(
    ops: SimpleNamespace, gen: torch.Generator, dev: torch.device, dt: torch.dtype
) -> dict[str, Seen]:
    x = _small_rows(gen, dev, dt, 2, 30, SHAPE.value_heads, SHAPE.value_dim)
    z = _randn(gen, dev, dt, 2, 30, SHAPE.value_heads, SHAPE.value_dim)
    w = _randn(gen, dev, dt, SHAPE.value_dim, scale=0.1) + 1
    y = ops.gated_rmsnorm(x, z, w)
    return {"y": Seen(y, "gated_rmsnorm", (2,)), "x after": Seen(x, "gated_rmsnorm", (2,))}


def _gdn(
    gen: torch.Generator, dev: torch.device, dt: torch.dtype, B: int, T: int
) -> tuple[torch.Tensor, ...]:
    s = SHAPE
    return gdn_inputs(gen, dev, dt, B=B, T=T, H=s.key_heads, HV=s.value_heads, K=s.key_dim, V=s.value_dim)


def _state(gen: torch.Generator, dev: torch.device, n: int, scale: float) -> torch.Tensor:
    return _randn(gen, dev, torch.float32, n, SHAPE.value_heads, SHAPE.key_dim, SHAPE.value_dim, scale=scale)


def _chunk(B: int, T: int, lengths: tuple[int, ...] | None = None, state_scale: float = 0.5,
           decay: Callable[[torch.Tensor], torch.Tensor] | None = None, half_keys: bool = False) -> Scenario:  # fmt: skip
    def run(
        ops: SimpleNamespace, gen: torch.Generator, dev: torch.device, dt: torch.dtype
    ) -> dict[str, Seen]:
        op = "chunk_gated_delta_rule"
        seen: dict[str, Seen] = {}
        for layer in (0, 1):
            q, k, v, g, beta = _gdn(gen, dev, dt, B, T)
            if decay is not None:
                g = decay(g).contiguous()
            if half_keys:  # the large rows of the state are never overwritten: a large final state
                k[..., SHAPE.key_dim // 2 :] = 0
            n = B if lengths is None else len(lengths)
            init = _state(gen, dev, n, state_scale)
            kw = {"initial_state": init, "output_final_state": True, "use_qk_l2norm": True}
            if lengths is not None:
                kw["cu_seqlens"] = _cu(lengths, dev)
            o, fin = ops.chunk_gated_delta_rule(q, k, v, g, beta, **kw)
            if layer == 0:
                seen = {"o": Seen(o, op, (2,)), "final state": Seen(fin, op, (0, 1)),
                        "v after": Seen(v, op, (2,)),
                        "initial state after": Seen(init, op, (0, 1))}  # fmt: skip
        return seen

    return run


def _recurrent(rows: int, pool: int, tokens: tuple[int, ...], state_scale: float) -> Scenario:
    def run(
        ops: SimpleNamespace, gen: torch.Generator, dev: torch.device, dt: torch.dtype
    ) -> dict[str, Seen]:
        op = "fused_recurrent_gated_delta_rule"
        state = _state(gen, dev, pool, state_scale)
        idx = torch.tensor([*range(pool - 1, pool - 1 - rows, -1), -1], dtype=torch.int32, device=dev)
        seen: dict[str, Seen] = {}
        for T in tokens:
            q, k, v, g, beta = _gdn(gen, dev, dt, rows + 1, T)
            o = ops.fused_recurrent_gated_delta_rule(
                q, k, v, g, beta, state=state, state_indices=idx, use_qk_l2norm=True
            )
            seen.setdefault(f"o (T={T})", Seen(o, op, (0, 2)))
        seen["state pool"] = Seen(state, op, (0, 1))
        return seen

    return run


def _strong(g: torch.Tensor) -> torch.Tensor:
    rate = torch.logspace(-2, math.log10(16.0), g.shape[-1], device=g.device)
    return -rate * torch.rand(g.shape, generator=torch.Generator().manual_seed(1)).to(g.device) * 2


TRIGGERS: dict[str, Scenario] = {
    "conv_prefill": _conv(None),
    "conv_varlen_init": _conv((0, 3, 20)),
    "conv_decode": conv_decode,
    "gating": _gating(grid=False),
    "gating_regimes": _gating(grid=True),
    "l2norm": l2norm,
    "gated_norm": gated_norm,
    "chunk_prefill": _chunk(2, 70),
    "chunk_varlen_init": _chunk(1, 23, (0, 3, 20)),
    "chunk_long": _chunk(1, 40, state_scale=3e4, decay=lambda g: torch.full_like(g, -1e-4), half_keys=True),
    "chunk_strong_decay": _chunk(1, 40, decay=_strong),
    "recurrent_decode": _recurrent(2, 4, (2, 2, 1), 0.5),
    "recurrent_large_state": _recurrent(1, 2, (1, 1), 3e4),
}
