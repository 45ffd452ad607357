"""The benchmark rows: for each, its shapes, fresh random inputs, clef's call, FLA's call in clef's
layouts (`clef_runtime.bench.fla_peer`) and its byte/FLOP floor (`clef_runtime.bench.floors`).
The rows are built in `clef_runtime.bench.rows_ops` (kernels) and `clef_runtime.bench.rows_layer`
(a layer's decode step) from the parts in `clef_runtime.bench.row_types`.
"""

from __future__ import annotations

import math
from fnmatch import fnmatchcase

from clef_runtime.bench.row_types import Context, Impl, Row, Setup, Tensors
from clef_runtime.bench.rows_layer import layer_core, layer_decode
from clef_runtime.bench.rows_ops import (
    chunk,
    chunk_packed,
    conv,
    conv_update,
    gated_rmsnorm,
    gating,
    l2norm,
    recurrent,
)

__all__ = ["ROWS", "Context", "Impl", "Row", "Setup", "Tensors", "rotation_sets", "select_rows"]

CHUNK_OP = "chunk_gated_delta_rule"
RECURRENT_OP = "fused_recurrent_gated_delta_rule"

ROWS: tuple[Row, ...] = (
    Row("chunk_b1_t32768", CHUNK_OP, False, (1, 32768), (1, 128), chunk),
    Row("chunk_b1_t8192", CHUNK_OP, False, (1, 8192), (1, 64), chunk),
    Row("chunk_b4_t8192", CHUNK_OP, False, (4, 8192), (2, 64), chunk),
    Row("chunk_b1_t2048_graph", CHUNK_OP, True, (1, 2048), (1, 64), chunk),
    Row("chunk_b1_t131072", CHUNK_OP, False, (1, 131072), (1, 192), chunk),
    Row("chunk_packed_8x4096", CHUNK_OP, False, (1, 32768), (1, 64), chunk_packed),
    Row("chunk_b1_t512_graph", CHUNK_OP, True, (1, 512), (1, 32), chunk),
    Row("recurrent_b1", RECURRENT_OP, True, (1, 1), (1, 1), recurrent),
    Row("recurrent_b32", RECURRENT_OP, True, (32, 1), (2, 1), recurrent),
    Row("recurrent_b128", RECURRENT_OP, True, (128, 1), (3, 1), recurrent),
    Row("recurrent_b512", RECURRENT_OP, True, (512, 1), (4, 1), recurrent),
    Row("conv_b1_t32768", "causal_conv1d", False, (1, 32768), (1, 64), conv),
    Row("conv_update_b1", "causal_conv1d_update", True, (1, 1), (1, 1), conv_update),
    Row("conv_update_b256", "causal_conv1d_update", True, (256, 1), (4, 1), conv_update),
    Row("gated_rmsnorm_t8192", "gated_rmsnorm", False, (1, 8192), (1, 16), gated_rmsnorm),
    Row("gdn_gating_t8192", "gdn_gating", False, (1, 8192), (1, 16), gating),
    Row("l2norm_t8192", "l2norm", False, (1, 8192), (1, 16), l2norm),
    Row("layer_decode_b1_graph", "gdn_layer_decode_step", True, (1, 1), (1, 1), layer_decode),
    Row("layer_core_decode_b1_graph", "gdn_core_decode_step", True, (1, 1), (1, 1), layer_core),
)


def select_rows(patterns: list[str] | None) -> tuple[list[Row], list[str]]:
    """Rows matching any pattern (a row name, a glob over names, a name prefix such as ``chunk`` or
    ``recurrent``, or an op name); returns (rows in table order, patterns that matched nothing)."""
    if not patterns:
        return list(ROWS), []

    def hit(row: Row, p: str) -> bool:
        return fnmatchcase(row.name, p) or row.name.startswith(p + "_") or row.op == p

    unmatched = [p for p in patterns if not any(hit(r, p) for r in ROWS)]
    return [r for r in ROWS if any(hit(r, p) for p in patterns)], unmatched


def rotation_sets(
    set_bytes: int, shared_bytes: int, target_bytes: int, min_sets: int, max_sets: int, memory_bytes: int
) -> int:
    """How many input sets to rotate through so that between two uses of one set at least
    ``target_bytes`` (a few times the L2) pass through memory: each call touches its own set and
    the shared tensors.  At least ``min_sets`` (so that a round amortises the event and graph-launch
    overhead over several calls), at most ``max_sets``, and all sets within ``memory_bytes``."""
    per_call = max(1, set_bytes + shared_bytes)
    n = max(min_sets, math.ceil(target_bytes / per_call))
    n = min(n, max_sets, memory_bytes // max(1, set_bytes))
    return max(1, n)
