"""clef owns its children: pure decisions that keep them as rendered.

- `revert_drift`: a serving Deployment whose pod template differs from clef's rendering
  (`drift.template_drift`) gets the rendering back, for every revision (active, candidate,
  history), with a `DriftReverted` event naming what differed.
- `service_conflict`: whether the Service named in the spec may be driven by this model (created
  by clef for it, adopted with `spec.service.adopt`, never one controlled by another owner).
- `repair_ports`: the Service's `http` port follows spec.service.port / containerPort.
- `release_ops`: the JSON patch that hands an adopted Service back when its model is deleted.
- `label_verified_pods`: the serving label goes on the pods of verified revisions only.

Nothing here reads the cluster; `rollout` calls these from its phases, `kube` and `handlers`
carry out what they return.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clef_operator import labels
from clef_operator.actions import Action, Event, LabelPod, PatchServicePorts, ReplaceTemplate
from clef_operator.api import ServiceSpec, Verdict
from clef_operator.drift import as_dict, template_drift
from clef_operator.observed import DeploymentState, ModelRef, Observed, ServiceState
from clef_operator.render import SERVICE_PORT_NAME, service_port
from clef_operator.revision import short_hash
from clef_operator.verdicts import decode_verdict, is_trusted

# ---------------------------------------------------------------------------- drift


def rendered_template(
    dep: DeploymentState, known: Mapping[str, Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """What clef rendered for `dep`'s pod template: from `known` (revision -> template, what the
    current spec renders), else from the annotation the Deployment was created with, trusted only
    when its pod spec hashes to the revision (an edited annotation cannot steer a revert)."""
    if dep.revision in known:
        return known[dep.revision]
    text = dep.annotations.get(labels.POD_TEMPLATE)
    if not text:
        return None
    try:
        template = json.loads(text)
    except ValueError:
        return None
    if not isinstance(template, dict) or short_hash(template.get("spec")) != dep.revision:
        return None
    return template


@dataclass(frozen=True)
class Drift:
    """Revisions whose pod template drifted (revision -> differing paths) and the reverts."""

    drifted: Mapping[str, tuple[str, ...]]
    actions: tuple[Action, ...] = ()


def revert_drift(observed: Observed, known: Mapping[str, Mapping[str, Any]]) -> Drift:
    drifted: dict[str, tuple[str, ...]] = {}
    actions: list[Action] = []
    for dep in observed.deployments:
        if dep.deleting or dep.template is None:
            continue
        rendered = rendered_template(dep, known)
        if rendered is None:
            continue
        rendered = _with_legacy_labels(rendered, dep.template)
        paths = template_drift(rendered, dep.template)
        if not paths:
            continue
        drifted[dep.revision] = tuple(paths)
        shown = ", ".join(paths[:8]) + (f" (and {len(paths) - 8} more)" if len(paths) > 8 else "")
        actions.append(ReplaceTemplate(dep.name, rendered))
        actions.append(
            Event(
                "Warning",
                "DriftReverted",
                f"the pod template of {dep.name} (revision {dep.revision}) was changed outside clef"
                f" ({shown}); put back what clef rendered",
            )
        )
    return Drift(drifted, tuple(actions))


def _with_legacy_labels(rendered: Mapping[str, Any], observed: Mapping[str, Any]) -> Mapping[str, Any]:
    """A Deployment made by a clef that created serving pods with the serving label has it in its
    template and its (immutable) selector: its template keeps those labels, the rest is compared."""
    found = as_dict(observed).get("metadata", {}).get("labels", {})
    if labels.MODEL not in found or labels.REVISION_OF in found:
        return rendered
    mine = dict(rendered["metadata"]["labels"])
    legacy = {k: v for k, v in mine.items() if k != labels.REVISION_OF}
    legacy[labels.MODEL] = mine.get(labels.REVISION_OF, found[labels.MODEL])
    return {**rendered, "metadata": {**rendered["metadata"], "labels": legacy}}


# ---------------------------------------------------------------------------- the Service


def service_conflict(svc: ServiceState | None, model: str, adopt: bool) -> str:
    """Why this model may not drive `svc` ("" when it may)."""
    if svc is None:
        return ""
    if svc.model and svc.model != model:
        return f"Service {svc.name} is driven by ClefModel {svc.model}; choose another spec.service.name"
    if svc.owned:
        return ""
    if svc.controller:
        return (
            f"Service {svc.name} is controlled by {svc.controller}; clef never adopts a Service another"
            " controller owns: choose another spec.service.name"
        )
    if svc.model == model:
        return ""  # adopted by this model earlier
    if not adopt:
        return (
            f"Service {svc.name} exists and was not created by clef; set spec.service.adopt: true to adopt it"
            " (clef then changes only its selector and its http port) or choose another spec.service.name"
        )
    return ""


def adoption_annotations(svc: ServiceState) -> dict[str, str]:
    """Saved when clef first adopts `svc`: its selector, to be put back on release."""
    if svc.owned or svc.model or labels.ORIGINAL_SELECTOR in svc.annotations:
        return {}
    return {labels.ORIGINAL_SELECTOR: json.dumps(dict(svc.selector), sort_keys=True)}


def _port_matches(observed: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return (
        observed.get("port") == wanted["port"]
        and str(observed.get("targetPort", observed.get("port"))) == str(wanted["targetPort"])
        and observed.get("protocol", "TCP") == wanted["protocol"]
    )


def wanted_ports(svc: ServiceState, service: ServiceSpec) -> tuple[Mapping[str, Any], ...] | None:
    """The Service's ports with clef's `http` port as spec.service says; None when they already are."""
    wanted = service_port(service)
    ours = [p for p in svc.ports if p.get("name") == SERVICE_PORT_NAME]
    others = [p for p in svc.ports if p.get("name") != SERVICE_PORT_NAME]
    if len(ours) == 1 and _port_matches(ours[0], wanted):
        return None
    if not ours and len(others) == 1 and not others[0].get("name") and _port_matches(others[0], wanted):
        return None  # an adopted Service's one unnamed port already says the same
    # Another port on the same number would be refused by the API server: clef's port wins.
    kept = [dict(p) for p in others if p.get("port") != wanted["port"]]
    node_port = {"nodePort": ours[0]["nodePort"]} if ours and ours[0].get("nodePort") else {}
    return (wanted | node_port, *kept)


def unnamed_port_conflict(svc: ServiceState | None, service: ServiceSpec) -> str:
    """Why clef cannot put its `http` port on an adopted Service ("" when it can): the API server
    requires a name on every port of a Service with more than one, and clef never renames a port
    it does not own.  Said once, as a conflict, instead of a patch refused on every pass."""
    if svc is None or svc.owned:
        return ""
    ports = wanted_ports(svc, service)
    unnamed = [p for p in ports or () if not p.get("name")]
    if not unnamed or len(ports or ()) < 2:
        return ""
    shown = ", ".join(f"{p.get('port')}->{p.get('targetPort', p.get('port'))}" for p in unnamed)
    return (
        f"Service {svc.name} has a port without a name ({shown}), and a Service with two ports needs a name"
        f" on each: clef cannot add its `http` port ({service.port}->{service.container_port})"
        " beside it. Name that port, or set spec.service.port and containerPort to that port's numbers"
        " so that clef uses it as it is"
    )


def repair_ports(svc: ServiceState | None, service: ServiceSpec) -> tuple[Action, ...]:
    if svc is None:
        return ()
    ports = wanted_ports(svc, service)
    if ports is None:
        return ()
    was = ", ".join(f"{p.get('name', '')}:{p.get('port')}->{p.get('targetPort')}" for p in svc.ports)
    return (
        PatchServicePorts(svc.name, ports),
        Event(
            "Normal",
            "ServiceRepaired",
            f"Service {svc.name} port http set to {service.port}->{service.container_port}"
            f" (was: {was or 'none'})",
        ),
    )


def release_ops(annotations: Mapping[str, str], model: str) -> list[dict[str, Any]]:
    """The JSON patch that hands an adopted Service back: the selector it had before clef adopted
    it, clef's annotations gone.  Empty when `model` does not drive it."""
    if annotations.get(labels.SERVICE_MODEL) != model:
        return []
    ops: list[dict[str, Any]] = []
    saved = annotations.get(labels.ORIGINAL_SELECTOR)
    if saved is not None:
        try:
            selector = json.loads(saved)
        except ValueError:
            selector = None
        if isinstance(selector, dict) and selector:
            ops.append({"op": "add", "path": "/spec/selector", "value": selector})
        elif isinstance(selector, dict):
            ops.append({"op": "remove", "path": "/spec/selector"})
    else:
        # Adopted before clef saved selectors: the selector stays as clef set it, and says so.
        ops.append(
            {
                "op": "add",
                "path": f"/metadata/annotations/{_escape(labels.RELEASED_BY)}",
                "value": f"ClefModel {model} was deleted; the selector is still the one clef set",
            }
        )
    for key in (labels.SERVICE_MODEL, labels.SERVICE_ACTIVE_REVISION, labels.ORIGINAL_SELECTOR):
        if key in annotations:
            ops.append({"op": "remove", "path": f"/metadata/annotations/{_escape(key)}"})
    return ops


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


