"""Fail closed on the real control plane (issue 6, tests 4 and 10b): an image that cannot be
pulled, a verification that exceeds its timeout, and a model no node can hold."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Cluster, wait_for
from .operator_support import HANG_IMAGE, UNPULLABLE_IMAGE, Models, clefmodel, operator_running

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
