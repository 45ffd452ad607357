"""Kernel-source mutants (`mutants.source`, `mutants.inject`, `mutants.score`): the generator is
mechanical and its edits are real, an injected mutant changes what the op computes and is gone
on exit, and a small seeded sample of the gating and norm kernels' mutants runs the whole pipeline
at f16 (damage on the triggers, then verify's default Job on each damaging one).  The full run,
every dtype, is `make mutants` (docs/verification.md, "Kernel-source mutants")."""

from __future__ import annotations

import ast
import importlib
import inspect
import zlib
from pathlib import Path

import pytest
import torch
from mutants.inject import injected
from mutants.memo import Memo
from mutants.score import (
    OPS_ROOT,
    Clean,
    clean_run,
    default_job,
    isolated,
    judge,
    run_trigger,
    sample,
    tally,
    verify_ops,
)
from mutants.source import OPERATORS, Mutant, generate, generate_all, jit_functions, mutate, op_modules

import clef_runtime.ops
from clef_runtime.ops import TRITON_OPS


def test_every_operator_finds_sites_in_todays_kernels() -> None:
    mutants = generate_all(OPS_ROOT)
    assert {m.operator for m in mutants} == set(OPERATORS)
    assert len({m.id for m in mutants}) == len(mutants), "mutant ids are unique"
    assert len({m.module for m in mutants}) == len(op_modules(OPS_ROOT)) >= 5


def _function_sources(source: str) -> dict[str, str]:
    return {f.name: ast.unparse(f) for f in jit_functions(ast.parse(source))}


@pytest.mark.parametrize("module", sorted(op_modules(OPS_ROOT)))
def test_a_mutant_edits_one_function_once(module: str) -> None:
    source = op_modules(OPS_ROOT)[module].read_text()
    original = _function_sources(source)
    mutants = generate(module, source)
    for m in mutants[:: max(1, len(mutants) // 8)]:  # an even spread of each module's mutants
        changed = _function_sources(mutate(source, m))
        assert [f for f in original if changed[f] != original[f]] == [m.function], m.id
        assert m.after in changed[m.function], m.id


def test_a_stale_mutant_is_refused() -> None:
    module, path = next(iter(op_modules(OPS_ROOT).items()))
    m = generate(module, path.read_text())[0]
    with pytest.raises(ValueError, match="changed since it was generated"):
        mutate("\n\n" + path.read_text(), m)  # every line moved


def _gating_output() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(64, 4, generator=gen), torch.randn(64, 4, generator=gen)
    A_log, dt_bias = torch.randn(4, generator=gen), torch.randn(4, generator=gen)
    return TRITON_OPS.gdn_gating(a.half(), b.half(), A_log, dt_bias)


def _gating_mutants(operator: str) -> list[Mutant]:
    module, path = next((n, p) for n, p in op_modules(OPS_ROOT).items() if n.endswith(".gating"))
    return [m for m in generate(module, path.read_text()) if m.operator == operator]


def test_an_injected_mutant_changes_what_the_kernel_computes() -> None:
    """The interpreter runs the mutated source: among the gating module's first `arith` mutants
    (each run in a forked process: a mutated pointer offset may crash it) one changes
    gdn_gating's output."""
    g0, beta0 = _gating_output()
    tried = []
    for m in _gating_mutants("arith")[:6]:

        def run(m: Mutant = m) -> tuple[torch.Tensor, torch.Tensor]:
            with injected(m):
                return _gating_output()

        kind, value = isolated(run, 120)
        tried.append((m.id, kind))
        if kind == "ok" and not (torch.equal(value[0], g0) and torch.equal(value[1], beta0)):
            break
    else:
        pytest.fail(f"no arith mutant changed gdn_gating's output: {tried}")


def test_injection_swaps_every_reference_and_puts_them_back() -> None:
    m = _gating_mutants("arith")[0]
    mod = importlib.import_module(m.module)
    original = getattr(mod, m.function)
    with injected(m) as replaced:
        assert replaced >= 1
        swapped = getattr(mod, m.function)
        assert swapped is not original and type(swapped) is type(original)
        assert Path(inspect.getsourcefile(swapped.fn) or "").name.startswith("gating_mutant_")
        assert m.after in inspect.getsource(swapped.fn)
    assert getattr(mod, m.function) is original
    assert clef_runtime.ops.TRITON_OPS is TRITON_OPS


def test_clean_kernels_do_no_damage_by_the_harness_bound() -> None:
    """The bound is relative to the clean kernels' own error, so the clean run against itself is
    no damage, and a copy 1% off in one head is."""
    from mutants.damage import damaged, error

    clean = clean_f16()
    for t, errs in clean.errors.items():
        assert damaged(errs, errs, torch.float16) == [], t
    name = "gated_norm"  # one of CI_TRIGGERS
    seen = run_trigger(name, TRITON_OPS, torch.float16)
    off = {k: s.tensor.clone() for k, s in seen.items()}
    off["y"][..., -1, :] *= 1.01
    errs = {k: error(off[k], clean.refs[name][k].tensor, s.groups) for k, s in seen.items()}
    assert damaged(errs, clean.errors[name], torch.float16), "one head 1% off is damage"


# The CI sample's scope: the gating and norm kernels, and the triggers of their ops (cheap under
# the interpreter; the full run, `make mutants`, covers every kernel and dtype).
CI_MODULES = ("gating", "norm")
CI_TRIGGERS = ("gating", "gating_regimes", "l2norm", "gated_norm")
CI_JUDGED = 12  # at most this many mutants judged ...
CI_DAMAGING = 3  # ... to find this many damaging ones
_CLEAN: list[Clean] = []


def clean_f16() -> Clean:
    if not _CLEAN:
        _CLEAN.append(clean_run(torch.float16, CI_TRIGGERS))
    return _CLEAN[0]


def test_a_seeded_sample_runs_the_whole_pipeline() -> None:
    """The gating and norm kernels' mutants in a seeded order (the same every run), f16: judged one
    by one until three do damage (at most twelve judged); verify's default Job must catch each of
    those three."""
    clean = clean_f16()
    mutants = [m for m in generate_all(OPS_ROOT) if m.module.rsplit(".", 1)[-1] in CI_MODULES]
    reach = set().union(*clean.reached.values())
    order = sample(
        mutants, lambda m: (m.module.rsplit(".", 1)[-1], m.function) in reach, CI_JUDGED, zlib.crc32(b"ci")
    )
    memo = Memo()
    warm = default_job("f16", verify_ops(set(), memo))
    assert warm.verdict == "pass", warm.summary()
    outcomes = []
    for m in order:
        outcomes.append(judge(m, "f16", clean, memo))
        if tally(outcomes)["damaging"] == CI_DAMAGING:
            break
    described = [(o.id, o.status, o.caught, o.detail[:80]) for o in outcomes]
    assert tally(outcomes)["damaging"] == CI_DAMAGING, f"fewer damaging mutants than expected: {described}"
    missed = [o for o in outcomes if o.status == "damaging" and not o.caught]
    assert not missed, f"verify's default Job passed damaging mutants: {missed}"
