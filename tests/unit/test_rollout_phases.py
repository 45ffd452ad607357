"""The planner's phases one at a time, on small cases; conditions; what is wrong with a pod."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from clef_builders import GOOD, T0, VERDICT_KEY, digest_for, make_spec
from pydantic import ValidationError

from clef_operator import labels
from clef_operator.actions import CreateJob, DeleteJob, Event, PatchServiceSelector, ScaleDeployment
from clef_operator.api import (
    ClefModelSpec,
    ClefModelStatus,
    ConditionStatus,
    Dtype,
    Suite,
    Verdict,
    VerificationRecord,
)
from clef_operator.conditions import DEGRADED, READY, Reason, Stamp, Why, invalid_spec, merge_conditions
from clef_operator.observed import DeploymentState, JobState, ModelRef, Observed, PodState, ServiceState
from clef_operator.plan_revisions import Move, move_towards_desired, retire_old_revisions
from clef_operator.plan_service import Active, active_revision
from clef_operator.plan_status import MAX_RECORDS, Conditions, build_status, derive_conditions
from clef_operator.plan_verification import Desired, desired_revision, drive_verification
from clef_operator.render import Owner, service_port, serving_revision
from clef_operator.renderings import renderings, verification_key
from clef_operator.revision import job_name
from clef_operator.verdicts import Verdicts, collect_verdicts, encode_verdict, sign
from clef_operator.verification import Progress, Verification, VerificationState

MODEL = ModelRef("clef-flash", "default", "uid-1", 3)
OWNER = Owner("clef-flash", "default", "uid-1")
PINNED = f"registry.clef.test/clef-runtime@{digest_for(GOOD)}"


def record(
    spec: ClefModelSpec,
    verdict: Verdict = Verdict.PASSED,
    reason: str = Reason.VERIFIED,
    gpu_class: str | None = None,
) -> VerificationRecord:
    return VerificationRecord(
        gpu_class=gpu_class,
        key=verification_key(spec),
        image=spec.image,
        digest=PINNED,
        dtype=Dtype.F16,
        suite=Suite.KERNELS,
        verdict=verdict,
        reason=reason,
        summary="token ids 420/420",
        job="clef-flash-verify-x",
        finished_at=T0.isoformat(),
    )


def no_verdicts() -> Verdicts:
    return Verdicts((), (), None, reverify_requested=False)


def deployment(
    rev: str, replicas: int = 1, available: int | None = None, **changes: object
) -> DeploymentState:
    available = replicas if available is None else available
    return DeploymentState(
        name=f"clef-flash-{rev}",
        revision=rev,
        replicas=replicas,
        status_replicas=replicas,
        available_replicas=available,
        updated_replicas=replicas,
        **changes,  # type: ignore[arg-type]
    )


def service(rev: str, **changes: object) -> ServiceState:
    base = ServiceState(
        name="clef-serve",
        selector=labels.selector("clef-flash", rev),
        annotations={labels.SERVICE_MODEL: "clef-flash", labels.SERVICE_ACTIVE_REVISION: rev},
        owned=True,
        ports=(service_port(make_spec().service),),
    )
    return ServiceState(**{**vars(base), **changes})  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- verification


def verify(
    spec: ClefModelSpec, observed: Observed | None = None, verdicts: Verdicts | None = None
) -> Verification:
    return drive_verification(
        MODEL,
        renderings(OWNER, spec),
        spec,
        observed or Observed(),
        verdicts or no_verdicts(),
        T0,
        VERDICT_KEY,
    )


def test_no_verdict_and_no_job_creates_the_job():
    spec = make_spec()
    v = verify(spec)
    assert v.state is VerificationState.RUNNING
    assert v.progress is not None and v.progress.reason == Reason.PENDING
    assert [type(a) for a in v.actions] == [CreateJob, Event]
    assert v.job == job_name("clef-flash", verification_key(spec), "")


def test_a_verdict_that_counts_is_reused_without_a_job():
    spec = make_spec()
    passed = record(spec, gpu_class="Tesla-V100-SXM2-16GB")
    v = verify(spec, verdicts=Verdicts((passed,), (passed,), passed, reverify_requested=False))
    assert (v.state, v.record, v.actions) == (VerificationState.PASSED, passed, ())
    assert v.new_record is None, "nothing new for status"


def test_a_failed_verdict_that_counts_stays_failed():
    spec = make_spec()
    failed = record(spec, Verdict.FAILED, Reason.KERNEL_MISMATCH)
    v = verify(spec, verdicts=Verdicts((failed,), (failed,), failed, reverify_requested=False))
    assert v.state is VerificationState.FAILED and v.actions == ()


def test_verification_not_required_runs_nothing_but_still_cancels_old_jobs():
    spec = make_spec(verification={"required": False})
    v = verify(spec, Observed(jobs=(JobState("clef-flash-verify-old", "old"),)))
    assert v.state is VerificationState.NOT_REQUIRED
    assert DeleteJob("clef-flash-verify-old") in v.actions


def test_a_judged_job_gives_a_new_record():
    spec = make_spec()
    name = job_name("clef-flash", verification_key(spec), "")
    pod = PodState(
        name="p",
        component=labels.COMPONENT_VERIFICATION,
        job_name=name,
        waiting_reason="ErrImagePull",
        owner_uids=("job-uid",),
    )
    v = verify(spec, Observed(jobs=(JobState(name, verification_key(spec), uid="job-uid"),), pods=(pod,)))
    assert v.state is VerificationState.FAILED
    assert v.new_record is not None and v.new_record.reason == Reason.IMAGE_PULL_FAILED
    assert DeleteJob(name) in v.actions


# ---------------------------------------------------------------------------- desired, active


def test_the_desired_revision_is_the_pass_pinned_to_its_digest_rendered_once():
    spec = make_spec()
    passed = record(spec)
    d = desired_revision(
        renderings(OWNER, spec), spec, Verification(VerificationState.PASSED, "j", record=passed), ""
    )
    assert d.image == PINNED
    assert d.revision == serving_revision(spec, PINNED)
    assert d.manifest is not None
    annotations = dict(d.manifest["metadata"]["annotations"])
    assert json.loads(annotations.pop(labels.POD_TEMPLATE)) == d.manifest["spec"]["template"]
    assert annotations == encode_verdict(GOOD, PINNED, "", passed)


@pytest.mark.parametrize("state", [VerificationState.RUNNING, VerificationState.FAILED])
def test_nothing_is_desired_without_a_pass(state):
    assert (
        desired_revision(renderings(OWNER, make_spec()), make_spec(), Verification(state, "j"), "")
        == Desired()
    )


def active_of(observed: Observed) -> Active:
    """The active revision of the current spec while nothing new is desired, status lost."""
    return active_revision(MODEL, OWNER, make_spec(), observed, ClefModelStatus(), no_verdicts(), Desired())


def test_a_hand_edited_selector_is_put_back():
    svc = service("r1", selector={"app": "other"})
    a = active_of(Observed((deployment("r1"),), service=svc))
    assert a.revision == "r1" and not a.conflict
    assert isinstance(a.actions[0], PatchServiceSelector)
    assert a.actions[0].selector == labels.selector("clef-flash", "r1")


def test_a_service_of_another_model_has_no_active_revision():
    svc = service("r1", annotations={labels.SERVICE_MODEL: "coder"})
    a = active_of(Observed((deployment("r1"),), service=svc))
    assert (a.revision, a.conflict, a.actions) == ("", True, ())


def test_a_deleted_active_deployment_without_its_spec_is_forgotten():
    a = active_of(Observed(service=service("r1")))
    assert (a.revision, a.actions) == ("", ())


# ---------------------------------------------------------------------------- move, retire


def candidate(spec: ClefModelSpec) -> Desired:
    passed = record(spec)
    return desired_revision(
        renderings(OWNER, spec), spec, Verification(VerificationState.PASSED, "j", record=passed), ""
    )


def test_recreate_stops_the_active_revision_first():
    spec = make_spec(rollout={"strategy": "Recreate"})
    old = deployment("r0")
    active = Active("r0", old, service("r0"), False, None)
    m = move_towards_desired(MODEL, OWNER, spec, Observed((old,)), candidate(spec), active)
    assert m.active_revision == "r0" and m.candidate_revision == candidate(spec).revision
    assert m.stage is not None and m.stage.reason == Why.STOPPING_OLD
    assert ScaleDeployment(old.name, 0, {labels.SCALE_DOWN_AT: None}) in m.actions


@pytest.mark.parametrize(
    ("phase", "starts"), [("Running", False), ("Pending", False), ("Succeeded", True), ("Failed", True)]
)
def test_recreate_waits_for_the_old_pods_not_the_deployment_status(phase: str, starts: bool):
    """Scaled to 0, the old Deployment's status counts no terminating pod, yet a terminating pod
    holds its GPUs until it is gone: the candidate starts only when no old pod holds one."""
    spec = make_spec(rollout={"strategy": "Recreate"})
    old = deployment("r0", 0)
    pod = PodState(name="clef-flash-r0-x", component=labels.COMPONENT_SERVING, revision="r0", phase=phase)
    active = Active("r0", old, service("r0"), False, None)
    m = move_towards_desired(MODEL, OWNER, spec, Observed((old,), pods=(pod,)), candidate(spec), active)
    created = any(type(a).__name__ == "CreateDeployment" for a in m.actions)
    assert created is starts
    if not starts:
        assert m.stage is not None and m.stage.reason == Why.STOPPING_OLD and m.actions == ()
        assert "(still there: clef-flash-r0-x)" in m.stage.message, "names the pod that holds its GPU"


def test_recreate_names_at_most_three_pods_it_waits_for():
    spec = make_spec(rollout={"strategy": "Recreate"})
    old = deployment("r0", 0)
    pods = tuple(
        PodState(name=f"p{i}", component=labels.COMPONENT_SERVING, revision="r0", phase="Running")
        for i in (4, 2, 0, 3, 1)
    )
    active = Active("r0", old, service("r0"), False, None)
    m = move_towards_desired(MODEL, OWNER, spec, Observed((old,), pods=pods), candidate(spec), active)
    assert m.stage is not None and m.stage.message.endswith("(still there: p0, p1, p2 and 2 more)")


def test_recreate_ignores_pods_of_other_revisions_and_verification():
    spec = make_spec(rollout={"strategy": "Recreate"})
    old = deployment("r0", 0)
    others = (
        PodState(name="a", component=labels.COMPONENT_SERVING, revision="r9", phase="Running"),
        PodState(name="b", component=labels.COMPONENT_VERIFICATION, revision="r0", phase="Running"),
    )
    active = Active("r0", old, service("r0"), False, None)
    m = move_towards_desired(MODEL, OWNER, spec, Observed((old,), pods=others), candidate(spec), active)
    assert any(type(a).__name__ == "CreateDeployment" for a in m.actions)


def test_blue_green_switches_to_an_available_candidate():
    spec = make_spec()
    want = candidate(spec)
    old, new = deployment("r0"), deployment(want.revision)
    active = Active("r0", old, service("r0"), False, None)
    m = move_towards_desired(MODEL, OWNER, spec, Observed((old, new)), want, active)
    # The switch is reported by the next pass: status says what the Service selected.
    assert (m.active_revision, m.active_deployment, m.candidate_revision) == ("r0", old, want.revision)
    assert m.switching and m.stage is not None and m.stage.reason == Why.SWITCHING
    patch = next(a for a in m.actions if isinstance(a, PatchServiceSelector))
    assert patch.selector == labels.selector("clef-flash", want.revision)


def test_blue_green_waits_for_every_replica():
    spec = make_spec(replicas=2)
    want = candidate(spec)
    old, new = deployment("r0", 2), deployment(want.revision, 2, available=1)
    m = move_towards_desired(
        MODEL, OWNER, spec, Observed((old, new)), want, Active("r0", old, service("r0"), False, None)
    )
    assert m.actions == () and m.active_revision == "r0"
    assert m.stage is not None and "1/2 replicas available" in m.stage.message


def test_an_old_revision_is_marked_then_scaled_down_after_the_delay():
    spec = make_spec()
    old = deployment("r0")
    active = deployment("r1")
    r = retire_old_revisions(spec, Observed((old, active)), Move("r1", active), T0)
    assert r.pending_scale_down and r.requeue_after == 30
    due = (T0 + timedelta(seconds=30)).isoformat()
    assert [type(a).__name__ for a in r.actions] == ["AnnotateDeployment"]
    marked = DeploymentState(**{**vars(old), "annotations": {labels.SCALE_DOWN_AT: due}})
    r = retire_old_revisions(spec, Observed((marked,)), Move("r1", active), T0 + timedelta(seconds=30))
    assert ScaleDeployment(old.name, 0, {labels.SCALE_DOWN_AT: None}) in r.actions
    assert not r.pending_scale_down and r.requeue_after is None


def test_history_beyond_the_limit_is_deleted_oldest_first():
    spec = make_spec(rollout={"revisionHistoryLimit": 1})
    parked = [deployment(f"r{i}", 0, created_at=T0 + timedelta(seconds=i)) for i in range(3)]
    r = retire_old_revisions(spec, Observed((*parked, deployment("r9"))), Move("r9", None), T0)
    assert [a.name for a in r.actions if type(a).__name__ == "DeleteDeployment"] == [
        "clef-flash-r1",
        "clef-flash-r0",
    ]


# ---------------------------------------------------------------------------- conditions, status


def conditions_of(
    spec: ClefModelSpec, observed: Observed, v: Verification, active: Active, move: Move
) -> Conditions:
    retired = retire_old_revisions(spec, observed, move, T0)
    return derive_conditions(Stamp(T0, 3), MODEL, spec, observed, v, active, move, retired)


def test_a_failed_verification_degrades_while_the_active_revision_stays_ready():
    spec = make_spec()
    failed = record(spec, Verdict.FAILED, Reason.KERNEL_MISMATCH)
    v = Verification(VerificationState.FAILED, "j", record=failed)
    active = deployment("r0")
    c = conditions_of(
        spec, Observed((active,)), v, Active("r0", active, None, False, None), Move("r0", active)
    )
    assert (c.ready.status, c.ready.reason) == (ConditionStatus.TRUE, Why.AVAILABLE)
    assert (c.verified.status, c.verified.reason) == (ConditionStatus.FALSE, Reason.KERNEL_MISMATCH)
    assert (c.degraded.status, c.degraded.reason) == (ConditionStatus.TRUE, Reason.KERNEL_MISMATCH)
    assert (c.progressing.status, c.progressing.reason) == (ConditionStatus.FALSE, Why.HALTED)
    assert all(x.observed_generation == 3 for x in c.in_order())


def test_a_stuck_candidate_pod_reaches_progressing_and_degraded():
    spec = make_spec()
    pod = PodState(
        name="c", component=labels.COMPONENT_SERVING, revision="r1", unschedulable_message="0/1 nodes"
    )
    v = Verification(VerificationState.PASSED, "j", record=record(spec))
    move = Move("r0", None, "r1", Progress(Why.CANDIDATE_STARTING, "starting revision r1"))
    c = conditions_of(spec, Observed(pods=(pod,)), v, Active("r0", None, None, False, None), move)
    assert c.progressing.message == "starting revision r1: pod c cannot be scheduled: 0/1 nodes"
    assert (c.degraded.reason, c.degraded.message) == (
        Why.UNSCHEDULABLE,
        "pod c cannot be scheduled: 0/1 nodes",
    )
    assert (c.ready.status, c.ready.reason) == (ConditionStatus.FALSE, Why.UNAVAILABLE)


def test_status_puts_the_new_verdict_first_and_keeps_a_bounded_history():
    spec = make_spec()
    old = [
        sign(VERDICT_KEY, MODEL, record(spec).model_copy(update={"job": f"j{i}"})) for i in range(MAX_RECORDS)
    ]
    new = record(spec).model_copy(update={"job": "new"})
    verdicts = collect_verdicts(
        MODEL, verification_key(spec), ClefModelStatus(verifications=old), [], VERDICT_KEY
    )
    v = Verification(VerificationState.PASSED, "new", record=new, new_record=new)
    move = Move("", None)
    active = Active("", None, None, False, None)
    c = conditions_of(spec, Observed(), v, active, move)
    s = build_status(
        MODEL,
        spec,
        verification_key(spec),
        Observed(),
        ClefModelStatus(),
        verdicts,
        v,
        Desired(),
        active,
        move,
        c,
    )
    assert len(s.verifications) == MAX_RECORDS
    assert [r.job for r in s.verifications[:2]] == ["new", "j0"]
    assert s.verification_job == "new" and s.active_revision is None


def test_merge_keeps_the_transition_time_of_an_unchanged_status():
    before = [Stamp(T0, 1).condition(READY, ConditionStatus.TRUE, Why.AVAILABLE, "a")]
    later = T0 + timedelta(minutes=5)
    same = merge_conditions(
        before, [Stamp(later, 2).condition(READY, ConditionStatus.TRUE, Why.AVAILABLE, "b")]
    )
    flipped = merge_conditions(
        before, [Stamp(later, 2).condition(READY, ConditionStatus.FALSE, Why.UNAVAILABLE, "c")]
    )
    assert same[0].last_transition_time == T0.isoformat() and same[0].message == "b"
    assert flipped[0].last_transition_time == later.isoformat()


def test_an_invalid_spec_replaces_only_degraded():
    old = [
        Stamp(T0, 1).condition(READY, ConditionStatus.TRUE, Why.AVAILABLE, "serving"),
        Stamp(T0, 1).condition(DEGRADED, ConditionStatus.FALSE, Why.AS_EXPECTED, ""),
    ]
    with pytest.raises(ValidationError) as caught:
        make_spec(kvFraction="lots")
    out = invalid_spec(old, caught.value, Stamp(T0, 2))
    assert [c.type for c in out] == [READY, DEGRADED]
    assert out[0] == old[0]
    assert (out[1].reason, out[1].observed_generation) == (Why.INVALID_SPEC, 2)
    assert out[1].message.startswith("spec.kvFraction: ") and "crds/clefmodel.yaml" in out[1].message


# ---------------------------------------------------------------------------- PodState.problem


@pytest.mark.parametrize(
    ("changes", "reason", "message"),
    [
        ({}, None, None),
        ({"phase": "Running", "ready": True}, None, None),
        ({"unschedulable_message": "0/1 nodes"}, Why.UNSCHEDULABLE, "pod p cannot be scheduled: 0/1 nodes"),
        (
            {
                "waiting_reason": "CrashLoopBackOff",
                "restart_count": 4,
                "last_termination_message": " panic \n",
            },
            Why.CRASH_LOOP,
            "pod p is crash-looping (4 restarts); last words: panic",
        ),
        (
            {
                "waiting_reason": "CrashLoopBackOff",
                "last_terminated_reason": "OOMKilled",
                "waiting_message": "back-off",
            },
            Why.CRASH_LOOP,
            "pod p is crash-looping (0 restarts); last words: OOMKilled",
        ),
        (
            {"waiting_reason": "CrashLoopBackOff", "waiting_message": "back-off 5m"},
            Why.CRASH_LOOP,
            "pod p is crash-looping (0 restarts); last words: back-off 5m",
        ),
        (
            {"waiting_reason": "ImagePullBackOff", "waiting_message": "nope"},
            Why.IMAGE_PULL,
            "pod p: ImagePullBackOff: nope",
        ),
        (
            {"waiting_reason": "CreateContainerConfigError", "waiting_message": 'secret "s" not found'},
            Why.CONTAINER_ERROR,
            'pod p: CreateContainerConfigError: secret "s" not found',
        ),
        ({"waiting_reason": "ContainerCreating"}, None, None),
    ],
    ids=[
        "pending",
        "running",
        "unschedulable",
        "crash-loop",
        "crash-reason",
        "crash-waiting",
        "pull",
        "config",
        "creating",
    ],
)
def test_what_is_wrong_with_a_pod(changes, reason, message):
    problem = PodState(name="p", component=labels.COMPONENT_SERVING, **changes).problem()
    if reason is None:
        assert problem is None
    else:
        assert problem is not None and (problem.reason, problem.message) == (reason, message)


def test_the_judge_words_a_stuck_verification_pod_as_the_planner_does():
    """One answer to "what is wrong with this pod", phrased for a verification pod."""
    from clef_operator.verification import judge

    spec = make_spec()
    pod = PodState(
        name="v",
        component=labels.COMPONENT_VERIFICATION,
        job_name="j",
        waiting_reason="CreateContainerError",
        waiting_message="x",
    )
    judged = judge(spec, JobState("j", "k"), [pod], T0)
    problem = pod.problem()
    assert problem is not None
    assert judged == Progress(Reason.CONTAINER_CONFIG, f"verification {problem.message}")
