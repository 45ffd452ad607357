"""The operator killed (SIGKILL) mid-rollout at each phase and restarted converges to the right end
state, with one verification per image (issue 6, test 7)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clef_devcluster.images import put_image

from .conftest import Cluster, wait_for
from .operator_support import VERIFY_SECONDS, Models, OperatorProcess, clefmodel, delete_models

pytestmark = pytest.mark.cluster

Status = dict[str, Any]


def verifying(key_before: str) -> Callable[[Models], bool]:
    def check(models: Models) -> bool:
        return any(
            j.metadata.labels["clef.riotpiao.com/verification-key"] != key_before for j in models.jobs("m")
        )

    return check


def verified(key_before: str) -> Callable[[Models], bool]:
    def check(models: Models) -> bool:
        records = models.get("m").get("status", {}).get("verifications", [])
        return bool(records) and records[0]["key"] != key_before and records[0]["verdict"] == "Passed"

    return check


def switched(active_before: str) -> Callable[[Models], bool]:
    def check(models: Models) -> bool:
        return models.get("m").get("status", {}).get("activeRevision") not in (None, active_before)

    return check


PHASES = ["verifying", "verified", "switched"]


def test_killed_at_each_phase_converges(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    cluster.image_table()
    op = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "operator.log")
    models = Models(cluster, namespace, op)
    op.start()
    try:
        models.create(clefmodel("m", rollout={"scaleDownDelaySeconds": 3}))
        models.wait_condition("m", "Ready", "True", "Available", timeout=VERIFY_SECONDS + 120)
        for phase in PHASES:
            status: Status = models.get("m")["status"]
            tag = f"registry.clef.test/clef-runtime:restart-{phase}-{uuid.uuid4().hex[:6]}"
            entry = put_image(cluster.core, tag, "good")
            probe = {
                "verifying": verifying(status["verificationKey"]),
                "verified": verified(status["verificationKey"]),
                "switched": switched(status["activeRevision"]),
            }[phase]
            models.set_image("m", tag)
            wait_for(
                lambda p=probe: p(models), VERIFY_SECONDS + 60, f"phase {phase}", lambda: models.describe("m")
            )
            op.kill()
            if phase == "verifying":
                # The Job finishes while no operator runs; its verdict must still be read.
                wait_for(
                    lambda t=tag: any(
                        any(
                            c.type in ("Complete", "Failed") and c.status == "True"
                            for c in j.status.conditions or []
                        )
                        for j in models.jobs("m")
                        if j.metadata.annotations.get("clef.riotpiao.com/image") == t
                    ),
                    VERIFY_SECONDS,
                    "the Job to finish with the operator down",
                )
            else:
                time.sleep(4)  # past scaleDownDelaySeconds while nobody watches
            op.start()
            models.wait_status(
                "m",
                lambda s, e=entry: s.get("activeImage") == e.image_id,
                f"convergence after a kill at {phase}",
                VERIFY_SECONDS + 120,
            )
            models.wait_condition("m", "Progressing", "False", "RolloutComplete", timeout=60)
            models.wait_condition("m", "Ready", "True", "Available", timeout=30)
            active = models.get("m")["status"]["activeRevision"]
            wait_for(
                lambda a=active: all(
                    (d.spec.replicas or 0) == 0
                    for d in models.deployments("m")
                    if d.metadata.name != f"m-{a}"
                ),
                60,
                "only the active revision running",
            )
            jobs = [
                j for j in models.jobs("m") if j.metadata.annotations.get("clef.riotpiao.com/image") == tag
            ]
            assert len(jobs) == 1, (
                f"{phase}: {len(jobs)} verifications of one image: {[j.metadata.name for j in jobs]}"
            )
        assert op.starts == 1 + len(PHASES)
    finally:
        if not op.alive():
            op.start()
        delete_models(cluster, namespace)
        op.stop()
