"""The operator image, deployed from the shipped kustomize tree, on a real node: both replicas
Ready, one elected (Lease clef-system/clef-operator held), /healthz passing, the verdict key made;
then, with that in-cluster operator, Pod Security "restricted" enforced on the pods it creates.

This is what every other tier cannot see: the image's own Python, user (UID 65532 with no passwd
entry), read-only root, seccomp profile, service-account token and in-cluster configuration.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_devcluster.host_operator import OPERATOR_NAMESPACE, clef_flash
from clef_devcluster.kustomize import BASE, find, kustomize_build
from clef_devcluster.realnode import LABEL, NODE_NAME, TOLERATION
from clef_operator.api import GROUP, PLURAL, VERSION
from clef_operator.conditions import READY
from clef_operator.kube import VERDICT_KEY_SECRET
from clef_operator.leader import LEASE_NAME

from .conftest import PINNED, STATE_DIR, BuiltImage, RealCluster, watch_until, write_overlay

pytestmark = pytest.mark.real_node

SELECTOR = "app.kubernetes.io/name=clef-operator"
START_SECONDS = 180.0


def _placement() -> list[dict[str, Any]]:
    """The only change to the shipped tree: the operator's pods go to the real node (tainted, so
    that nothing of the cluster tier's kwok nodes' lands there)."""
    ops = [
        {"op": "add", "path": "/spec/template/spec/tolerations", "value": [TOLERATION]},
        *(
            {"op": "add", "path": f"/spec/template/spec/nodeSelector/{k.replace('/', '~1')}", "value": v}
            for k, v in LABEL.items()
        ),
    ]
    return [{"target": {"kind": "Deployment", "name": "clef-operator"}, "patch": _json(ops)}]


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


@pytest.fixture(scope="module")
def deployed_operator(real: RealCluster, operator_image: BuiltImage) -> Iterator[list[dict[str, Any]]]:
    """The pinned overlay (`make images`: kustomize/base with the operator at the digest just
    built; the install path of docs/operations.md) applied with the placement above."""
    if (PINNED / "kustomization.yaml").is_file():
        source, patches = PINNED, _placement()
    else:
        source, patches = BASE, _placement()
    overlay = write_overlay(STATE_DIR / "overlays" / "operator", source, patches)
    if source == BASE:
        # The same pin the generated overlay makes, where it has not been generated.
        import yaml

        doc = yaml.safe_load((overlay / "kustomization.yaml").read_text())
        repo = operator_image.ref.rsplit(":", 1)[0]
        doc["images"] = [
            {"name": "ghcr.io/riotpiao/clef-operator", "newName": repo, "digest": operator_image.digest}
        ]
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    objects = kustomize_build(real.kubectl, overlay)
    image = find(objects, "Deployment", "clef-operator")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == operator_image.pinned, f"the overlay deploys {image}, not the image just built"
    real.run_kubectl("apply", "--server-side", "-k", str(overlay))
    try:
        yield objects
    finally:
        real.run_kubectl(
            "-n", OPERATOR_NAMESPACE, "delete", "deployment", "clef-operator", "--wait=false", check=False
        )
        # The pods stop through the kubelet (a clean container stop), not the node's teardown.
        try:
            watch_until(
                real.core.list_namespaced_pod,
                lambda pods: not pods or None,
                60,
                "the operator's pods to go",
                namespace=OPERATOR_NAMESPACE,
                label_selector=SELECTOR,
            )
        except AssertionError as e:
            print(f"real-node: {e}")


def _why_not_running(real: RealCluster, pod: client.V1Pod) -> str | None:
    """A container that restarted or ended: the reason and its log (a crash-loop fails at once,
    not at the timeout)."""
    for cs in (pod.status and pod.status.container_statuses) or []:
        term = (cs.state and cs.state.terminated) or (cs.last_state and cs.last_state.terminated)
        if cs.restart_count or term:
            try:
                log = real.core.read_namespaced_pod_log(
                    pod.metadata.name, OPERATOR_NAMESPACE, container=cs.name, previous=bool(cs.restart_count),
                    tail_lines=30,
                )  # fmt: skip
            except ApiException as e:
                log = f"(no log: {e.reason})"
            reason = f"{term.reason} (exit {term.exit_code})" if term else "restarted"
            return (
                f"pod {pod.metadata.name} container {cs.name}: {reason}, restarts {cs.restart_count}:\n{log}"
            )
    return None


def _logs(real: RealCluster) -> str:
    """Each operator pod's state and last log lines (its previous container's if it restarted)."""
    out = []
    for pod in real.core.list_namespaced_pod(OPERATOR_NAMESPACE, label_selector=SELECTOR).items:
        restarts = sum(cs.restart_count for cs in (pod.status and pod.status.container_statuses) or [])
        try:
            text = real.core.read_namespaced_pod_log(
                pod.metadata.name, OPERATOR_NAMESPACE, tail_lines=25, previous=restarts > 0
            )
        except ApiException as e:
            text = f"(no log: {e.reason})"
        out.append(f"--- {pod.metadata.name} ({pod.status.phase}, {restarts} restarts) ---\n{text}")
    return "\n".join(out)


def _ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status and pod.status.conditions) or [])


def test_operator_image_from_the_shipped_tree_runs_and_elects_a_leader(
    real: RealCluster, deployed_operator: list[dict[str, Any]]
) -> None:
    replicas = find(deployed_operator, "Deployment", "clef-operator")["spec"]["replicas"]

    def running(pods: list[client.V1Pod]) -> list[client.V1Pod] | None:
        for pod in pods:
            problem = _why_not_running(real, pod)
            if problem:
                raise AssertionError(problem)
        live = [p for p in pods if p.metadata.deletion_timestamp is None]
        return live if len(live) == replicas and all(_ready(p) for p in live) else None

    def events() -> str:
        items = real.core.list_namespaced_event(OPERATOR_NAMESPACE).items
        return "\n".join(f"{e.involved_object.name}: {e.reason}: {e.message}" for e in items[-15:])

    pods = watch_until(
        real.core.list_namespaced_pod, running, START_SECONDS, f"{replicas} operator pods Ready", events,
        namespace=OPERATOR_NAMESPACE, label_selector=SELECTOR,
    )  # fmt: skip
    names = {p.metadata.name for p in pods}
    for pod in pods:
        # Run by this node's containerd, not played by kwok.
        assert pod.spec.node_name == NODE_NAME, (pod.metadata.name, pod.spec.node_name)
        assert pod.status.container_statuses[0].container_id.startswith("containerd://")

    coordination = client.CoordinationV1Api(real.api)

    def held(leases: list[Any]) -> str | None:
        for lease in leases:
            holder = (lease.spec and lease.spec.holder_identity) or ""
            # The default identity is the pod's hostname (its name) and a random suffix.
            if holder.rsplit("_", 1)[0] in names:
                return str(holder)
        return None

    holder = watch_until(
        coordination.list_namespaced_lease, held, 60, f"Lease {LEASE_NAME} held by one of {sorted(names)}",
        events, namespace=OPERATOR_NAMESPACE, field_selector=f"metadata.name={LEASE_NAME}",
    )  # fmt: skip

    # /healthz from the host, at each pod's address on the node's bridge (what the kubelet's
    # liveness probe asks too), in the leader and in the standby.
    for pod in pods:
        try:
            with urllib.request.urlopen(f"http://{pod.status.pod_ip}:9090/healthz", timeout=5) as r:
                assert r.status == 200, (pod.metadata.name, r.status)
        except OSError as e:
            raise AssertionError(f"/healthz of {pod.metadata.name}: {e}\n{_logs(real)}") from None

    # The leader did its first work through the in-cluster API path (DNAT to the API server).
    watch_until(
        real.core.list_namespaced_secret, lambda secrets: secrets or None, 60, f"Secret {VERDICT_KEY_SECRET}",
        lambda: _logs(real), namespace=OPERATOR_NAMESPACE, field_selector=f"metadata.name={VERDICT_KEY_SECRET}",
    )  # fmt: skip
    print(f"leader: {holder}")


# A model as the cluster tier's (kwok's V100 node, the harness's image table: the runner runs
# its verification for real on this host); only the namespace is new: it enforces "restricted".
MODEL_IMAGE = "registry.clef.test/clef-runtime:1.0"
V100 = "Tesla-V100-SXM2-16GB"
RESTRICTED = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn", "audit")}
ROLLOUT_SECONDS = 600.0


def test_restricted_pod_security_admits_every_pod_the_operator_creates(
    real: RealCluster, deployed_operator: list[dict[str, Any]]
) -> None:
    ns = "t-restricted"
    real.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns, labels=RESTRICTED)))
    custom = client.CustomObjectsApi(real.api)
    try:
        watch_until(
            real.core.list_namespaced_service_account, lambda sas: sas or None, 30, f"ServiceAccount {ns}/default",
            namespace=ns, field_selector="metadata.name=default",
        )  # fmt: skip
        # The namespace really enforces the profile: a pod without its settings is refused.
        probe = real.run_kubectl(
            "-n", ns, "run", "pss-probe", "--image=registry.clef.test/x:1.0", "--dry-run=server", check=False
        )  # fmt: skip
        assert probe.returncode != 0 and "PodSecurity" in probe.stderr, probe.stderr
        spec = {
            **clef_flash(MODEL_IMAGE),
            "nodeSelector": {"nvidia.com/gpu.product": V100},
            "service": {"name": "clef-serve"},
            "verification": {"mode": "kernels", "timeoutSeconds": int(ROLLOUT_SECONDS)},
        }
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ClefModel",
            "metadata": {"name": "flash"},
            "spec": spec,
        }
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)

        def refused(events: list[client.CoreV1Event]) -> None:
            bad = [e for e in events if e.reason == "FailedCreate" and "PodSecurity" in (e.message or "")]
            if bad:
                raise AssertionError(
                    "Pod Security 'restricted' refused pods the operator created:\n"
                    + "\n".join(
                        f"{e.involved_object.kind}/{e.involved_object.name}: {e.message}" for e in bad
                    )
                )

        def model_ready(models: list[Any]) -> dict[str, Any] | None:
            refused(real.core.list_namespaced_event(ns).items)
            for m in models:
                for c in (m.get("status") or {}).get("conditions") or []:
                    if c["type"] == READY and c["status"] == "True":
                        return dict(m)
            return None

        def describe() -> str:
            events = real.core.list_namespaced_event(ns).items
            return "\n".join(
                f"{e.involved_object.kind}/{e.involved_object.name}: {e.reason}: {e.message}"
                for e in events[-15:]
            )

        _watch_models(custom, ns, model_ready, ROLLOUT_SECONDS, describe)
        pods = real.core.list_namespaced_pod(ns).items
        kinds = {(p.metadata.labels or {}).get("clef.riotpiao.com/component", "?") for p in pods}
        # Both kinds of pod the operator makes were admitted: the verification Job's and serving's.
        assert len(pods) >= 2, [p.metadata.name for p in pods]
        print(f"admitted under restricted: {sorted(p.metadata.name for p in pods)} ({sorted(kinds)})")
    finally:
        for m in custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]:
            custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, m["metadata"]["name"])
        real.core.delete_namespace(ns)


def _watch_models(
    custom: client.CustomObjectsApi, ns: str, done: Any, timeout: float, describe: Any
) -> dict[str, Any]:
    """watch_until for custom objects (plain dicts, not models)."""
    import time

    from kubernetes import watch

    deadline = time.monotonic() + timeout
    listed = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
    found = done(listed["items"])
    if found:
        return dict(found)
    rv = listed["metadata"]["resourceVersion"]
    objects = {m["metadata"]["name"]: m for m in listed["items"]}
    w = watch.Watch()
    while (left := deadline - time.monotonic()) > 0:
        for event in w.stream(
            custom.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL,
            resource_version=rv, timeout_seconds=max(1, int(min(left, 20))),
        ):  # fmt: skip
            obj = event["object"]
            rv = obj["metadata"]["resourceVersion"]
            objects[obj["metadata"]["name"]] = obj
            found = done(list(objects.values()))
            if found:
                w.stop()
                return dict(found)
        # A watch that ended without news: look at the events once more (a refusal is an event).
        found = done(list(objects.values()))
        if found:
            return dict(found)
    raise AssertionError(
        f"timed out after {timeout:.0f}s waiting for the ClefModel to be Ready\n{describe()}"
    )
