"""Rollout rule 2 when the engine is asked (modes endpoint and both): goldens -> preview ->
comparison, one after another, so that they fit one spare GPU (the comparison Job needs none).

Each step is decided from observed state only (the goldens ConfigMap, the Jobs, the preview
Deployment and its pods) and the signed records of the steps already passed, so an operator
restarted at any point takes the same next step:

1. **goldens** (`_goldens_step`): trusted goldens for the spec's goldens key are reused; without
   them the goldens Job runs, and its file is stored from the pod's log (`goldens`).  Untrusted
   goldens fail closed (`GoldensUntrusted`) and are deleted; a failed Job is `GoldensFailed` or
   `GoldensInvalid`, and is deleted so a re-verify starts afresh.
2. **preview** (`_preview_step`): the candidate Deployment at one replica; Ready within
   `endpoint.readyTimeoutSeconds`, or `PreviewNotReady`; `PreviewCrashLoop`, `ImagePullFailed`.
3. **comparison** (`_comparison_step`): the CPU-only Job asks the preview pod it was made for; the
   verdict is read from the pod that belongs to its UID.  Pass: a final record bound to the digest
   the preview pod ran (its imageID) and its GPU class.  Fail: `EndpointMismatch` naming prompt and
   position; could not run: `EndpointCheckError`; the preview pod gone or replaced: `PreviewLost`.
   Every failure scales the preview to 0; the active revision keeps serving.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from clef_operator import labels
from clef_operator.actions import (
    Action,
    CreateConfigMap,
    CreateDeployment,
    CreateJob,
    DeleteConfigMap,
    DeleteJob,
    Event,
    ScaleDeployment,
)
from clef_operator.api import ClefModelSpec, Step, Verdict, VerificationRecord
from clef_operator.conditions import Reason, Why, clause
from clef_operator.endpoint import (
    JobKind,
    Judged,
    check_job_name,
    dialect_of,
    goldens_read,
    judge_run,
    preview_annotations,
    read_comparison,
    read_goldens,
    render_comparison_job,
)
from clef_operator.goldens import (
    Trusted,
    Unusable,
    check_stored,
    goldens_argv,
    goldens_name,
    render_goldens_job,
    stored_goldens,
)
from clef_operator.observed import ConfigMapState, DeploymentState, JobState, ModelRef, Observed, PodState
from clef_operator.render import Owner, render_deployment
from clef_operator.renderings import Renderings
from clef_operator.revision import pinned_reference
from clef_operator.verdicts import sign
from clef_operator.verification import Progress, Verification, VerificationState

RUNNING = VerificationState.RUNNING
FAILED = VerificationState.FAILED
# How soon to look again while a preview may time out (the resync would be up to 30 s late).
PREVIEW_RECHECK_SECONDS = 5.0


@dataclass(frozen=True)
class Ctx:
    """What every record of this verification shares."""

    model: ModelRef
    rendered: Renderings
    spec: ClefModelSpec
    run: str
    now: datetime
    secret: bytes

    @property
    def owner(self) -> Owner:
        return self.rendered.owner

    @property
    def key(self) -> str:
        return self.rendered.key

    def record(
        self,
        step: Step,
        passed: bool,
        reason: str,
        summary: str,
        job: str,
        job_uid: str,
        **fields: Any,
    ) -> VerificationRecord:
        record = VerificationRecord(
            key=self.key,
            image=self.spec.image,
            dtype=self.spec.dtype,
            suite=self.spec.verification.suite,
            verdict=Verdict.PASSED if passed else Verdict.FAILED,
            reason=reason,
            summary=summary[:1024],
            job=job,
            job_uid=job_uid,
            finished_at=self.now.isoformat(),
            run=self.run,
            step=step,
            final=not passed or step is Step.ENDPOINT,
            generation=self.model.generation,
            **fields,
        )
        return sign(self.secret, self.model, record)

    def failed(
        self, step: Step, job: str, reason: str, summary: str, *actions: Action, **fields: Any
    ) -> Verification:
        rec = self.record(step, False, reason, summary, job, fields.pop("job_uid", ""), **fields)
        said = Event("Warning", "VerificationFailed", f"{self.spec.image}: {reason}: {rec.summary}")
        return Verification(FAILED, job, record=rec, new_record=rec, actions=(*actions, said))


def _running(job: str, reason: str, message: str, *actions: Action, **fields: Any) -> Verification:
    return Verification(RUNNING, job, progress=Progress(reason, message), actions=actions, **fields)


def drive_endpoint(
    model: ModelRef,
    rendered: Renderings,
    spec: ClefModelSpec,
    run: str,
    observed: Observed,
    now: datetime,
    secret: bytes,
    kernels: VerificationRecord | None = None,
) -> Verification:
    """The next step of the endpoint verification of `key` (after `kernels`, the signed pass of
    the kernels suite in mode both)."""
    ctx = Ctx(model, rendered, spec, run, now, secret)
    check = check_job_name(model.name, rendered.key, run)
    gname = goldens_name(model.name, rendered.goldens)
    found = _steps(ctx, observed, check, kernels)
    return replace(found, job=check, jobs=(gname, check))


def _steps(ctx: Ctx, observed: Observed, check: str, kernels: VerificationRecord | None) -> Verification:
    goldens = _goldens_step(ctx, observed, check)
    if isinstance(goldens, Verification):
        return goldens
    job = observed.job(check)
    preview = _preview(ctx, kernels)
    rev = preview["metadata"]["labels"][labels.REVISION]
    if job is not None:
        return _comparison_step(ctx, observed, check, goldens, rev)
    ready = _preview_step(ctx, observed, check, preview)
    if isinstance(ready, Verification):
        return replace(ready, preview=rev)
    return _start_comparison(ctx, observed, check, goldens, rev, ready)


# ------------------------------------------------------------------------------ goldens

GOLDENS = JobKind("goldens", read_goldens, Reason.GOLDENS_FAILED, Reason.GOLDENS_FAILED)


def _goldens_step(ctx: Ctx, observed: Observed, check: str) -> Trusted | Verification:
    model, spec = ctx.model, ctx.spec
    gkey = ctx.rendered.goldens
    name = goldens_name(model.name, gkey)
    cm = observed.config_map(name)
    if cm is not None and cm.deleting:
        return _running(check, Reason.PENDING, f"waiting for the goldens ConfigMap {name} to be deleted")
    if cm is not None:
        return _stored_goldens(ctx, observed, name, gkey, cm)
    job = observed.job(name)
    if job is None:
        argv = " ".join(goldens_argv(spec)[:7])
        started = Event(
            "Normal", "GoldensStarted", f"no goldens for key {gkey}: Job {name} runs `{argv} ...`"
        )
        return _running(
            check,
            Reason.PENDING,
            f"making goldens: Job {name} created",
            CreateJob(render_goldens_job(ctx.owner, spec, gkey)),
            started,
        )
    if job.deleting:
        return _running(check, Reason.PENDING, f"waiting for the goldens Job {name} to be deleted")
    judged = judge_run(GOLDENS, job, observed.pods_of_job(job), spec.verification.timeout_seconds)
    if isinstance(judged, Progress):
        return _running(check, judged.reason, f"making goldens: {judged.message}")
    if not judged.passed or judged.pod is None:
        # Deleted, so that a re-verify makes them afresh (the Job's name is the goldens key's).
        return ctx.failed(Step.GOLDENS, name, judged.reason, judged.summary, DeleteJob(name), job_uid=job.uid)
    return _store_goldens(ctx, observed, check, job, judged)


def _stored_goldens(
    ctx: Ctx, observed: Observed, name: str, gkey: str, cm: ConfigMapState
) -> Trusted | Verification:
    """Goldens already stored: trusted when their signature and key check out; otherwise they and
    the Job that made them are deleted, so that a re-verify makes new ones with a new Job."""
    checked = check_stored(ctx.model, gkey, cm, ctx.secret)
    if isinstance(checked, Trusted):
        return checked
    said = Event("Warning", "GoldensUntrusted", f"{checked.message}; deleted it, it is never used")
    job = observed.job(name)
    stop = (DeleteJob(name),) if job is not None and not job.deleting else ()
    return ctx.failed(
        Step.GOLDENS,
        name,
        checked.reason,
        f"{clause(checked.message)}. Deleted it; re-verify to have new goldens made",
        DeleteConfigMap(name),
        *stop,
        said,
    )


def _store_goldens(ctx: Ctx, observed: Observed, check: str, job: JobState, judged: Judged) -> Verification:
    """The goldens Job passed: its output, checked and signed, becomes the goldens ConfigMap."""
    name, pod = job.name, judged.pod
    assert pod is not None
    stored = stored_goldens(
        ctx.model, ctx.owner, ctx.spec, job, pod, observed.logs.get(pod.uid), ctx.secret, ctx.now.isoformat()
    )
    if isinstance(stored, Unusable):
        return ctx.failed(Step.GOLDENS, name, stored.reason, stored.message, DeleteJob(name), job_uid=job.uid)
    made = ctx.record(
        Step.GOLDENS,
        True,
        Reason.VERIFIED,
        judged.summary,
        name,
        job.uid,
        runtime_version=judged.runtime_version,
    )
    said = Event(
        "Normal", "GoldensStored", f"stored the goldens of Job {name} in ConfigMap {name}: {judged.summary}"
    )
    return _running(
        check,
        Reason.RUNNING,
        f"goldens made by Job {name}; storing them",
        CreateConfigMap(stored),
        said,
        step_records=(made,),
        recheck=0.0,
    )


# ------------------------------------------------------------------------------ preview


def _preview(ctx: Ctx, kernels: VerificationRecord | None) -> dict[str, Any]:
    """The digest and GPU class of a kernels pass (mode both), else spec.image where the spec
    schedules it; since `now` (used only when it is created or scaled up)."""
    image = kernels.digest if kernels is not None and kernels.digest else ctx.spec.image
    gpu_class = kernels.gpu_class if kernels is not None else None
    pod = ctx.rendered.serving_pod(image, gpu_class)
    annotations = preview_annotations(ctx.spec.image, ctx.key, ctx.now)
    return render_deployment(ctx.owner, ctx.spec, image, 1, annotations, gpu_class, pod=pod)


def _stop(dep: DeploymentState | None, key: str) -> tuple[Action, ...]:
    """The preview of `key` back to 0 (never a Deployment that is not that preview)."""
    if dep is None or dep.replicas == 0 or dep.annotations.get(labels.PREVIEW_FOR) != key:
        return ()
    return (
        ScaleDeployment(dep.name, 0, {labels.PREVIEW_SINCE: None}),
        Event("Normal", "PreviewStopped", f"scaled the preview {dep.name} to 0: verification failed"),
    )


def _preview_step(
    ctx: Ctx, observed: Observed, check: str, manifest: dict[str, Any]
) -> PodState | Verification:
    spec, key, now = ctx.spec, ctx.key, ctx.now
    rev = manifest["metadata"]["labels"][labels.REVISION]
    name = manifest["metadata"]["name"]
    dep = observed.deployment(rev)
    timeout = spec.verification.endpoint.ready_timeout_seconds if spec.verification.endpoint else 0
    if dep is None:
        image = manifest["spec"]["template"]["spec"]["containers"][0]["image"]
        said = Event(
            "Normal",
            "PreviewStarted",
            f"created the preview {name}: 1 replica of {image} that no Service selects",
        )
        return _running(
            check, Reason.RUNNING, f"starting the preview {name}", CreateDeployment(manifest), said
        )
    if dep.deleting:
        return _running(check, Reason.PENDING, f"waiting for Deployment {name} to be deleted")
    if dep.replicas == 0:
        since = {labels.PREVIEW_FOR: key, labels.PREVIEW_SINCE: now.isoformat()}
        said = Event("Normal", "PreviewStarted", f"scaled {name} to 1 replica as the preview")
        return _running(
            check, Reason.RUNNING, f"starting the preview {name}", ScaleDeployment(name, 1, since), said
        )
    pods = observed.pods_of_revision(rev)
    ready = [p for p in pods if p.ready and p.ip and p.problem() is None]
    if ready:
        return max(ready, key=lambda p: (p.created_at or now, p.name))
    return _preview_waiting(ctx, check, dep, pods, timeout)


def _since(dep: DeploymentState, now: datetime) -> datetime:
    text = dep.annotations.get(labels.PREVIEW_SINCE, "")
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return dep.created_at or now


def _preview_waiting(
    ctx: Ctx, check: str, dep: DeploymentState, pods: list[PodState], timeout: int
) -> Verification:
    """A preview that is not Ready yet: still in time, or failed (bounded)."""
    problems = [p for p in (pod.problem() for pod in pods) if p is not None]
    stop = _stop(dep, ctx.key)
    for problem in problems:
        if problem.reason == Why.CRASH_LOOP:
            return ctx.failed(
                Step.PREVIEW, dep.name, Reason.PREVIEW_CRASH_LOOP, f"the preview {problem.message}", *stop
            )
        if problem.reason == Why.IMAGE_PULL:
            return ctx.failed(
                Step.PREVIEW, dep.name, Reason.IMAGE_PULL_FAILED, f"the preview {problem.message}", *stop
            )
    waited = (ctx.now - _since(dep, ctx.now)).total_seconds()
    detail = (
        "; ".join(p.message for p in problems[:2])
        or ", ".join(
            f"pod {p.name} is {p.phase}{' (not Ready)' if p.phase == 'Running' else ''}" for p in pods[:2]
        )
        or "no pod yet"
    )
    if waited > timeout:
        return ctx.failed(
            Step.PREVIEW,
            dep.name,
            Reason.PREVIEW_NOT_READY,
            f"the preview {dep.name} did not become Ready within"
            f" spec.verification.endpoint.readyTimeoutSeconds ({timeout}s): {detail}",
            *stop,
        )
    reason = Reason.UNSCHEDULABLE if any(p.reason == Why.UNSCHEDULABLE for p in problems) else Reason.RUNNING
    return _running(
        check,
        reason,
        f"waiting for the preview {dep.name} to become Ready ({waited:.0f}s of {timeout}s): {detail}",
        recheck=PREVIEW_RECHECK_SECONDS,
    )


# ------------------------------------------------------------------------------ comparison


def _start_comparison(
    ctx: Ctx, observed: Observed, check: str, goldens: Trusted, rev: str, pod: PodState
) -> Verification:
    dep = observed.deployment(rev)
    name = dep.name if dep is not None else rev
    digest = pinned_reference(pod_image(dep, ctx.spec.image), pod.image_id)
    if digest is None:
        return ctx.failed(
            Step.PREVIEW,
            name,
            Reason.DIGEST_UNKNOWN,
            f"the preview pod {pod.name} reported no image digest (imageID {pod.image_id!r}): nothing to pin to",
            *_stop(dep, ctx.key),
        )
    ready = ctx.record(
        Step.PREVIEW,
        True,
        Reason.VERIFIED,
        f"the preview pod {pod.name} is Ready at {pod.ip}, running {digest}",
        name,
        pod.uid,
        digest=digest,
        gpu_class=pod.node_gpu_product or None,
        gpu_memory_mib=pod.node_gpu_memory_mib,
        node_driver=pod.node_driver or None,
        node_cuda_runtime=pod.node_cuda_runtime or None,
    )
    said = Event(
        "Normal",
        "ComparisonStarted",
        f"Job {check} asks the preview pod {pod.name} ({pod.ip}, {digest}) the prompts of {goldens.describe()}"
        f" in the {dialect_of(ctx.spec.engine)} dialect",
    )
    job = render_comparison_job(ctx.owner, ctx.spec, ctx.key, ctx.run, pod, goldens)
    return _running(
        check,
        Reason.RUNNING,
        f"comparing the preview {name} with the goldens: Job {check} created",
        CreateJob(job),
        said,
        step_records=(ready,),
        preview=rev,
    )


def pod_image(dep: DeploymentState | None, fallback: str) -> str:
    """The image the preview's pods were rendered with (its pod template)."""
    if dep is None or dep.template is None:
        return fallback
    containers = dep.template.get("spec", {}).get("containers") or [{}]
    return str(containers[0].get("image") or fallback)


