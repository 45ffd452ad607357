"""Phase 2 and 3 of the planner (`rollout`): drive the verification of the current spec (create,
judge or cancel its Jobs; endpoint mode in `endpoint_flow`), and the revision a pass makes
desired: the serving Deployment pinned to the digest and GPU class that passed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from clef_operator import labels
from clef_operator.actions import Action, CreateJob, DeleteJob, event
from clef_operator.api import (
    BuiltinPrompts,
    ClefModelSpec,
    Step,
    Verdict,
    VerificationMode,
    VerificationRecord,
    Verifier,
)
from clef_operator.conditions import Reason
from clef_operator.endpoint_flow import drive_endpoint
from clef_operator.observed import JobState, ModelRef, Observed
from clef_operator.render import render_deployment, render_job, verify_argv
from clef_operator.renderings import Renderings
from clef_operator.revision import job_name
from clef_operator.verdicts import Verdicts, encode_verdict, sign
from clef_operator.verification import (
    Outcome,
    Progress,
    Verification,
    VerificationState,
    judge,
)

# How soon a pass looks again at a verification Job that has no pod (kube reads its FailedCreate).
POD_RECHECK_SECONDS = 5.0


def drive_verification(
    model: ModelRef,
    rendered: Renderings,
    spec: ClefModelSpec,
    observed: Observed,
    verdicts: Verdicts,
    now: datetime,
    secret: bytes,
) -> Verification:
    """Rule 2: reuse the verdict that counts, else create or judge the current key's Job of the
    current re-verify run; stop Jobs of other keys and runs, so they free their GPUs.  A new
    verdict is signed with `secret` before it is recorded anywhere."""
    job = job_name(model.name, rendered.key, verdicts.run)
    if not spec.verification.required:
        found = Verification(VerificationState.NOT_REQUIRED, job)
    elif verdicts.current is not None:
        state = (
            VerificationState.PASSED
            if verdicts.current.verdict is Verdict.PASSED
            else VerificationState.FAILED
        )
        found = Verification(state, job, record=verdicts.current)
    elif rendered.mode is VerificationMode.KERNELS:
        found = _signed(
            secret, model, _run_job(rendered, spec, observed, job, verdicts.run, now), verdicts.run
        )
    else:
        found = _engine_asked(model, rendered, spec, observed, verdicts, now, secret)
    found = _unpinnable(spec, found)
    requested: tuple[Action, ...] = ()
    if verdicts.reverify_requested:
        token = model.reverify_token
        shown = token if len(token) <= 64 else token[:64] + "…"
        requested = (
            event(
                "ReverifyRequested", f"re-verification of {spec.image} requested ({labels.REVERIFY}={shown})"
            ),
        )
    untrusted = tuple(
        event(
            "StaleVerdictIgnored",
            f"ignored a signed {i.record.verdict.value} verdict for {i.record.image} (key {i.record.key},"
            f" Job {i.record.job}, finished {i.record.finished_at}) in {i.where}: {i.stale}; a verdict"
            f" speaks for its own run only, and a failed run stays failed until a newer run passes;"
            f" fingerprint {i.fingerprint}",
            warning=True,
        )
        if i.stale
        else event(
            "UntrustedVerdictIgnored",
            f"ignored a {i.record.verdict.value} verdict for {i.record.image} (key {i.record.key}) in {i.where}:"
            f" it is not signed by this operator's key, so it is not evidence; fingerprint {i.fingerprint}",
            warning=True,
        )
        for i in verdicts.new_ignored()
    )
    current = {found.job, job, *found.jobs}
    return replace(
        found,
        actions=(*untrusted, *requested, *found.actions, *_cancel_obsolete_jobs(observed, current)),
        message=pass_message(spec, found.passed) if found.passed is not None else "",
    )


def _signed(secret: bytes, model: ModelRef, found: Verification, run: str) -> Verification:
    if found.new_record is None:
        return found
    signed = sign(
        secret, model, found.new_record.model_copy(update={"run": run, "generation": model.generation})
    )
    return replace(found, record=signed, new_record=signed)


def _engine_asked(
    model: ModelRef,
    rendered: Renderings,
    spec: ClefModelSpec,
    observed: Observed,
    verdicts: Verdicts,
    now: datetime,
    secret: bytes,
) -> Verification:
    """Modes endpoint and both: in mode both the kernels suite first (its pass does not conclude:
    it gives the digest and GPU class the preview runs), then goldens, preview, comparison."""
    run, key = verdicts.run, rendered.key
    kernels = None
    if rendered.mode is VerificationMode.BOTH:
        kernels = verdicts.step_passed(key, Step.KERNELS)
        if kernels is None:
            found = _run_job(rendered, spec, observed, job_name(model.name, key, run), run, now)
            if found.new_record is not None and found.new_record.verdict is Verdict.PASSED:
                found = replace(found, new_record=found.new_record.model_copy(update={"final": False}))
            found = _signed(secret, model, found, run)
            if found.state is not VerificationState.PASSED:
                return found
            # The kernels passed: the engine is asked next (the next pass, at once).
            progress = Progress(Reason.RUNNING, "the kernels suite passed; asking the engine next")
            return replace(
                found,
                state=VerificationState.RUNNING,
                record=None,
                progress=progress,
                new_record=None,
                step_records=(found.new_record,) if found.new_record else (),
                recheck=0.0,
            )
    return drive_endpoint(model, rendered, spec, run, observed, now, secret, kernels)


def _unpinnable(spec: ClefModelSpec, found: Verification) -> Verification:
    """A pass on a node without a GPU class label cannot pin serving to a class: fail closed."""
    passed = found.passed
    if passed is None or passed.gpu_class or spec.node_selector.get(labels.NODE_GPU_PRODUCT):
        return found
    held = passed.model_copy(
        update={
            "verdict": Verdict.FAILED,
            "reason": Reason.GPU_CLASS_UNKNOWN,
            "summary": f"verification passed on a node without the {labels.NODE_GPU_PRODUCT} label, so serving"
            " cannot be pinned to the GPU class that passed; label the GPU nodes (NVIDIA GPU feature"
            f" discovery) or set spec.nodeSelector {labels.NODE_GPU_PRODUCT} explicitly",
        }
    )
    return replace(found, state=VerificationState.FAILED, record=held)


def _run_job(
    rendered: Renderings, spec: ClefModelSpec, observed: Observed, name: str, run: str, now: datetime
) -> Verification:
    running = VerificationState.RUNNING
    job = observed.job(name)
    if job is None:
        started = event(
            "VerificationStarted",
            f"verifying {spec.image}: Job {name} runs `{' '.join(verify_argv(spec))}`"
            f" (timeout {spec.verification.timeout_seconds}s)",
        )
        progress = Progress(Reason.PENDING, f"Job {name} created")
        return Verification(
            running, name, progress=progress, actions=(CreateJob(_job(rendered, spec, run)), started)
        )
    if job.deleting:
        return Verification(
            running, name, progress=Progress(Reason.PENDING, f"waiting for Job {name} to be deleted")
        )
    judged, recheck = judge_job(spec, observed, job, now)
    if isinstance(judged, Progress):
        return Verification(running, name, progress=judged, recheck=recheck)
    return _concluded(spec, name, judged)


def judge_job(
    spec: ClefModelSpec, observed: Observed, job: JobState, now: datetime
) -> tuple[Outcome | Progress, float | None]:
    """A verification Job of `spec` judged by its pods: its outcome, or its progress and how soon
    to look again.  Nothing wakes the loop when the Job controller is refused the pod (an event,
    not a change to the Job): a Job with no pod is looked at again soon, not at the next resync."""
    pods = observed.pods_of_job(job)
    judged = judge(spec, job, pods, now)
    return judged, None if pods or not isinstance(judged, Progress) else POD_RECHECK_SECONDS


def _job(rendered: Renderings, spec: ClefModelSpec, run: str) -> dict[str, Any]:
    return render_job(rendered.owner, spec, rendered.key, rendered.verification_pod, run)


def _concluded(spec: ClefModelSpec, name: str, outcome: Outcome) -> Verification:
    new = outcome.record
    stop: tuple[Action, ...] = (DeleteJob(name),) if outcome.stop_job else ()
    if new.verdict is Verdict.PASSED:
        said = event("VerificationPassed", pass_message(spec, new))
        return Verification(VerificationState.PASSED, name, record=new, new_record=new, actions=(*stop, said))
    said = event("VerificationFailed", f"{spec.image}: {new.reason}: {new.summary}", warning=True)
    return Verification(VerificationState.FAILED, name, record=new, new_record=new, actions=(*stop, said))


def custom_verifier(spec: ClefModelSpec) -> str:
    """The user-supplied verifier, named as the spec names it."""
    v = spec.verification
    parts = [f"image {v.image}"] if v.image else []
    if v.command:
        parts.append(f"command `{' '.join(v.command)}`")
    return " and ".join(parts)


def pass_message(spec: ClefModelSpec, record: VerificationRecord) -> str:
    """The words of a pass: clef's suite, or a user-supplied verifier's, never one for the other."""
    where = f" on {record.gpu_class}" if record.gpu_class else ""
    image = record.image if record.digest in (None, record.image) else f"{record.image} ({record.digest})"
    if record.step is Step.ENDPOINT:
        weak = floor_shortfalls(spec)
        below = f". Weaker than clef's floor: {'; '.join(weak)}" if weak else ""
        return (
            f"{image} answered the goldens through its own engine at {record.dtype.value}{where}:"
            f" {record.summary}{below}"
        )
    if record.verifier is Verifier.CUSTOM:
        return (
            f"a user-supplied verifier ({custom_verifier(spec)}) passed for {image} at"
            f" {record.dtype.value}{where}; clef's own checks did not run: {record.summary}"
        )
    return f"{image} passed the {record.suite.value} suite at {record.dtype.value}{where}: {record.summary}"


# The delta rule's chunk length (the runtime's BT): a prompt no longer than this is one chunk,
# so the state carried from chunk to chunk, where long-context faults live, is never checked.
DELTA_RULE_CHUNK = 64


def floor_shortfalls(spec: ClefModelSpec) -> list[str]:
    """How an endpoint verification falls short of clef's floor (docs/verification.md, "The
    verification floor"); none for clef's built-in prompts, which include prompts of 65, 1001 and
    8197 tokens.  Admission already refuses fewer than 2 new tokens (no decode step).  A user's
    prompt of B bytes of UTF-8 is at most B tokens of text under a byte-level tokenizer, so one
    that short cannot be shown to cross a chunk."""
    endpoint = spec.verification.endpoint
    if endpoint is None or endpoint.builtin_prompts is not BuiltinPrompts.NONE:
        return []
    longest = max((len(p.text.encode()) for p in endpoint.prompts), default=0)
    if longest > DELTA_RULE_CHUNK:
        return []
    return [
        f"no prompt is sure to be longer than one {DELTA_RULE_CHUNK}-token chunk of the delta rule (the longest"
        f" is {longest} bytes), so the state carried between chunks may never have been checked: add a longer"
        " prompt, or builtinPrompts short"
    ]


def _cancel_obsolete_jobs(observed: Observed, current: set[str]) -> tuple[Action, ...]:
    actions: list[Action] = []
    for j in observed.jobs:
        if j.step in (labels.STEP_PROBE, labels.STEP_DRIVER):
            # Probes of the serving revision (plan_watch) and verifications of a driver
            # (plan_drivers) are not a verification of a spec: their planners stop them.
            continue
        if j.name not in current and not j.finished and not j.deleting:
            actions.append(DeleteJob(j.name))
            actions.append(
                event(
                    "VerificationCancelled",
                    f"Job {j.name} verified a spec that has since changed; deleted it",
                )
            )
    return tuple(actions)


# ------------------------------------------------------------------------ desired and active


@dataclass(frozen=True)
class Desired:
    """The revision the current spec should serve, rendered once: empty while none may serve
    (verification running or failed); under watch policy rollback, the rollback target."""

    revision: str = ""
    image: str | None = None
    manifest: Mapping[str, Any] | None = None
    # Watch policy rollback: the current key failed in service (plan_rollback); the revision, when
    # one, is the rollback target, served as it was made.
    failed: VerificationRecord | None = None


def desired_revision(
    rendered: Renderings,
    spec: ClefModelSpec,
    verification: Verification,
    run: str,
    drivers: tuple[str, ...] | None = None,
) -> Desired:
    """Rule 3: serve the digest that passed, on the GPU class it passed on and the driver versions
    a verdict covers (`plan_drivers`; or the image as written when no verification is required)."""
    image: str | None = None
    passed = verification.passed
    if verification.state is VerificationState.NOT_REQUIRED:
        image = spec.image
    elif passed is not None:
        image = passed.digest
    if not image:
        return Desired()
    annotations = encode_verdict(spec.image, image, run, passed)
    gpu_class = passed.gpu_class if passed is not None else None
    pod = rendered.serving_pod(image, gpu_class, drivers)
    manifest = render_deployment(
        rendered.owner, spec, image, spec.replicas, annotations, gpu_class, drivers, pod
    )
    return Desired(manifest["metadata"]["labels"][labels.REVISION], image, manifest)
