"""What a benchmark row is made of: the implementations (`Impl`), what a row needs at run time
(`Setup`), what every row runs with (`Context`), the row itself (`Row`) and seeded input draws.

An input *set* is a dict of tensors in clef's layouts, drawn from a seed.  ``Impl.prepare`` maps a
set to what an implementation needs (FLA's conv cache layout, say) outside the timed region;
``Impl.run`` is the timed call and returns its outputs in clef's layouts (as views, never
copies), so that the two implementations can be compared key by key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from clef_runtime.bench.fla_peer import FlaPeer
from clef_runtime.bench.floors import Dims, Floor
from clef_runtime.inputs import gdn_inputs
from clef_runtime.opset import OpSet

Tensors = dict[str, torch.Tensor]
EPS = 1e-6


def identity(s: Tensors) -> Tensors:
    return s


@dataclass
class Impl:
    name: str
    run: Callable[[Tensors], Tensors]
    prepare: Callable[[Tensors], Tensors] = identity


@dataclass
class Setup:
    """What a row needs at run time.  ``shared_bytes``: bytes every call reads from tensors shared
    by all sets (a layer's weights), for sizing the rotation.  ``peers``: implementations timed
    beside clef and FLA (FlashQLA, clef's split chunk design), checked against FLA (or clef when
    there is no FLA); ``peer_missing``: the peers a row would have, with why they are absent."""

    case: str
    floor: Floor
    make_set: Callable[[int], Tensors]
    clef: Impl
    fla: Impl | None
    fla_missing: str | None
    notes: list[str] = field(default_factory=list)
    fla_notes: list[str] = field(default_factory=list)  # how FLA was called; shown when FLA is loaded
    shared_bytes: int = 0
    show_tflops: bool = False
    peers: list[Impl] = field(default_factory=list)
    peer_missing: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Context:
    device: torch.device
    dtype: torch.dtype
    dims: Dims
    ops: OpSet
    fla: FlaPeer | None
    fla_reason: str = ""
    flashqla: Callable[..., object] | None = None
    flashqla_reason: str = "not loaded"
    split: bool = False  # also time clef's split chunk design (`clef_runtime.ops.delta_rule_chunk_split`)
    # chunk rows: q/k normalised inside the op (as the model calls it); False: they arrive
    # normalised and no implementation normalises them
    qk_l2norm: bool = True
    fla_backend: str = ""  # which backend FLA's chunked call runs (`fla_peer.fla_chunk_backend`)

    @property
    def elt(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class Row:
    """``full``/``tiny``: (B, T) at the model's shapes and at the --allow-cpu shapes."""

    name: str
    op: str
    graph: bool
    full: tuple[int, int]
    tiny: tuple[int, int]
    build: Callable[[Context, int, int], Setup]


class Draw:
    """Seeded random tensors drawn on the device (float32, then cast)."""

    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)

    def normal(
        self, shape: tuple[int, ...], dtype: torch.dtype, scale: float = 1.0, mean: float = 0.0
    ) -> torch.Tensor:
        t = torch.randn(shape, generator=self.gen, device=self.device, dtype=torch.float32)
        return (t * scale + mean).to(dtype)

    def uniform(self, shape: tuple[int, ...], lo: float, hi: float) -> torch.Tensor:
        t = torch.rand(shape, generator=self.gen, device=self.device, dtype=torch.float32)
        return t * (hi - lo) + lo


def fla_impl(
    ctx: Context, names: tuple[str, ...], make: Callable[[FlaPeer], Impl]
) -> tuple[Impl | None, str | None]:
    if ctx.fla is None:
        return None, ctx.fla_reason or "FLA not loaded"
    why = ctx.fla.why_missing(*names)
    if why is not None:
        return None, why
    return make(ctx.fla), None


def require(t: torch.Tensor | None, what: str) -> torch.Tensor:
    if t is None:
        raise RuntimeError(f"{what} returned no tensor where one was asked for")
    return t


def gdn_set(r: Draw, d: Dims, B: int, T: int, dtype: torch.dtype, normalise_qk: bool = False) -> Tensors:
    """q, k, v, g, beta as `clef_runtime.inputs.gdn_inputs` draws them (on the device)."""
    q, k, v, g, beta = gdn_inputs(
        r.gen, r.device, dtype, B=B, T=T, H=d.H, HV=d.HV, K=d.K, V=d.V, normalise_qk=normalise_qk
    )
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta}
