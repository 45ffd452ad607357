"""clef owns its children (issue 13, route 3 and "also found"): a hand-edited pod template is
reverted, a refused child surfaces in Degraded, the Service follows the spec's ports, adoption
is opt-in and handed back, status names only what the Service selects, an older revision keeps
its pods while the active one lacks them, and a model in Service conflict holds no GPUs.

Each test runs the operator as a subprocess against the real API server; none mocks it.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_operator import labels
from clef_operator.api import ClefModelSpec
from clef_operator.drift import template_drift
from clef_operator.render import Owner, render_deployment

from .conftest import Cluster, wait_for
from .operator_support import (
    IMAGE_10,
    IMAGE_11,
    V100,
    VERIFY_SECONDS,
    Models,
    clefmodel,
    model_watch,
    operator_running,
)

pytestmark = pytest.mark.cluster

NAME = "clef-flash"
SERVICE = "clef-serve"


def _spec(**changes: Any) -> ClefModelSpec:
    return ClefModelSpec.model_validate({**clefmodel(NAME)["spec"], **changes})


# Every shape of serving pod clef renders: engines, both volume sources, sub-paths, tolerations,
# env, requests and limits written in non-canonical quantities, replicas and tensor parallelism.
RENDERED_SHAPES: dict[str, dict[str, Any]] = {
    "plain": {},
    "host-path": {
        "model": {
            "name": "m",
            "path": "/models/m",
            "weightsMiB": 1000,
            "volume": {"hostPath": {"path": "/srv/m"}},
        }
    },
    "pvc-sub-path": {
        "model": {
            "name": "m",
            "path": "/models/m",
            "weightsMiB": 1000,
            "volume": {"pvc": {"claimName": "weights"}, "subPath": "m/v1"},
        }
    },
    "vllm": {"engine": "vllm", "gpuMemoryMiB": 16384, "gpus": 2, "args": ["--enforce-eager"]},
    "tolerations-env-resources": {
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {
                "key": "dedicated",
                "operator": "Equal",
                "value": "ml",
                "effect": "NoExecute",
                "tolerationSeconds": 60,
            },
        ],
        "env": [{"name": "HF_HOME", "value": "/tmp/hf"}],
        "resources": {
            "limits": {"cpu": "0.5", "memory": "8192Mi"},
            "requests": {"cpu": "250m", "memory": "1Gi"},
        },
    },
    "no-node-selector": {"nodeSelector": {}},
}


@pytest.mark.parametrize("shape", sorted(RENDERED_SHAPES))
def test_every_rendered_deployment_reads_back_without_drift(
    cluster: Cluster, namespace: str, shape: str
) -> None:
    """Guards drift.DEFAULTED: what the API server adds to clef's rendering is not drift, or the
    operator would fight the API server forever."""
    spec = _spec(**RENDERED_SHAPES[shape])
    owner = Owner(NAME, namespace, str(uuid.uuid4()))
    manifest = render_deployment(owner, spec, IMAGE_10, 0, {})
    manifest["metadata"].pop("ownerReferences")  # no such owner exists here
    cluster.apps.create_namespaced_deployment(namespace, manifest)
    back = cluster.apps.read_namespaced_deployment(manifest["metadata"]["name"], namespace)
    observed = client.ApiClient().sanitize_for_serialization(back.spec.template)
    assert template_drift(manifest["spec"]["template"], observed) == []


# ---------------------------------------------------------------------------- helpers


def _kubectl(cluster: Cluster, namespace: str, *args: str) -> None:
    assert cluster.kubectl, "kubectl is needed: the edits are the ones a user makes with it"
    subprocess.run(
        [cluster.kubectl, "--kubeconfig", str(cluster.kubeconfig), "-n", namespace, *args],
        check=True,
        capture_output=True,
        timeout=60,
    )


def _serving(models: Models, timeout: float = VERIFY_SECONDS + 120) -> dict[str, Any]:
    models.wait_condition(NAME, "Ready", "True", "Available", timeout=timeout)
    return dict(models.get(NAME)["status"])


def _template(models: Models, name: str) -> dict[str, Any]:
    dep = models.cluster.apps.read_namespaced_deployment(name, models.ns)
    wire: dict[str, Any] = client.ApiClient().sanitize_for_serialization(dep.spec.template)
    return wire


def _selected(cluster: Cluster, namespace: str, service: str) -> str:
    svc = cluster.core.read_namespaced_service(service, namespace)
    return (svc.spec.selector or {}).get(labels.REVISION, "")


@contextmanager
def _models(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[Models]:
    cluster.image_table()
    with operator_running(cluster, namespace, tmp_path) as op:
        yield Models(cluster, namespace, op)


# ---------------------------------------------------------------------------- route 3: drift


def _set_image_is_reverted(models: Models, deployment: str, pinned: str, what: str) -> None:
    _kubectl(models.cluster, models.ns, "set", "image", f"deployment/{deployment}", f"engine={IMAGE_11}")
    wait_for(
        lambda: _template(models, deployment)["spec"]["containers"][0]["image"] == pinned,
        30,
        what,
        lambda: models.describe(NAME),
    )


def test_hand_edits_of_any_clef_deployment_are_reverted(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    with _models(cluster, namespace, tmp_path) as models:
        models.create(clefmodel(NAME))
        status = _serving(models)
        first, pinned = f"{NAME}-{status['activeRevision']}", status["activeImage"]

        _set_image_is_reverted(models, first, pinned, "kubectl set image to be reverted")
        models.wait_events(NAME, "DriftReverted")

        _kubectl(cluster, namespace, "set", "env", f"deployment/{first}", "CLEF_SHAPES=reduced")
        extra = {"name": "sidecar", "image": IMAGE_11, "command": ["true"]}
        models.cluster.apps.patch_namespaced_deployment(
            first,
            namespace,
            {"spec": {"template": {"spec": {"hostNetwork": True, "initContainers": [extra]}}}},
        )

        def clean() -> bool:
            spec = _template(models, first)["spec"]
            env = {e["name"] for e in spec["containers"][0].get("env", [])}
            return "initContainers" not in spec and "hostNetwork" not in spec and "CLEF_SHAPES" not in env

        wait_for(
            clean, 30, "env, initContainer and hostNetwork to be reverted", lambda: models.describe(NAME)
        )
        status = _serving(models, 120)
        assert status["activeImage"] == pinned

        # A revision the spec no longer renders (history, after a rollout) is reverted too.
        models.set_image(NAME, IMAGE_11)
        models.wait_status(
            NAME,
            lambda s: s.get("activeRevision") not in (None, first.split("-")[-1]),
            "the new revision",
            VERIFY_SECONDS + 120,
        )
        _set_image_is_reverted(models, first, pinned, "the history revision's template to be reverted")


# ---------------------------------------------------------------------------- refused children


def test_a_child_the_api_server_refuses_is_in_degraded_and_retried_before_the_resync(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """Degraded says ChildRejected within 30 s; once nothing wakes the model, the refused pass
    comes back by itself within REFUSED_RETRY_SECONDS (30 s), not at the resync (300 s)."""
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="no-jobs"),
        spec=client.V1ResourceQuotaSpec(hard={"count/jobs.batch": "0"}),
    )
    cluster.core.create_namespaced_resource_quota(namespace, quota)
    wait_for(
        lambda: cluster.core.read_namespaced_resource_quota("no-jobs", namespace).status.hard or {},
        30,
        "the quota controller to count the namespace",
    )
    with _models(cluster, namespace, tmp_path) as models:
        models.create(clefmodel(NAME))
        degraded = models.wait_condition(NAME, "Degraded", "True", "ChildRejected", timeout=30)
        assert "exceeded quota" in degraded["message"] and "Job" in degraded["message"]
        models.wait_events(NAME, "ChildRejected")
        # Once the passes its own status writes woke have settled (the model unchanged for
        # QUIET_SECONDS, on a watch), nothing the operator watches says the quota is gone: only
        # the refused pass's own retry can create the Job.
        _until_quiet(cluster, namespace, NAME)
        cluster.core.delete_namespaced_resource_quota("no-jobs", namespace)
        deleted = time.monotonic()
        # 120 s: four retry periods, well short of the resync (300 s) this must not wait for.
        wait_for(
            lambda: models.jobs(NAME),
            120,
            "the Job created once the quota is gone",
            lambda: models.describe(NAME),
        )
        print(f"Job created {time.monotonic() - deleted:.1f}s after the quota was deleted")
        models.wait_condition(NAME, "Verified", "True", timeout=VERIFY_SECONDS + 60)
        assert models.condition(NAME, "Degraded")["reason"] != "ChildRejected"


# A model no pass has written for this long has settled: the passes its own writes wake follow
# each other within a second on the local cluster.
QUIET_SECONDS = 3.0


def _until_quiet(cluster: Cluster, namespace: str, name: str, timeout: float = 60) -> None:
    """Until the ClefModel has not changed for QUIET_SECONDS, seen on a watch (within `timeout`)."""
    with model_watch(cluster, namespace, name) as watched:
        started = last = time.monotonic()
        seen = 0
        while time.monotonic() - last < QUIET_SECONDS:
            assert time.monotonic() - started < timeout, f"{name} kept changing for {timeout:.0f}s"
            if len(watched.snapshot()) != seen:
                seen, last = len(watched.snapshot()), time.monotonic()
            # The quiet window is the check; the watch thread fills the snapshot, read every 50 ms.
            time.sleep(0.05)


def test_pods_the_api_server_refuses_are_in_degraded(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """A spec the CRD accepts but whose pods Kubernetes refuses (here: a RuntimeClass that does not
    exist) says so, in the API server's words, instead of waiting forever."""
    with _models(cluster, namespace, tmp_path) as models:
        models.create(clefmodel(NAME, runtimeClassName="no-such-class", verification={"required": False}))
        degraded = models.wait_condition(NAME, "Degraded", "True", "ChildRejected", timeout=60)
        assert 'RuntimeClass "no-such-class" not found' in degraded["message"]


