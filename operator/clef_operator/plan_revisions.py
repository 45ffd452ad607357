"""Phases 5 and 6 of the planner (`rollout`): move towards the desired revision (BlueGreen or
Recreate, one step a pass), stop previews that will not serve, and retire the revisions that
no longer serve (scale-down delay, history limit)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from clef_operator import labels
from clef_operator.actions import (
    Action,
    AnnotateDeployment,
    CreateDeployment,
    DeleteDeployment,
    ScaleDeployment,
    event,
)
from clef_operator.api import ClefModelSpec, Strategy
from clef_operator.conditions import Why
from clef_operator.observed import DeploymentState, ModelRef, Observed
from clef_operator.plan_service import Active, switch_service
from clef_operator.plan_verification import Desired
from clef_operator.render import Owner
from clef_operator.revision import deployment_name
from clef_operator.verification import Progress


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
            event("PreviewStopped", f"scaled the preview {d.name} to 0: it is not the revision to serve")
        )
    return Previews(tuple(stopped), tuple(actions))


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
                event(
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
            actions.append(event("RevisionScaledDown", f"scaled {d.name} to 0: {active.conflict_message}"))
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
    return (scale, event("RevisionScaled", f"scaled {dep.name} from {dep.replicas} to {replicas} replicas"))


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
        created = event(
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
            event("RevisionScaledUp", f"scaled {dep.name} to {replicas} replicas (revision {candidate})"),
        )
        return replace(hold, stage=starting(dep.available_replicas), actions=scale_up)
    if dep.is_available() and not dep.deleting and not active.conflict:
        switching = Progress(
            Why.SWITCHING, f"switching Service {spec.service.name} to revision {candidate} ({image})"
        )
        return replace(
            hold,
            stage=switching,
            actions=switch_service(owner, spec, active, candidate, image),
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
        event(
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
    said = event("PreviewPromoted", f"the preview {dep.name} passed: scaled to {replicas} replicas")
    return (ScaleDeployment(dep.name, replicas, promote), said)


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


def _active_short(spec: ClefModelSpec, observed: Observed, move: Move) -> str:
    """Why older revisions must keep their pods: the active one lacks available replicas.  Not
    while one of its pods waits for GPUs (the scheduler's `Insufficient nvidia.com/gpu`): the
    older pods may hold the very GPUs it waits for (a scale-up on a full cluster), and they serve
    no traffic, so holding them would stall the active revision for good.  A pod that waits for
    anything else (a cordoned or lost node) gains nothing from their scale-down, and they stay."""
    dep = move.active_deployment
    if dep is not None and dep.is_available() and dep.replicas >= spec.replicas:
        return ""
    if _waiting_for_room(observed, move.active_revision):
        return ""
    available = dep.available_replicas if dep is not None else 0
    return (
        f"revision {move.active_revision} has {available}/{spec.replicas} replicas available;"
        " older revisions keep their pods until it has all of them"
    )


def _waiting_for_room(observed: Observed, revision: str) -> str:
    """The scheduler's message for a pod of `revision` that cannot be scheduled for want of GPUs,
    else ""."""
    short = f"Insufficient {labels.GPU_RESOURCE}"
    serving = (p for p in observed.pods if p.component == labels.COMPONENT_SERVING and not p.deleting)
    waiting = (p.unschedulable_message for p in serving if p.revision == revision)
    return next((m for m in waiting if short in m), "")


def _scale_down(
    spec: ClefModelSpec, observed: Observed, move: Move, keep: set[str], now: datetime
) -> Retirement:
    delay, active_rev = spec.rollout.scale_down_delay_seconds, move.active_revision
    held = _active_short(spec, observed, move) if active_rev else ""
    room = _waiting_for_room(observed, active_rev) if active_rev else ""
    why = f"; revision {active_rev} has a pod waiting to be scheduled: {room}" if room else ""
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
                event("RevisionScaledDown", f"scaled {d.name} to 0: the spec moved on before it served")
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
                event(
                    "RevisionScaledDown",
                    f"scaled {d.name} to 0 ({delay}s after revision {active_rev} took over){why}",
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
            event("RevisionDeleted", f"deleted {d.name}: beyond spec.rollout.revisionHistoryLimit ({limit})")
        )
    return tuple(actions)


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None
