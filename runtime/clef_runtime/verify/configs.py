"""The launch configurations each kernel can select at the shapes under test, enumerated through
the kernels' own config functions: a config that a new size threshold adds gets a case of its own
without anyone editing the suite.

Each enumeration maps the sizes an op can be called with (token counts, decode batch rows, rows
of a row-wise op) through the kernel's chooser and keeps the smallest size per distinct choice.
The chunked delta rule's tiles depend on head dims, dtype and the device only (one choice per
run); the decode delta rule's on V only, and the conv decode's on the channel count only.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable

from clef_runtime.ops import conv
from clef_runtime.ops._common import row_tile

# The largest sizes enumerated: tokens in one prefill call, rows of a row-wise op.  Beyond them no
# chooser changes its answer (they saturate far below).
MAX_TOKENS = 1 << 16


def _powers(limit: int) -> list[int]:
    out, n = [], 1
    while n <= limit:
        out.append(n)
        n *= 2
    return out


def smallest_per_choice(choose: Callable[[int], Hashable], sizes: Iterable[int]) -> dict[Hashable, int]:
    """The smallest size of `sizes` that makes `choose` return each distinct answer."""
    found: dict[Hashable, int] = {}
    for n in sorted(set(sizes)):
        found.setdefault(choose(n), n)
    return found


def conv_prefill_tokens(conv_dim: int, covered: Iterable[int]) -> dict[str, int]:
    """Token counts (one per prefill tile choice not chosen at a `covered` length), by label."""
    done = {conv._prefill_config(t, conv_dim) for t in covered}
    picks = smallest_per_choice(lambda t: conv._prefill_config(t, conv_dim), _powers(MAX_TOKENS))
    return {_label("CHUNK_T,BLOCK_D,warps", c): t for c, t in picks.items() if c not in done}


def row_tile_rows(width: int, covered: Iterable[int]) -> dict[str, int]:
    """Row counts of a row-wise op over rows of `width` (gating: HV, l2norm: K, gated norm: V),
    one per `row_tile` choice not chosen at `covered`."""
    done = {row_tile(m, width) for m in covered}
    picks = smallest_per_choice(lambda m: row_tile(m, width), _powers(MAX_TOKENS))
    return {_label("BLOCK_M,BLOCK_N,warps", c): m for c, m in picks.items() if c not in done}


def _label(names: str, choice: Hashable) -> str:
    values = choice if isinstance(choice, tuple) else (choice,)
    return " ".join(f"{n}={v}" for n, v in zip(names.split(","), values, strict=False))
