"""One reconcile pass over one ClefModel: read it and its children from the cache, ask the planner,
write what it decided (ledger, status) and apply its actions through the API server.

* **The namespace anchor.**  Before a pass writes, its namespace holds a ClefModel labelled as
  the anchor that admission asks for (`anchor`): this one, when none does.  A model that anchors its
  namespace hands the label on to another before its finalizer goes.
* **Deletion.**  Every ClefModel carries clef's finalizer (`finalizer`, the name kopf used for clef
  before): a pass adds it; once the model is deleted a pass hands back a Service it adopted
  (`Kube.release_service`) and then removes it, so a failed release keeps the model (and is
  retried).  A pass that finds its model gone from the cache forgets the model's Service index
  entry; the workers (`manager.workers`) forget its key.

Status is written before the actions, so verdicts and re-verify bookkeeping are never lost to a
crash between the two; an action the API server refuses stops the rest and is reported in
Degraded (ChildRejected) in the same pass.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from clef_operator import anchor, finalizer
from clef_operator.actions import Action, Event
from clef_operator.api import ClefModelSpec, ClefModelStatus
from clef_operator.conditions import Stamp, carried_rejection, child_rejected, invalid_spec
from clef_operator.kube import Kube
from clef_operator.manager import metrics, probe_metrics
from clef_operator.observed import ModelRef, Observed
from clef_operator.rollout import Plan, plan_rollout

log = logging.getLogger("clef.operator")

# A pass whose action the API server refused looks again this soon: what lifts a refusal (a quota
# raised or deleted, an admission policy or RuntimeClass changed) is nothing clef watches, so no
# event would wake the model before the resync.
REFUSED_RETRY_SECONDS = 30.0


def reconcile(kube: Kube, namespace: str, name: str, now: datetime | None = None) -> float | None:
    """One level-triggered pass over one ClefModel.  Returns when to look again (None: only on
    the next event or resync)."""
    obj = kube.read_model(namespace, name)
    if obj is None:
        kube.service_readers.forget(namespace, name)
        return None
    todo = finalizer.step(obj["metadata"])
    if todo is finalizer.Step.RELEASE:
        _finalize(kube, namespace, name, obj)
        return None
    if todo is finalizer.Step.WAIT:
        return None
    if todo is finalizer.Step.ADD and not kube.patch_model(
        namespace, name, finalizer.add_patch(obj["metadata"])
    ):
        return None  # deleted since the cache saw it
    # Before any child is written: the namespace's anchor, this model when there is none.
    kube.anchor_namespace(namespace, lambda: [anchor.member(obj["metadata"])])
    return _reconcile(kube, namespace, name, obj, now or datetime.now(UTC))


def _finalize(kube: Kube, namespace: str, name: str, obj: Mapping[str, Any]) -> None:
    """The model is being deleted: hand back a Service it adopted and delete its verdict ledger
    (in the operator's namespace, where no owner reference reaches; its Deployments and Jobs go
    with it, by their owner references), then remove clef's finalizer.  A failed release or delete
    raises before the finalizer is removed: the model stays, and the pass is retried."""
    if anchor.member(obj["metadata"]).anchored:
        # It anchors its namespace until it is gone: another live model takes over first (no wait
        # for admission to see it: it does before it sees this one go, as etcd ordered them).
        kube.anchor_namespace(namespace, lambda: kube.members(namespace, but=name), confirm=False)
    service = finalizer.released_service(obj)
    if service and kube.release_service(namespace, name, service):
        log.info("%s/%s: released Service %s", namespace, name, service)
    kube.delete_ledger(str(obj["metadata"].get("uid") or ""))
    kube.patch_model(namespace, name, finalizer.remove_patch(obj["metadata"]))


def _reconcile(kube: Kube, namespace: str, name: str, obj: Mapping[str, Any], now: datetime) -> float | None:
    meta = obj["metadata"]
    model = ModelRef(
        name=name,
        namespace=namespace,
        uid=meta["uid"],
        generation=meta.get("generation", 0),
        annotations=dict(meta.get("annotations") or {}),
    )
    try:
        status = ClefModelStatus.model_validate(obj.get("status") or {})
    except ValidationError:
        log.warning("%s/%s: unreadable status, starting from an empty one", model.namespace, model.name)
        status = ClefModelStatus()
    try:
        spec = ClefModelSpec.model_validate(obj.get("spec") or {})
    except ValidationError as e:
        conditions = invalid_spec(status.conditions, e, Stamp(now, model.generation))
        kube.write_status(model, status.model_copy(update={"conditions": conditions}))
        return None
    observed = kube.observe(model, spec.service.name)
    plan = plan_rollout(model, spec, observed, status, now, kube.verdict_key)
    try:
        return _carry_out(kube, model, status, observed, plan, now)
    finally:
        metrics.RECONCILES.inc()


def _carry_out(
    kube: Kube, model: ModelRef, status: ClefModelStatus, observed: Observed, plan: Plan, now: datetime
) -> float | None:
    """Write the ledger (when a run concluded), then status, apply the actions, write what they
    changed; count what the pass did.  The ledger goes first: a record in status that the ledger
    does not hold never counts (verdicts.py)."""
    if plan.ledger is not None:
        kube.write_ledger(model, plan.ledger)
    before = plan.status.model_copy(
        update={"conditions": carried_rejection(status.conditions, plan.status.conditions)}
    )
    if before != status:
        kube.write_status(model, before)
    refused = _apply_all(kube, model, plan.actions)
    after = plan.status
    if refused:
        # Against `before`, which carries a refusal already reported: the same refusal again keeps
        # its lastTransitionTime, so nothing is written, and the write's own watch event does not
        # wake the model into the same refusal at once, over and over.
        rejected = child_rejected(before.conditions, refused, Stamp(now, model.generation))
        after = after.model_copy(update={"conditions": rejected})
    if after != before:
        kube.write_status(model, after)
    if refused:
        metrics.RECONCILE_ERRORS.labels(kind="rejected").inc()
    metrics.record_pass(
        metrics.derive_pass(status, after, plan.actions, observed, datetime.now(UTC), bool(refused))
    )
    metrics.record_model(model.namespace, model.name, after)
    probe_metrics.record(model.namespace, model.name, plan.probes)
    if refused:
        return min(plan.requeue_after or REFUSED_RETRY_SECONDS, REFUSED_RETRY_SECONDS)
    return plan.requeue_after


def _apply_all(kube: Kube, model: ModelRef, actions: tuple[Action, ...]) -> str:
    """Apply in order; at the first refusal stop (the rest follows from it) and say why."""
    for action in actions:
        log.info("%s/%s: %s", model.namespace, model.name, _describe(action))
        refused = kube.apply(model, action)
        if refused:
            message = f"the API server refused {_name(action)}: {refused}"
            log.warning("%s/%s: %s", model.namespace, model.name, message)
            kube.apply(model, Event("Warning", "ChildRejected", message))
            return message
    return ""


def _name(action: Action) -> str:
    manifest = getattr(action, "manifest", None)
    if manifest is not None:
        return f"{manifest['kind']} {manifest['metadata']['name']} ({type(action).__name__})"
    return f"{type(action).__name__} {getattr(action, 'name', '')}".rstrip()


def _describe(action: Any) -> str:
    fields = {k: v for k, v in vars(action).items() if k != "manifest"}
    if "manifest" in vars(action):
        fields["name"] = action.manifest["metadata"]["name"]
    return f"{type(action).__name__} {fields}"
