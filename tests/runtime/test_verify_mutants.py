"""Contract mutants: 41 hand-written wrappers around clef's own Triton ops (`mutants.catalogue`),
regression tests that verify's contract checks still fire.  They were written beside those checks,
so they are not a score of verify (that is the kernel-source mutants' job,
`test_source_mutants.py`, `make mutants`).  Each must do damage on its triggering case beyond
the op's tolerance (verify's own: these test that its checks fire at its thresholds), and
verify's default Job configuration (`--suite kernels --dtype f16`, on the CPU with the local
cluster's reduced shapes) must fail on each and pass the clean runtime.

Mutants are injected the way the fault catalogue is, through the op set: `get_opset("triton")`
builds on `clef_runtime.ops.TRITON_OPS`, which these tests replace.  Under the Triton interpreter
every kernel call costs seconds, so the real ops sit under a memoising layer (`mutants.memo`) that
replays the clean run's kernel calls bit for bit."""

from __future__ import annotations

import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from mutants.catalogue import MUTANTS, Mutant, Shape
from mutants.memo import Memo, memoised
from mutants.triggers import TRIGGERS, Seen

import clef_runtime.ops
from clef_runtime.compare import worst_group
from clef_runtime.ops import TRITON_OPS
from clef_runtime.reference import REFERENCE_OPS
from clef_runtime.tolerances import tolerance
from clef_runtime.verify.report import Report
from clef_runtime.verify.run import REDUCED_HEADS, VerifyArgs, run_verify

DTYPE = "f16"  # the operator's default dtype (spec.dtype), what the default Job verifies
MEMO = Memo()  # one cache for the session: every mutant run replays the clean run's calls
# The shapes verify's reduced profile runs (the local cluster's verification pods)
REDUCED = Shape(
    key_heads=REDUCED_HEADS["linear_num_key_heads"],
    value_heads=REDUCED_HEADS["linear_num_value_heads"],
    key_dim=REDUCED_HEADS["linear_key_head_dim"],
    value_dim=REDUCED_HEADS["linear_value_head_dim"],
)


def _fast() -> SimpleNamespace:
    return memoised(TRITON_OPS, MEMO)


def scenario(name: str, ops: SimpleNamespace) -> dict[str, Seen]:
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return TRIGGERS[name](ops, gen, torch.device("cpu"), torch.float16)


def damage(seen: dict[str, Seen], reference: dict[str, Seen]) -> list[str]:
    """What the candidate's scenario left beyond the tolerance of the reference's (per head/block)."""
    found = []
    for name, s in seen.items():
        tol = tolerance(s.op, DTYPE)
        w = worst_group(s.tensor, reference[name].tensor, s.groups)
        if not w.finite or w.rel_rms > tol.rel_rms or w.rel_max > tol.rel_max:
            found.append(f"{name}: rel_rms {w.rel_rms:.3g}, rel_max {w.rel_max:.3g} (tolerance {tol})")
    return found


def test_the_contract_mutants_are_named_and_triggered() -> None:
    names = [m.name for m in MUTANTS]
    assert len(MUTANTS) >= 30 and len(set(names)) == len(names)
    ops = {n for n in vars(TRITON_OPS) if n != "name"}
    for m in MUTANTS:
        assert m.op in ops and m.trigger in TRIGGERS, m


@pytest.mark.parametrize("trigger", sorted(TRIGGERS))
def test_clean_kernels_do_no_damage(trigger: str) -> None:
    """Against the same scenario, the healthy kernels stay within tolerance: what the mutants
    leave beyond it is theirs."""
    assert damage(scenario(trigger, _fast()), scenario(trigger, REFERENCE_OPS)) == []


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_each_mutant_does_real_damage(mutant: Mutant) -> None:
    bad = mutant.apply(_fast(), REDUCED)
    found = damage(scenario(mutant.trigger, bad), scenario(mutant.trigger, REFERENCE_OPS))
    assert found, f"{mutant.name} ({mutant.bug}) leaves {mutant.trigger} within tolerance: not a bug"


def test_memo_replays_the_kernels_bit_for_bit() -> None:
    """The layer the mutant runs stand on changes no bit: a hit returns what the kernel returns,
    and replays its in-place write."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 40, generator=gen).half()
    state = torch.randn(3, 40, 3, generator=gen).half()
    w = torch.randn(40, 4, generator=gen).half()
    memo = Memo()
    ops = memoised(TRITON_OPS, memo)
    s1, s2, s3 = state.clone(), state.clone(), state.clone()
    y1 = ops.causal_conv1d_update(x, s1, w)
    y2 = ops.causal_conv1d_update(x, s2, w)
    y3 = TRITON_OPS.causal_conv1d_update(x, s3, w)
    assert (memo.misses, memo.hits) == (1, 1)
    assert torch.equal(y1, y3) and torch.equal(y2, y3) and torch.equal(s1, s3) and torch.equal(s2, s3)
    assert not torch.equal(s3, state), "the decode call must have shifted the state"


def default_job(ops: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Report:
    """verify as the local cluster's default Job runs it: `--suite kernels --dtype f16`, on the CPU
    with reduced shapes, in this process, with `ops` as the Triton op set."""
    monkeypatch.setattr(clef_runtime.ops, "TRITON_OPS", ops)
    args = VerifyArgs(
        suite="kernels", dtype=DTYPE, device="cpu", shapes="reduced", termination_log=str(tmp_path / "log")
    )
    return run_verify(args)


def test_default_job_passes_the_clean_runtime(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    report = default_job(_fast(), monkeypatch, tmp_path)
    assert report.verdict == "pass", report.summary()


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_default_job_catches_the_mutant(
    mutant: Mutant, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    report = default_job(mutant.apply(_fast(), REDUCED), monkeypatch, tmp_path)
    assert report.error is None, report.error
    assert report.verdict == "fail", f"{mutant.name} ({mutant.bug}) passed verify: {report.summary()}"
    assert any(c.op == mutant.op for c in report.failing), (
        f"{mutant.name}: failing checks name other ops: {[c.name for c in report.failing[:5]]}"
    )
