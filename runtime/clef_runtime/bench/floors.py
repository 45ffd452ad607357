"""The two numbers before any timing: the fewest bytes each benchmark row must move through device
memory, and (where it means something) the arithmetic it must do.

Pure integer arithmetic, no torch: the tests check every formula against a hand-computed small
case.  Conventions (docs/performance.md, "Byte floors"):

* every input is read once and every output written once, in the dtype the op contract gives it
  (`clef_runtime.opset`): activations in the run's dtype (``elt`` bytes), ``g``/``beta`` and the
  recurrent state float32, conv state in the activation dtype;
* a state updated in place is read once and written once;
* intermediates that a fused implementation need not write (the WY factors of the chunked delta
  rule, a layer's projections' outputs, ...) are not counted;
* FLOPs are multiply-adds counted as two; elementwise work (norms, gating, activations) is not
  counted: those rows are bound by bytes, and their FLOP field is ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# float32 bytes (recurrent state, g, beta, A_log, dt_bias)
F32 = 4
# chunk length of the chunked (WY) delta-rule algorithm whose FLOPs are counted
CHUNK = 64


@dataclass(frozen=True)
class Dims:
    """GDN layer dimensions: key heads ``H``, value heads ``HV``, head dims ``K``/``V``, conv width
    ``W`` and the model width ``hidden`` (for the layer-step rows)."""

    H: int = 16
    HV: int = 32
    K: int = 128
    V: int = 128
    W: int = 4
    hidden: int = 4096

    @property
    def D(self) -> int:
        """Conv channels: ``[q | k | v]``."""
        return 2 * self.H * self.K + self.HV * self.V

    @property
    def qkv_split(self) -> tuple[int, int, int]:
        return (self.H * self.K, self.H * self.K, self.HV * self.V)


# Qwen3.5-9B's GDN layer (docs/performance.md): D = 2*16*128 + 32*128 = 8192.
QWEN35_9B = Dims()
# The shapes of the `tiny` model preset: what --allow-cpu runs under the Triton interpreter.
TINY = Dims(H=2, HV=4, K=16, V=16, W=4, hidden=64)


@dataclass(frozen=True)
class Floor:
    """``bytes``: the sum of ``terms`` (named, for the record); ``flops``: None where not counted."""

    terms: Mapping[str, int]
    flops: int | None = None

    @property
    def bytes(self) -> int:
        return sum(self.terms.values())


def chunk_flops(d: Dims, B: int, T: int, chunk: int = CHUNK) -> int:
    """Matmul work of the chunked (WY / UT-transform) delta rule at chunk length ``C``, full C×C
    blocks, the triangular solve and elementwise work not counted.  Per token:

    * per key head (q and k are shared by the HV/H value heads of a group): the Gram blocks
      ``K Kᵀ`` and ``Q Kᵀ``: ``2·C·K`` each, ``4·C·K``;
    * per value head: ``w = T·(βe^G K)`` ``2·C·K``; ``u = T·(βV)`` ``2·C·V``; the intra-chunk
      output ``Aqk·v_new`` ``2·C·V``; ``v_new = u - w S``, ``o += (q e^G) S`` and the state update
      ``Kᵀ v_new`` ``2·K·V`` each: ``2CK + 4CV + 6KV``.
    """
    per_token = d.H * 4 * chunk * d.K + d.HV * (2 * chunk * d.K + 4 * chunk * d.V + 6 * d.K * d.V)
    return B * T * per_token


def recurrent_flops(d: Dims, tokens: int) -> int:
    """Token-by-token delta rule, per token and value head: decay ``S·e^g`` (K·V), ``Sᵀk``
    (2KV), the rank-1 update (2KV), the readout ``Sᵀq`` (2KV): ``7·K·V``."""
    return tokens * d.HV * 7 * d.K * d.V


def chunk_floor(d: Dims, B: int, T: int, elt: int, states: int | None = None) -> Floor:
    """chunk_gated_delta_rule, no initial state, final state written: q, k, v, g, beta read; o and
    the final state written (``states``: one per sequence, B unless packed)."""
    terms = {
        "q": B * T * d.H * d.K * elt,
        "k": B * T * d.H * d.K * elt,
        "v": B * T * d.HV * d.V * elt,
        "g": B * T * d.HV * F32,
        "beta": B * T * d.HV * F32,
        "o": B * T * d.HV * d.V * elt,
        "final_state": (B if states is None else states) * d.HV * d.K * d.V * F32,
    }
    return Floor(terms, chunk_flops(d, B, T))


def recurrent_floor(d: Dims, B: int, elt: int, T: int = 1) -> Floor:
    """fused_recurrent_gated_delta_rule (decode): q, k, v, g, beta read, o written, the float32
    state read and written once."""
    terms = {
        "q": B * T * d.H * d.K * elt,
        "k": B * T * d.H * d.K * elt,
        "v": B * T * d.HV * d.V * elt,
        "g": B * T * d.HV * F32,
        "beta": B * T * d.HV * F32,
        "o": B * T * d.HV * d.V * elt,
        "state_read": B * d.HV * d.K * d.V * F32,
        "state_write": B * d.HV * d.K * d.V * F32,
    }
    return Floor(terms, recurrent_flops(d, B * T))


def conv_floor(d: Dims, B: int, T: int, elt: int) -> Floor:
    """causal_conv1d (prefill), no initial state, final state written: x and the ``[D, W]`` weight
    read, y and the ``[B, D, W-1]`` final state written."""
    terms = {
        "x": B * T * d.D * elt,
        "weight": d.D * d.W * elt,
        "y": B * T * d.D * elt,
        "final_state": B * d.D * (d.W - 1) * elt,
    }
    return Floor(terms, 2 * d.W * B * T * d.D)


def conv_update_floor(d: Dims, B: int, elt: int) -> Floor:
    """causal_conv1d_update (decode, one token): x and weight read, y written, the ``[B, D, W-1]``
    conv state read and written."""
    terms = {
        "x": B * d.D * elt,
        "weight": d.D * d.W * elt,
        "y": B * d.D * elt,
        "state_read": B * d.D * (d.W - 1) * elt,
        "state_write": B * d.D * (d.W - 1) * elt,
    }
    return Floor(terms, 2 * d.W * B * d.D)


def gated_rmsnorm_floor(d: Dims, T: int, elt: int) -> Floor:
    """gated_rmsnorm over ``[T, HV, V]``: x and z read, y written, the ``[V]`` weight read."""
    n = T * d.HV * d.V
    return Floor({"x": n * elt, "z": n * elt, "weight": d.V * elt, "y": n * elt})


def gating_floor(d: Dims, T: int, elt: int) -> Floor:
    """gdn_gating over ``[T, HV]``: a, b read (activation dtype), A_log and dt_bias read (float32),
    g and beta written (float32)."""
    n = T * d.HV
    return Floor(
        {
            "a": n * elt,
            "b": n * elt,
            "A_log": d.HV * F32,
            "dt_bias": d.HV * F32,
            "g": n * F32,
            "beta": n * F32,
        }
    )


def l2norm_floor(d: Dims, T: int, elt: int) -> Floor:
    """l2norm of a q-shaped ``[T, H, K]`` tensor: read once, written once."""
    n = T * d.H * d.K
    return Floor({"x": n * elt, "y": n * elt})


def projection_params(d: Dims) -> int:
    """Weights of a GDN layer's matmuls: in_proj_qkv ``[D, hidden]``, in_proj_z ``[HV·V, hidden]``,
    in_proj_b and in_proj_a ``[HV, hidden]``, out_proj ``[hidden, HV·V]``."""
    return (d.D + d.HV * d.V + 2 * d.HV) * d.hidden + d.hidden * d.HV * d.V


def _core_state_terms(d: Dims, B: int, elt: int) -> dict[str, int]:
    return {
        "conv_weight": d.D * d.W * elt,
        "A_log": d.HV * F32,
        "dt_bias": d.HV * F32,
        "norm_weight": d.V * elt,
        "conv_state_read": B * d.D * (d.W - 1) * elt,
        "conv_state_write": B * d.D * (d.W - 1) * elt,
        "state_read": B * d.HV * d.K * d.V * F32,
        "state_write": B * d.HV * d.K * d.V * F32,
    }


def layer_decode_floor(d: Dims, B: int, elt: int) -> Floor:
    """One GDN layer decode step (one token per sequence): hidden states read, the layer output
    written, every weight read once (matmuls in the activation dtype; A_log, dt_bias float32),
    conv and recurrent state read and written.  The projections' outputs are intermediates.
    FLOPs: the matmuls (``2·B·params``), the conv (``2·W·B·D``) and the recurrence."""
    terms = {
        "x": B * d.hidden * elt,
        "projection_weights": projection_params(d) * elt,
        **_core_state_terms(d, B, elt),
        "out": B * d.hidden * elt,
    }
    flops = 2 * B * projection_params(d) + 2 * d.W * B * d.D + recurrent_flops(d, B)
    return Floor(terms, flops)


def layer_core_floor(d: Dims, B: int, elt: int) -> Floor:
    """The GDN part of a decode step without the projections: the conv input ``[B, D]``, z
    ``[B, HV·V]``, a and b ``[B, HV]`` read, the gated-norm output ``[B, HV·V]`` written, the small
    weights read, both states read and written."""
    terms = {
        "mixed": B * d.D * elt,
        "z": B * d.HV * d.V * elt,
        "a": B * d.HV * elt,
        "b": B * d.HV * elt,
        **_core_state_terms(d, B, elt),
        "out": B * d.HV * d.V * elt,
    }
    return Floor(terms, 2 * d.W * B * d.D + recurrent_flops(d, B))
