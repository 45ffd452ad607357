"""A memoising layer under the mutants, so that the CPU tier can run verify's whole default suite
once per mutant: under the Triton interpreter a kernel call costs seconds, and most calls of a
mutant run repeat the clean run's calls exactly.

A call is looked up by the op and the bytes, shapes, strides and dtypes of every argument; a hit
replays what the kernel did: its results (fresh copies) and its writes into the in-place state
arguments.  The kernels are deterministic, so a hit gives the bits the kernel would have given;
`test_verify_mutants.test_memo_replays_the_kernels_bit_for_bit` checks that."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

INPLACE = ("conv_state", "state")


def _key(v: object) -> object:
    if isinstance(v, torch.Tensor):
        data = v.detach().contiguous().cpu()
        digest = hashlib.blake2b(data.view(torch.uint8).numpy().tobytes(), digest_size=16).hexdigest()
        return ("tensor", str(v.dtype), tuple(v.shape), tuple(v.stride()), digest)
    return ("value", repr(v))


def _copy(out: object) -> object:
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, tuple):
        return tuple(_copy(t) for t in out)
    return out


class Memo:
    """One cache shared by every op it wraps; `hits` and `misses` count the calls."""

    def __init__(self) -> None:
        self.cache: dict[object, tuple[object, dict[str, torch.Tensor]]] = {}
        self.hits = 0
        self.misses = 0

    def wrap(self, name: str, fn: Callable[..., Any], positional: tuple[str, ...]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            kw = {**dict(zip(positional, args, strict=False)), **kwargs}
            key = (name, tuple(sorted((k, _key(v)) for k, v in kw.items())))
            hit = self.cache.get(key)
            if hit is None:
                self.misses += 1
                out = fn(**kw)
                after = {k: kw[k].clone() for k in INPLACE if isinstance(kw.get(k), torch.Tensor)}
                self.cache[key] = (_copy(out), after)
                return out
            self.hits += 1
            out, after = hit
            for k, t in after.items():
                kw[k].copy_(t)
            return _copy(out)

        return call


POSITIONAL = {
    "causal_conv1d": ("x", "weight", "bias"),
    "causal_conv1d_update": ("x", "conv_state", "weight", "bias"),
    "gdn_gating": ("a", "b", "A_log", "dt_bias"),
    "l2norm": ("x", "eps"),
    "chunk_gated_delta_rule": ("q", "k", "v", "g", "beta"),
    "fused_recurrent_gated_delta_rule": ("q", "k", "v", "g", "beta"),
    "gated_rmsnorm": ("x", "z", "weight", "eps"),
}


def memoised(ops: SimpleNamespace, memo: Memo) -> SimpleNamespace:
    """`ops` with every op memoised through `memo`."""
    return SimpleNamespace(
        name=ops.name, **{op: memo.wrap(op, getattr(ops, op), pos) for op, pos in POSITIONAL.items()}
    )
