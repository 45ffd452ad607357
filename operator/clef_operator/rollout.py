"""The rollout planner: the rollout rules of clef, as a sequence of named phases.

    plan_rollout(model, spec, observed, status, now) -> Plan(actions, status, requeue_after)

It decides from observed state only (the children, the Service, and the verdicts recorded in
status and on Deployments), never from memory of what it did before, so an operator restarted at
any moment computes the same next step.  Each phase is a pure function that returns a frozen
value; `plan_rollout` runs them in order and joins their actions.  The rules, and the one
function that keeps each (docs/architecture.md, "The planner"):

1. `verdicts.collect_verdicts`: the current spec has a verification key.  A verdict for that key
   (in status, or on a serving Deployment created from it) that was not superseded by a re-verify
   request is reused: a rollback to a revision that passed needs no Job.
2. `drive_verification`: otherwise the Job `<model>-verify-<key>` is created, or judged when it
   exists (fail closed: `verification.judge`); Jobs of other keys are deleted.
3. `desired_revision`: a pass pins serving to the digest the verification pod ran; the serving
   revision is the hash of the serving pod rendered with that digest.  A failure (or a Job still
   running) gives no revision to serve: no Deployment is created for the candidate.
   `children.revert_drift`: a serving Deployment's pod template edited outside clef is put back.
4. `active_revision`: what serves is what the Service says.  A deleted active Deployment is
   recreated (from the spec it was made from); someone else's change to the selector or the
   `http` port is put back.  A Service this model may not drive (not created by clef and not
   adopted with spec.service.adopt, or another owner's) is a conflict and stays untouched.
5. `move_towards_desired`: BlueGreen: create (or scale up) the candidate, wait until every
   replica is available, then patch the Service selector in one patch (an adopted Service: only
   its selector, its `http` port and clef's annotations change); the switch is reported by the
   next pass, requeued at once.  Recreate: first scale the active revision to 0 and wait for its
   pods to go (the pods themselves, terminating ones included: `_holding_gpus`), then the
   same.  The Service never selects a revision that is not available while another one serves.
   A model in Service conflict scales its serving Deployments to 0.
6. `retire_old_revisions`: revisions that no longer serve are scaled to 0
   `scaleDownDelaySeconds` after they were first seen not serving (recorded on them as an
   annotation, so it survives restarts), never while the active revision lacks available
   replicas; only `revisionHistoryLimit` of them are kept at 0, older ones are deleted.
7. `derive_conditions`: stuck pods (unschedulable, crash-looping, unpullable:
   `observed.PodState.problem`) surface in the conditions with the scheduler's or the container's
   own message; a failed verification is `Degraded=True` while `Ready` still reflects the active
   revision.  No timer ever promotes anything.
8. `build_status`: status reports what happened, after it happened: the active revision is the
   one the Service selected when the pass began.

DESIGN.md's "Rollout rules" in the same terms: 1 and 7 (reuse, rollback without a Job) ->
`collect_verdicts`; 2 (Job, fail closed) -> `drive_verification`; 3 and 4 (scale up, one
selector patch) -> `move_towards_desired`; 5 (delay, history) -> `retire_old_revisions`; 6
(failure holds the candidate) -> `desired_revision`, its conditions -> `derive_conditions`; 8
(digests) -> `desired_revision`; 9 (nothing stuck silently) -> `derive_conditions`; 10 (a verdict
speaks for what it checked) -> `verification.judge` and `verdicts` (scope, signatures), pinning
serving pods to the GPU class that passed -> `desired_revision`, reverting pod-template drift ->
`children.revert_drift`; 11
(status after the fact) -> `derive_conditions` and `build_status`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

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
    Step,
    Strategy,
    Verdict,
    VerificationMode,
    VerificationRecord,
    Verifier,
    effective_mode,
)
from clef_operator.children import (
    Drift,
    adoption_annotations,
    label_verified_pods,
    repair_ports,
    revert_drift,
    service_conflict,
    unnamed_port_conflict,
)
from clef_operator.conditions import (
    DEGRADED,
    PROGRESSING,
    READY,
    VERIFIED,
    Reason,
    Stamp,
    Why,
    merge_conditions,
)
from clef_operator.endpoint_flow import drive_endpoint
from clef_operator.kvcache import estimate_kv_cache_tokens
from clef_operator.observed import DeploymentState, ModelRef, Observed, PodProblem, PodState, ServiceState
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
from clef_operator.verdicts import Verdicts, collect_verdicts, encode_verdict, ledger_after, sign
from clef_operator.verification import (
    Outcome,
    Progress,
    Verification,
    VerificationState,
    floor_shortfalls,
    judge,
)

MAX_RECORDS = 16
# How soon a pass looks again at a verification Job that has no pod (kube reads its FailedCreate).
POD_RECHECK_SECONDS = 5.0


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    status: ClefModelStatus
    requeue_after: float | None = None
    # The model's ledger to write before status, when it changed (verdicts.py, "the ledger").
    ledger: dict[str, VerificationRecord] | None = None


def plan_rollout(
    model: ModelRef,
    spec: ClefModelSpec,
    observed: Observed,
    status: ClefModelStatus,
    now: datetime,
    verdict_key: bytes,
) -> Plan:
    """The phases in order; the actions are theirs, in the same order (status goes first: the
    handlers write it before applying any action).  `verdict_key` is the operator's HMAC key:
    verdicts it did not sign never count (verdicts.py)."""
    owner = Owner(model.name, model.namespace, model.uid)
    key = verification_key(spec)
    verdicts = collect_verdicts(
        model, key, status, observed.deployments, verdict_key, observed.jobs, observed.ledger
    )
    verification = drive_verification(model, owner, spec, key, observed, verdicts, now, verdict_key)
    desired = desired_revision(owner, spec, verification, verdicts.run)
    drift = revert_drift(observed, _known_templates(desired))
    serving_labels = label_verified_pods(model, spec, observed, verdict_key)
    active = active_revision(model, owner, spec, observed, status, verdicts, desired)
    move = move_towards_desired(model, owner, spec, observed, desired, active)
    previews = stop_stale_previews(observed, {verification.preview, desired.revision, move.active_revision})
    retired = retire_old_revisions(spec, observed, move, now, {verification.preview, *previews.stopped})
    conditions = derive_conditions(
        Stamp(now, model.generation), model, spec, observed, verification, active, move, retired, drift
    )
    new_status = build_status(
        model, spec, key, observed, status, verdicts, verification, desired, active, move, conditions
    )
    # Drift is reverted first: a revision is never scaled up or switched to with a foreign template.
    actions = (
        *verification.actions,
        *drift.actions,
        # Before any switch: the Service selects a revision's pods by the serving label.
        *serving_labels,
        *active.actions,
        *move.actions,
        *previews.actions,
        *retired.actions,
    )
    # A switch made in this pass is reported by the next one, which comes at once.
    waits = [w for w in (retired.requeue_after, verification.recheck) if w is not None]
    requeue = 0.0 if move.switching else (min(waits) if waits else None)
    ledger = None
    if verdicts.ledger is not None:
        ledger = ledger_after(verdicts.ledger, verification.new_record)
        ledger = None if ledger == observed.ledger else ledger
    return Plan(actions, new_status, requeue, ledger)


@dataclass(frozen=True)
class Previews:
    stopped: tuple[str, ...] = ()
    actions: tuple[Action, ...] = ()


def stop_stale_previews(observed: Observed, keep: set[str]) -> Previews:
    """A preview of a key that is no longer verified, or one that passed but is not the revision
    that serves (it ran a tag; serving is pinned to the digest), gives its GPU back at once: it
    never served."""
    stopped: list[str] = []
    actions: list[Action] = []
    for d in observed.deployments:
        if labels.PREVIEW_FOR not in d.annotations or d.revision in keep or d.replicas == 0 or d.deleting:
            continue
        stopped.append(d.revision)
        actions.append(ScaleDeployment(d.name, 0, {labels.PREVIEW_FOR: None, labels.PREVIEW_SINCE: None}))
        actions.append(
            _event("PreviewStopped", f"scaled the preview {d.name} to 0: it is not the revision to serve")
        )
    return Previews(tuple(stopped), tuple(actions))


def _known_templates(desired: Desired) -> dict[str, Mapping[str, Any]]:
    if desired.manifest is None:
        return {}
    return {desired.revision: desired.manifest["spec"]["template"]}


def _event(reason: str, message: str, warning: bool = False) -> Event:
    return Event("Warning" if warning else "Normal", reason, message)


# ------------------------------------------------------------------------ verification


def drive_verification(
    model: ModelRef,
    owner: Owner,
    spec: ClefModelSpec,
    key: str,
    observed: Observed,
    verdicts: Verdicts,
    now: datetime,
    secret: bytes,
) -> Verification:
    """Rule 2: reuse the verdict that counts, else create or judge the current key's Job of the
    current re-verify run; stop Jobs of other keys and runs, so they free their GPUs.  A new
    verdict is signed with `secret` before it is recorded anywhere."""
    job = job_name(model.name, key, verdicts.run)
    if not spec.verification.required:
        found = Verification(VerificationState.NOT_REQUIRED, job)
    elif verdicts.current is not None:
        state = (
            VerificationState.PASSED
            if verdicts.current.verdict is Verdict.PASSED
            else VerificationState.FAILED
        )
        found = Verification(state, job, record=verdicts.current)
    elif effective_mode(spec) is VerificationMode.KERNELS:
        found = _signed(secret, model, _run_job(owner, spec, observed, job, verdicts.run, now), verdicts.run)
    else:
        found = _engine_asked(model, owner, spec, key, observed, verdicts, now, secret)
    found = _unpinnable(spec, found)
    requested: tuple[Action, ...] = ()
    if verdicts.reverify_requested:
        token = model.reverify_token
        shown = token if len(token) <= 64 else token[:64] + "…"
        requested = (
            _event(
                "ReverifyRequested", f"re-verification of {spec.image} requested ({labels.REVERIFY}={shown})"
            ),
        )
    untrusted = tuple(
        _event(
            "StaleVerdictIgnored",
            f"ignored a signed {i.record.verdict.value} verdict for {i.record.image} (key {i.record.key},"
            f" Job {i.record.job}, finished {i.record.finished_at}) in {i.where}: {i.stale}; a verdict"
            f" speaks for its own run only, and a failed run stays failed until a newer run passes;"
            f" fingerprint {i.fingerprint}",
            warning=True,
        )
        if i.stale
        else _event(
            "UntrustedVerdictIgnored",
            f"ignored a {i.record.verdict.value} verdict for {i.record.image} (key {i.record.key}) in {i.where}:"
            f" it is not signed by this operator's key, so it is not evidence; fingerprint {i.fingerprint}",
            warning=True,
        )
        for i in verdicts.new_ignored()
    )
    current = {found.job, job, *found.jobs}
    return replace(
        found, actions=(*untrusted, *requested, *found.actions, *_cancel_obsolete_jobs(observed, current))
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
    owner: Owner,
    spec: ClefModelSpec,
    key: str,
    observed: Observed,
    verdicts: Verdicts,
    now: datetime,
    secret: bytes,
) -> Verification:
    """Modes endpoint and both: in mode both the kernels suite first (its pass does not conclude:
    it gives the digest and GPU class the preview runs), then goldens, preview, comparison."""
    run = verdicts.run
    kernels = None
    if effective_mode(spec) is VerificationMode.BOTH:
        kernels = verdicts.step_passed(key, Step.KERNELS)
        if kernels is None:
            found = _run_job(owner, spec, observed, job_name(model.name, key, run), run, now)
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
    return drive_endpoint(model, owner, spec, key, run, observed, now, secret, kernels)


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
    owner: Owner, spec: ClefModelSpec, observed: Observed, name: str, run: str, now: datetime
) -> Verification:
    running = VerificationState.RUNNING
    job = observed.job(name)
    if job is None:
        started = _event(
            "VerificationStarted",
            f"verifying {spec.image}: Job {name} runs `{' '.join(verify_argv(spec))}`"
            f" (timeout {spec.verification.timeout_seconds}s)",
        )
        progress = Progress(Reason.PENDING, f"Job {name} created")
        return Verification(
            running, name, progress=progress, actions=(CreateJob(render_job(owner, spec, run)), started)
        )
    if job.deleting:
        return Verification(
            running, name, progress=Progress(Reason.PENDING, f"waiting for Job {name} to be deleted")
        )
    pods = observed.pods_of_job(job)
    judged = judge(spec, job, pods, now)
    if isinstance(judged, Progress):
        # Nothing wakes the loop when the Job controller is refused the pod (an event, not a
        # change to the Job): look again soon rather than at the next resync.
        return Verification(running, name, progress=judged, recheck=None if pods else POD_RECHECK_SECONDS)
    return _concluded(spec, name, judged)


def _concluded(spec: ClefModelSpec, name: str, outcome: Outcome) -> Verification:
    new = outcome.record
    stop: tuple[Action, ...] = (DeleteJob(name),) if outcome.stop_job else ()
    if new.verdict is Verdict.PASSED:
        said = _event("VerificationPassed", _pass_message(spec, new))
        return Verification(VerificationState.PASSED, name, record=new, new_record=new, actions=(*stop, said))
    said = _event("VerificationFailed", f"{spec.image}: {new.reason}: {new.summary}", warning=True)
    return Verification(VerificationState.FAILED, name, record=new, new_record=new, actions=(*stop, said))


def custom_verifier(spec: ClefModelSpec) -> str:
    """The user-supplied verifier, named as the spec names it."""
    v = spec.verification
    parts = [f"image {v.image}"] if v.image else []
    if v.command:
        parts.append(f"command `{' '.join(v.command)}`")
    return " and ".join(parts)


def _pass_message(spec: ClefModelSpec, record: VerificationRecord) -> str:
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


def _cancel_obsolete_jobs(observed: Observed, current: set[str]) -> tuple[Action, ...]:
    actions: list[Action] = []
    for j in observed.jobs:
        if j.name not in current and not j.finished and not j.deleting:
            actions.append(DeleteJob(j.name))
            actions.append(
                _event(
                    "VerificationCancelled",
                    f"Job {j.name} verified a spec that has since changed; deleted it",
                )
            )
    return tuple(actions)


# ------------------------------------------------------------------------ desired and active


@dataclass(frozen=True)
class Desired:
    """The revision the current spec should serve, rendered once: empty while none may serve
    (verification running or failed)."""

    revision: str = ""
    image: str | None = None
    manifest: Mapping[str, Any] | None = None


def desired_revision(owner: Owner, spec: ClefModelSpec, verification: Verification, run: str) -> Desired:
    """Rule 3: serve the digest that passed, on the GPU class it passed on (or the image as
    written when no verification is required)."""
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
    manifest = render_deployment(owner, spec, image, spec.replicas, annotations, gpu_class)
    return Desired(manifest["metadata"]["labels"][labels.REVISION], image, manifest)


@dataclass(frozen=True)
class Active:
    """The revision that serves, as the Service says.  `served` is the spec it was rendered from
    while that differs from the current one (a halted rollout)."""

    revision: str
    deployment: DeploymentState | None
    service: ServiceState | None
    conflict: bool
    served: ClefModelSpec | None
    actions: tuple[Action, ...] = ()
    conflict_message: str = ""
    # How the Service was found changed or deleted outside clef ("" when it was not).
    tampered: str = ""


def active_revision(
    model: ModelRef,
    owner: Owner,
    spec: ClefModelSpec,
    observed: Observed,
    status: ClefModelStatus,
    verdicts: Verdicts,
    desired: Desired,
) -> Active:
    """Rule 4: the Service's annotation (written with its selector) names the active revision; a
    deleted active Deployment is recreated as it was, a hand-edited selector or port put back.  A
    Service this model may not drive (`children.service_conflict`) is left untouched."""
    svc = observed.service
    conflict_message = service_conflict(svc, model.name, spec.service.adopt) or unnamed_port_conflict(
        svc, spec
    )
    conflict = bool(conflict_message)
    rev = "" if svc is None or conflict else _selected_revision(model, svc, observed)
    dep = observed.deployment(rev) if rev else None
    served = _served_spec(status, rev, verdicts)
    actions: tuple[Action, ...] = ()
    if dep is None and rev and rev != desired.revision:
        if served is not None and status.active_image:
            actions = _recreate_served(model, owner, spec, verdicts, rev, served, status.active_image)
        else:
            rev = ""
    restore: tuple[Action, ...] = ()
    if svc is not None and not conflict and rev and (svc.intended_revision or svc.owned or svc.model):
        restore = _restore_selector(model, svc, rev)
    actions += restore
    if not conflict:
        actions += repair_ports(svc, spec)
    tampered = "" if conflict else _tampered(model, svc, status, rev, bool(restore))
    return Active(rev, dep, svc, conflict, served, actions, conflict_message, tampered)


def _selected_revision(model: ModelRef, svc: ServiceState, observed: Observed) -> str:
    """The revision the Service selects, by clef's annotation (else by its selector), unless that
    is a preview: a preview never serves, whoever pointed the Service at it."""
    rev = svc.intended_revision
    if not rev and svc.selector.get(labels.MODEL) == model.name:
        rev = svc.selector.get(labels.REVISION, "")
    dep = observed.deployment(rev) if rev else None
    if dep is not None and labels.PREVIEW_FOR in dep.annotations:
        return ""
    return rev


def _tampered(
    model: ModelRef, svc: ServiceState | None, status: ClefModelStatus, rev: str, restoring: bool
) -> str:
    """How the Service clef drives was changed or deleted outside clef (rule 12: the Service named
    in the spec is clef's by name, whatever its annotations say)."""
    if svc is None:
        if status.active_revision:
            return f"the Service does not exist (deleted outside clef, or newly named) while revision {status.active_revision} served"
        return ""
    if not (svc.owned or svc.model == model.name):
        return ""  # not clef's yet: created by someone else, not adopted
    if restoring or (not rev and status.active_revision):
        return f"Service {svc.name} selects {dict(svc.selector)}, not what clef set (changed outside clef)"
    if not svc.intended_revision and status.active_revision:
        return f"Service {svc.name} lost clef's annotations (changed outside clef)"
    return ""


def _served_spec(status: ClefModelStatus, active_rev: str, verdicts: Verdicts) -> ClefModelSpec | None:
    """status.activeSpec, if it is the spec that rendered `active_rev`."""
    if not active_rev or not status.active_spec or not status.active_image:
        return None
    try:
        served = ClefModelSpec.model_validate(status.active_spec)
    except ValueError:
        return None
    pin = verdicts.gpu_class(verification_key(served))
    return served if serving_revision(served, status.active_image, pin) == active_rev else None


def _recreate_served(
    model: ModelRef,
    owner: Owner,
    spec: ClefModelSpec,
    verdicts: Verdicts,
    rev: str,
    served: ClefModelSpec,
    image: str,
) -> tuple[Action, ...]:
    """The current spec cannot rebuild the active revision, the spec it was made from can."""
    passed = verdicts.passed(verification_key(served))
    annotations = encode_verdict(served.image, image, verdicts.run, passed)
    pin = verdicts.gpu_class(verification_key(served))
    return (
        CreateDeployment(render_deployment(owner, served, image, spec.replicas, annotations, pin)),
        _event(
            "RevisionRecreated",
            f"Deployment {deployment_name(model.name, rev)} of the serving revision was missing;"
            " recreated it from the spec it was made from",
            warning=True,
        ),
    )


def _restore_selector(model: ModelRef, svc: ServiceState, rev: str) -> tuple[Action, ...]:
    """The selector and clef's annotations put back, whichever of them was changed."""
    wanted = labels.selector(model.name, rev)
    if dict(svc.selector) == wanted and svc.intended_revision == rev and svc.model == model.name:
        return ()
    return (
        PatchServiceSelector(svc.name, wanted, service_annotations(model.name, rev)),
        _event(
            "SelectorRestored",
            f"Service {svc.name} selector was changed to {dict(svc.selector)} outside clef; restored it to"
            f" revision {rev}",
            warning=True,
        ),
    )


# ------------------------------------------------------------------------ move towards desired


@dataclass(frozen=True)
class Move:
    """The active and candidate revisions after this pass's step towards the desired one, and
    where the candidate's rollout stands (`stage`: the Progressing condition's reason and message)."""

    active_revision: str
    active_deployment: DeploymentState | None
    candidate_revision: str = ""
    stage: Progress | None = None
    actions: tuple[Action, ...] = ()
    # The Service selector patch that makes the candidate serve is among `actions`; status still
    # names the revision the Service selected when the pass began.
    switching: bool = False
    # The model may not drive its Service: every serving Deployment goes to 0.
    released: bool = False


def move_towards_desired(
    model: ModelRef,
    owner: Owner,
    spec: ClefModelSpec,
    observed: Observed,
    desired: Desired,
    active: Active,
) -> Move:
    """Rule 5: keep the active revision at spec.replicas, or take one step of the rollout of the
    desired revision (BlueGreen or Recreate)."""
    if active.conflict:
        return _release_gpus(observed, active)
    if not desired.revision or desired.image is None or desired.manifest is None:
        # Verification of a new spec is pending or failed: the active revision keeps serving,
        # at the replica count asked for.
        return Move(active.revision, active.deployment, actions=_keep_replicas(spec, active.deployment))
    if desired.revision == active.revision:
        dep = observed.deployment(desired.revision)
        if dep is None:
            recreated = (
                CreateDeployment(desired.manifest),
                _event(
                    "RevisionRecreated",
                    f"Deployment {deployment_name(model.name, desired.revision)} of the active revision was"
                    " missing; recreated it",
                    warning=True,
                ),
            )
            return Move(active.revision, active.deployment, actions=recreated)
        return Move(active.revision, active.deployment, actions=_keep_replicas(spec, dep, unmark=True))
    return _roll_out(owner, spec, observed, desired, active)


def _release_gpus(observed: Observed, active: Active) -> Move:
    """A model in Service conflict cannot serve, so it holds no GPUs."""
    actions: list[Action] = []
    for d in observed.deployments:
        if d.replicas and not d.deleting:
            actions.append(ScaleDeployment(d.name, 0, {labels.SCALE_DOWN_AT: None}))
            actions.append(_event("RevisionScaledDown", f"scaled {d.name} to 0: {active.conflict_message}"))
    stage = Progress(Why.SERVICE_CONFLICT, active.conflict_message)
    return Move("", None, stage=stage, actions=tuple(actions), released=True)


def _keep_replicas(
    spec: ClefModelSpec, dep: DeploymentState | None, unmark: bool = False
) -> tuple[Action, ...]:
    """Scale `dep` to spec.replicas; `unmark` also clears a scale-down it was marked for."""
    if dep is None:
        return ()
    replicas = spec.replicas
    if dep.replicas == replicas and not (unmark and labels.SCALE_DOWN_AT in dep.annotations):
        return ()
    scale = ScaleDeployment(dep.name, replicas, {labels.SCALE_DOWN_AT: None})
    if dep.replicas == replicas:
        return (scale,)
    return (scale, _event("RevisionScaled", f"scaled {dep.name} from {dep.replicas} to {replicas} replicas"))


def _roll_out(
    owner: Owner, spec: ClefModelSpec, observed: Observed, desired: Desired, active: Active
) -> Move:
    """One step of moving the Service from the active revision to the candidate."""
    assert desired.manifest is not None and desired.image is not None
    candidate, image, replicas = desired.revision, desired.image, spec.replicas

    def starting(available: int) -> Progress:
        # One wording from the pass that starts the candidate to the one that sees it available:
        # the message changes only with the count, so starting costs no extra status write.
        count = f"{available}/{replicas} replicas available"
        return Progress(
            Why.CANDIDATE_STARTING, f"waiting for revision {candidate} to become available ({count})"
        )

    hold = Move(active.revision, active.deployment, candidate)
    old = active.deployment
    if spec.rollout.strategy is Strategy.RECREATE and old is not None:
        left = _holding_gpus(old, observed)
        if not old.drained or left:
            return _recreate_first(hold, old, candidate, left)
    dep = observed.deployment(candidate)
    if dep is None:
        created = _event(
            "RevisionCreated",
            f"created Deployment {deployment_name(owner.name, candidate)} ({replicas} replicas) running {image}",
        )
        return replace(hold, stage=starting(0), actions=(CreateDeployment(desired.manifest), created))
    if labels.PREVIEW_FOR in dep.annotations:
        return replace(
            hold, stage=starting(dep.available_replicas), actions=_promote_preview(dep, desired, replicas)
        )
    if dep.replicas != replicas or labels.SCALE_DOWN_AT in dep.annotations:
        scale_up = (
            ScaleDeployment(dep.name, replicas, {labels.SCALE_DOWN_AT: None}),
            _event("RevisionScaledUp", f"scaled {dep.name} to {replicas} replicas (revision {candidate})"),
        )
        return replace(hold, stage=starting(dep.available_replicas), actions=scale_up)
    if dep.is_available() and not dep.deleting and not active.conflict:
        switching = Progress(
            Why.SWITCHING, f"switching Service {spec.service.name} to revision {candidate} ({image})"
        )
        return replace(
            hold,
            stage=switching,
            actions=_switch_service(owner, spec, active, candidate, image),
            switching=True,
        )
    return replace(hold, stage=starting(dep.available_replicas))


def _holding_gpus(old: DeploymentState, observed: Observed) -> list[str]:
    """The names of the old revision's pods that may still hold their GPUs: every one that has
    not finished.  The Deployment's status stops counting a pod once it is terminating, but a
    terminating pod keeps its GPUs until it is gone, so Recreate waits on the pods themselves."""
    pods = observed.pods_of_revision(old.revision)
    return sorted(p.name for p in pods if p.phase not in ("Succeeded", "Failed"))


def _recreate_first(hold: Move, old: DeploymentState, candidate: str, left: list[str]) -> Move:
    """Recreate: the old revision's pods stop before the candidate starts (`left`: those that
    have not, named in the condition so that a pod stuck terminating can be found)."""
    named = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
    still = f" (still there: {named})" if left else ""
    stopping = Progress(
        Why.STOPPING_OLD,
        f"Recreate: waiting for the pods of {old.name} to stop before starting revision {candidate}{still}",
    )
    if old.replicas == 0:
        return replace(hold, stage=stopping)
    scale_down = (
        ScaleDeployment(old.name, 0, {labels.SCALE_DOWN_AT: None}),
        _event(
            "RevisionScaledDown",
            f"Recreate: scaled {old.name} to 0 to make room for revision {candidate}",
        ),
    )
    return replace(hold, stage=stopping, actions=scale_down)


def _promote_preview(dep: DeploymentState, desired: Desired, replicas: int) -> tuple[Action, ...]:
    """The preview passed and is the revision to serve: it keeps its replica, gets the rest,
    and carries its verdict from now on (rollback without a Job)."""
    assert desired.manifest is not None
    verdict = {
        k: v for k, v in desired.manifest["metadata"]["annotations"].items() if k != labels.POD_TEMPLATE
    }
    promote = {
        labels.PREVIEW_FOR: None,
        labels.PREVIEW_SINCE: None,
        labels.SCALE_DOWN_AT: None,
        **verdict,
    }
    said = _event("PreviewPromoted", f"the preview {dep.name} passed: scaled to {replicas} replicas")
    return (ScaleDeployment(dep.name, replicas, promote), said)


def _switch_service(
    owner: Owner, spec: ClefModelSpec, active: Active, candidate: str, image: str
) -> tuple[Action, ...]:
    """The one selector patch (or the Service's creation) that makes `candidate` serve."""
    svc = active.service
    actions: list[Action] = []
    if svc is None:
        actions.append(CreateService(render_service(owner, spec, candidate)))
        actions.append(_event("ServiceCreated", f"created Service {spec.service.name}"))
    else:
        selector = labels.selector(owner.name, candidate)
        annotations = {**service_annotations(owner.name, candidate), **adoption_annotations(svc)}
        actions.append(PatchServiceSelector(svc.name, selector, annotations))
        if not svc.owned and not svc.model:
            actions.append(
                _event(
                    "ServiceAdopted",
                    f"adopted existing Service {svc.name} (ClusterIP {svc.cluster_ip or 'unchanged'}):"
                    " only its selector and http port change; when this ClefModel is deleted it stays,"
                    f" with its selector {dict(svc.selector)} back",
                )
            )
    previous = f"; previous revision {active.revision}" if active.revision else ""
    actions.append(
        _event(
            "ServiceSwitched",
            f"Service {spec.service.name} now selects revision {candidate} ({image}){previous}",
        )
    )
    return tuple(actions)


# ------------------------------------------------------------------------ retire old revisions


@dataclass(frozen=True)
class Retirement:
    pending_scale_down: bool = False
    requeue_after: float | None = None
    actions: tuple[Action, ...] = ()
    # Why a scale-down that is due waits ("" when none does).
    held: str = ""


HOLD_RECHECK_SECONDS = 5.0


def retire_old_revisions(
    spec: ClefModelSpec, observed: Observed, move: Move, now: datetime, previews: Iterable[str] = ()
) -> Retirement:
    """Rule 6: what no longer serves goes to 0 after scaleDownDelaySeconds; a bounded history of
    revisions is kept at 0 for rollbacks, older ones are deleted.  `previews` (the one being
    verified, those stopped in this pass) are left alone."""
    if move.released:
        return Retirement()  # move_towards_desired scaled everything to 0
    keep = {move.active_revision, move.candidate_revision, *previews} - {""}
    scaled = _scale_down(spec, observed, move, keep, now)
    return replace(scaled, actions=scaled.actions + _trim_history(spec, observed, keep, now))


def _active_short(spec: ClefModelSpec, move: Move) -> str:
    """Why older revisions must keep their pods: the active one lacks available replicas."""
    dep = move.active_deployment
    if dep is not None and dep.is_available() and dep.replicas >= spec.replicas:
        return ""
    available = dep.available_replicas if dep is not None else 0
    return (
        f"revision {move.active_revision} has {available}/{spec.replicas} replicas available;"
        " older revisions keep their pods until it has all of them"
    )


def _scale_down(
    spec: ClefModelSpec, observed: Observed, move: Move, keep: set[str], now: datetime
) -> Retirement:
    delay, active_rev = spec.rollout.scale_down_delay_seconds, move.active_revision
    held = _active_short(spec, move) if active_rev else ""
    actions: list[Action] = []
    waits: list[float] = []
    for d in observed.deployments:
        if d.revision in keep or d.deleting or d.replicas == 0:
            continue
        if not active_rev:
            # Nothing serves, so nothing can be stranded: a revision the spec moved away from
            # before it ever served gives its GPUs back at once.
            actions.append(ScaleDeployment(d.name, 0, {labels.SCALE_DOWN_AT: None}))
            actions.append(
                _event("RevisionScaledDown", f"scaled {d.name} to 0: the spec moved on before it served")
            )
            continue
        due = _parse_time(d.annotations.get(labels.SCALE_DOWN_AT))
        if due is None and delay > 0:
            due = now + timedelta(seconds=delay)
            actions.append(AnnotateDeployment(d.name, {labels.SCALE_DOWN_AT: due.isoformat()}))
        if (due is None or now >= due) and held:
            waits.append(HOLD_RECHECK_SECONDS)
        elif due is None or now >= due:
            actions.append(ScaleDeployment(d.name, 0, {labels.SCALE_DOWN_AT: None}))
            actions.append(
                _event(
                    "RevisionScaledDown",
                    f"scaled {d.name} to 0 ({delay}s after revision {active_rev} took over)",
                )
            )
        else:
            waits.append(max((due - now).total_seconds(), 0.0))
    held_now = held if waits and held else ""
    return Retirement(bool(waits), min(waits) if waits else None, tuple(actions), held_now)


def _trim_history(
    spec: ClefModelSpec, observed: Observed, keep: set[str], now: datetime
) -> tuple[Action, ...]:
    limit = spec.rollout.revision_history_limit
    history = [
        d for d in observed.deployments if d.revision not in keep and d.replicas == 0 and not d.deleting
    ]
    history.sort(
        key=lambda d: (d.created_at or datetime.min.replace(tzinfo=now.tzinfo), d.name), reverse=True
    )
    actions: list[Action] = []
    for d in history[limit:]:
        actions.append(DeleteDeployment(d.name))
        actions.append(
            _event("RevisionDeleted", f"deleted {d.name}: beyond spec.rollout.revisionHistoryLimit ({limit})")
        )
    return tuple(actions)


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


# ------------------------------------------------------------------------ conditions and status


@dataclass(frozen=True)
class Conditions:
    ready: Condition
    verified: Condition
    progressing: Condition
    degraded: Condition

    def in_order(self) -> list[Condition]:
        return [self.ready, self.verified, self.progressing, self.degraded]


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
) -> Conditions:
    """Rule 7: Verified says what the verdict is; Ready what serves (only what the Service
    selects); Progressing where the rollout stands; Degraded what needs a human, in the words of
    the scheduler, the container or the verification."""
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
            candidate_problems + active_problems,
            _refused_pods(observed, move),
        ),
    )


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
        return at.condition(VERIFIED, ConditionStatus.TRUE, record.reason, _pass_message(spec, record))
    if (
        verification.state is VerificationState.FAILED
        and record is not None
        and (record.reason == Reason.GPU_CLASS_UNKNOWN)
    ):
        return at.condition(
            VERIFIED, ConditionStatus.FALSE, record.reason, f"{record.image}: {record.summary}. {advice}"
        )
    if verification.state is VerificationState.FAILED and record is not None:
        return at.condition(
            VERIFIED,
            ConditionStatus.FALSE,
            record.reason,
            f"{record.image} failed verification ({record.reason}, Job {record.job}): {record.summary}. {advice}",
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
    if rev and rev == desired.revision:
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
