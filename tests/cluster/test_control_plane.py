"""The control plane behaves like a cluster: nodes with GPUs, a scheduler that schedules,
admission that rejects, kwok that runs serving pods and lets them go."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_devcluster.config import MANIFESTS_DIR

from .conftest import Cluster, missing_prerequisite, wait_for
from .objects import RUNTIME_IMAGE, describe_pods, serving_deployment

pytestmark = pytest.mark.cluster

GPU = "nvidia.com/gpu"


def gpu_nodes(cluster: Cluster) -> dict[str, int]:
    found = {}
    for n in cluster.core.list_node().items:
        gpus = int((n.status.allocatable or {}).get(GPU, "0"))
        if gpus > 0:
            found[n.metadata.name] = gpus
    if not found:
        if cluster.local is not None:  # the harness makes GPU nodes: their absence is a bug
            pytest.fail(f"the local cluster has no node with allocatable {GPU}", pytrace=False)
        missing_prerequisite(
            f"no node in this cluster has allocatable {GPU} (add a GPU node, or use the local cluster)"
        )
    return found


def test_kubectl_lists_the_gpu_nodes_ready_with_allocatable_gpus(cluster: Cluster) -> None:
    if cluster.kubectl is None:
        if cluster.local is not None:  # the local cluster's build provides kubectl
            pytest.fail("the local cluster's build has no kubectl (make cluster-build)", pytrace=False)
        missing_prerequisite(
            "no kubectl: neither the cached build nor one on PATH (make cluster-build, or install kubectl)"
        )
    out = subprocess.run(
        [cluster.kubectl, "--kubeconfig", str(cluster.kubeconfig), "get", "nodes", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    nodes = {n["metadata"]["name"]: n for n in json.loads(out.stdout)["items"]}
    if cluster.local is None:
        expected = {name: gpus for name, gpus in gpu_nodes(cluster).items()}
    else:
        # What the harness declared; the API server and kwok must have kept all of it.
        declared = [d for d in yaml.safe_load_all((MANIFESTS_DIR / "nodes.yaml").read_text()) if d]
        expected = {d["metadata"]["name"]: int(d["status"]["allocatable"][GPU]) for d in declared}
        for d in declared:
            labels = nodes[d["metadata"]["name"]]["metadata"]["labels"]
            assert labels["nvidia.com/gpu.product"] == d["metadata"]["labels"]["nvidia.com/gpu.product"]
    for name, gpus in expected.items():
        assert name in nodes, f"node {name} missing from `kubectl get nodes`: {sorted(nodes)}"
        node = nodes[name]
        assert int(node["status"]["allocatable"][GPU]) == gpus
        assert int(node["status"]["capacity"][GPU]) == gpus
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", f"{name} is not Ready: {node['status']['conditions']}"
    # The plain table a user sees names them too.
    table = subprocess.run(
        [cluster.kubectl, "--kubeconfig", str(cluster.kubeconfig), "get", "nodes"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    for name in expected:
        assert name in table.stdout


def test_gpu_deployment_with_runtime_class_becomes_ready(cluster: Cluster, namespace: str) -> None:
    nodes = gpu_nodes(cluster)
    cluster.apps.create_namespaced_deployment(namespace, serving_deployment("serve", replicas=2, gpus=1))

    def ready() -> bool:
        d = cluster.apps.read_namespaced_deployment("serve", namespace)
        return (d.status.ready_replicas or 0) == 2 and (d.status.available_replicas or 0) == 2

    wait_for(
        ready,
        90,
        "Deployment serve to have 2 ready replicas",
        lambda: describe_pods(cluster.core, namespace, "app=serve"),
    )
    pods = cluster.core.list_namespaced_pod(namespace, label_selector="app=serve").items
    assert len(pods) == 2
    for p in pods:
        assert p.spec.node_name in nodes, f"{p.metadata.name} landed on {p.spec.node_name}, not a GPU node"
        assert p.spec.runtime_class_name == "nvidia"
        assert p.status.phase == "Running"


def test_more_gpus_than_any_node_has_stays_pending_with_the_schedulers_reason(
    cluster: Cluster, namespace: str
) -> None:
    most = max(gpu_nodes(cluster).values())
    cluster.apps.create_namespaced_deployment(
        namespace, serving_deployment("greedy", replicas=1, gpus=most + 1)
    )

    def unschedulable() -> client.V1PodCondition | None:
        for p in cluster.core.list_namespaced_pod(namespace, label_selector="app=greedy").items:
            for c in p.status.conditions or []:
                if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                    return c
        return None

    cond = wait_for(unschedulable, 60, "the scheduler to mark the pod Unschedulable",
                    lambda: describe_pods(cluster.core, namespace, "app=greedy"))  # fmt: skip
    assert f"Insufficient {GPU}" in (cond.message or "")
    (pod,) = cluster.core.list_namespaced_pod(namespace, label_selector="app=greedy").items
    assert pod.spec.node_name is None
    assert pod.status.phase == "Pending"


def test_a_pod_naming_a_missing_runtime_class_is_rejected(cluster: Cluster, namespace: str) -> None:
    missing = f"no-such-runtime-{uuid.uuid4().hex[:6]}"
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="orphan"),
        spec=client.V1PodSpec(
            runtime_class_name=missing,
            containers=[client.V1Container(name="engine", image=RUNTIME_IMAGE)],
        ),
    )
    with pytest.raises(ApiException) as caught:
        cluster.core.create_namespaced_pod(namespace, pod)
    assert caught.value.status == 403
    message = json.loads(caught.value.body)["message"]
    assert f'RuntimeClass "{missing}" not found' in message
    assert not cluster.core.list_namespaced_pod(namespace).items


def test_deleting_a_serving_pod_removes_it(cluster: Cluster, namespace: str) -> None:
    cluster.apps.create_namespaced_deployment(namespace, serving_deployment("gone", replicas=1, gpus=1))

    def running_pod() -> str | None:
        for p in cluster.core.list_namespaced_pod(namespace, label_selector="app=gone").items:
            if p.status.phase == "Running":
                return str(p.metadata.name)
        return None

    name = wait_for(running_pod, 60, "a running serving pod")
    cluster.core.delete_namespaced_pod(name, namespace)

    def removed() -> bool:
        try:
            cluster.core.read_namespaced_pod(name, namespace)
        except ApiException as e:
            return e.status == 404
        return False

    # A bound pod is only marked for deletion by the API server; its node has to finish it.
    wait_for(removed, 60, f"pod {name} to be removed by its (kwok) node")
