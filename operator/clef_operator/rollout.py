"""The rollout planner: the rollout rules of clef, in one pure function.

    plan_rollout(model, spec, observed, status, now) -> Plan(actions, status, requeue_after)

It decides from observed state only (the children, the Service, and the verdicts recorded in
status and on Deployments), never from memory of what it did before, so an operator restarted at
any moment computes the same next step.  The rules (docs/architecture.md, "The planner"):

1. The current spec has a verification key.  A verdict for that key (in status, or on a serving
   Deployment created from it) that was not superseded by a re-verify request is reused: a
   rollback to a revision that passed needs no Job.  Otherwise the Job `<model>-verify-<key>` is
   created, or judged when it exists (fail closed: `verification.judge`).
2. A pass pins serving to the digest the verification pod ran; the serving revision is the hash
   of the serving pod rendered with that digest.  A failure halts the rollout: no Deployment is
   created for the candidate, the active revision keeps serving, `Degraded=True`.
3. BlueGreen: create (or scale up) the candidate, wait until every replica is available, then
   patch the Service selector in one patch.  Recreate: first scale the active revision to 0 and
   wait for its pods to go, then the same.  The Service never selects a revision that is not
   available while another one serves.
4. Revisions that no longer serve are scaled to 0 `scaleDownDelaySeconds` after they were first
   seen not serving (recorded on them as an annotation, so it survives restarts); only
   `revisionHistoryLimit` of them are kept at 0, older ones are deleted.
5. Someone else's change to the selector is put back; a deleted child is recreated; a Service
   that existed before clef is adopted (only its selector and clef's annotations change).
6. Stuck pods (unschedulable, crash-looping, unpullable) surface in the conditions with the
   scheduler's or the container's own message.  No timer ever promotes anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from clef_operator import labels
from clef_operator.actions import (
    Action,
    AnnotateDeployment,
    CreateDeployment,
    CreateJob,
    CreateService,
    DeleteDeployment,
    DeleteJob,
    Event,
    PatchServiceSelector,
    ScaleDeployment,
)
from clef_operator.api import (
    ClefModelSpec,
    ClefModelStatus,
    Condition,
    ConditionStatus,
    Dtype,
    Strategy,
    Suite,
    Verdict,
    VerificationRecord,
)
from clef_operator.kvcache import estimate_kv_cache_tokens
from clef_operator.observed import DeploymentState, ModelRef, Observed, PodState
from clef_operator.render import (
    Owner,
    render_deployment,
    render_job,
    render_service,
    service_annotations,
    serving_revision,
    verification_key,
    verify_argv,
)
from clef_operator.revision import deployment_name, job_name
from clef_operator.verification import IMAGE_PULL_REASONS, Outcome, Progress, Reason, judge

MAX_RECORDS = 16
NOT_REQUIRED = "NotRequired"

READY = "Ready"
VERIFIED = "Verified"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
CONDITION_TYPES = (READY, VERIFIED, PROGRESSING, DEGRADED)


class Why:
    """Reasons of Ready, Progressing and Degraded (Verified's are in `verification.Reason`)."""

    AVAILABLE = "Available"
    PARKED = "Parked"
    NO_ACTIVE = "NoActiveRevision"
    UNAVAILABLE = "RevisionUnavailable"
    CANDIDATE_STARTING = "CandidateStarting"
    STOPPING_OLD = "StoppingOldRevision"
    SCALE_DOWN_PENDING = "ScaleDownPending"
    COMPLETE = "RolloutComplete"
    HALTED = "VerificationFailed"
    SERVICE_CONFLICT = "ServiceConflict"
    CRASH_LOOP = "CrashLoopBackOff"
    UNSCHEDULABLE = "Unschedulable"
    IMAGE_PULL = "ImagePullFailed"
    CONTAINER_ERROR = "ContainerError"
    AS_EXPECTED = "AsExpected"


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    status: ClefModelStatus
    requeue_after: float | None = None


@dataclass
class _Verification:
    """Where the current spec's verification stands."""

    state: str  # passed | failed | running | not_required
    record: VerificationRecord | None = None
    progress: Progress | None = None


@dataclass
class _Draft:
    actions: list[Action] = field(default_factory=list)
    requeue_after: float | None = None

    def do(self, action: Action) -> None:
        self.actions.append(action)

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.actions.append(Event("Warning" if warning else "Normal", reason, message))

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)