def _asked(
    ctx: Ctx, observed: Observed, job_annotations: dict[str, str], command: tuple[str, ...]
) -> PodState | str:
    """The preview pod the comparison Job asked, if it is still that pod, Ready, at that address,
    running that image; else why not."""
    uid = job_annotations.get(labels.PREVIEW_POD_UID, "")
    ip = job_annotations.get(labels.PREVIEW_POD_IP, "")
    pod = observed.pod(uid)
    url = f"http://{ip}:{ctx.spec.service.container_port}"
    if pod is None:
        return f"the preview pod it asked (uid {uid or '?'}) is gone"
    if url not in command or pod.ip != ip:
        return f"the preview pod {pod.name} is at {pod.ip or 'no address'}, the Job asked {url}"
    if pod.image_id != job_annotations.get(labels.PREVIEW_IMAGE_ID):
        return f"the preview pod {pod.name} now runs {pod.image_id}, not the image it was asked in"
    if not pod.ready or pod.problem() is not None:
        problem = pod.problem()
        return f"the preview pod {pod.name} is no longer Ready" + (f": {problem.message}" if problem else "")
    return pod


def _comparison_step(ctx: Ctx, observed: Observed, check: str, goldens: Trusted, rev: str) -> Verification:
    job = observed.job(check)
    assert job is not None
    dep = observed.deployment(rev)
    preview_rev = rev if dep is not None else ""
    if job.deleting:
        return _running(
            check,
            Reason.PENDING,
            f"waiting for the comparison Job {check} to be deleted",
            preview=preview_rev,
        )
    timeout = ctx.spec.verification.timeout_seconds
    judged = judge_run(COMPARISON(ctx.spec), job, observed.pods_of_job(job), timeout)
    asked = _asked(ctx, observed, dict(job.annotations), job.command)
    stop = _stop(dep, ctx.key)
    if isinstance(asked, str) and isinstance(judged, Judged) and judged.reason == Reason.ENGINE_ERROR:
        # The engine failed a prompt and its pod did not outlive it (a crash takes the server
        # down): the comparison's own report says which prompt and what the engine said.
        return ctx.failed(
            Step.ENDPOINT,
            check,
            judged.reason,
            f"{judged.summary}; {asked}",
            DeleteJob(check),
            *stop,
            job_uid=job.uid,
        )
    if isinstance(asked, str):
        # The verdict would speak for a pod that is not the one serving would start from.
        return ctx.failed(
            Step.ENDPOINT,
            check,
            Reason.PREVIEW_LOST,
            f"comparison Job {check}: {asked}",
            DeleteJob(check),
            *stop,
            job_uid=job.uid,
        )
    if isinstance(judged, Progress):
        return _running(
            check,
            judged.reason,
            f"comparing the preview with the goldens: {judged.message}",
            preview=preview_rev,
        )
    if job.annotations.get(labels.GOLDENS_CONFIGMAP) != goldens.name:
        judged = Judged(
            False,
            Reason.REPORT_INVALID,
            f"the Job compared with {job.annotations.get(labels.GOLDENS_CONFIGMAP)}, not {goldens.name}",
        )
    else:
        judged = goldens_read(judged, job.command, goldens)
    if judged.reason == Reason.GOLDENS_UNTRUSTED:
        said = Event("Warning", "GoldensUntrusted", f"comparison Job {check}: {judged.summary}")
        stop = (*stop, said)
    return _concluded(ctx, check, job.uid, judged, asked, dep, stop)


