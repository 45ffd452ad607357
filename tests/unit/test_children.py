"""clef owns its children: drift of pod templates, the Service's conflict/adoption/ports/release
rules, and what the planner does with them (issue 13, route 3 and "also found")."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
from clef_builders import T0, VERDICT_KEY, World, make_spec

from clef_operator import labels
from clef_operator.actions import Event, LabelPod, PatchServicePorts, ReplaceTemplate, ScaleDeployment
from clef_operator.children import (
    adoption_annotations,
    label_verified_pods,
    release_ops,
    rendered_template,
    revert_drift,
    service_conflict,
    wanted_ports,
)
from clef_operator.drift import quantity, template_drift
from clef_operator.observed import DeploymentState, Observed, PodState, ServiceState
from clef_operator.plan_revisions import Move, retire_old_revisions
from clef_operator.render import Owner, render_deployment, service_port

OWNER = Owner("clef-flash", "default", "uid-1")
IMAGE = "registry.clef.test/clef-runtime@sha256:" + "a" * 64


def rendered(**spec: Any) -> dict[str, Any]:
    manifest = render_deployment(OWNER, make_spec(**spec), IMAGE, 1, {})
    template: dict[str, Any] = manifest["spec"]["template"]
    return template


def served_back(template: dict[str, Any]) -> dict[str, Any]:
    """The template as an API server returns it: clef's fields plus the defaults it fills in."""
    out = copy.deepcopy(template)
    spec = out["spec"]
    spec.update(dnsPolicy="ClusterFirst", restartPolicy="Always", schedulerName="default-scheduler")
    for c in spec["containers"]:
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            c[probe].update(timeoutSeconds=1, successThreshold=1)
            c[probe]["httpGet"]["scheme"] = "HTTP"
        if not c.get("env"):
            c.pop("env", None)
    out["metadata"]["creationTimestamp"] = None
    return out


# ---------------------------------------------------------------------------- template_drift


def test_defaults_the_api_server_fills_in_are_not_drift():
    t = rendered()
    assert template_drift(t, served_back(t)) == []


def test_an_identical_template_has_no_drift():
    t = rendered()
    assert template_drift(t, copy.deepcopy(t)) == []


def edit(t: dict[str, Any], change: Any) -> dict[str, Any]:
    out = served_back(t)
    change(out)
    return out


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (lambda t: t["spec"]["containers"][0].update(image="evil:latest"), "spec.containers[0].image"),
        (
            lambda t: t["spec"]["containers"][0].setdefault("env", []).append({"name": "X", "value": "1"}),
            "spec.containers[0].env",
        ),
        (lambda t: t["spec"].update(initContainers=[{"name": "i", "image": "x"}]), "spec.initContainers"),
        (lambda t: t["spec"].update(hostNetwork=True), "spec.hostNetwork"),
        (
            lambda t: t["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": "2"}),
            "spec.containers[0].resources.limits.nvidia.com/gpu",
        ),
        (lambda t: t["spec"]["containers"][0].update(command=["sh"]), "spec.containers[0].command"),
        (lambda t: t["spec"]["containers"][0]["command"].append("--x"), "spec.containers[0].command"),
        (lambda t: t["spec"]["containers"].append({"name": "side", "image": "x"}), "spec.containers"),
        (lambda t: t["spec"].pop("nodeSelector"), "spec.nodeSelector"),
        (lambda t: t["spec"]["nodeSelector"].update(extra="1"), "spec.nodeSelector.extra"),
        (lambda t: t["metadata"]["labels"].update(x="y"), "metadata.labels.x"),
        (lambda t: t["spec"].update(affinity={"nodeAffinity": {"x": 1}}), "spec.affinity.nodeAffinity.x"),
        (lambda t: t["spec"]["securityContext"].update(runAsUser=0), "spec.securityContext.runAsUser"),
        (
            lambda t: t["spec"]["containers"][0]["securityContext"].update(privileged=True),
            "spec.containers[0].securityContext.privileged",
        ),
        (
            lambda t: t["spec"]["volumes"][0].update(emptyDir={"medium": ""}),
            "spec.volumes[0].emptyDir.medium",
        ),
    ],
)
def test_every_edit_of_what_clef_renders_is_drift(change, path):
    t = rendered(env=[{"name": "HF_HOME", "value": "/tmp"}], nodeSelector={labels.NODE_GPU_PRODUCT: "V100"})
    assert path in template_drift(t, edit(t, change))


def test_a_defaulted_field_clef_renders_is_compared():
    t = rendered()
    changed = edit(t, lambda o: o["spec"]["containers"][0].update(imagePullPolicy="Always"))
    assert template_drift(t, changed) == ["spec.containers[0].imagePullPolicy"]


