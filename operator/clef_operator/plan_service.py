"""Phase 4 of the planner (`rollout`) and the Service switch: the revision that serves is the one
clef's Service selects; a deleted active Deployment is recreated, someone else's change to the
Service put back; `switch_service` is the one selector patch that makes a candidate serve."""

from __future__ import annotations

from dataclasses import dataclass

from clef_operator import labels
from clef_operator.actions import Action, CreateDeployment, CreateService, PatchServiceSelector, event
from clef_operator.api import ClefModelSpec, ClefModelStatus
from clef_operator.children import adoption_annotations, repair_ports, service_conflict, unnamed_port_conflict
from clef_operator.observed import DeploymentState, ModelRef, Observed, ServiceState
from clef_operator.plan_drivers import covered_drivers
from clef_operator.plan_verification import Desired
from clef_operator.render import (
    Owner,
    render_deployment,
    render_service,
    service_annotations,
    serving_revision,
)
from clef_operator.renderings import verification_key
from clef_operator.revision import deployment_name
from clef_operator.verdicts import Verdicts, encode_verdict


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
        svc, spec.service
    )
    conflict = bool(conflict_message)
    rev = "" if svc is None or conflict else _selected_revision(model, svc, observed)
    dep = observed.deployment(rev) if rev else None
    # The spec that made the active revision matters only while it is not the desired one.
    served = _served_spec(status, rev, verdicts) if rev != desired.revision else None
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
        actions += repair_ports(svc, spec.service)
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
    key = verification_key(served)
    pin, drivers = verdicts.gpu_class(key), covered_drivers(served, key, verdicts)
    return served if serving_revision(served, status.active_image, pin, drivers) == active_rev else None


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
    key = verification_key(served)
    passed = verdicts.passed(key)
    annotations = encode_verdict(served.image, image, verdicts.run, passed)
    pin, drivers = verdicts.gpu_class(key), covered_drivers(served, key, verdicts)
    return (
        CreateDeployment(render_deployment(owner, served, image, spec.replicas, annotations, pin, drivers)),
        event(
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
        event(
            "SelectorRestored",
            f"Service {svc.name} selector was changed to {dict(svc.selector)} outside clef; restored it to"
            f" revision {rev}",
            warning=True,
        ),
    )


def switch_service(
    owner: Owner, spec: ClefModelSpec, active: Active, candidate: str, image: str
) -> tuple[Action, ...]:
    """The one selector patch (or the Service's creation) that makes `candidate` serve."""
    svc = active.service
    actions: list[Action] = []
    if svc is None:
        actions.append(CreateService(render_service(owner, spec, candidate)))
        actions.append(event("ServiceCreated", f"created Service {spec.service.name}"))
    else:
        selector = labels.selector(owner.name, candidate)
        annotations = {**service_annotations(owner.name, candidate), **adoption_annotations(svc)}
        actions.append(PatchServiceSelector(svc.name, selector, annotations))
        if not svc.owned and not svc.model:
            actions.append(
                event(
                    "ServiceAdopted",
                    f"adopted existing Service {svc.name} (ClusterIP {svc.cluster_ip or 'unchanged'}):"
                    " only its selector and http port change; when this ClefModel is deleted it stays,"
                    f" with its selector {dict(svc.selector)} back",
                )
            )
    previous = f"; previous revision {active.revision}" if active.revision else ""
    actions.append(
        event(
            "ServiceSwitched",
            f"Service {spec.service.name} now selects revision {candidate} ({image}){previous}",
        )
    )
    return tuple(actions)
