"""The contract mutants: hand-written regression tests of verify's contract checks (the score of
verify is the kernel-source mutants', `source`).  Realistic silent bugs, each a wrapper around
one of clef's own Triton ops (the real op runs; then its output, its state or its inputs are
corrupted, or a path of the contract is skipped).  No exception, finite numbers unless the bug
itself overflows.  Each names the trigger (`triggers`) on which it provably does damage."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

Op = Callable[..., Any]


@dataclass(frozen=True)
class Shape:
    """The GDN layout a mutant may need (where the key band is, how wide a head is)."""

    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int

    @property
    def key_band(self) -> tuple[int, int]:
        nk = self.key_heads * self.key_dim
        return nk, 2 * nk


@dataclass(frozen=True)
class Mutant:
    name: str
    op: str
    bug: str
    trigger: str
    make: Callable[[Op, Shape], Op]  # the real op → the buggy one

    def apply(self, ops: SimpleNamespace, shape: Shape) -> SimpleNamespace:
        return SimpleNamespace(**{**vars(ops), self.op: self.make(getattr(ops, self.op), shape)})


def _arg(args: tuple[Any, ...], kw: dict[str, Any], i: int, name: str) -> Any:
    return args[i] if len(args) > i else kw.get(name)


def _reused_buffer(
    pick: Callable[[Any], torch.Tensor], put: Callable[[Any, torch.Tensor], Any]
) -> Callable[[Op, Shape], Op]:
    """The result `pick` selects is copied into a workspace kept across calls and returned as a
    view of it: right after its call it is correct, the next call overwrites it."""

    def make(op: Op, shape: Shape) -> Op:
        del shape
        ws: dict[tuple[object, ...], torch.Tensor] = {}

        def mutant(*args: Any, **kw: Any) -> Any:
            out = op(*args, **kw)
            t = pick(out)
            key = (tuple(t.shape), t.dtype, t.device)
            buf = ws.setdefault(key, torch.empty_like(t))
            buf.copy_(t)
            return put(out, buf.view(t.shape))

        return mutant

    return make


def _scale_head(
    index: Callable[[Any], torch.Tensor], axis: int, width: Callable[[Shape], int] = lambda s: 1
) -> Callable[[Op, Shape], Op]:
    """The last head (the last `width` entries along `axis`) of the result `index` selects 1% off."""

    def make(op: Op, shape: Shape) -> Op:
        n = width(shape)

        def mutant(*args: Any, **kw: Any) -> Any:
            out = op(*args, **kw)
            t = index(out)
            t.narrow(axis, t.shape[axis] - n, n).mul_(1.01)
            return out

        return mutant

    return make


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def _second(out: Any) -> torch.Tensor:
    return out[1]


def _with_first(out: Any, t: torch.Tensor) -> Any:
    return (t, *out[1:]) if isinstance(out, tuple) else t


def _with_second(out: Any, t: torch.Tensor) -> Any:
    return (out[0], t, *out[2:])


# ---- bugs of either op of a family -----------------------------------------------------------------


def clobbers_initial_state(op: Op, shape: Shape) -> Op:
    """initial_state used as scratch (zeroed) before it is read."""
    del shape

    def mutant(*args: Any, **kw: Any) -> Any:
        init = kw.get("initial_state")
        if init is not None:
            init.zero_()
        return op(*args, **kw)

    return mutant


def varlen_ignores_initial_states(op: Op, shape: Shape) -> Op:
    """Packed sequences start from zeros whatever initial states are given."""
    del shape

    def mutant(*args: Any, **kw: Any) -> Any:
        if kw.get("cu_seqlens") is not None:
            kw = {**kw, "initial_state": None}
        return op(*args, **kw)

    return mutant


def empty_sequence_state_zero(op: Op, shape: Shape) -> Op:
    """No tile covers a zero-length sequence, so nothing writes its final state (left zero)."""
    del shape

    def mutant(*args: Any, **kw: Any) -> Any:
        out, fin = op(*args, **kw)
        cu = kw.get("cu_seqlens")
        if cu is not None and fin is not None:
            fin[(cu[1:] == cu[:-1]).nonzero().flatten()] = 0
        return out, fin

    return mutant


def padding_row_uses_slot_0(op: Op, shape: Shape) -> Op:
    """A padding row (slot -1) reads and writes slot 0."""
    del shape

    def mutant(*args: Any, **kw: Any) -> Any:
        idx = kw.get("state_indices")
        if idx is not None:
            kw = {**kw, "state_indices": idx.clamp_min(0)}
        return op(*args, **kw)

    return mutant


def multi_token_sets(tokens: str, flag: str, value: object) -> Callable[[Op, Shape], Op]:
    """The T > 1 decode path (T: dim 1 of the first argument, named `tokens`) passes
    `flag`=`value`: it forgets the activation, the L2 norm."""

    def make(op: Op, shape: Shape) -> Op:
        del shape

        def mutant(*args: Any, **kw: Any) -> Any:
            if (args[0] if args else kw[tokens]).shape[1] > 1:
                kw = {**kw, flag: value}
            return op(*args, **kw)

        return mutant

    return make


def state_stored_through_f16(saturate: bool, returned: bool) -> Callable[[Op, Shape], Op]:
    """The state (the returned final state, or the in-place `state`) goes through an f16 store,
    which overflows to inf, or saturates at ±65504."""

    def make(op: Op, shape: Shape) -> Op:
        del shape

        def store(t: torch.Tensor) -> None:
            t.copy_((t.clamp(-65504, 65504) if saturate else t).half().float())

        def mutant(*args: Any, **kw: Any) -> Any:
            out = op(*args, **kw)
            if returned and out[1] is not None:
                store(out[1])
            if not returned:
                store(kw["state"])
            return out

        return mutant

    return make


# ---- causal_conv1d ------------------------------------------------------------------------------


def conv_zeroes_key_band_of_x(op: Op, shape: Shape) -> Op:
    lo, hi = shape.key_band

    def mutant(x: torch.Tensor, *args: Any, **kw: Any) -> Any:
        x[..., lo:hi] = 0  # the incident, through the input buffer
        return op(x, *args, **kw)

    return mutant


def conv_writes_y_into_x(op: Op, shape: Shape) -> Op:
    del shape

    def mutant(x: torch.Tensor, *args: Any, **kw: Any) -> Any:
        y, fin = op(x, *args, **kw)
        x.copy_(y)  # "saves memory": the output buffer is the input's
        return x, fin

    return mutant


# ---- causal_conv1d_update -----------------------------------------------------------------------


def conv_update_advances_one_token(op: Op, shape: Shape) -> Op:
    del shape

    def mutant(x: torch.Tensor, conv_state: torch.Tensor, *args: Any, **kw: Any) -> Any:
        if x.shape[1] == 1:
            return op(x, conv_state, *args, **kw)
        before = conv_state.clone()
        y = op(x, conv_state, *args, **kw)
        conv_state.copy_(before)
        op(x[:, :1].contiguous(), conv_state, *args, **kw)  # the state moves by one token only
        return y

    return mutant


def conv_update_ignores_state_indices(op: Op, shape: Shape) -> Op:
    del shape

    def mutant(*args: Any, **kw: Any) -> Any:
        return op(*args, **{**kw, "state_indices": None})

    return mutant


def softplus_replaced(
    where: Callable[[torch.Tensor], torch.Tensor], by: Callable[[torch.Tensor], torch.Tensor]
) -> Callable[[Op, Shape], Op]:
    """softplus(x) computed as ``by(x)`` where ``where(x)``: a branch of it gone wrong."""

    def make(op: Op, shape: Shape) -> Op:
        del shape

        def mutant(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> Any:
            g, beta = op(a, b, A_log, dt_bias)
            x = a.float() + dt_bias
            g = torch.where(where(x), g * (by(x) / torch.nn.functional.softplus(x)), g)
            return g.contiguous(), beta

        return mutant

    return make


def gating_dt_bias_dropped(op: Op, shape: Shape) -> Op:
    del shape

    def mutant(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> Any:
        return op(a, b, A_log, torch.zeros_like(dt_bias))

    return mutant


def gating_adds_bias_into_a(op: Op, shape: Shape) -> Op:
    del shape

    def mutant(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> Any:
        out = op(a, b, A_log, dt_bias)
        a.add_(dt_bias.to(a.dtype))  # a fused add that writes back into its input
        return out

    return mutant


# ---- l2norm and gated_rmsnorm --------------------------------------------------------------------


def l2norm_eps_outside_sqrt(op: Op, shape: Shape) -> Op:
    del shape

    def mutant(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        y = op(x, eps)
        s = x.float().pow(2).sum(-1, keepdim=True)
        return (y.float() * (s + eps).sqrt() / (s.sqrt() + eps)).to(y.dtype)

    return mutant


def l2norm_eps_dropped(op: Op, shape: Shape) -> Op:
    del shape

    def mutant(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        return op(x, 0.0)

    return mutant


def l2norm_in_place(op: Op, shape: Shape) -> Op:
    del shape

    def mutant(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        y = op(x, eps)
        x.copy_(y)
        return y

    return mutant


def gated_norm_eps_dropped(op: Op, shape: Shape) -> Op:
    del shape

    def mutant(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        return op(x, z, weight, 0.0)

    return mutant


def gated_norm_writes_into_x(op: Op, shape: Shape) -> Op:
    del shape

    def mutant(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        y = op(x, z, weight, eps)
        x.copy_(y)
        return x

    return mutant


# ---- the delta rule -------------------------------------------------------------------------------


def chunk_decay_clamped(op: Op, shape: Shape) -> Op:
    """A fast exp with a clamped input range: per-token log-decays below -4 taken as -4."""
    del shape

    def mutant(q: Any, k: Any, v: Any, g: torch.Tensor, beta: Any, **kw: Any) -> Any:
        return op(q, k, v, g.clamp_min(-4.0), beta, **kw)

    return mutant


def chunk_writes_o_into_v(op: Op, shape: Shape) -> Op:
    del shape

    def mutant(q: Any, k: Any, v: torch.Tensor, *args: Any, **kw: Any) -> Any:
        o, fin = op(q, k, v, *args, **kw)
        v.copy_(o)
        return v, fin

    return mutant


def chunk_no_l2norm_after_first_chunk(op: Op, shape: Shape) -> Op:
    """The fused q/k L2 norm dropped for tokens past the first chunk (64)."""
    del shape

    def mutant(q: torch.Tensor, k: torch.Tensor, v: Any, g: Any, beta: Any, **kw: Any) -> Any:
        if not kw.get("use_qk_l2norm") or q.shape[1] <= 64:
            return op(q, k, v, g, beta, **kw)
        qn, kn = q.clone(), k.clone()
        for t in (qn, kn):
            head = t[:, :64].float()
            t[:, :64] = (head * torch.rsqrt(head.pow(2).sum(-1, keepdim=True) + 1e-6)).to(t.dtype)
        return op(qn, kn, v, g, beta, **{**kw, "use_qk_l2norm": False})

    return mutant


def recurrent_advances_one_token(op: Op, shape: Shape) -> Op:
    del shape

    def mutant(q: torch.Tensor, k: Any, v: Any, g: Any, beta: Any, *, state: torch.Tensor, **kw: Any) -> Any:
        if q.shape[1] == 1:
            return op(q, k, v, g, beta, state=state, **kw)
        before = state.clone()
        o = op(q, k, v, g, beta, state=state, **kw)
        state.copy_(before)
        first = [t[:, :1].contiguous() for t in (q, k, v, g, beta)]
        op(*first, state=state, **kw)
        return o

    return mutant


def recurrent_state_not_written_when_large(op: Op, shape: Shape) -> Op:
    """A state above 1e4 is treated as overflowed and left as it was (a bad "guard")."""
    del shape

    def mutant(*args: Any, state: torch.Tensor, **kw: Any) -> Any:
        before = state.clone()
        o = op(*args, state=state, **kw)
        big = before.flatten(1).abs().amax(1) > 1e4
        state[big] = before[big]
        return o

    return mutant


MUTANTS: tuple[Mutant, ...] = (
    Mutant("conv_zeroes_key_band_of_x", "causal_conv1d", "zero-fills the key band of x in place, then convolves", "conv_prefill", conv_zeroes_key_band_of_x),
    Mutant("conv_clobbers_initial_state", "causal_conv1d", "uses initial_state as scratch (zeroes it) before reading it", "conv_prefill", clobbers_initial_state),
    Mutant("conv_varlen_ignores_initial_states", "causal_conv1d", "packed sequences start from zeros even when initial states are given", "conv_varlen_init", varlen_ignores_initial_states),
    Mutant("conv_empty_sequence_state_unwritten", "causal_conv1d", "a zero-length sequence's final state is left zero instead of its initial state", "conv_varlen_init", empty_sequence_state_zero),
    Mutant("conv_writes_y_into_x", "causal_conv1d", "the output is written into x's buffer and returned", "conv_prefill", conv_writes_y_into_x),
    Mutant("conv_final_state_in_reused_buffer", "causal_conv1d", "the final state is a view of a workspace the next call overwrites", "conv_prefill", _reused_buffer(_second, _with_second)),
    Mutant("conv_y_in_reused_buffer", "causal_conv1d", "y is a view of a workspace the next call overwrites", "conv_prefill", _reused_buffer(_first, _with_first)),
    Mutant("conv_value_head_off", "causal_conv1d", "the last value head's channels come out 1% too large", "conv_prefill", _scale_head(_first, 2, lambda s: s.value_dim)),
    Mutant("conv_update_advances_one_token", "causal_conv1d_update", "with T > 1 new tokens the state moves by one token only", "conv_decode", conv_update_advances_one_token),
    Mutant("conv_update_padding_row_uses_slot_0", "causal_conv1d_update", "a padding row (-1) reads and writes slot 0", "conv_decode", padding_row_uses_slot_0),
    Mutant("conv_update_ignores_state_indices", "causal_conv1d_update", "row b uses slot b whatever state_indices says", "conv_decode", conv_update_ignores_state_indices),
    Mutant("conv_update_multi_token_drops_activation", "causal_conv1d_update", "the T > 1 path forgets the silu", "conv_decode", multi_token_sets("x", "activation", None)),
    Mutant("conv_update_y_in_reused_buffer", "causal_conv1d_update", "y is a view of a workspace the next call overwrites", "conv_decode", _reused_buffer(_first, _with_first)),
    Mutant("gating_softplus_linear_above_zero", "gdn_gating", "softplus(x) = x for every x > 0 (the large-x shortcut at the wrong threshold)", "gating_regimes", softplus_replaced(lambda x: x > 0, lambda x: x)),
    Mutant("gating_log1p_approximated", "gdn_gating", "log1p(u) ≈ u on the small-u branch (x < -ln 8)", "gating", softplus_replaced(lambda x: x < -2.0794, torch.exp)),
    Mutant("gating_dt_bias_dropped", "gdn_gating", "dt_bias is not added", "gating", gating_dt_bias_dropped),
    Mutant("gating_adds_bias_into_a", "gdn_gating", "a + dt_bias is written back into a", "gating", gating_adds_bias_into_a),
    Mutant("gating_value_head_off", "gdn_gating", "the last value head's g comes out 1% too large", "gating", _scale_head(_first, -1)),
    Mutant("l2norm_eps_outside_sqrt", "l2norm", "x / (|x| + eps) instead of x / sqrt(|x|² + eps)", "l2norm", l2norm_eps_outside_sqrt),
    Mutant("l2norm_eps_dropped", "l2norm", "eps dropped: zero rows become NaN", "l2norm", l2norm_eps_dropped),
    Mutant("l2norm_in_place", "l2norm", "normalises x in place as well", "l2norm", l2norm_in_place),
    Mutant("gated_norm_eps_dropped", "gated_rmsnorm", "eps dropped: zero rows become NaN", "gated_norm", gated_norm_eps_dropped),
    Mutant("gated_norm_writes_into_x", "gated_rmsnorm", "the output is written into x's buffer and returned", "gated_norm", gated_norm_writes_into_x),
    Mutant("gated_norm_value_head_off", "gated_rmsnorm", "the last value head comes out 1% too large", "gated_norm", _scale_head(lambda o: o, -2)),
    Mutant("chunk_clobbers_initial_state", "chunk_gated_delta_rule", "uses initial_state as scratch (zeroes it) before reading it", "chunk_prefill", clobbers_initial_state),
    Mutant("chunk_varlen_ignores_initial_states", "chunk_gated_delta_rule", "packed sequences start from zero states even when initial states are given", "chunk_varlen_init", varlen_ignores_initial_states),
    Mutant("chunk_empty_sequence_state_zero", "chunk_gated_delta_rule", "a zero-length sequence's final state is zero instead of its initial state", "chunk_varlen_init", empty_sequence_state_zero),
    Mutant("chunk_final_state_through_f16", "chunk_gated_delta_rule", "the final state is stored through f16 (overflows to inf)", "chunk_long", state_stored_through_f16(saturate=False, returned=True)),
    Mutant("chunk_final_state_saturated_f16", "chunk_gated_delta_rule", "the final state is stored through a saturating f16 store", "chunk_long", state_stored_through_f16(saturate=True, returned=True)),
    Mutant("chunk_final_state_in_reused_buffer", "chunk_gated_delta_rule", "the final state is a view of a workspace the next call overwrites", "chunk_prefill", _reused_buffer(_second, _with_second)),
    Mutant("chunk_value_head_off", "chunk_gated_delta_rule", "the last value head's output comes out 1% too large", "chunk_prefill", _scale_head(_first, 2)),
    Mutant("chunk_decay_clamped", "chunk_gated_delta_rule", "per-token log-decays below -4 are taken as -4", "chunk_strong_decay", chunk_decay_clamped),
    Mutant("chunk_writes_o_into_v", "chunk_gated_delta_rule", "the output is written into v's buffer and returned", "chunk_prefill", chunk_writes_o_into_v),
    Mutant("chunk_no_l2norm_after_first_chunk", "chunk_gated_delta_rule", "the fused q/k L2 norm is skipped past the first chunk", "chunk_prefill", chunk_no_l2norm_after_first_chunk),
    Mutant("recurrent_advances_one_token", "fused_recurrent_gated_delta_rule", "with T > 1 tokens the state advances by the first token only", "recurrent_decode", recurrent_advances_one_token),
    Mutant("recurrent_state_through_f16", "fused_recurrent_gated_delta_rule", "the state is written back through f16 (overflows to inf)", "recurrent_large_state", state_stored_through_f16(saturate=False, returned=False)),
    Mutant("recurrent_padding_row_uses_slot_0", "fused_recurrent_gated_delta_rule", "a padding row (-1) reads and writes slot 0", "recurrent_decode", padding_row_uses_slot_0),
    Mutant("recurrent_multi_token_skips_l2norm", "fused_recurrent_gated_delta_rule", "the T > 1 path skips the q/k L2 norm", "recurrent_decode", multi_token_sets("q", "use_qk_l2norm", False)),
    Mutant("recurrent_state_not_written_when_large", "fused_recurrent_gated_delta_rule", "a state above 1e4 is left unwritten (a bad overflow guard)", "recurrent_large_state", recurrent_state_not_written_when_large),
    Mutant("recurrent_o_in_reused_buffer", "fused_recurrent_gated_delta_rule", "o is a view of a workspace the next call overwrites", "recurrent_decode", _reused_buffer(_first, _with_first)),
    Mutant("recurrent_value_head_off", "fused_recurrent_gated_delta_rule", "the last value head's output comes out 1% too large", "recurrent_decode", _scale_head(_first, 2)),
)  # fmt: skip