def test_a_verification_pod_the_api_server_refuses_fails_closed_long_before_its_deadline(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """The Job is accepted, its pod never is (a RuntimeClass that does not exist, which admission
    cannot know): the Job controller's FailedCreate reaches Verified and Degraded in the API
    server's words within seconds, not at the verification deadline, and the Job is stopped."""
    with _models(cluster, namespace, tmp_path) as models:
        models.create(clefmodel(NAME, runtimeClassName="no-such-class"))
        # A Job without a pod is looked at again every 5 s; its deadline is VERIFY_SECONDS away.
        verified = models.wait_condition(NAME, "Verified", "False", "VerificationPodRejected", timeout=90)
        assert 'RuntimeClass "no-such-class" not found' in verified["message"]
        degraded = models.condition(NAME, "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "VerificationPodRejected")
        wait_for(lambda: not models.jobs(NAME), 30, "the refused Job deleted", lambda: models.describe(NAME))
        assert not models.deployments(NAME), "nothing serves a spec that was never verified"


# ---------------------------------------------------------------------------- the Service


def test_service_ports_follow_the_spec(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    with _models(cluster, namespace, tmp_path) as models:
        models.create(clefmodel(NAME))
        first = _serving(models)["activeRevision"]
        models.patch(NAME, {"spec": {"service": {"port": 9000, "containerPort": 9000}}})

        def ports() -> list[tuple[Any, ...]]:
            svc = cluster.core.read_namespaced_service(SERVICE, namespace)
            return [(p.name, p.port, p.target_port) for p in svc.spec.ports]

        wait_for(lambda: ports() == [("http", 9000, 9000)], 30, "the Service's port 9000->9000", ports)
        models.wait_events(NAME, "ServiceRepaired")
        status = models.wait_status(
            NAME,
            lambda s: s.get("activeRevision") not in (None, first),
            "the revision listening on 9000",
            120,
        )
        container = _template(models, f"{NAME}-{status['activeRevision']}")["spec"]["containers"][0]
        assert container["ports"][0]["containerPort"] == 9000


def _legacy(cluster: Cluster, namespace: str, name: str, **meta: Any) -> client.V1Service:
    body = client.V1Service(
        metadata=client.V1ObjectMeta(name=name, annotations={"gateway.example/route": "clef"}, **meta),
        spec=client.V1ServiceSpec(
            selector={"app": "legacy-predictor"},
            ports=[client.V1ServicePort(name="http", port=8000, target_port=8000)],
        ),
    )
    return cluster.core.create_namespaced_service(namespace, body)


def _replicas(models: Models) -> dict[str, int]:
    return {d.metadata.name: d.spec.replicas for d in models.deployments(NAME)}


def test_adoption_is_opt_in_and_a_released_service_gets_its_selector_back(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    before = _legacy(cluster, namespace, SERVICE)
    with _models(cluster, namespace, tmp_path) as models:
        models.create(clefmodel(NAME))
        degraded = models.wait_condition(
            NAME, "Degraded", "True", "ServiceConflict", timeout=VERIFY_SECONDS + 60
        )
        assert "spec.service.adopt" in degraded["message"]
        models.wait_condition(NAME, "Verified", "True", timeout=VERIFY_SECONDS + 60)
        untouched = cluster.core.read_namespaced_service(SERVICE, namespace)
        assert untouched.metadata.resource_version == before.metadata.resource_version, (
            "not opted in: untouched"
        )
        assert not any(_replicas(models).values()), "a model in Service conflict holds no GPUs"

        models.patch(NAME, {"spec": {"service": {"adopt": True}}})
        status = _serving(models)
        assert status["serviceAdopted"] is True
        adopted = cluster.core.read_namespaced_service(SERVICE, namespace)
        assert adopted.metadata.uid == before.metadata.uid
        assert json.loads(adopted.metadata.annotations[labels.ORIGINAL_SELECTOR]) == {
            "app": "legacy-predictor"
        }

        models.delete(NAME)
        wait_for(
            lambda: _released(cluster, namespace),
            60,
            "the adopted Service to be handed back",
            lambda: cluster.core.read_namespaced_service(SERVICE, namespace),
        )
        after = cluster.core.read_namespaced_service(SERVICE, namespace)
        assert after.metadata.uid == before.metadata.uid and after.spec.cluster_ip == before.spec.cluster_ip
        assert after.metadata.annotations == {"gateway.example/route": "clef"}

        def service_reasons() -> list[str]:
            selector = f"involvedObject.name={SERVICE},involvedObject.kind=Service"
            return [
                e.reason for e in cluster.core.list_namespaced_event(namespace, field_selector=selector).items
            ]

        # The event is posted after the release it describes: wait for it, do not read once.
        wait_for(
            lambda: "ServiceReleased" in service_reasons(), 30, "the ServiceReleased event", service_reasons
        )

        # A successor may adopt it: nothing of the first model blocks it.
        models.create(clefmodel("clef-next", service={"name": SERVICE, "adopt": True}))
        models.wait_condition("clef-next", "Ready", "True", "Available", timeout=VERIFY_SECONDS + 120)


def _released(cluster: Cluster, namespace: str) -> bool:
    svc = cluster.core.read_namespaced_service(SERVICE, namespace)
    return svc.spec.selector == {"app": "legacy-predictor"} and labels.SERVICE_MODEL not in (
        svc.metadata.annotations or {}
    )


def test_a_service_another_controller_owns_is_never_adopted(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    owner = cluster.core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="gateway"))
    )
    ref = client.V1OwnerReference(
        api_version="v1", kind="ConfigMap", name="gateway", uid=owner.metadata.uid, controller=True
    )
    before = _legacy(cluster, namespace, SERVICE, owner_references=[ref])
    with _models(cluster, namespace, tmp_path) as models:
        models.create(clefmodel(NAME, service={"name": SERVICE, "adopt": True}))
        degraded = models.wait_condition(NAME, "Degraded", "True", "ServiceConflict", timeout=60)
        assert "ConfigMap/gateway" in degraded["message"]
        models.wait_condition(NAME, "Verified", "True", timeout=VERIFY_SECONDS + 60)
        svc = cluster.core.read_namespaced_service(SERVICE, namespace)
        assert svc.metadata.resource_version == before.metadata.resource_version


def test_a_model_moved_onto_a_conflicting_service_releases_its_gpus(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    _legacy(cluster, namespace, "legacy")
    with _models(cluster, namespace, tmp_path) as models:
        models.create(clefmodel(NAME))
        _serving(models)
        models.patch(NAME, {"spec": {"service": {"name": "legacy"}}})
        models.wait_condition(NAME, "Degraded", "True", "ServiceConflict", timeout=30)
        wait_for(
            lambda: not any(_replicas(models).values()),
            30,
            "every serving Deployment at 0 replicas",
            lambda: (_replicas(models), models.describe(NAME)),
        )
        assert cluster.core.read_namespaced_service("legacy", namespace).spec.selector == {
            "app": "legacy-predictor"
        }


# ---------------------------------------------------------------------------- status ordering


DENY_SELECTOR_CHANGES = """
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: {name}}}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: [v1]
      operations: [UPDATE]
      resources: [services]
  validations:
  - expression: object.spec.selector == oldObject.spec.selector
    message: selector changes are frozen in this namespace
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: {name}}}
spec:
  policyName: {name}
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {{kubernetes.io/metadata.name: {namespace}}}
"""


def _selector_frozen(cluster: Cluster, namespace: str) -> bool:
    patch = {"spec": {"selector": {"probe": "frozen"}}}
    try:
        cluster.core.patch_namespaced_service(SERVICE, namespace, patch, dry_run="All")
    except ApiException as e:
        return "frozen" in (e.body or "")
    return False


def test_status_never_names_a_revision_the_service_does_not_select(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    policy = f"freeze-{namespace}"
    with _models(cluster, namespace, tmp_path) as models:
        models.create(clefmodel(NAME))
        first = _serving(models)["activeRevision"]
        manifest = tmp_path / "freeze.yaml"
        manifest.write_text(DENY_SELECTOR_CHANGES.format(name=policy, namespace=namespace))
        _kubectl(cluster, namespace, "apply", "-f", str(manifest))
        try:
            wait_for(lambda: _selector_frozen(cluster, namespace), 30, "the admission policy to take effect")
            models.set_image(NAME, IMAGE_11)
            degraded = models.wait_condition(
                NAME, "Degraded", "True", "ChildRejected", timeout=VERIFY_SECONDS + 120
            )
            assert "frozen" in degraded["message"]
            status = models.get(NAME)["status"]
            assert _selected(cluster, namespace, SERVICE) == first
            assert status["activeRevision"] == first, "status names a revision the Service does not select"
            assert status["candidateRevision"] not in (None, first)
        finally:
            _kubectl(
                cluster,
                namespace,
                "delete",
                "validatingadmissionpolicybinding,validatingadmissionpolicy",
                policy,
            )
        models.wait_status(NAME, lambda s: s.get("activeRevision") not in (None, first), "the switch", 60)
        assert _selected(cluster, namespace, SERVICE) == models.get(NAME)["status"]["activeRevision"]


# ---------------------------------------------------------------------------- scale-down timer


def _set_unschedulable(cluster: Cluster, value: bool) -> list[str]:
    nodes = cluster.core.list_node(label_selector=f"{labels.NODE_GPU_PRODUCT}={V100}").items
    for n in nodes:
        cluster.core.patch_node(n.metadata.name, {"spec": {"unschedulable": value or None}})
    return [n.metadata.name for n in nodes]


def test_an_older_revision_keeps_its_pods_while_the_active_one_lacks_them(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    with _models(cluster, namespace, tmp_path) as models:
        models.create(clefmodel(NAME, rollout={"scaleDownDelaySeconds": 30}))
        first = _serving(models)["activeRevision"]
        models.set_image(NAME, IMAGE_11)
        status = models.wait_status(
            NAME, lambda s: s.get("activeRevision") not in (None, first), "the switch", VERIFY_SECONDS + 120
        )
        active = status["activeRevision"]
        try:
            _set_unschedulable(cluster, True)
            cluster.core.delete_collection_namespaced_pod(
                namespace, label_selector=f"{labels.REVISION}={active}", grace_period_seconds=0
            )
            models.wait_condition(NAME, "Progressing", "True", "ScaleDownHeld", timeout=60)
            assert _replicas(models)[f"{NAME}-{first}"] == 1, "the older revision lost its pods"
            kept = cluster.core.list_namespaced_pod(
                namespace, label_selector=f"{labels.REVISION}={first}"
            ).items
            assert [p.status.phase for p in kept] == ["Running"], "its pod still runs"
        finally:
            _set_unschedulable(cluster, False)
        wait_for(
            lambda: _replicas(models)[f"{NAME}-{first}"] == 0,
            90,
            "the older revision to go to 0 once the active one is back",
            lambda: models.describe(NAME),
        )


# ---------------------------------------------------------------------- the Service is clef's by name

HIJACKS = 52  # four kinds, 13 of each: enough samples for a p99 (a figure, printed, not asserted)
# The resync re-plans every model after 300 s with no event: an undoing well inside this bound
# can only have come from the Service's own event, whatever the hijack left on it.
UNDO_BOUND_SECONDS = 30


def _hijack(cluster: Cluster, namespace: str, kind: str, i: int) -> None:
    """One edit a namespace editor can make to clef's Service."""
    if kind == "deleted":
        cluster.core.delete_namespaced_service(SERVICE, namespace)
        return
    # A strategic merge patch merges maps: clef's keys are removed explicitly (null).
    patch: dict[str, Any] = {
        "spec": {"selector": {"app": f"hijack-{i}", labels.MODEL: None, labels.REVISION: None}}
    }
    if kind == "annotations-stripped":
        patch["metadata"] = {
            "annotations": {labels.SERVICE_MODEL: None, labels.SERVICE_ACTIVE_REVISION: None}
        }
    elif kind == "ports":
        port = cluster.core.read_namespaced_service(SERVICE, namespace).spec.ports[0].port
        moved = [{"op": "replace", "path": "/spec/ports/0/port", "value": port + 1000 + i}]
        cluster.core.patch_namespaced_service(SERVICE, namespace, moved)  # a list: a JSON patch
        return
    cluster.core.patch_namespaced_service(SERVICE, namespace, patch)


def _clefs(svc: Any, wanted: dict[str, str], port: int) -> bool:
    """The Service as clef sets it: its selector, its annotations, its port."""
    if svc is None:
        return False
    annotations = svc.metadata.annotations or {}
    return (
        dict(svc.spec.selector or {}) == wanted
        and annotations.get(labels.SERVICE_ACTIVE_REVISION) == wanted[labels.REVISION]
        and [p.port for p in svc.spec.ports or []] == [port]
    )


def _ready_reason(model: dict[str, Any]) -> tuple[str, str]:
    found = [c for c in (model.get("status") or {}).get("conditions", []) if c["type"] == "Ready"]
    return (found[0]["status"], found[0]["reason"]) if found else ("", "")


def test_the_service_is_clefs_by_name_whatever_its_annotations_say(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """Issue 33, route 4: a changed selector, stripped annotations, changed ports or a deleted
    Service are undone by the Service's own event (on the old code, an edit that stripped clef's
    annotations waited for the 300 s resync, while Ready said the model served behind it); while
    it is not restored, the model says so (Ready=False, ServiceRestoring) before the Service is
    put back.  Both are read from gapless watches of the Service and of the ClefModel."""
    from clef_operator.api import GROUP, PLURAL, VERSION

    from .watches import GaplessWatch, states

    kinds = ("selector", "annotations-stripped", "ports", "deleted")
    with _models(cluster, namespace, tmp_path) as models:
        models.create(clefmodel(NAME, verification={"required": False}))  # the Service is the point
        rev = _serving(models)["activeRevision"]
        wanted = labels.selector(NAME, rev)
        port = cluster.core.read_namespaced_service(SERVICE, namespace).spec.ports[0].port
        undo: list[float] = []
        custom = client.CustomObjectsApi(cluster.api)
        named = f"metadata.name={SERVICE}"
        with (
            GaplessWatch(cluster.core.list_namespaced_service, namespace, field_selector=named) as services,
            GaplessWatch(
                custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL
            ) as model_changes,
        ):
            for i in range(HIJACKS):
                kind = kinds[i % len(kinds)]
                started = time.monotonic()
                _hijack(cluster, namespace, kind, i)

                def restored() -> bool:
                    try:
                        return _clefs(cluster.core.read_namespaced_service(SERVICE, namespace), wanted, port)
                    except ApiException as e:
                        if e.status == 404:
                            return False
                        raise

                wait_for(
                    restored, UNDO_BOUND_SECONDS, f"hijack {i} ({kind}) undone", lambda: models.describe(NAME)
                )
                undo.append(time.monotonic() - started)
                models.wait_condition(NAME, "Ready", "True", "Available", timeout=UNDO_BOUND_SECONDS)
        # Every stretch of the Service's history in which it was not clef's, as resourceVersions.
        stretches: list[tuple[int, int]] = []
        bad_since: int | None = None
        changes = services.snapshot()
        for state, change in zip(states(services.initial, changes), [None, *changes], strict=True):
            ok = _clefs(state.get(SERVICE), wanted, port)
            if change is not None and not ok and bad_since is None:
                bad_since = change.resource_version
            elif ok and bad_since is not None and change is not None:
                stretches.append((bad_since, change.resource_version))
                bad_since = None
        assert len(stretches) == HIJACKS, f"{len(stretches)} hijack stretches seen, {HIJACKS} made"
        said = [(c.resource_version, _ready_reason(c.obj)) for c in model_changes.snapshot()]
        made = [kinds[i % len(kinds)] for i in range(HIJACKS)]
        for kind, (bad, good) in zip(made, stretches, strict=True):
            inside = [r for v, r in said if bad < v < good]
            if kind != "ports":  # wrong ports leave the selector right: what serves is still clef's
                assert ("False", "ServiceRestoring") in inside, f"{kind}: Ready while hijacked said {inside}"
            assert ("True", "Available") not in inside, f"{kind}: Ready=True while hijacked: {inside}"
    undo.sort()
    p50, p99 = undo[len(undo) // 2], undo[min(len(undo) - 1, int(len(undo) * 0.99))]
    print(f"\nService hijacks undone: {len(undo)}, p50 {p50:.2f}s, p99 {p99:.2f}s, max {undo[-1]:.2f}s")
