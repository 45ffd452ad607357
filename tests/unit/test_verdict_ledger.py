"""Issue 33, finding 3: a verdict speaks for one run.  A signed record is proof that the operator
wrote it, not that it is still the truth: the operator's ledger (in its own namespace, which a
namespace editor cannot write) names the latest final run of each key, and status is re-derived
from it.  A failed run stays failed until a newer run of the key passes."""

from __future__ import annotations

from dataclasses import replace

from clef_builders import GOOD, VERDICT_KEY, World, digest_for, make_spec, passed_record, report

from clef_operator import labels
from clef_operator.actions import CreateJob, Event
from clef_operator.api import ClefModelStatus, Verdict
from clef_operator.conditions import Reason
from clef_operator.observed import ModelRef
from clef_operator.renderings import verification_key
from clef_operator.verdicts import (
    collect_verdicts,
    decode_ledger,
    encode_ledger,
    ledger_after,
    reconcile_with_ledger,
    sign,
)

MODEL = ModelRef("clef-flash", "default", "uid-1", 1)
KEY_BAND = [{"name": "causal_conv1d", "op": "causal_conv1d", "detail": "key channel band [32, 64) is zero"}]


def signed(**changes: object):
    return sign(VERDICT_KEY, MODEL, passed_record(**changes))


def failed_after_pass() -> tuple[World, list]:
    """Verified and serving; then the tag moved to a faulty digest and a re-verify failed.
    Returns the world and the genuinely signed status records saved before the re-verify."""
    w = World(make_spec())
    w.deploy_first()
    saved = list(w.status.verifications)
    assert saved[0].verdict is Verdict.PASSED and not saved[0].superseded
    w.model = replace(w.model, annotations={labels.REVERIFY: "moved"})
    w.step()
    w.finish_job(exit_code=1, message=report("fail", failing=KEY_BAND, summary="token ids 0/420"))
    w.step()
    assert w.condition("Verified")[:2] == ("False", Reason.KERNEL_MISMATCH)
    return w, saved


def test_a_concluded_run_is_written_to_the_ledger_before_status() -> None:
    w = World(make_spec())
    plan = w.step()
    assert plan.ledger is None, "nothing concluded yet: no ledger write"
    w.finish_job()
    plan = w.step()
    key = verification_key(w.spec)
    assert plan.ledger is not None and plan.ledger[key] == w.status.verifications[0]
    assert plan.ledger[key].generation == w.model.generation and plan.ledger[key].job_uid


def test_a_signed_pass_replayed_after_a_failed_run_never_counts() -> None:
    """The issue's replay: the saved Passed record written back into status."""
    w, saved = failed_after_pass()
    failed = w.status.verifications[0]
    w.status = w.status.model_copy(update={"verifications": saved})
    plan = w.step()
    assert w.condition("Verified")[:2] == ("False", Reason.KERNEL_MISMATCH)
    assert w.condition("Degraded")[:2] == ("True", Reason.KERNEL_MISMATCH)
    assert w.status.verifications[0] == failed, "the erased failure is put back from the ledger"
    assert not any(isinstance(a, CreateJob) for a in plan.actions), "no new run: it stays failed"
    stale = [a for a in plan.actions if isinstance(a, Event) and a.reason == "StaleVerdictIgnored"]
    assert len(stale) == 1 and stale[0].type == "Warning", plan.actions
    assert f"Job {failed.job} (Failed, KernelMismatch" in stale[0].message
    assert all(r.superseded or r.verdict is Verdict.FAILED for r in w.status.verifications if r.final)
    # Announced once; the same replay again is ignored without a second event.
    w.status = w.status.model_copy(update={"verifications": saved})
    assert not [a for a in w.step().actions if isinstance(a, Event) and a.reason == "StaleVerdictIgnored"]
    assert w.condition("Verified")[:2] == ("False", Reason.KERNEL_MISMATCH)


def test_a_replay_of_the_whole_old_status_never_promotes() -> None:
    """observedReverify and reverifyRuns written back too: at worst a new run, never the old pass."""
    w = World(make_spec())
    w.deploy_first()
    old = w.status
    w.model = replace(w.model, annotations={labels.REVERIFY: "moved"})
    w.step()
    w.finish_job(exit_code=1, message=report("fail", failing=KEY_BAND))
    w.step()
    w.status = old
    w.step()
    assert w.condition("Verified")[0] != "True"


def test_a_newer_run_that_passes_clears_the_failure() -> None:
    w, _ = failed_after_pass()
    w.model = replace(w.model, annotations={labels.REVERIFY: "fixed"})
    w.step()
    w.finish_job(image_id="registry.clef.test/clef-runtime@" + digest_for("fixed"))
    w.step()
    assert w.condition("Verified")[:2] == ("True", Reason.VERIFIED)


def test_a_pass_the_ledger_never_saw_is_ignored_and_a_lost_status_is_rebuilt() -> None:
    w = World(make_spec())
    w.deploy_first()
    ledger = dict(w.ledger or {})
    key = verification_key(w.spec)
    other = signed(
        key=key, job="clef-flash-verify-other", job_uid="uid-other", finished_at="2030-01-01T00:00:00+00:00"
    )
    records, ignored = reconcile_with_ledger([other], ledger)
    assert records == [ledger[key]] and [i.record for i in ignored] == [other]
    assert "latest run of key" in ignored[0].stale
    # Status lost entirely: the ledger alone says what passed.
    w.status = ClefModelStatus()
    w.step()
    assert w.condition("Verified")[:2] == ("True", Reason.VERIFIED)
    assert w.status.verifications[0] == ledger[key]


def test_a_step_pass_of_a_concluded_run_does_not_answer_a_new_run() -> None:
    key = "k1"
    step = signed(key=key, final=False, finished_at="2026-03-01T12:00:00+00:00", job="k-step", job_uid="u1")
    failed = signed(
        key=key,
        verdict=Verdict.FAILED,
        reason=Reason.KERNEL_MISMATCH,
        finished_at="2026-03-01T12:05:00+00:00",
    )
    status = ClefModelStatus(verifications=[step])
    v = collect_verdicts(MODEL, key, status, (), VERDICT_KEY, ledger={key: failed})
    assert v.step_passed(key, step.step) is None
    assert v.current == failed and v.records[0] == failed


def test_the_ledger_round_trips_and_refuses_what_it_did_not_sign() -> None:
    r = signed(key="k1")
    data = encode_ledger(ledger_after({}, r))
    assert decode_ledger(data, VERDICT_KEY, MODEL) == ({"k1": r}, [])
    forged = encode_ledger({"k1": passed_record(key="k1")})
    found, problems = decode_ledger({**forged, "k2": "{"}, VERDICT_KEY, MODEL)
    assert found == {} and len(problems) == 2
    assert decode_ledger(data, VERDICT_KEY, replace(MODEL, uid="uid-2"))[0] == {}, "another model's"
    steps = ledger_after({}, signed(key="k3", final=False))
    assert steps == {}, "only final records enter the ledger"
    assert GOOD  # the builders' image, for the records above
