"""The metrics of the probes of the serving revision (`probe_metrics`): the pure derivation from
the previous pass's series and a pass's probe report, case by case, then over the planner's own
passes (`test_plan_watch`'s world), then applied to the process's registry."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY
from test_plan_watch import INTERVAL, answer, probe_of, probes, serving, wrong_answer

from clef_operator.api import ClefModelSpec
from clef_operator.manager import metrics, probe_metrics
from clef_operator.manager.probe_metrics import LastPass, ProbeDone, ProbeFacts, Seen, derive_probes, job_id
from clef_operator.observed import JobState, PodState
from clef_operator.plan_watch import ENGINE_ERROR, ERROR, MISMATCH, PASSED, Finding, ProbeReport

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def pod(name: str, node: str = "worker-1") -> PodState:
    return PodState(name=name, component="serving", uid=f"uid-{name}", node_name=node, ready=True)


def finding(p: PodState, found: str, round_: int = 0, took: float | None = 7.0) -> Finding:
    created = T0 + timedelta(seconds=INTERVAL * round_)
    job = JobState(
        name=f"probe-{p.name}-{round_}",
        key="",
        uid=f"uid-probe-{p.name}-{round_}",
        complete=found == PASSED,
        failed=found != PASSED,
        created_at=created,
        finished_at=created + timedelta(seconds=took) if took is not None else None,
    )
    return Finding(p, job, found, "summary")


def at(f: Finding) -> float:
    assert f.job.finished_at is not None
    return f.job.finished_at.timestamp()


A, B = pod("a"), pod("b", node="worker-2")


# ------------------------------------------------------------------------------ case by case


def test_the_first_pass_in_a_process_counts_nothing_it_finds_finished_but_shows_the_passes() -> None:
    fa, fb = finding(A, PASSED), finding(B, MISMATCH)
    facts = derive_probes(None, ProbeReport((fa, fb), (A, B)))
    assert facts.done == (), "they may have been counted by the process before this one"
    assert facts.seen == Seen(
        {"a": LastPass("worker-1", at(fa))}, frozenset({job_id(fa.job), job_id(fb.job)})
    )
    assert facts.removed == ()
    # The next pass with the same Jobs counts nothing either.
    again = derive_probes(facts.seen, ProbeReport((fa, fb), (A, B)))
    assert again == ProbeFacts(facts.seen)


@pytest.mark.parametrize("found", [PASSED, MISMATCH, ENGINE_ERROR, ERROR])
def test_a_probe_that_finished_since_the_last_pass_is_counted_once_with_its_duration(found: str) -> None:
    seen = derive_probes(None, ProbeReport((), (A,))).seen
    f = finding(A, found, took=12.5)
    facts = derive_probes(seen, ProbeReport((f,), (A,)))
    assert facts.done == (ProbeDone(found, 12.5),)
    assert facts.seen.counted == {job_id(f.job)}
    assert derive_probes(facts.seen, ProbeReport((f,), (A,))).done == ()


def test_a_job_without_a_finish_time_is_counted_without_a_duration_and_is_no_pass_time() -> None:
    seen = derive_probes(None, ProbeReport((), (A,))).seen
    f = finding(A, PASSED, took=None)
    facts = derive_probes(seen, ProbeReport((f,), (A,)))
    assert facts.done == (ProbeDone(PASSED, None),)
    assert facts.seen.last_pass == {}


def test_a_failing_probe_keeps_the_last_pass_and_the_next_pass_moves_it() -> None:
    ok, bad, ok2 = finding(A, PASSED, 0), finding(A, MISMATCH, 1), finding(A, PASSED, 2)
    s1 = derive_probes(derive_probes(None, ProbeReport((), (A,))).seen, ProbeReport((ok,), (A,))).seen
    assert s1.last_pass == {"a": LastPass("worker-1", at(ok))}
    # The passed Job is deleted once the failing one has finished: only the failure is seen.
    f2 = derive_probes(s1, ProbeReport((bad,), (A,)))
    assert f2.done == (ProbeDone(MISMATCH, 7.0),) and f2.removed == ()
    assert f2.seen.last_pass == s1.last_pass, "the last pass is still the one before the failure"
    f3 = derive_probes(f2.seen, ProbeReport((ok2,), (A,)))
    assert f3.seen.last_pass == {"a": LastPass("worker-1", at(ok2))}
    assert f3.seen.counted == {job_id(ok2.job)}, "one remembered Job per probed pod"


def test_a_serving_pod_never_passed_has_no_series() -> None:
    facts = derive_probes(Seen(), ProbeReport((finding(A, ERROR),), (A, B)))
    assert facts.seen.last_pass == {}


@pytest.mark.parametrize("why", ["not serving (not Ready, cordoned, old revision)", "deleted"])
def test_a_pod_that_no_longer_serves_loses_its_series_but_its_finding_still_counts(why: str) -> None:
    fa, fb = finding(A, PASSED), finding(B, PASSED)
    seen = derive_probes(None, ProbeReport((fa, fb), (A, B))).seen
    assert set(seen.last_pass) == {"a", "b"}
    # Not serving: B's probes are still read (its pod is there); deleted: they are gone too.
    bad = finding(B, ENGINE_ERROR, 1)
    findings = (fa, bad) if why.startswith("not") else (fa,)
    facts = derive_probes(seen, ProbeReport(findings, (A,)))
    assert facts.removed == (("b", "worker-2"),)
    assert facts.seen.last_pass == {"a": seen.last_pass["a"]}
    assert facts.done == ((ProbeDone(ENGINE_ERROR, 7.0),) if why.startswith("not") else ())


def test_a_passing_pod_that_does_not_serve_gets_no_series() -> None:
    facts = derive_probes(Seen(), ProbeReport((finding(A, PASSED),), ()))
    assert facts.seen.last_pass == {} and facts.done == (ProbeDone(PASSED, 7.0),)


def test_a_pod_name_on_another_node_is_another_series() -> None:
    seen = Seen({"a": LastPass("worker-1", 100.0)})
    moved = pod("a", node="worker-9")
    kept = derive_probes(seen, ProbeReport((), (moved,)))
    assert kept.removed == (("a", "worker-1"),) and kept.seen.last_pass == {}, "no time it did not earn"
    f = finding(moved, PASSED, 3)
    passed = derive_probes(seen, ProbeReport((f,), (moved,)))
    assert passed.removed == (("a", "worker-1"),)
    assert passed.seen.last_pass == {"a": LastPass("worker-9", at(f))}


def test_without_probes_every_series_goes() -> None:
    seen = Seen({"a": LastPass("worker-1", 1.0), "b": LastPass("worker-2", 2.0)}, frozenset({"x/y"}))
    facts = derive_probes(seen, ProbeReport())
    assert facts == ProbeFacts(Seen(), (("a", "worker-1"), ("b", "worker-2")))


# ------------------------------------------------------------------------------ over the planner's passes


class Metered:
    """The planner's passes with each one's probe metrics derived, as the operator does."""

    def __init__(self, policy: str = "alert") -> None:
        self.w, self.rev = serving(policy=policy)
        self.seen: Seen | None = None
        self.done: list[ProbeDone] = []
        self.removed: list[tuple[str, str]] = []
        self.step()

    def step(self) -> None:
        facts = derive_probes(self.seen, self.w.step().probes)
        self.seen = facts.seen
        self.done += facts.done
        self.removed += facts.removed

    @property
    def last_pass(self) -> dict[str, float]:
        assert self.seen is not None
        return {name: lp.at for name, lp in self.seen.last_pass.items()}


def test_over_passes_alert_counts_each_probe_once_and_keeps_the_failing_pods_last_pass() -> None:
    m = Metered()
    w, bad = m.w, f"preview-{m.rev}"
    answer(w, probe_of(w, "serving-1"))
    answer(w, probe_of(w, bad))
    passed_at = w.now.timestamp()
    m.step()
    m.step()
    assert m.last_pass == {"serving-1": passed_at, bad: passed_at}
    assert m.done == [ProbeDone(PASSED, 0.0)] * 2
    w.advance(INTERVAL)
    m.step()
    w.advance(5)
    answer(w, probe_of(w, "serving-1", finished=False))
    answer(w, probe_of(w, bad, finished=False), wrong_answer(), exit_code=1)
    m.step()
    m.step()
    assert sorted(d.found for d in m.done) == [MISMATCH, PASSED, PASSED, PASSED]
    assert [d.seconds for d in m.done[2:]] == [5.0, 5.0], "from the Job's creation to its finish"
    assert m.last_pass == {"serving-1": w.now.timestamp(), bad: passed_at}, "alert: it still serves"
    assert m.removed == []


def test_over_passes_a_cordoned_pod_loses_its_series_and_a_deleted_one_too() -> None:
    m = Metered(policy="cordon-pod")
    w, bad = m.w, f"preview-{m.rev}"
    answer(w, probe_of(w, "serving-1"))
    answer(w, probe_of(w, bad))
    m.step()
    w.advance(INTERVAL)
    m.step()
    answer(w, probe_of(w, bad, finished=False), wrong_answer(), exit_code=1)
    m.step()
    assert w.pods[bad].serving_label == "", "cordoned"
    assert m.removed == [(bad, w.pods[bad].node_name)] and set(m.last_pass) == {"serving-1"}
    assert [d.found for d in m.done].count(MISMATCH) == 1
    for _ in range(2):
        m.step()
    assert [d.found for d in m.done].count(MISMATCH) == 1, "the kept record is not counted again"
    node = w.pods["serving-1"].node_name
    del w.pods["serving-1"]
    m.step()
    assert ("serving-1", node) in m.removed and m.last_pass == {}
    assert not any(j for j in probes(w) if not w.jobs[j].finished), "nothing left to probe"


def test_over_passes_pods_that_serve_unprobed_keep_their_last_pass_and_a_watch_removed_drops_all() -> None:
    m = Metered()
    w = m.w
    for job in list(probes(w)):
        answer(w, job)
    m.step()
    passed = dict(m.last_pass)
    assert len(passed) == 2
    body = w.spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    body["kvFraction"] = 0.25  # a new revision, being verified: the serving one is probed no more
    w.spec = ClefModelSpec.model_validate(body)
    for _ in range(3):
        w.advance(INTERVAL)
        m.step()
    assert w.condition("Serving")[:2] == ("Unknown", "NotProbed")
    assert m.last_pass == passed and m.removed == [], "still serving: the time ages, for an alert to see"
    del body["verification"]["watch"]
    w.spec = ClefModelSpec.model_validate(body)
    m.step()
    assert m.last_pass == {} and sorted(p for p, _ in m.removed) == sorted(passed)


# ------------------------------------------------------------------------------ the registry


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_record_sets_and_removes_series_and_a_deleted_model_leaves_none() -> None:
    ns, model = "probe-metrics-test", "m"
    a = replace(pod("a"), uid="uid-reg-a")
    before_count = sample("clef_probe_duration_seconds_count", found=MISMATCH) or 0.0
    probe_metrics.record(ns, model, ProbeReport((), (a,)))
    ok = finding(a, PASSED)
    probe_metrics.record(ns, model, ProbeReport((ok,), (a,)))
    series = {"namespace": ns, "model": model, "pod": "a", "node": "worker-1"}
    assert sample("clef_probe_last_pass_timestamp_seconds", **series) == at(ok)
    bad = finding(a, MISMATCH, 1)
    probe_metrics.record(ns, model, ProbeReport((bad,), (a,)))
    probe_metrics.record(ns, model, ProbeReport((bad,), (a,)))
    failures = {"namespace": ns, "model": model, "found": MISMATCH}
    assert sample("clef_probe_failures_total", **failures) == 1.0
    assert sample("clef_probe_duration_seconds_count", found=MISMATCH) == before_count + 1
    assert sample("clef_probe_last_pass_timestamp_seconds", **series) == at(ok)
    probe_metrics.record(ns, model, ProbeReport((bad,), ()))
    assert sample("clef_probe_last_pass_timestamp_seconds", **series) is None, "no longer serving"
    probe_metrics.record(ns, model, ProbeReport((ok,), (a,)))
    metrics.record_model(ns, model, None)  # what the workers call once the model is gone
    assert sample("clef_probe_last_pass_timestamp_seconds", **series) is None
    assert sample("clef_probe_failures_total", **failures) is None, "a deleted model keeps no series"
    # Seen again after a forget: a first pass, which counts nothing it finds finished.
    probe_metrics.record(ns, model, ProbeReport((bad,), (a,)))
    assert sample("clef_probe_failures_total", **failures) is None
    probe_metrics.forget(ns, model)