def test_quantities_are_compared_by_value():
    t = rendered(resources={"limits": {"cpu": "0.5", "memory": "1024Mi"}})
    back = edit(
        t, lambda o: o["spec"]["containers"][0]["resources"]["limits"].update(cpu="500m", memory="1Gi")
    )
    assert template_drift(t, back) == []
    more = edit(t, lambda o: o["spec"]["containers"][0]["resources"]["limits"].update(cpu="1"))
    assert template_drift(t, more) == ["spec.containers[0].resources.limits.cpu"]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("1Gi", Decimal(2**30)),
        ("2", Decimal(2)),
        ("1e3", Decimal(1000)),
        ("3k", Decimal(3000)),
    ],
)
def test_quantity(text, value):
    assert quantity(text) == value


def test_a_quantity_that_is_not_one_is_none():
    assert quantity("lots") is None


def test_the_restart_annotation_of_kubectl_rollout_restart_is_not_drift():
    t = rendered()
    back = edit(t, lambda o: o["metadata"].update(annotations={"kubectl.kubernetes.io/restartedAt": "now"}))
    assert template_drift(t, back) == []
    other = edit(t, lambda o: o["metadata"].update(annotations={"x": "y"}))
    assert template_drift(t, other) == ["metadata.annotations.x"]


# ---------------------------------------------------------------------------- revert_drift


def deployment_of(
    template: dict[str, Any], observed: dict[str, Any], annotate: bool = True
) -> DeploymentState:
    rev = template["metadata"]["labels"][labels.REVISION]
    annotations = {labels.POD_TEMPLATE: json.dumps(template)} if annotate else {}
    return DeploymentState(
        name=f"clef-flash-{rev}", revision=rev, replicas=1, annotations=annotations, template=observed
    )


def test_drift_of_a_revision_the_spec_no_longer_renders_is_reverted_from_its_annotation():
    t = rendered()
    dep = deployment_of(t, edit(t, lambda o: o["spec"]["containers"][0].update(image="evil")))
    drift = revert_drift(Observed((dep,)), {})
    assert drift.drifted == {dep.revision: ("spec.containers[0].image",)}
    assert drift.actions[0] == ReplaceTemplate(dep.name, t)
    assert isinstance(drift.actions[1], Event) and drift.actions[1].reason == "DriftReverted"
    assert "spec.containers[0].image" in drift.actions[1].message


def test_an_annotation_that_does_not_hash_to_the_revision_is_not_trusted():
    t = rendered()
    forged = copy.deepcopy(t)
    forged["spec"]["containers"][0]["image"] = "evil"
    dep = replace(
        deployment_of(t, served_back(forged)), annotations={labels.POD_TEMPLATE: json.dumps(forged)}
    )
    assert rendered_template(dep, {}) is None
    assert revert_drift(Observed((dep,)), {}).actions == ()
    assert rendered_template(dep, {dep.revision: t}) == t, "what the spec renders is known without it"


def test_unreadable_annotations_and_clean_or_deleting_deployments_need_nothing():
    t = rendered()
    assert rendered_template(replace(deployment_of(t, t), annotations={labels.POD_TEMPLATE: "{"}), {}) is None
    clean = deployment_of(t, served_back(t))
    deleting = replace(deployment_of(t, {"spec": {}}), deleting=True)
    assert revert_drift(Observed((clean, deleting)), {}) == revert_drift(Observed(), {})


def test_drift_of_the_active_revision_makes_ready_false_and_is_reverted_first():
    w = World(make_spec())
    w.deploy_first()
    dep = w.active_deployment()
    assert dep is not None and dep.template is not None
    w.deployments[dep.name] = replace(
        dep, template=edit(dict(dep.template), lambda o: o["spec"].update(hostNetwork=True))
    )
    p = w.step()
    assert isinstance(p.actions[0], ReplaceTemplate)
    assert w.condition("Ready")[:2] == ("False", "TemplateDrift")
    assert "spec.hostNetwork" in w.condition("Ready")[2]


# ---------------------------------------------------------------------------- the Service


def svc(**changes: Any) -> ServiceState:
    return replace(ServiceState(name="clef-serve", selector={"app": "legacy"}), **changes)


@pytest.mark.parametrize(
    ("service", "adopt", "conflict"),
    [
        (None, False, ""),
        (svc(owned=True), False, ""),
        (svc(annotations={labels.SERVICE_MODEL: "clef-flash"}), False, ""),
        (svc(), True, ""),
        (svc(), False, "spec.service.adopt"),
        (svc(controller="ConfigMap/gateway"), True, "ConfigMap/gateway"),
        (svc(annotations={labels.SERVICE_MODEL: "coder"}), True, "ClefModel coder"),
        (svc(owned=True, annotations={labels.SERVICE_MODEL: "coder"}), False, "ClefModel coder"),
    ],
)
def test_service_conflict(service, adopt, conflict):
    said = service_conflict(service, "clef-flash", adopt)
    assert (conflict in said) if conflict else said == ""