# ---------------------------------------------------------------------------- the serving label


def verified_revisions(model: ModelRef, observed: Observed, verdict_key: bytes) -> set[str]:
    """The revisions whose Deployment carries a passed verdict signed with the operator's key and
    is not a preview (a preview's verdict is written only when it is promoted)."""
    out: set[str] = set()
    for d in observed.deployments:
        if d.deleting or labels.PREVIEW_FOR in d.annotations:
            continue
        record = decode_verdict(d.annotations)
        if record is not None and record.verdict is Verdict.PASSED and is_trusted(verdict_key, model, record):
            out.add(d.revision)
    return out


def label_verified_pods(
    model: ModelRef,
    required: bool,
    observed: Observed,
    verdict_key: bytes,
    withheld: Mapping[str, str] | None = None,
) -> tuple[Action, ...]:
    """The serving label (`clef.riotpiao.com/model=<name>`, which clef's Service selects with the
    revision) on every live pod of a verified revision that lacks it, and off every pod of a
    preview that carries it (someone put it there: clef never does).  Serving pods are created
    without it (`render.serving_pod_labels`), so a preview, which has no verdict yet, is selected by
    no Service that selects on it (docs/operations.md, "Selecting serving pods").  A model that
    does not require verification (not `required`: spec.verification.required) serves its
    revisions without a verdict: every one but a preview.
    A pod in `withheld` (cordoned by a failed probe, `plan_watch`; on a driver no verification
    covers, `plan_drivers`, `plan_endpoint_drivers`: name -> why) never has it: it is taken off,
    with a `PodCordoned` event."""
    withheld = withheld or {}
    if required:
        verified = verified_revisions(model, observed, verdict_key)
    else:
        verified = {
            d.revision
            for d in observed.deployments
            if not d.deleting and labels.PREVIEW_FOR not in d.annotations
        }
    previews = {d.revision for d in observed.deployments if labels.PREVIEW_FOR in d.annotations}
    actions: list[Action] = []
    for p in observed.pods:
        if p.component != labels.COMPONENT_SERVING or p.deleting or p.phase in ("Succeeded", "Failed"):
            continue
        if p.name in withheld:
            if p.serving_label and p.revision_of == model.name:
                actions.append(LabelPod(p.name, {labels.MODEL: None}))
                actions.append(_cordoned(model, observed, p.name, withheld[p.name]))
        elif p.revision in verified and p.serving_label != model.name:
            actions.append(LabelPod(p.name, {labels.MODEL: model.name}))
        elif p.revision in previews and p.serving_label and p.revision_of == model.name:
            actions.append(LabelPod(p.name, {labels.MODEL: None}))
            actions.append(
                Event(
                    "Warning",
                    "ServingLabelRemoved",
                    f"pod {p.name} of the preview {p.revision}, which has not passed, carried the serving"
                    f" label {labels.MODEL}={p.serving_label} that clef did not give it; removed it",
                )
            )
    return tuple(actions)


def _cordoned(model: ModelRef, observed: Observed, name: str, why: str) -> Event:
    """The event of a pod taken out of serving, saying what still serves."""
    left = [
        p.name
        for p in observed.pods
        if p.serving_label == model.name and p.name != name and not p.deleting and p.ready
    ]
    serves = (
        f"{len(left)} pod(s) still carry it"
        if left
        else f"no other pod of {model.name} carries it: nothing serves now (fail closed: no answer rather"
        " than a wrong one)"
    )
    return Event(
        "Warning",
        "PodCordoned",
        f"removed the serving label {labels.MODEL} from pod {name}: {why}. {serves}",
    )