# ------------------------------------------------------------------------------ helpers


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _record_from_deployment(d: DeploymentState) -> VerificationRecord | None:
    """The verdict a serving Deployment was created from (annotations), if it was a pass."""
    a = d.annotations
    if a.get(labels.VERDICT) != Verdict.PASSED.value:
        return None
    try:
        return VerificationRecord(
            key=a[labels.VERIFICATION_KEY],
            image=a[labels.IMAGE],
            digest=a[labels.PINNED_IMAGE],
            gpu_class=a.get(labels.GPU_CLASS) or None,
            dtype=Dtype(a[labels.VERIFIED_DTYPE]),
            suite=Suite(a[labels.VERIFIED_SUITE]),
            verdict=Verdict.PASSED,
            reason=Reason.VERIFIED,
            summary=a.get(labels.VERDICT_SUMMARY, ""),
            job=a.get(labels.VERIFICATION_JOB, ""),
            finished_at=a.get(labels.VERIFIED_AT, ""),
        )
    except (KeyError, ValueError):
        return None


def _deployment_annotations(
    spec: ClefModelSpec, image_ref: str, verification: _Verification, token: str
) -> dict[str, str]:
    out = {labels.IMAGE: spec.image, labels.PINNED_IMAGE: image_ref, labels.REVERIFY_TOKEN: token}
    record = verification.record
    if verification.state == "passed" and record is not None:
        out.update(
            {
                labels.VERIFICATION_KEY: record.key,
                labels.VERDICT: Verdict.PASSED.value,
                labels.VERDICT_SUMMARY: record.summary[:256],
                labels.VERIFIED_SUITE: record.suite.value,
                labels.VERIFIED_DTYPE: record.dtype.value,
                labels.VERIFIED_AT: record.finished_at,
                labels.VERIFICATION_JOB: record.job,
            }
        )
        if record.gpu_class:
            out[labels.GPU_CLASS] = record.gpu_class
    else:
        out[labels.VERDICT] = NOT_REQUIRED
    return out


def pod_problems(pods: Iterable[PodState]) -> list[tuple[str, str]]:
    """Why pods are stuck, in their own words (scheduler message, container output)."""
    problems = []
    for pod in pods:
        if pod.unschedulable_message:
            problems.append(
                (Why.UNSCHEDULABLE, f"pod {pod.name} cannot be scheduled: {pod.unschedulable_message}")
            )
        elif pod.waiting_reason == "CrashLoopBackOff":
            said = pod.last_termination_message.strip() or pod.last_terminated_reason or pod.waiting_message
            problems.append(
                (
                    Why.CRASH_LOOP,
                    f"pod {pod.name} is crash-looping ({pod.restart_count} restarts); last words: {said}",
                )
            )
        elif pod.waiting_reason in IMAGE_PULL_REASONS:
            problems.append((Why.IMAGE_PULL, f"pod {pod.name}: {pod.waiting_reason}: {pod.waiting_message}"))
        elif pod.waiting_reason in {
            "CreateContainerConfigError",
            "CreateContainerError",
            "RunContainerError",
        }:
            problems.append(
                (Why.CONTAINER_ERROR, f"pod {pod.name}: {pod.waiting_reason}: {pod.waiting_message}")
            )
    return problems


def _summarise(problems: list[tuple[str, str]]) -> str:
    shown = "; ".join(message for _, message in problems[:3])
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


def _served_spec(status: ClefModelStatus, active_rev: str) -> ClefModelSpec | None:
    """status.activeSpec, if it is the spec that rendered `active_rev`."""
    if not active_rev or not status.active_spec or not status.active_image:
        return None
    try:
        served = ClefModelSpec.model_validate(status.active_spec)
    except ValueError:
        return None
    return served if serving_revision(served, status.active_image) == active_rev else None


def _merge_conditions(old: list[Condition], new: list[Condition], now: datetime) -> list[Condition]:
    """Keep lastTransitionTime when a condition's status did not change."""
    before = {c.type: c for c in old}
    out = []
    for c in new:
        prev = before.get(c.type)
        if prev is not None and prev.status == c.status:
            c = c.model_copy(update={"last_transition_time": prev.last_transition_time})
        out.append(c)
    return out


# ------------------------------------------------------------------------------ the planner