def test_adoption_saves_the_original_selector_once():
    assert adoption_annotations(svc()) == {labels.ORIGINAL_SELECTOR: '{"app": "legacy"}'}
    assert adoption_annotations(svc(owned=True)) == {}
    assert adoption_annotations(svc(annotations={labels.SERVICE_MODEL: "clef-flash"})) == {}


def test_ports_follow_the_spec_and_other_ports_stay():
    spec = make_spec(service={"name": "clef-serve", "port": 9000, "containerPort": 9001})
    metrics = {"name": "metrics", "port": 9100, "targetPort": 9100, "protocol": "TCP"}
    old = {"name": "http", "port": 8000, "targetPort": 8000, "protocol": "TCP", "nodePort": 30080}
    assert wanted_ports(svc(ports=(old, metrics)), spec.service) == (
        {**service_port(spec.service), "nodePort": 30080},
        metrics,
    )
    assert wanted_ports(svc(ports=(service_port(spec.service), metrics)), spec.service) is None
    unnamed = {"port": 9000, "targetPort": 9001}
    assert wanted_ports(svc(ports=(unnamed,)), spec.service) is None, "one unnamed port that says the same"
    clash = {"name": "web", "port": 9000, "targetPort": 80}
    assert wanted_ports(svc(ports=(clash,)), spec.service) == (service_port(spec.service),)
    assert (
        wanted_ports(svc(ports=({**service_port(spec.service), "targetPort": "9001"},)), spec.service) is None
    )


def test_a_changed_port_is_repaired_with_an_event():
    w = World(make_spec())
    w.deploy_first()
    w.spec = w.spec.model_copy(update={"service": w.spec.service.model_copy(update={"port": 9000})})
    p = w.step()
    assert any(isinstance(a, PatchServicePorts) for a in p.actions)
    assert "ServiceRepaired" in w.event_reasons()
    assert w.service is not None and w.service.ports[0]["port"] == 9000


def test_release_restores_the_selector_and_removes_clefs_annotations():
    annotations = {
        labels.SERVICE_MODEL: "clef-flash",
        labels.SERVICE_ACTIVE_REVISION: "r1",
        labels.ORIGINAL_SELECTOR: '{"app": "legacy"}',
        "gateway.example/route": "x",
    }
    ops = release_ops(annotations, "clef-flash")
    assert ops[0] == {"op": "add", "path": "/spec/selector", "value": {"app": "legacy"}}
    removed = {op["path"] for op in ops if op["op"] == "remove"}
    assert removed == {
        "/metadata/annotations/clef.riotpiao.com~1model",
        "/metadata/annotations/clef.riotpiao.com~1active-revision",
        "/metadata/annotations/clef.riotpiao.com~1original-selector",
    }
    assert release_ops(annotations, "coder") == [], "only the model that drives it releases it"


def test_release_without_a_saved_selector_says_so():
    ops = release_ops({labels.SERVICE_MODEL: "clef-flash"}, "clef-flash")
    assert ops[0]["path"].endswith("released-by") and "clef-flash" in ops[0]["value"]
    empty = release_ops({labels.SERVICE_MODEL: "clef-flash", labels.ORIGINAL_SELECTOR: "{}"}, "clef-flash")
    assert empty[0] == {"op": "remove", "path": "/spec/selector"}


def test_a_model_in_service_conflict_scales_its_deployments_to_zero():
    w = World(make_spec())
    w.deploy_first()
    w.service = replace(w.service, annotations={labels.SERVICE_MODEL: "coder"}, owned=False)
    p = w.step()
    assert [a.replicas for a in p.actions if isinstance(a, ScaleDeployment)] == [0]
    assert w.condition("Degraded")[:2] == ("True", "ServiceConflict")
    assert "releasing their GPUs" in w.condition("Degraded")[2]
    assert w.condition("Progressing")[:2] == ("False", "ServiceConflict")
    w.settle()
    assert not [a for a in w.step().actions if isinstance(a, ScaleDeployment)], "nothing more to release"


# ---------------------------------------------------------------------------- retire


def test_an_older_revision_keeps_its_pods_while_the_active_one_lacks_them():
    spec = make_spec()
    due = {labels.SCALE_DOWN_AT: T0.isoformat()}
    old = DeploymentState(
        name="clef-flash-r0", revision="r0", replicas=1, annotations=due, available_replicas=1
    )
    short = DeploymentState(name="clef-flash-r1", revision="r1", replicas=1, available_replicas=0)
    r = retire_old_revisions(spec, Observed((old, short)), Move("r1", short), T0)
    assert r.actions == () and r.pending_scale_down and r.requeue_after is not None
    assert "0/1 replicas available" in r.held
    ready = replace(short, available_replicas=1, updated_replicas=1)
    r = retire_old_revisions(spec, Observed((old, ready)), Move("r1", ready), T0)
    assert ScaleDeployment(old.name, 0, {labels.SCALE_DOWN_AT: None}) in r.actions and r.held == ""


