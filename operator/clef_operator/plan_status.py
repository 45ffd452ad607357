"""Phases 7 and 8 of the planner (`rollout`): the conditions a pass derives from what it saw and
did, and the status it writes (what happened, after it happened)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from clef_operator import labels
from clef_operator.api import (
    ClefModelSpec,
    ClefModelStatus,
    Condition,
    ConditionStatus,
    Step,
    VerificationRecord,
)
from clef_operator.children import Drift
from clef_operator.conditions import (
    DEGRADED,
    PROGRESSING,
    READY,
    VERIFIED,
    Reason,
    Stamp,
    Why,
    clause,
    merge_conditions,
)
from clef_operator.kvcache import estimate_kv_cache_tokens
from clef_operator.observed import ModelRef, Observed, PodProblem, PodState
from clef_operator.plan_revisions import Move, Retirement
from clef_operator.plan_service import Active
from clef_operator.plan_verification import Desired
from clef_operator.verdicts import Verdicts
from clef_operator.verification import Verification, VerificationState

MAX_RECORDS = 16


@dataclass(frozen=True)
class Conditions:
    ready: Condition
    verified: Condition
    progressing: Condition
    degraded: Condition
    # Only with spec.verification.watch (plan_watch).
    serving: Condition | None = None

    def in_order(self) -> list[Condition]:
        found = [self.ready, self.verified, self.progressing, self.degraded]
        return found + ([self.serving] if self.serving is not None else [])


def derive_conditions(
    at: Stamp,
    model: ModelRef,
    spec: ClefModelSpec,
    observed: Observed,
    verification: Verification,
    active: Active,
    move: Move,
    retired: Retirement,
    drift: Drift | None = None,
    off_driver: Mapping[str, str] | None = None,
) -> Conditions:
    """Rule 7: Verified says what the verdict is; Ready what serves (only what the Service
    selects); Progressing where the rollout stands; Degraded what needs a human, in the words of
    the scheduler, the container or the verification.  `off_driver`: serving pods withheld from
    the Service because their node's driver changed under them (`plan_drivers.off_their_drivers`)."""
    active_problems = (
        pod_problems(observed.pods_of_revision(move.active_revision)) if move.active_revision else []
    )
    candidate_problems = (
        pod_problems(observed.pods_of_revision(move.candidate_revision)) if move.candidate_revision else []
    )
    verified = _verified(at, spec, verification, _failure_advice(model, move.active_revision))
    drifted = (drift.drifted if drift is not None else {}).get(move.active_revision, ())
    return Conditions(
        ready=_ready(at, spec, verification, move, verified, active_problems, drifted, active.tampered),
        verified=verified,
        progressing=_progressing(at, spec, verification, move, retired, verified, candidate_problems),
        degraded=_degraded(
            at,
            verification,
            active,
            verified,
            _with_drivers(
                candidate_problems + active_problems,
                _unverified_drivers(model, observed, move.active_revision, off_driver or {}),
            ),
            _refused_pods(observed, move),
        ),
    )


def _unverified_drivers(
    model: ModelRef, observed: Observed, active_rev: str, off_driver: Mapping[str, str]
) -> list[PodProblem]:
    """Serving pods kept out of the Service for their driver; first, when no Ready pod of the
    active revision is left to serve, that nothing serves (never 0 endpoints unsaid)."""
    problems = [
        PodProblem(Why.UNVERIFIED_DRIVER, f"pod {name} is kept out of serving: {why}")
        for name, why in sorted(off_driver.items())
    ]
    left = [
        p
        for p in observed.pods_of_revision(active_rev)
        if p.ready and not p.deleting and p.name not in off_driver
    ]
    if problems and active_rev and not left:
        nothing = PodProblem(
            Why.UNVERIFIED_DRIVER,
            f"no pod of {model.name} serves now: every Ready pod of revision {active_rev} is on a driver no"
            " verification covers (fail closed: no answer rather than one nothing vouches for)",
        )
        problems.insert(0, nothing)
    return problems


def _with_drivers(pods: list[PodProblem], drivers: list[PodProblem]) -> list[PodProblem]:
    """Stuck pods, then pods kept out for their driver; that nothing serves goes first."""
    if drivers and drivers[0].message.startswith("no pod of "):
        return drivers + pods
    return pods + drivers


def _refused_pods(observed: Observed, move: Move) -> str:
    """The API server refuses the pods of the active or candidate revision (ReplicaFailure)."""
    for rev in (move.active_revision, move.candidate_revision):
        dep = observed.deployment(rev) if rev else None
        if dep is not None and dep.replica_failure:
            return f"the pods of {dep.name} are refused: {dep.replica_failure}"
    return ""


def pod_problems(pods: Iterable[PodState]) -> list[PodProblem]:
    """Why pods are stuck, in their own words (scheduler message, container output)."""
    return [problem for problem in (pod.problem() for pod in pods) if problem is not None]


def _summarise(problems: list[PodProblem]) -> str:
    shown = "; ".join(p.message for p in problems[:3])
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return shown + more


