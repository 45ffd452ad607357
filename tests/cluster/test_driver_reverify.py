"""Re-verify when the ground changes (issue 37): a node whose driver label changes gets a
re-verification before a new pod of the model lands there.

A kwok node of a GPU class of this test's own (tainted, so that no other test's pods land on it)
reports driver OLD.  `drv` (kernels mode) is verified there and served, its pods pinned to OLD.
Then the node's driver label becomes NEW, as a driver upgrade in place leaves it.  The serving pod
already there keeps running (the pin is required at scheduling, ignored during execution) but
loses the serving label before anything is verified on NEW (`plan_drivers.off_their_drivers`); the
operator runs a kernels Job of the digest that passed, pinned to NEW, and only after it passed does
a revision pinned to {OLD, NEW} roll out, whose pod lands on the node.  The order is read from one
gap-free watch of the namespace's pods (watches.py), not sampled.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from clef_devcluster.gpunode import kwok_gpu_node
from clef_devcluster.rest import Rest, object_path

from .conftest import Cluster, wait_for
from .operator_support import IMAGE_10, VERIFY_SECONDS, Models, OperatorProcess, clefmodel, delete_models
from .watches import GaplessWatch

pytestmark = pytest.mark.cluster

NAME = "drv"
PRODUCT = "Driver-Reverify-Test-GPU"
TAINT = "clef.riotpiao.com/driver-reverify-test"
FULL = "nvidia.com/cuda.driver-version.full"
OLD, NEW = "550.127.05", "570.86.15"
STEP = "clef.riotpiao.com/verification-step"
REVISION_OF = "clef.riotpiao.com/revision-of"
REVISION = "clef.riotpiao.com/revision"
SERVING_LABEL = "clef.riotpiao.com/model"


@dataclass
class Setup:
    models: Models
    cluster: Cluster
    node: str


def _node(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    # Three GPUs: the first revision's pod, the driver verification, the next revision's pod.
    return kwok_gpu_node(
        name,
        product=PRODUCT,
        taint=TAINT,
        gpus=3,
        memory_mib=16384,
        room={"cpu": "32", "memory": "256Gi", "pods": "110"},
        labels={FULL: OLD, "nvidia.com/cuda.runtime-version.full": "12.4"},
        addresses=[{"type": "InternalIP", "address": "10.10.0.37"}],
    )


@pytest.fixture(scope="module")
def setup(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    cluster.image_table()  # a missing harness runner is a stated skip
    root = tmp_path_factory.mktemp("driver-reverify")
    suffix = uuid.uuid4().hex[:6]
    namespace, node_name = f"t-driver-{suffix}", f"driver-test-{suffix}"
    rest = Rest(cluster.kubeconfig)
    node, status = _node(node_name)
    rest.apply(node)
    rest.patch_status(object_path(node), status)
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    operator = OperatorProcess(cluster.kubeconfig, namespace, root / "operator.log")
    operator.start()
    try:
        yield Setup(Models(cluster, namespace, operator), cluster, node_name)
    finally:
        delete_models(cluster, namespace)
        operator.stop()
        cluster.core.delete_namespace(namespace)
        cluster.core.delete_node(node_name)


def _affinity(template: Any) -> list[dict[str, Any]]:
    affinity = template.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    return [
        {"key": e.key, "operator": e.operator, "values": sorted(e.values or [])}
        for t in affinity.node_selector_terms
        for e in t.match_expressions
        if e.key == FULL and e.operator == "In"
    ]


def test_a_node_whose_driver_changes_is_verified_before_a_new_pod_of_the_model_lands_there(
    setup: Setup,
) -> None:
    m, cluster, node = setup.models, setup.cluster, setup.node
    started = time.monotonic()
    m.create(
        clefmodel(
            NAME,
            IMAGE_10,
            nodeSelector={"nvidia.com/gpu.product": PRODUCT},
            tolerations=[{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            rollout={"scaleDownDelaySeconds": 2, "revisionHistoryLimit": 1},
        )
    )
    m.wait_condition(NAME, "Ready", "True", "Available", timeout=VERIFY_SECONDS + 120)
    first = m.get(NAME)["status"]
    [passed] = first["verifications"]
    assert (passed["verdict"], passed["gpuClass"], passed["nodeDriver"]) == ("Passed", PRODUCT, OLD), passed
    old_revision = first["activeRevision"]
    old_template = m.deployment_of(NAME, old_revision).spec.template
    assert _affinity(old_template) == [{"key": FULL, "operator": "In", "values": [OLD]}]
    verified_at = time.monotonic() - started

    pods = GaplessWatch(cluster.core.list_namespaced_pod, m.ns).start()
    try:
        cluster.core.patch_node(node, {"metadata": {"labels": {FULL: NEW}}})
        changed = time.monotonic()

        def widened() -> dict[str, Any] | None:
            status = m.get(NAME).get("status", {})
            ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
            moved = status.get("activeRevision") not in (None, old_revision)
            return status if moved and ready.get("status") == "True" else None

        status = wait_for(
            widened,
            VERIFY_SECONDS + 120,
            "a revision pinned to the new driver serving",
            lambda: m.describe(NAME),
        )
        took = time.monotonic() - changed
        changes = pods.caught_up()
    finally:
        pods.stop()

    new_revision = status["activeRevision"]
    new_template = m.deployment_of(NAME, new_revision).spec.template
    assert _affinity(new_template) == [{"key": FULL, "operator": "In", "values": sorted([OLD, NEW])}]
    record = next(r for r in status["verifications"] if r.get("nodeDriver") == NEW)
    assert (record["verdict"], record["digest"]) == ("Passed", passed["digest"]), record
    assert "DriverVerified" in m.event_reasons(NAME)

    def labels_of(c: Any) -> dict[str, str]:
        return dict(c.obj.metadata.labels or {})

    # The driver verification pod: bound to the node, and when it succeeded.
    driver_pods = [c for c in changes if labels_of(c).get(STEP) == "driver"]
    assert driver_pods, "no driver verification pod was seen"
    assert {c.obj.spec.node_name for c in driver_pods if c.obj.spec.node_name} == {node}
    succeeded = next(c.resource_version for c in driver_pods if c.obj.status.phase == "Succeeded")
    # The pod that was serving when the driver changed under it left the Service first.
    [serving] = [
        p.metadata.name for p in pods.initial if (p.metadata.labels or {}).get(SERVING_LABEL) == NAME
    ]
    left = [c.resource_version for c in changes if c.name == serving and SERVING_LABEL not in labels_of(c)]
    assert left and min(left) < succeeded, f"{serving} kept serving on an unverified driver: {left}"
    assert "PodCordoned" in m.event_reasons(NAME)
    # Every serving pod that got a node after the label changed: only the new revision's, only
    # after the driver verification succeeded.
    bound = [
        c
        for c in changes
        if labels_of(c).get(REVISION_OF) == NAME
        and c.obj.spec.node_name
        and c.name not in {p.metadata.name for p in pods.initial}
    ]
    assert bound, "no pod of the new revision was scheduled"
    assert {labels_of(c)[REVISION] for c in bound} == {new_revision}
    assert {c.obj.spec.node_name for c in bound} == {node}
    first_bound = min(c.resource_version for c in bound)
    assert succeeded < first_bound, (succeeded, first_bound)
    print(f"\nverified and served in {verified_at:.1f}s; label change to new revision serving in {took:.1f}s")
