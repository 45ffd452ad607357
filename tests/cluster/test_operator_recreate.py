"""Recreate on a node without room for two copies: verify, stop the old revision, start the new
(issue 6, test 9).

worker-1 has 4 GPUs.  Three 1-GPU replicas plus the 1-GPU verification pod fit; three old plus
three new do not, so a blue-green rollout could never finish here."""

from __future__ import annotations

from collections.abc import Callable
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
from .watches import Change, GaplessWatch, states

pytestmark = pytest.mark.cluster


SERVING = "clef.riotpiao.com/component=serving"
REVISION = "clef.riotpiao.com/revision"


def live_by_revision(pods: dict[str, Any]) -> dict[str, int]:
    """Pods that hold their GPUs, by revision: every pod that exists and has not finished (a
    terminating pod keeps its GPUs until it is gone)."""
    by_revision: dict[str, int] = {}
    for p in pods.values():
        if p.status.phase not in ("Succeeded", "Failed"):
            rev = p.metadata.labels[REVISION]
            by_revision[rev] = by_revision.get(rev, 0) + 1
    return by_revision


def first(changes: list[Change], what: str, match: Callable[[Change], bool]) -> int:
    """The resourceVersion of the first change that matches; fails naming `what` if none does."""
    for c in changes:
        if match(c):
            return c.resource_version
    raise AssertionError(f"never saw {what}: {[(c.type, c.name, c.resource_version) for c in changes]}")


def job_complete(job: Any) -> bool:
    return any(c.type == "Complete" and c.status == "True" for c in (job.status.conditions or []))


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

        # Every change to the model's pods, Deployments and Jobs from here on, without gaps.
        model = "clef.riotpiao.com/model=coder"
        with (
            GaplessWatch(cluster.core.list_namespaced_pod, namespace, label_selector=SERVING) as pods,
            GaplessWatch(cluster.apps.list_namespaced_deployment, namespace, label_selector=model) as deps,
            GaplessWatch(cluster.batch.list_namespaced_job, namespace, label_selector=model) as jobs,
        ):
            models.set_image("coder", IMAGE_11)
            models.wait_status(
                "coder",
                lambda s: s.get("activeRevision") not in (None, old),
                "the new revision to serve",
                VERIFY_SECONDS + 120,
            )
            models.wait_condition("coder", "Ready", "True", "Available", timeout=60)
        new = models.get("coder")["status"]["activeRevision"]
        assert models.deployment_of("coder", new).status.available_replicas == 3
        assert models.deployment_of("coder", old).spec.replicas == 0

        # Never two revisions holding GPUs, in any state the pods went through.
        overlaps = [s for s in map(live_by_revision, states(pods.initial, pods.changes)) if len(s) > 1]
        assert not overlaps, f"old and new revisions held GPUs at the same time: {overlaps[:3]}"
        unschedulable = [
            f"{c.name}: {cond.message}"
            for c in pods.changes
            for cond in c.obj.status.conditions or []
            if cond.type == "PodScheduled" and cond.reason == "Unschedulable"
        ]
        assert not unschedulable, unschedulable[:3]

        # The promised order, from the resourceVersions of the changes (one etcd orders them all):
        # the new image's verification Job completes, then the old revision is scaled to 0, then
        # its last pod is gone, then the new Deployment asks for replicas, then its pods appear.
        earlier = {j.metadata.name for j in jobs.initial}
        verified = first(
            jobs.changes,
            "the new verification Job complete",
            lambda c: c.name not in earlier and job_complete(c.obj),
        )
        old_name, new_name = f"coder-{old}", f"coder-{new}"
        stopped = first(
            deps.changes, f"{old_name} scaled to 0", lambda c: c.name == old_name and c.obj.spec.replicas == 0
        )
        pod_states = list(states(pods.initial, pods.changes))
        # states() yields one state before the changes and one after each: state i+1 follows change i.
        old_gone = next(
            (
                c.resource_version
                for c, after in zip(pods.changes, pod_states[1:], strict=True)
                if old not in live_by_revision(after) and c.resource_version > stopped
            ),
            None,
        )
        assert old_gone is not None, f"the pods of {old_name} never all went away"
        started = first(
            deps.changes,
            f"{new_name} asking for replicas",
            lambda c: c.name == new_name and (c.obj.spec.replicas or 0) > 0,
        )
        new_pod = first(
            pods.changes, f"a pod of {new_name}", lambda c: c.obj.metadata.labels[REVISION] == new
        )
        order = {"verified": verified, "old scaled to 0": stopped, "old pods gone": old_gone}
        order |= {"new Deployment scaled up": started, "first new pod": new_pod}
        assert list(order.values()) == sorted(order.values()) and len(set(order.values())) == len(order), (
            f"out of order (resourceVersions): {order}"
        )
        models.wait_events("coder", "VerificationPassed", "RevisionScaledDown", "RevisionCreated")