def _failure_advice(model: ModelRef, active_rev: str) -> str:
    serving = (
        f"revision {active_rev} keeps serving"
        if active_rev
        else "nothing was serving before, so nothing serves"
    )
    return (
        f"The candidate is held at 0 replicas and {serving}. Fix the image and change spec.image, or retry with"
        f" `kubectl annotate clefmodel/{model.name} {labels.REVERIFY}=$(date +%s) --overwrite`."
    )


def _verified(at: Stamp, spec: ClefModelSpec, verification: Verification, advice: str) -> Condition:
    record = verification.record
    if verification.state is VerificationState.NOT_REQUIRED:
        return at.condition(
            VERIFIED,
            ConditionStatus.UNKNOWN,
            Reason.NOT_REQUIRED,
            f"spec.verification.required is false: {spec.image} is rolled out without verification",
        )
    if verification.state is VerificationState.PASSED and record is not None:
        return at.condition(VERIFIED, ConditionStatus.TRUE, record.reason, verification.message)
    if (
        verification.state is VerificationState.FAILED
        and record is not None
        and (record.reason == Reason.GPU_CLASS_UNKNOWN)
    ):
        return at.condition(
            VERIFIED,
            ConditionStatus.FALSE,
            record.reason,
            f"{record.image}: {clause(record.summary)}. {advice}",
        )
    if verification.state is VerificationState.FAILED and record is not None and record.step is Step.PROBE:
        return at.condition(
            VERIFIED,
            ConditionStatus.FALSE,
            record.reason,
            f"{record.image} ({record.digest}) failed in service ({record.reason}, probe Job {record.job}):"
            f" {clause(record.summary)}. Watch policy rollback: see the Serving condition for what serves. Fix the node"
            f" or the image, then re-verify or change spec.image",
        )
    if verification.state is VerificationState.FAILED and record is not None:
        return at.condition(
            VERIFIED,
            ConditionStatus.FALSE,
            record.reason,
            f"{record.image} failed verification ({record.reason}, Job {record.job}): {clause(record.summary)}. {advice}",
        )
    assert verification.progress is not None
    return at.condition(
        VERIFIED, ConditionStatus.UNKNOWN, verification.progress.reason, verification.progress.message
    )


def _ready(
    at: Stamp,
    spec: ClefModelSpec,
    verification: Verification,
    move: Move,
    verified: Condition,
    problems: list[PodProblem],
    drifted: tuple[str, ...] = (),
    tampered: str = "",
) -> Condition:
    rev, dep, replicas = move.active_revision, move.active_deployment, spec.replicas
    if tampered:
        # Status goes out before the pass's actions: until the Service is back (the next pass,
        # woken by its event), nothing can be said to serve behind it.
        return at.condition(
            READY,
            ConditionStatus.FALSE,
            Why.SERVICE_RESTORING,
            f"{tampered}; restoring Service {spec.service.name}",
        )
    if drifted:
        # Its pods run a template clef did not render (and no verdict speaks for): not Ready
        # until the reverted template's pods are.
        return at.condition(
            READY,
            ConditionStatus.FALSE,
            Why.TEMPLATE_DRIFT,
            f"the pod template of revision {rev} was changed outside clef ({', '.join(drifted[:8])});"
            " reverted it, waiting for its pods",
        )
    if dep is not None and dep.is_available() and dep.replicas == replicas:
        if replicas == 0:
            return at.condition(
                READY,
                ConditionStatus.TRUE,
                Why.PARKED,
                f"revision {rev} is verified and parked at 0 replicas",
            )
        return at.condition(
            READY,
            ConditionStatus.TRUE,
            Why.AVAILABLE,
            f"revision {rev} serves behind Service {spec.service.name}: {dep.available_replicas}/{replicas}"
            " replicas available",
        )
    if rev:
        available = dep.available_replicas if dep is not None else 0
        detail = _summarise(problems) or f"{available}/{replicas} replicas available"
        return at.condition(
            READY, ConditionStatus.FALSE, Why.UNAVAILABLE, f"revision {rev} is not available: {detail}"
        )
    if verification.state is not VerificationState.PASSED:
        why = verified.message
    else:
        why = move.stage.message if move.stage else ""
    return at.condition(
        READY, ConditionStatus.FALSE, Why.NO_ACTIVE, f"nothing serves yet: {why}".rstrip(": ")
    )


