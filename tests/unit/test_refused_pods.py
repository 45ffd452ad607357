"""Pods the API server refuses (issue 13): a verification Job whose pod the Job controller cannot
create fails closed in one reconcile, in the API server's words (VerificationPodRejected), and a
serving revision whose ReplicaSet cannot create pods (ReplicaFailure) is in Degraded, for the
active and the candidate revision alike; the revision that serves keeps serving."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from clef_builders import GOOD2, T0, World, make_spec
from kubernetes import client

from clef_operator.actions import DeleteJob
from clef_operator.api import Verdict
from clef_operator.conditions import Reason, Why
from clef_operator.observed import DeploymentState, JobState, PodState
from clef_operator.plan_verification import POD_RECHECK_SECONDS
from clef_operator.snapshots import pod_refusal
from clef_operator.verification import Outcome, Progress, judge

REFUSED = 'Error creating: pods "m-verify-k-" is forbidden: pod rejected: RuntimeClass "nvidia" not found'


def event(reason: str, message: str, at: datetime | None) -> client.CoreV1Event:
    return client.CoreV1Event(
        metadata=client.V1ObjectMeta(name=f"e{message[:4]}", creation_timestamp=T0),
        involved_object=client.V1ObjectReference(kind="Job", name="m-verify-k", uid="u"),
        reason=reason,
        message=message,
        last_timestamp=at,
    )


def test_the_newest_failed_create_is_the_refusal():
    t = datetime(2026, 3, 1, tzinfo=UTC)
    events = [
        event("FailedCreate", "Error creating: exceeded quota", t),
        event("FailedCreate", REFUSED, t + timedelta(seconds=5)),
        event("SuccessfulCreate", "Created pod: m-verify-k-abcde", t + timedelta(seconds=9)),
    ]
    assert pod_refusal(events) == REFUSED
    # Without lastTimestamp (events.k8s.io writers) the creation time orders them.
    assert pod_refusal([event("FailedCreate", REFUSED, None)]) == REFUSED
    assert pod_refusal([events[2]]) == ""
    assert pod_refusal([]) == ""


def test_a_refused_verification_pod_fails_closed_and_stops_the_job():
    spec = make_spec()
    job = JobState(name="m-verify-k", key="k", uid="u", pods_refused=REFUSED)
    judged = judge(spec, job, [], T0)
    assert isinstance(judged, Outcome) and judged.stop_job
    record = judged.record
    assert (record.verdict, record.reason) == (Verdict.FAILED, Reason.POD_REJECTED)
    assert REFUSED in record.summary and "m-verify-k" in record.summary
    assert record.digest is None


def test_a_job_with_a_pod_or_without_a_refusal_is_still_pending():
    spec = make_spec()
    job = JobState(name="m-verify-k", key="k", uid="u")
    assert isinstance(judge(spec, job, [], T0), Progress)
    pod = PodState(name="p", component="verification", owner_uids=("u",))
    # A refusal read while the Job had no pod is stale once it has one (a quota that was raised).
    assert isinstance(judge(spec, replace(job, pods_refused=REFUSED), [pod], T0), Progress)


def _refuse_current_job(w: World) -> str:
    """The Job controller cannot create the pod: the Job exists, no pod, a FailedCreate event."""
    name = w.current_job()
    w.pods = {k: p for k, p in w.pods.items() if p.job_name != name}
    w.jobs[name] = replace(w.jobs[name], pods_refused=REFUSED)
    return name


def test_a_job_without_a_pod_is_looked_at_again_soon():
    """A refused pod is an event, which wakes nothing: the next pass must not wait for a resync."""
    w = World(make_spec())
    w.step()
    name = w.current_job()
    w.pods = {k: p for k, p in w.pods.items() if p.job_name != name}
    assert w.plan().requeue_after == POD_RECHECK_SECONDS
    w.pods[name + "-pod"] = PodState(
        name=name + "-pod", component="verification", owner_uids=(f"uid-{name}",)
    )
    assert w.plan().requeue_after is None, "its pod exists: watches on it wake the loop"


def test_a_refused_verification_pod_is_verified_false_and_degraded_in_one_reconcile():
    w = World(make_spec())
    w.step()
    name = _refuse_current_job(w)
    plan = w.step()
    assert plan.requeue_after is None
    assert DeleteJob(name) in plan.actions, "the Job stops: its controller would keep trying"
    for type_ in ("Verified", "Degraded"):
        state, reason, message = w.condition(type_)
        assert (state, reason) == ("False" if type_ == "Verified" else "True", Reason.POD_REJECTED)
        assert REFUSED in message
    assert w.condition("Ready")[:2] == ("False", Why.NO_ACTIVE)
    assert "VerificationFailed" in w.event_reasons()
    assert not w.deployments, "nothing is created for a spec that was never verified"
    # The verdict is in status: the next pass neither recreates the Job nor forgets why.
    w.step()
    assert not w.jobs and w.condition("Verified")[1] == Reason.POD_REJECTED


def _serving_then_new_spec() -> tuple[World, DeploymentState]:
    """The first spec serves; a new one (another image) is being verified."""
    w = World(make_spec())
    w.deploy_first()
    serving = w.active_deployment()
    assert serving is not None
    w.spec = make_spec(image=GOOD2)
    w.step()
    return w, serving


def test_the_old_revision_keeps_serving_while_a_new_specs_pod_is_refused():
    w, serving = _serving_then_new_spec()
    _refuse_current_job(w)
    w.step()
    w.settle()
    w.step()
    assert w.active_deployment() == serving
    assert w.condition("Ready")[:2] == ("True", Why.AVAILABLE)
    assert w.condition("Verified")[:2] == ("False", Reason.POD_REJECTED)
    assert w.condition("Degraded")[:2] == ("True", Reason.POD_REJECTED)


def test_a_candidate_revision_whose_pods_are_refused_is_degraded_while_the_old_one_serves():
    w, serving = _serving_then_new_spec()
    w.finish_job()
    w.step()
    (candidate,) = (d for d in w.deployments.values() if d.name != serving.name)
    refused = 'FailedCreate: pods "x" is forbidden: exceeded quota: gpus, requested: nvidia.com/gpu=1'
    w.deployments[candidate.name] = replace(candidate, replica_failure=refused)
    w.step()
    state, reason, message = w.condition("Degraded")
    assert (state, reason) == ("True", Why.CHILD_REJECTED)
    assert candidate.name in message and "exceeded quota" in message
    assert w.active_deployment() == serving and w.condition("Ready")[:2] == ("True", Why.AVAILABLE)