def COMPARISON(spec: ClefModelSpec) -> JobKind:
    dialect = dialect_of(spec.engine)
    return JobKind(
        "comparison",
        lambda m: read_comparison(m, dialect),
        Reason.ENDPOINT_MISMATCH,
        Reason.ENDPOINT_CHECK_ERROR,
    )


def _concluded(
    ctx: Ctx,
    check: str,
    job_uid: str,
    judged: Judged,
    pod: PodState,
    dep: DeploymentState | None,
    stop: tuple[Action, ...],
) -> Verification:
    digest = pinned_reference(pod_image(dep, ctx.spec.image), pod.image_id)
    fields: dict[str, Any] = {
        "digest": digest,
        "gpu_class": pod.node_gpu_product or None,
        "gpu_memory_mib": pod.node_gpu_memory_mib,
        "node_driver": pod.node_driver or None,
        "node_cuda_runtime": pod.node_cuda_runtime or None,
        "failing": list(judged.failing),
        "device": judged.device,
        "runtime_version": judged.runtime_version,
        "job_uid": job_uid,
    }
    halt = (DeleteJob(check),) if judged.stop_job else ()
    if not judged.passed:
        return ctx.failed(Step.ENDPOINT, check, judged.reason, judged.summary, *halt, *stop, **fields)
    fields.pop("job_uid")
    passed = ctx.record(Step.ENDPOINT, True, Reason.VERIFIED, judged.summary, check, job_uid, **fields)
    said = Event(
        "Normal",
        "VerificationPassed",
        f"{ctx.spec.image} ({digest}) answered the goldens through its own engine ({dialect_of(ctx.spec.engine)}"
        f" dialect) on {pod.node_gpu_product or 'an unlabelled node'}: {judged.summary}",
    )
    return Verification(VerificationState.PASSED, check, record=passed, new_record=passed, actions=(said,))