def _progressing(
    at: Stamp,
    spec: ClefModelSpec,
    verification: Verification,
    move: Move,
    retired: Retirement,
    verified: Condition,
    candidate_problems: list[PodProblem],
) -> Condition:
    if move.released and move.stage is not None:
        return at.condition(PROGRESSING, ConditionStatus.FALSE, move.stage.reason, move.stage.message)
    if move.candidate_revision and move.stage is not None:
        message = move.stage.message
        if candidate_problems:
            message += f": {_summarise(candidate_problems)}"
        return at.condition(PROGRESSING, ConditionStatus.TRUE, move.stage.reason, message)
    if verification.state is VerificationState.RUNNING:
        assert verification.progress is not None
        return at.condition(
            PROGRESSING, ConditionStatus.TRUE, verification.progress.reason, verification.progress.message
        )
    if verification.state is VerificationState.FAILED:
        return at.condition(PROGRESSING, ConditionStatus.FALSE, Why.HALTED, verified.message)
    rev = move.active_revision
    if retired.held:
        return at.condition(PROGRESSING, ConditionStatus.TRUE, Why.SCALE_DOWN_HELD, retired.held)
    if retired.pending_scale_down:
        return at.condition(
            PROGRESSING,
            ConditionStatus.TRUE,
            Why.SCALE_DOWN_PENDING,
            f"revision {rev} serves; older revisions go to 0 after {spec.rollout.scale_down_delay_seconds}s",
        )
    return at.condition(
        PROGRESSING,
        ConditionStatus.FALSE,
        Why.COMPLETE,
        f"revision {rev} is active" if rev else "no revision is active",
    )


def _degraded(
    at: Stamp,
    verification: Verification,
    active: Active,
    verified: Condition,
    problems: list[PodProblem],
    refused: str = "",
) -> Condition:
    svc, record, progress = active.service, verification.record, verification.progress
    if active.conflict and svc is not None:
        return at.condition(
            DEGRADED,
            ConditionStatus.TRUE,
            Why.SERVICE_CONFLICT,
            f"{active.conflict_message}. The Service is left untouched and this model's serving Deployments"
            " are scaled to 0, releasing their GPUs",
        )
    if verification.state is VerificationState.FAILED and record is not None:
        return at.condition(DEGRADED, ConditionStatus.TRUE, record.reason, verified.message)
    if refused:
        return at.condition(DEGRADED, ConditionStatus.TRUE, Why.CHILD_REJECTED, refused)
    if problems:
        return at.condition(DEGRADED, ConditionStatus.TRUE, problems[0].reason, _summarise(problems))
    if progress is not None and progress.reason in (Reason.UNSCHEDULABLE, Reason.CONTAINER_CONFIG):
        return at.condition(DEGRADED, ConditionStatus.TRUE, progress.reason, progress.message)
    return at.condition(DEGRADED, ConditionStatus.FALSE, Why.AS_EXPECTED, "")


def _same_step(a: VerificationRecord, b: VerificationRecord) -> bool:
    return (a.key, a.step, a.run, a.job, a.job_uid) == (b.key, b.step, b.run, b.job, b.job_uid)


def build_status(
    model: ModelRef,
    spec: ClefModelSpec,
    key: str,
    observed: Observed,
    status: ClefModelStatus,
    verdicts: Verdicts,
    verification: Verification,
    desired: Desired,
    active: Active,
    move: Move,
    conditions: Conditions,
) -> ClefModelStatus:
    """Rule 8: what happened, after it happened; verdicts newest first, at most MAX_RECORDS."""
    gpu_memory = spec.gpu_memory_mib
    if gpu_memory is None:
        gpu_memory = verdicts.gpu_memory_mib(key)
    if gpu_memory is None:
        gpu_memory = next((p.node_gpu_memory_mib for p in observed.pods if p.node_gpu_memory_mib), None)
    rev, dep = move.active_revision, move.active_deployment
    active_image = dep.annotations.get(labels.PINNED_IMAGE) if dep is not None else None
    active_spec = None
    if rev and rev == desired.revision and desired.failed is not None:
        active_image, active_spec = desired.image, None  # a rollback target: not the current spec's
    elif rev and rev == desired.revision:
        active_image, active_spec = desired.image, spec.to_wire()
    elif rev and active.served is not None:
        active_image, active_spec = active_image or status.active_image, status.active_spec
    # A step's record is written once, whatever happened to the action it went with.
    steps = [r for r in verification.step_records if not any(_same_step(r, old) for old in verdicts.records)]
    new = [r for r in (verification.new_record, *steps) if r is not None]
    svc = active.service
    return ClefModelStatus(
        observed_generation=model.generation,
        conditions=merge_conditions(status.conditions, conditions.in_order()),
        active_revision=rev or None,
        active_image=active_image,
        active_spec=active_spec,
        candidate_revision=move.candidate_revision or None,
        candidate_image=desired.image if move.candidate_revision else None,
        verification_key=key,
        verification_job=verification.job if spec.verification.required else None,
        observed_reverify=verdicts.marker or None,
        reverify_runs=verdicts.runs or None,
        ignored_verdicts=verdicts.ignored_fingerprints(),
        verifications=[*new, *verdicts.records][:MAX_RECORDS],
        kv_cache_tokens=estimate_kv_cache_tokens(spec, gpu_memory),
        gpu_memory_mib=gpu_memory,
        gpus_requested=spec.gpus * spec.replicas,
        service_name=spec.service.name,
        service_adopted=(not svc.owned) if svc is not None and not active.conflict else None,
    )
