"""Re-verify when the ground changes, in mode endpoint (issue 37): a new pod of the model that
lands on a node whose driver the endpoint verification never ran on does not serve until a
comparison Job asked that very pod the goldens in place and passed.

Two kwok nodes of a GPU class of this test's own (tainted, so that no other test's pods land on
them), one GPU each.  `edrv` (mode endpoint, candle-vllm, the runner serving its engine for real on
a loopback pod IP) is verified and served on the first, which reports driver OLD.  Then a second
node, reporting driver NEW, joins and the model is scaled to two replicas: the first node is full,
so the new pod lands on the second.  The serving revision is the promoted preview, not pinned to
any driver; what holds the pod back is the serving label (`plan_endpoint_drivers`).  The order is
read from one gap-free watch of the namespace's pods (watches.py), not sampled: the new pod never
carries the serving label before the in-place driver verification's pod succeeded, and then it
does.  (Runner pods have loopback IPs, so no EndpointSlice holds them: the label is what a
Service would select.)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from clef_devcluster.checkpoints import write_chat_checkpoint
from clef_devcluster.config import ENGINE_IMAGE_PREFIX
from clef_devcluster.gpunode import kwok_gpu_node
from clef_devcluster.rest import Rest, object_path

from .conftest import Cluster, wait_for
from .operator_support import VERIFY_SECONDS, Models, OperatorProcess, delete_models, endpoint_model
from .watches import GaplessWatch

pytestmark = pytest.mark.cluster

NAME = "edrv"
ENGINE = f"{ENGINE_IMAGE_PREFIX}candle-vllm"
GOOD = f"{ENGINE}:0.8.4"
PRODUCT = "Endpoint-Driver-Test-GPU"
TAINT = "clef.riotpiao.com/endpoint-driver-test"
FULL = "nvidia.com/cuda.driver-version.full"
OLD, NEW = "550.127.05", "570.86.15"
STEP = "clef.riotpiao.com/verification-step"
COMPONENT = "clef.riotpiao.com/component"
REVISION_OF = "clef.riotpiao.com/revision-of"
SERVING_LABEL = "clef.riotpiao.com/model"
PROBE_POD_UID = "clef.riotpiao.com/probe-pod-uid"


@dataclass
class Setup:
    models: Models
    cluster: Cluster
    rest: Rest
    checkpoint: Path
    nodes: list[str]


def _add_node(rest: Rest, name: str, driver: str, address: str) -> None:
    # One GPU: the goldens Job's, then the preview's, which is promoted and keeps it.
    node, status = kwok_gpu_node(
        name,
        product=PRODUCT,
        taint=TAINT,
        gpus=1,
        memory_mib=16384,
        room={"cpu": "32", "memory": "256Gi", "pods": "110"},
        labels={FULL: driver, "nvidia.com/cuda.runtime-version.full": "12.4"},
        addresses=[{"type": "InternalIP", "address": address}],
    )
    rest.apply(node)
    rest.patch_status(object_path(node), status)


@pytest.fixture(scope="module")
def setup(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    table = cluster.image_table()  # a missing harness runner is a stated skip
    entry = table.lookup(GOOD)
    assert entry is not None and entry.kind == "serve", f"{GOOD} is not a serve image in the table"
    root = tmp_path_factory.mktemp("endpoint-driver")
    checkpoint = write_chat_checkpoint(root / "clef-flash")
    suffix = uuid.uuid4().hex[:6]
    namespace = f"t-edriver-{suffix}"
    rest = Rest(cluster.kubeconfig)
    nodes: list[str] = []
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    operator = OperatorProcess(cluster.kubeconfig, namespace, root / "operator.log")
    operator.start()
    try:
        nodes.append(f"edriver-old-{suffix}")
        _add_node(rest, nodes[0], OLD, "10.10.0.38")
        yield Setup(Models(cluster, namespace, operator), cluster, rest, checkpoint, nodes)
    finally:
        delete_models(cluster, namespace)
        operator.stop()
        cluster.core.delete_namespace(namespace)
        for node in nodes:
            cluster.core.delete_node(node)


def _labels(c: Any) -> dict[str, str]:
    return dict(c.obj.metadata.labels or {})


def test_a_new_pod_on_a_new_driver_serves_only_after_it_was_verified_in_place(setup: Setup) -> None:
    m, cluster = setup.models, setup.cluster
    entry = cluster.image_table().lookup(GOOD)
    assert entry is not None
    pinned = f"{ENGINE}@sha256:{entry.digest}"
    body = endpoint_model(
        NAME,
        setup.checkpoint,
        pinned,
        60,
        nodeSelector={"nvidia.com/gpu.product": PRODUCT},
        tolerations=[{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
    )
    started = time.monotonic()
    m.create(body)
    m.wait_condition(NAME, "Ready", "True", "Available", timeout=VERIFY_SECONDS + 120)
    first = m.get(NAME)["status"]
    passed = first["verifications"][0]
    assert (passed["step"], passed["verdict"], passed["gpuClass"]) == ("endpoint", "Passed", PRODUCT), passed
    assert passed["nodeDriver"] == OLD, "the pass names the driver of the preview pod's node"
    verified_at = time.monotonic() - started

    pods = GaplessWatch(cluster.core.list_namespaced_pod, m.ns).start()
    try:
        setup.nodes.append(setup.nodes[0].replace("-old-", "-new-"))
        _add_node(setup.rest, setup.nodes[1], NEW, "10.10.0.39")
        m.patch(NAME, {"spec": {"replicas": 2}})
        scaled = time.monotonic()

        def verified_and_serving() -> tuple[str, dict[str, Any]] | None:
            """The pod on the new node carrying the serving label, once a record names NEW."""
            status = m.get(NAME).get("status", {})
            record = next((r for r in status.get("verifications", []) if r.get("nodeDriver") == NEW), None)
            for p in cluster.core.list_namespaced_pod(m.ns, label_selector=f"{REVISION_OF}={NAME}").items:
                on_new = p.spec.node_name == setup.nodes[1]
                if record is not None and on_new and (p.metadata.labels or {}).get(SERVING_LABEL) == NAME:
                    return str(p.metadata.name), record
            return None

        newpod, record = wait_for(
            verified_and_serving,
            VERIFY_SECONDS + 120,
            "a verification of driver NEW and the pod on its node carrying the serving label",
            lambda: m.describe(NAME),
        )
        took = time.monotonic() - scaled
        changes = pods.caught_up()
    finally:
        pods.stop()

    status = m.get(NAME)["status"]
    assert (record["verdict"], record["digest"], record["step"]) == ("Passed", passed["digest"], "endpoint")
    assert record["key"] != passed["key"], "a key of its own (driver_key), extending the pass"
    assert status["activeRevision"] == first["activeRevision"], "no re-render: the same revision serves"
    m.wait_events(NAME, "DriverVerificationStarted", "DriverVerified")

    # The driver verification: a comparison Job that asked the new pod, and when its pod succeeded.
    driver_pods = [c for c in changes if _labels(c).get(STEP) == "driver"]
    assert driver_pods, "no driver verification pod was seen"
    succeeded = min(c.resource_version for c in driver_pods if c.obj.status.phase == "Succeeded")
    [job] = [j for j in m.jobs(NAME) if (j.metadata.labels or {}).get(STEP) == "driver"]
    argv = job.spec.template.spec.containers[0].command
    assert argv[:2] == ["clef-runtime", "endpoint-check"] and "--goldens-sha256" in argv
    mine = [c for c in changes if c.name == newpod]
    assert job.metadata.annotations[PROBE_POD_UID] == mine[-1].obj.metadata.uid, "it asked the new pod itself"
    assert argv[argv.index("--url") + 1].startswith(f"http://{mine[-1].obj.status.pod_ip}:")
    # The new pod: bound to the new node, never labelled before the verification succeeded.
    labelled = [c.resource_version for c in mine if _labels(c).get(SERVING_LABEL) == NAME]
    assert labelled and min(labelled) > succeeded, (
        f"{newpod} carried the serving label at {min(labelled)} before its driver's verification"
        f" succeeded at {succeeded}"
    )
    ready_unlabelled = [
        c
        for c in mine
        if SERVING_LABEL not in _labels(c)
        and any(s.type == "Ready" and s.status == "True" for s in (c.obj.status.conditions or []))
    ]
    assert ready_unlabelled, f"{newpod} was never Ready and held back: the test proved nothing"
    # The pod that served all along on the verified driver never lost the label.
    [served] = [p.metadata.name for p in pods.initial if (p.metadata.labels or {}).get(SERVING_LABEL) == NAME]
    assert not [c for c in changes if c.name == served and SERVING_LABEL not in _labels(c)]
    print(
        f"\nverified and served in {verified_at:.1f}s; scale-up to the new pod serving on {NEW} in {took:.1f}s"
    )