def test_a_conflict_retires_nothing_more():
    r = retire_old_revisions(make_spec(), Observed(), Move("", None, released=True), T0)
    assert r.actions == () and not r.pending_scale_down


def test_pods_the_api_server_refuses_reach_degraded():
    w = World(make_spec(verification={"required": False}))
    w.step()
    (dep,) = w.deployments.values()
    refused = 'FailedCreate: pods "x" is forbidden: pod rejected: RuntimeClass "nvidia" not found'
    w.deployments[dep.name] = replace(dep, replica_failure=refused)
    w.step()
    state, reason, message = w.condition("Degraded")
    assert (state, reason) == ("True", "ChildRejected")
    assert dep.name in message and 'RuntimeClass "nvidia" not found' in message


# ---------------------------------------------------------------------------- the serving label


def _serving_pod(name: str, revision: str, **changes: Any) -> PodState:
    pod = PodState(name=name, component=labels.COMPONENT_SERVING, revision=revision, phase="Running")
    return replace(pod, **changes)


def test_only_pods_of_a_revision_with_a_signed_passed_verdict_get_the_serving_label():
    w = World(make_spec())
    w.deploy_first()
    dep = w.active_deployment()
    assert dep is not None
    forged = replace(dep, name="forged", revision="r-forged")
    forged = replace(
        forged, annotations={**dep.annotations, labels.VERDICT_SIGNATURE: "0" * 64, labels.IMAGE: "evil"}
    )
    preview = replace(dep, name="preview", revision="r-preview", annotations={labels.PREVIEW_FOR: "k"})
    pods = (
        _serving_pod("a", dep.revision),
        _serving_pod("labelled", dep.revision, serving_label="clef-flash"),
        _serving_pod("going", dep.revision, deleting=True),
        _serving_pod("done", dep.revision, phase="Succeeded"),
        _serving_pod("f", forged.revision),
        _serving_pod("p", preview.revision),
        PodState(name="job-pod", component=labels.COMPONENT_VERIFICATION, revision=dep.revision),
    )
    observed = Observed((dep, forged, preview), pods=pods)
    assert label_verified_pods(w.model, w.spec.verification.required, observed, VERDICT_KEY) == (
        LabelPod("a", {labels.MODEL: "clef-flash"}),
    )
    # A preview's pod that someone gave the serving label loses it, with a warning; one made by a
    # clef that created pods with it (no revision-of: its selector needs the label) keeps it.
    handed = _serving_pod("handed", preview.revision, serving_label="clef-flash", revision_of="clef-flash")
    legacy = _serving_pod("legacy", preview.revision, serving_label="clef-flash")
    actions = label_verified_pods(
        w.model, w.spec.verification.required, replace(observed, pods=(handed, legacy)), VERDICT_KEY
    )
    assert actions[0] == LabelPod("handed", {labels.MODEL: None})
    assert isinstance(actions[1], Event) and actions[1].reason == "ServingLabelRemoved" and len(actions) == 2
    # A model that does not require verification serves every revision but a preview.
    unverified = w.spec.model_copy(
        update={"verification": w.spec.verification.model_copy(update={"required": False})}
    )
    assert {
        a.name for a in label_verified_pods(w.model, unverified.verification.required, observed, VERDICT_KEY)
    } == {"a", "f"}  # type: ignore[attr-defined]


def test_a_deployment_made_with_the_serving_label_in_its_template_is_not_drift():
    """Before pods were created without the serving label, the template (and the immutable
    selector) carried it: such a Deployment keeps those labels and is compared on the rest."""
    t = rendered()
    legacy = copy.deepcopy(t)
    mine = legacy["metadata"]["labels"]
    mine[labels.MODEL] = mine.pop(labels.REVISION_OF)
    dep = deployment_of(t, served_back(legacy))
    assert revert_drift(Observed((dep,)), {dep.revision: t}).actions == ()
    edited = copy.deepcopy(legacy)
    edited["spec"]["containers"][0]["image"] = "evil"
    drift = revert_drift(Observed((deployment_of(t, served_back(edited)),)), {dep.revision: t})
    assert drift.drifted == {dep.revision: ("spec.containers[0].image",)}
    assert drift.actions[0].template["metadata"]["labels"] == legacy["metadata"]["labels"]  # type: ignore[union-attr]
