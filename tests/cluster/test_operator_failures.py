"""Fail closed, and never stuck silently, on the real control plane (issue 6, tests 4 and 10b):
an image that cannot be pulled, a verification that exceeds its timeout, a model no node can
hold, and a serving pod that crash-loops."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Cluster, wait_for
from .operator_support import (
    HANG_IMAGE,
    UNPULLABLE_IMAGE,
    VERIFY_SECONDS,
    Models,
    clefmodel,
    operator_running,
)

pytestmark = pytest.mark.cluster


@pytest.fixture
def models(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[Models]:
    cluster.image_table()
    with operator_running(cluster, namespace, tmp_path) as op:
        yield Models(cluster, namespace, op)


def test_unpullable_verification_image_fails_closed(models: Models) -> None:
    models.create(clefmodel("pull", UNPULLABLE_IMAGE))
    verified = models.wait_condition("pull", "Verified", "False", timeout=90)
    assert verified["reason"] == "ImagePullFailed", verified
    assert "ErrImagePull" in verified["message"] or "ImagePullBackOff" in verified["message"]
    assert models.condition("pull", "Degraded")["status"] == "True"
    assert models.condition("pull", "Ready")["status"] == "False"
    assert models.deployments("pull") == [], "nothing may serve an image that was never verified"
    wait_for(lambda: not models.jobs("pull"), 60, "the undecidable Job to be deleted (it held a GPU)")


def test_verification_exceeding_its_timeout_fails_closed(models: Models) -> None:
    models.create(clefmodel("slow", HANG_IMAGE, verification={"timeoutSeconds": 15}))
    verified = models.wait_condition("slow", "Verified", "False", timeout=120)
    assert verified["reason"] == "VerificationTimeout", verified
    assert "15s" in verified["message"]
    assert models.deployments("slow") == []
    assert models.condition("slow", "Ready")["status"] == "False"


def test_more_gpus_than_any_node_has_is_unschedulable_with_the_schedulers_message(models: Models) -> None:
    # 8 GPUs per replica (tensor-parallel 4 x pipeline 2 under vLLM); the largest node has 4.
    models.create(
        clefmodel("huge", engine="vllm", gpus=8, tensorParallel=4, gpuMemoryMiB=16384, nodeSelector={})
    )
    verified = models.wait_condition("huge", "Verified", "Unknown", "Unschedulable", timeout=60)
    assert "Insufficient nvidia.com/gpu" in verified["message"], verified
    degraded = models.wait_condition("huge", "Degraded", "True", "Unschedulable", timeout=30)
    assert "Insufficient nvidia.com/gpu" in degraded["message"]
    assert models.deployments("huge") == []


def test_crash_looping_serving_pod_surfaces_its_last_words(models: Models, cluster: Cluster) -> None:
    """kwok plays a kubelet whose containers never fail; here the test plays the kubelet of a
    node where the engine panics at start (no libcuda without runtimeClassName), writing the
    pod status a real kubelet would."""
    models.create(clefmodel("crash"))
    models.wait_condition("crash", "Ready", "True", "Available", timeout=VERIFY_SECONDS + 120)
    revision = models.get("crash")["status"]["activeRevision"]
    (pod,) = cluster.core.list_namespaced_pod(
        models.ns, label_selector=f"clef.riotpiao.com/revision={revision},clef.riotpiao.com/component=serving"
    ).items
    panic = "thread 'main' panicked: libcuda.so.1: cannot open shared object file: No such file or directory"
    status = {
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "ContainersReady", "status": "False"},
            ],
            "containerStatuses": [
                {
                    "name": "engine",
                    "image": pod.spec.containers[0].image,
                    "imageID": "",
                    "ready": False,
                    "started": False,
                    "restartCount": 4,
                    "state": {
                        "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 1m20s restarting"}
                    },
                    "lastState": {"terminated": {"exitCode": 101, "reason": "Error", "message": panic}},
                }
            ],
        }
    }
    cluster.core.patch_namespaced_pod_status(
        pod.metadata.name, models.ns, status, _content_type="application/strategic-merge-patch+json"
    )
    degraded = models.wait_condition("crash", "Degraded", "True", "CrashLoopBackOff", timeout=30)
    assert "libcuda.so.1" in degraded["message"], degraded
    ready = models.wait_condition("crash", "Ready", "False", "RevisionUnavailable", timeout=30)
    assert "libcuda.so.1" in ready["message"], ready
