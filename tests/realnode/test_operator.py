"""The operator image, deployed from the shipped kustomize tree, on a real node: both replicas
Ready, one elected (Lease clef-system/clef-operator held), /healthz passing, the verdict key made;
then, with that in-cluster operator, Pod Security "restricted" enforced on the pods it creates.

This is what every other tier cannot see: the image's own Python, user (UID 65532 with no passwd
entry), read-only root, seccomp profile, service-account token and in-cluster configuration.
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_contract.command import RUNTIME_UID
from clef_devcluster.host_operator import OPERATOR_NAMESPACE, clef_flash
from clef_devcluster.kustomize import find
from clef_devcluster.realnode import NODE_NAME
from clef_operator import labels
from clef_operator.api import GROUP, PLURAL, VERSION
from clef_operator.conditions import READY, VERIFIED
from clef_operator.kube import VERDICT_KEY_SECRET
from clef_operator.manager.leader import LEASE_NAME

from .conftest import SELECTOR, RealCluster, watch_until
from .support import condition, delete_namespace, events_of, model_object, restricted_namespace, watch_models

pytestmark = pytest.mark.real_node

START_SECONDS = 180.0


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


# Models as the cluster tier's (kwok's V100 node, the harness's image table: the runner runs
# their verification for real on this host); only the namespace is new: it enforces "restricted".
MODEL_IMAGE = "registry.clef.test/clef-runtime:1.0"
V100 = "Tesla-V100-SXM2-16GB"
ROLLOUT_SECONDS = 600.0
# An engine image that runs as a non-root user, as the model says with spec.runAsUser.
ENGINE_UID = 1000


def test_restricted_pod_security_admits_every_pod_the_operator_creates(
    real: RealCluster, deployed_operator: list[dict[str, Any]]
) -> None:
    """docs/operations.md, "Pods": verification pods always meet "restricted" (clef runs them as
    its runtime user, 65532); serving pods meet it when spec.runAsUser names a non-root user, and
    otherwise run as the engine image's user, which "restricted" refuses for runAsNonRoot alone.

    Two models in one namespace that enforces "restricted": `flash` (runAsUser set) must become
    Ready with every pod admitted; `rooted` (unset) must be verified (its verification pod was
    admitted) while its serving pods are refused for runAsNonRoot, and for nothing else."""
    ns = "t-restricted"
    restricted_namespace(real, ns)
    custom = client.CustomObjectsApi(real.api)
    try:
        common = {
            **clef_flash(MODEL_IMAGE),
            "nodeSelector": {"nvidia.com/gpu.product": V100},
            "verification": {"mode": "kernels", "timeoutSeconds": int(ROLLOUT_SECONDS)},
        }
        flash = {**common, "service": {"name": "clef-serve"}, "runAsUser": ENGINE_UID}
        rooted = {**common, "service": {"name": "rooted-serve"}}
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, model_object("flash", flash))
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, model_object("rooted", rooted))

        def refusals() -> list[client.CoreV1Event]:
            return [
                e
                for e in real.core.list_namespaced_event(ns).items
                if e.reason == "FailedCreate" and "PodSecurity" in (e.message or "")
            ]

        def unexpected(bad: list[client.CoreV1Event]) -> None:
            """Any refusal but the one documented (rooted's serving pods, runAsNonRoot) fails now."""
            for e in bad:
                ours = e.involved_object.kind == "ReplicaSet" and e.involved_object.name.startswith("rooted-")
                only_non_root = (
                    "runAsNonRoot != true" in e.message and "allowPrivilegeEscalation" not in e.message
                )
                only_non_root = (
                    only_non_root and "seccompProfile" not in e.message and "capabilities" not in e.message
                )
                if not (ours and only_non_root):
                    raise AssertionError(
                        f"Pod Security 'restricted' refused a pod the operator created: "
                        f"{e.involved_object.kind}/{e.involved_object.name}: {e.message}"
                    )

        def settled(models: list[Any]) -> dict[str, Any] | None:
            bad = refusals()
            unexpected(bad)
            by_name = {m["metadata"]["name"]: m for m in models}
            ready = condition(by_name.get("flash", {}), READY)
            verified = condition(by_name.get("rooted", {}), VERIFIED)
            if not (ready and ready["status"] == "True"):
                return None
            if not (verified and verified["status"] == "True"):
                return None
            if not any(e.involved_object.name.startswith("rooted-") for e in bad):
                return None
            return by_name

        started = time.monotonic()
        watch_models(custom, ns, settled, ROLLOUT_SECONDS, lambda: events_of(real, ns))
        print(
            f"restricted: flash Ready, rooted verified and its serving pods refused in {time.monotonic() - started:.0f}s"
        )
        refused = [e for e in refusals() if e.involved_object.name.startswith("rooted-")]
        print(f"rooted's serving pods, as documented: {refused[0].message}")
        pods = real.core.list_namespaced_pod(ns).items
        for p in pods:
            sc = p.spec.security_context
            component = (p.metadata.labels or {}).get(labels.COMPONENT)
            if component == labels.COMPONENT_VERIFICATION:
                assert (sc.run_as_non_root, sc.run_as_user) == (True, RUNTIME_UID), (p.metadata.name, sc)
            else:
                assert p.metadata.name.startswith("flash-"), f"{p.metadata.name} should have been refused"
                assert (sc.run_as_non_root, sc.run_as_user) == (True, ENGINE_UID), (p.metadata.name, sc)
        components = sorted({(p.metadata.labels or {}).get(labels.COMPONENT, "?") for p in pods})
        # Both kinds of pod the operator makes were admitted: verification (both models') and serving (flash's).
        assert components == sorted({labels.COMPONENT_VERIFICATION, labels.COMPONENT_SERVING}), components
        print(f"admitted under restricted: {sorted(p.metadata.name for p in pods)}")
    finally:
        delete_namespace(real, custom, ns)