def plan_rollout(
    model: ModelRef,
    spec: ClefModelSpec,
    observed: Observed,
    status: ClefModelStatus,
    now: datetime,
) -> Plan:
    draft = _Draft()
    owner = Owner(model.name, model.namespace, model.uid)
    token = model.reverify_token
    key = verification_key(spec)
    current_job = job_name(model.name, key, token)

    # ---- 1. verdicts: what status and the Deployments remember, minus what a re-verify voided.
    records = list(status.verifications)
    if token != (status.observed_reverify or ""):
        records = [r.model_copy(update={"superseded": True}) if r.key == key else r for r in records]
        if token:
            draft.event(
                "ReverifyRequested", f"re-verification of {spec.image} requested ({labels.REVERIFY}={token})"
            )
    known = list(records)
    for d in observed.deployments:
        derived = _record_from_deployment(d)
        if derived is None or any(r.key == derived.key and r.digest == derived.digest for r in known):
            continue
        if derived.key == key and d.annotations.get(labels.REVERIFY_TOKEN, "") != token:
            continue
        known.append(derived)
    current = next((r for r in known if r.key == key and not r.superseded), None)
    if current is not None and current not in records:
        records.insert(0, current)

    # ---- 2. the current spec's verification.
    if not spec.verification.required:
        verification = _Verification("not_required")
    elif current is not None:
        verification = _Verification(
            "passed" if current.verdict is Verdict.PASSED else "failed", record=current
        )
    else:
        job = observed.job(current_job)
        if job is None:
            draft.do(CreateJob(render_job(owner, spec, token)))
            draft.event(
                "VerificationStarted",
                f"verifying {spec.image}: Job {current_job} runs `{' '.join(verify_argv(spec))}`"
                f" (timeout {spec.verification.timeout_seconds}s)",
            )
            verification = _Verification(
                "running", progress=Progress(Reason.PENDING, f"Job {current_job} created")
            )
        elif job.deleting:
            verification = _Verification(
                "running", progress=Progress(Reason.PENDING, f"waiting for Job {current_job} to be deleted")
            )
        else:
            judged = judge(spec, job, observed.pods_of_job(current_job), now)
            if isinstance(judged, Outcome):
                new = judged.record
                records.insert(0, new)
                if judged.stop_job:
                    draft.do(DeleteJob(current_job))
                if new.verdict is Verdict.PASSED:
                    verification = _Verification("passed", record=new)
                    draft.event(
                        "VerificationPassed",
                        f"{spec.image} ({new.digest}) passed the {new.suite.value} suite at"
                        f" {new.dtype.value}: {new.summary}",
                    )
                else:
                    verification = _Verification("failed", record=new)
                    draft.event(
                        "VerificationFailed", f"{spec.image}: {new.reason}: {new.summary}", warning=True
                    )
            else:
                verification = _Verification("running", progress=judged)

    # Jobs for other specs are obsolete: stop them so they free their GPUs.
    for j in observed.jobs:
        if j.name != current_job and not j.finished and not j.deleting:
            draft.do(DeleteJob(j.name))
            draft.event(
                "VerificationCancelled", f"Job {j.name} verified a spec that has since changed; deleted it"
            )

    # ---- 3. what should serve.
    image_ref: str | None = None
    if verification.state == "not_required":
        image_ref = spec.image
    elif verification.state == "passed" and verification.record is not None:
        # With a separate verification image there is no serving digest to pin: serve as written.
        image_ref = spec.image if spec.verification.image else verification.record.digest
    desired_rev = serving_revision(spec, image_ref) if image_ref else ""

    # ---- 4. what serves: the Service says (its annotation is written with its selector).
    svc = observed.service
    conflict = svc is not None and bool(svc.model) and svc.model != model.name
    active_rev = ""
    if svc is not None and not conflict:
        if svc.intended_revision:
            active_rev = svc.intended_revision
        elif svc.selector.get(labels.MODEL) == model.name:
            active_rev = svc.selector.get(labels.REVISION, "")
    active_dep = observed.deployment(active_rev) if active_rev else None
    # The spec the active revision was rendered from, while it differs from the current one (a
    # halted rollout): it is what lets a deleted active Deployment be recreated as it was.
    served = _served_spec(status, active_rev)
    if active_dep is None and active_rev and active_rev != desired_rev:
        if served is not None and status.active_image:
            old_spec, old_image = served, status.active_image
            old_key = verification_key(old_spec)
            old_record = next((r for r in known if r.key == old_key and r.verdict is Verdict.PASSED), None)
            old_verification = (
                _Verification("passed", record=old_record) if old_record else _Verification("not_required")
            )
            draft.do(
                CreateDeployment(
                    render_deployment(
                        owner,
                        old_spec,
                        old_image,
                        spec.replicas,
                        _deployment_annotations(old_spec, old_image, old_verification, token),
                    )
                )
            )
            draft.event(
                "RevisionRecreated",
                f"Deployment {deployment_name(model.name, active_rev)} of the serving revision was missing;"
                " recreated it from the spec it was made from",
                warning=True,
            )
        else:
            active_rev = ""

    if svc is not None and not conflict and svc.intended_revision and active_rev:
        wanted = labels.selector(model.name, active_rev)
        if dict(svc.selector) != wanted:
            draft.do(PatchServiceSelector(svc.name, wanted, service_annotations(model.name, active_rev)))
            draft.event(
                "SelectorRestored",
                f"Service {svc.name} selector was changed to {dict(svc.selector)} outside clef; restored it to"
                f" revision {active_rev}",
                warning=True,
            )

    # ---- 5. move towards desired.
    replicas = spec.replicas
    candidate_rev = ""
    stage: tuple[str, str] | None = None
    if desired_rev and image_ref is not None:
        dep = observed.deployment(desired_rev)
        annotations = _deployment_annotations(spec, image_ref, verification, token)
        if desired_rev == active_rev:
            if dep is None:
                draft.do(CreateDeployment(render_deployment(owner, spec, image_ref, replicas, annotations)))
                draft.event(
                    "RevisionRecreated",
                    f"Deployment {deployment_name(model.name, desired_rev)} of the active revision was missing;"
                    " recreated it",
                    warning=True,
                )
            elif dep.replicas != replicas or labels.SCALE_DOWN_AT in dep.annotations:
                draft.do(ScaleDeployment(dep.name, replicas, {labels.SCALE_DOWN_AT: None}))
                if dep.replicas != replicas:
                    draft.event(
                        "RevisionScaled", f"scaled {dep.name} from {dep.replicas} to {replicas} replicas"
                    )
        else:
            candidate_rev = desired_rev
            stop_old_first = (
                spec.rollout.strategy is Strategy.RECREATE
                and active_dep is not None
                and not active_dep.drained
            )
            if stop_old_first and active_dep is not None:
                if active_dep.replicas > 0:
                    draft.do(ScaleDeployment(active_dep.name, 0, {labels.SCALE_DOWN_AT: None}))
                    draft.event(
                        "RevisionScaledDown",
                        f"Recreate: scaled {active_dep.name} to 0 to make room for revision {candidate_rev}",
                    )
                stage = (
                    Why.STOPPING_OLD,
                    f"Recreate: waiting for the pods of {active_dep.name} to stop before starting revision"
                    f" {candidate_rev}",
                )
            elif dep is None:
                draft.do(CreateDeployment(render_deployment(owner, spec, image_ref, replicas, annotations)))
                draft.event(
                    "RevisionCreated",
                    f"created Deployment {deployment_name(model.name, desired_rev)} ({replicas} replicas) running"
                    f" {image_ref}",
                )
                stage = (Why.CANDIDATE_STARTING, f"starting revision {candidate_rev} ({image_ref})")
            elif dep.replicas != replicas or labels.SCALE_DOWN_AT in dep.annotations:
                draft.do(ScaleDeployment(dep.name, replicas, {labels.SCALE_DOWN_AT: None}))
                draft.event(
                    "RevisionScaledUp", f"scaled {dep.name} to {replicas} replicas (revision {candidate_rev})"
                )
                stage = (Why.CANDIDATE_STARTING, f"starting revision {candidate_rev} ({image_ref})")
            elif dep.is_available() and not dep.deleting and not conflict:
                previous = active_rev
                if svc is None:
                    draft.do(CreateService(render_service(owner, spec, candidate_rev)))
                    draft.event("ServiceCreated", f"created Service {spec.service.name}")
                else:
                    draft.do(
                        PatchServiceSelector(
                            svc.name,
                            labels.selector(model.name, candidate_rev),
                            service_annotations(model.name, candidate_rev),
                        )
                    )
                    if not svc.owned and not svc.model:
                        draft.event(
                            "ServiceAdopted",
                            f"adopted existing Service {svc.name} (ClusterIP {svc.cluster_ip or 'unchanged'});"
                            " only its selector will be changed, and it stays when this ClefModel is deleted",
                        )
                draft.event(
                    "ServiceSwitched",
                    f"Service {spec.service.name} now selects revision {candidate_rev} ({image_ref})"
                    + (f"; previous revision {previous}" if previous else ""),
                )
                active_rev, active_dep, candidate_rev = candidate_rev, dep, ""
            else:
                count = f"{dep.available_replicas}/{replicas} replicas available"
                stage = (
                    Why.CANDIDATE_STARTING,
                    f"waiting for revision {candidate_rev} to become available ({count})",
                )
    elif active_dep is not None and active_dep.replicas != replicas:
        # Verification of a new spec is pending or failed: the active revision keeps serving,
        # at the replica count asked for.
        draft.do(ScaleDeployment(active_dep.name, replicas, {labels.SCALE_DOWN_AT: None}))
        draft.event(
            "RevisionScaled", f"scaled {active_dep.name} from {active_dep.replicas} to {replicas} replicas"
        )

    # ---- 6. retire what no longer serves; keep a bounded history at 0 for rollbacks.
    delay = spec.rollout.scale_down_delay_seconds
    keep = {active_rev, candidate_rev} - {""}
    pending_scale_down = False
    for d in observed.deployments:
        if d.revision in keep or d.deleting or d.replicas == 0:
            continue
        if not active_rev:
            # Nothing serves, so nothing can be stranded: a revision the spec moved away from
            # before it ever served gives its GPUs back at once.
            draft.do(ScaleDeployment(d.name, 0, {labels.SCALE_DOWN_AT: None}))
            draft.event("RevisionScaledDown", f"scaled {d.name} to 0: the spec moved on before it served")
            continue
        due = _parse_time(d.annotations.get(labels.SCALE_DOWN_AT))
        if due is None and delay > 0:
            due = now + timedelta(seconds=delay)
            draft.do(AnnotateDeployment(d.name, {labels.SCALE_DOWN_AT: due.isoformat()}))
        if due is None or now >= due:
            draft.do(ScaleDeployment(d.name, 0, {labels.SCALE_DOWN_AT: None}))
            draft.event(
                "RevisionScaledDown",
                f"scaled {d.name} to 0 ({delay}s after revision {active_rev} took over)",
            )
        else:
            pending_scale_down = True
            draft.requeue((due - now).total_seconds())

    history = [
        d for d in observed.deployments if d.revision not in keep and d.replicas == 0 and not d.deleting
    ]
    history.sort(
        key=lambda d: (d.created_at or datetime.min.replace(tzinfo=now.tzinfo), d.name), reverse=True
    )
    for d in history[spec.rollout.revision_history_limit :]:
        draft.do(DeleteDeployment(d.name))
        draft.event(
            "RevisionDeleted",
            f"deleted {d.name}: beyond spec.rollout.revisionHistoryLimit ({spec.rollout.revision_history_limit})",
        )

    # ---- 7. conditions.
    active_problems = pod_problems(observed.pods_of_revision(active_rev)) if active_rev else []
    candidate_problems = pod_problems(observed.pods_of_revision(candidate_rev)) if candidate_rev else []
    advice = _failure_advice(model, active_rev)

    def cond(type_: str, value: ConditionStatus, reason: str, message: str) -> Condition:
        return Condition(
            type=type_,
            status=value,
            reason=reason,
            message=message[:4096],
            last_transition_time=now.isoformat(),
            observed_generation=model.generation,
        )

    record = verification.record
    if verification.state == "not_required":
        verified = cond(
            VERIFIED,
            ConditionStatus.UNKNOWN,
            Reason.NOT_REQUIRED,
            f"spec.verification.required is false: {spec.image} is rolled out without verification",
        )
    elif verification.state == "passed" and record is not None:
        where = f" on {record.gpu_class}" if record.gpu_class else ""
        verified = cond(
            VERIFIED,
            ConditionStatus.TRUE,
            Reason.VERIFIED,
            f"{record.image} ({record.digest}) passed the {record.suite.value} suite at {record.dtype.value}"
            f"{where}: {record.summary}",
        )
    elif verification.state == "failed" and record is not None:
        verified = cond(
            VERIFIED,
            ConditionStatus.FALSE,
            record.reason,
            f"{record.image} failed verification ({record.reason}, Job {record.job}): {record.summary}. {advice}",
        )
    else:
        assert verification.progress is not None
        verified = cond(
            VERIFIED, ConditionStatus.UNKNOWN, verification.progress.reason, verification.progress.message
        )

    svc_name = spec.service.name
    if active_dep is not None and active_dep.is_available() and active_dep.replicas == replicas:
        if replicas == 0:
            ready = cond(
                READY,
                ConditionStatus.TRUE,
                Why.PARKED,
                f"revision {active_rev} is verified and parked at 0 replicas",
            )
        else:
            ready = cond(
                READY,
                ConditionStatus.TRUE,
                Why.AVAILABLE,
                f"revision {active_rev} serves behind Service {svc_name}: {active_dep.available_replicas}/{replicas}"
                " replicas available",
            )
    elif active_rev:
        available = active_dep.available_replicas if active_dep is not None else 0
        detail = _summarise(active_problems) or f"{available}/{replicas} replicas available"
        ready = cond(
            READY, ConditionStatus.FALSE, Why.UNAVAILABLE, f"revision {active_rev} is not available: {detail}"
        )
    else:
        why = verified.message if verification.state != "passed" else (stage[1] if stage else "")
        ready = cond(READY, ConditionStatus.FALSE, Why.NO_ACTIVE, f"nothing serves yet: {why}".rstrip(": "))

    if candidate_rev and stage is not None:
        message = stage[1]
        if candidate_problems:
            message += f": {_summarise(candidate_problems)}"
        progressing = cond(PROGRESSING, ConditionStatus.TRUE, stage[0], message)
    elif verification.state == "running":
        assert verification.progress is not None
        progressing = cond(
            PROGRESSING, ConditionStatus.TRUE, verification.progress.reason, verification.progress.message
        )
    elif verification.state == "failed":
        progressing = cond(PROGRESSING, ConditionStatus.FALSE, Why.HALTED, verified.message)
    elif pending_scale_down:
        progressing = cond(
            PROGRESSING,
            ConditionStatus.TRUE,
            Why.SCALE_DOWN_PENDING,
            f"revision {active_rev} serves; older revisions go to 0 after {delay}s",
        )
    else:
        progressing = cond(
            PROGRESSING,
            ConditionStatus.FALSE,
            Why.COMPLETE,
            f"revision {active_rev} is active" if active_rev else "no revision is active",
        )

    if conflict and svc is not None:
        degraded = cond(
            DEGRADED,
            ConditionStatus.TRUE,
            Why.SERVICE_CONFLICT,
            f"Service {svc.name} is driven by ClefModel {svc.model}; choose another spec.service.name",
        )
    elif verification.state == "failed" and record is not None:
        degraded = cond(DEGRADED, ConditionStatus.TRUE, record.reason, verified.message)
    elif candidate_problems or active_problems:
        problems = candidate_problems + active_problems
        degraded = cond(DEGRADED, ConditionStatus.TRUE, problems[0][0], _summarise(problems))
    elif verification.progress is not None and verification.progress.reason in (
        Reason.UNSCHEDULABLE,
        Reason.CONTAINER_CONFIG,
    ):
        degraded = cond(
            DEGRADED, ConditionStatus.TRUE, verification.progress.reason, verification.progress.message
        )
    else:
        degraded = cond(DEGRADED, ConditionStatus.FALSE, Why.AS_EXPECTED, "")

    # ---- 8. status.
    gpu_memory = spec.gpu_memory_mib
    if gpu_memory is None:
        gpu_memory = next((r.gpu_memory_mib for r in known if r.key == key and r.gpu_memory_mib), None)
    if gpu_memory is None:
        gpu_memory = next((p.node_gpu_memory_mib for p in observed.pods if p.node_gpu_memory_mib), None)
    active_image = None
    active_spec = None
    if active_dep is not None:
        active_image = active_dep.annotations.get(labels.PINNED_IMAGE)
    if active_rev and active_rev == desired_rev:
        active_image = image_ref
        active_spec = spec.to_wire()
    elif active_rev and served is not None:
        active_image = active_image or status.active_image
        active_spec = status.active_spec
    new_status = ClefModelStatus(
        observed_generation=model.generation,
        conditions=_merge_conditions(status.conditions, [ready, verified, progressing, degraded], now),
        active_revision=active_rev or None,
        active_image=active_image,
        active_spec=active_spec,
        candidate_revision=candidate_rev or None,
        candidate_image=image_ref if candidate_rev else None,
        verification_key=key,
        verification_job=current_job if spec.verification.required else None,
        observed_reverify=token or None,
        verifications=records[:MAX_RECORDS],
        kv_cache_tokens=estimate_kv_cache_tokens(spec, gpu_memory),
        gpu_memory_mib=gpu_memory,
        gpus_requested=spec.gpus * replicas,
        service_name=svc_name,
        service_adopted=(not svc.owned) if svc is not None and not conflict else None,
    )
    return Plan(tuple(draft.actions), new_status, draft.requeue_after)
