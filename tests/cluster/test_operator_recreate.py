"""Recreate on a node without room for two copies: verify, stop the old revision, start the new
(issue 6, test 9).

worker-1 has 4 GPUs.  Three 1-GPU replicas plus the 1-GPU verification pod fit; three old plus
three new do not, so a blue-green rollout could never finish here."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import Cluster
from .operator_support import (
    IMAGE_10,
    IMAGE_11,
    VERIFY_SECONDS,
    Models,
    clefmodel,
    operator_running,
    wait_gpus_free,
)

pytestmark = pytest.mark.cluster


class ServingPods:
    """Polls the serving pods and records every moment two revisions held GPUs at once."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster, self.ns = cluster, namespace
        self.overlaps: list[dict[str, int]] = []
        self.unschedulable: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            pods: list[Any] = self.cluster.core.list_namespaced_pod(
                self.ns, label_selector="clef.riotpiao.com/component=serving"
            ).items
            by_revision: dict[str, int] = {}
            for p in pods:
                if p.status.phase in ("Succeeded", "Failed"):
                    continue
                rev = p.metadata.labels["clef.riotpiao.com/revision"]
                by_revision[rev] = by_revision.get(rev, 0) + 1
                for c in p.status.conditions or []:
                    if c.type == "PodScheduled" and c.reason == "Unschedulable":
                        self.unschedulable.append(f"{p.metadata.name}: {c.message}")
            if len(by_revision) > 1:
                self.overlaps.append(by_revision)
            time.sleep(0.2)

    def __enter__(self) -> ServingPods:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_recreate_verifies_then_stops_old_then_starts_new(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    cluster.image_table()
    wait_gpus_free(cluster, "worker-1", 4, capacity=4)
    with operator_running(cluster, namespace, tmp_path) as op:
        models = Models(cluster, namespace, op)
        models.create(
            clefmodel(
                "coder", IMAGE_10, replicas=3, rollout={"strategy": "Recreate", "scaleDownDelaySeconds": 0}
            )
        )
        models.wait_condition("coder", "Ready", "True", "Available", timeout=VERIFY_SECONDS + 120)
        old = models.get("coder")["status"]["activeRevision"]

        with ServingPods(cluster, namespace) as watch:
            models.set_image("coder", IMAGE_11)
            models.wait_status(
                "coder",
                lambda s: s.get("activeRevision") not in (None, old),
                "the new revision to serve",
                VERIFY_SECONDS + 120,
            )
            models.wait_condition("coder", "Ready", "True", "Available", timeout=60)
        assert not watch.overlaps, f"old and new revisions held GPUs at the same time: {watch.overlaps[:3]}"
        assert not watch.unschedulable, watch.unschedulable[:3]
        new = models.get("coder")["status"]["activeRevision"]
        assert models.deployment_of("coder", new).status.available_replicas == 3
        assert models.deployment_of("coder", old).spec.replicas == 0
        reasons = models.event_reasons("coder")
        assert reasons.index("VerificationPassed", 1) < len(reasons), reasons
        assert "RevisionScaledDown" in reasons
