"""The demo's Narrator: one line per change between two snapshots of a ClefModel (what `make demo`
prints between its steps), and nothing for what did not change or is told elsewhere."""

from __future__ import annotations

import re
from typing import Any

import pytest

from clef_devcluster.demo.narration import Narrator
from clef_devcluster.demo.snapshot import Snapshot


def _snap(
    *,
    jobs: dict[str, str] | None = None,
    steps: dict[str, str] | None = None,
    pods: dict[str, tuple[str, str, str]] | None = None,
    deployments: dict[str, tuple[int, int]] | None = None,
    service: tuple[str, str] | None = None,
    previews: set[str] | None = None,
    conditions: list[dict[str, Any]] | None = None,
) -> Snapshot:
    jobs = jobs or {}
    return Snapshot(
        model={"metadata": {"generation": 1}, "status": {"conditions": conditions or []}},
        jobs=jobs,
        job_images={job: "registry.clef.test/clef-runtime:1.0" for job in jobs},
        job_steps=steps or {},
        pods=pods or {},
        deployments=deployments or {},
        service=service,
        previews=previews or set(),
    )


def _told(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [re.sub(r"^\[\d\d:\d\d:\d\d\] ", "", line) for line in capsys.readouterr().out.splitlines()]


def test_each_change_is_told_once_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    narrator = Narrator({"worker-1": "Tesla-V100-SXM2-16GB"})
    steps = {"m-goldens-1": "goldens", "m-check-1": "endpoint"}
    pending = [{"type": "Verified", "status": "Unknown", "reason": "VerificationPending"}]
    narrator.tell("m", _snap(jobs={"m-goldens-1": "Pending"}, steps=steps, conditions=pending))
    narrator.tell(
        "m",
        _snap(
            jobs={"m-goldens-1": "Running"},
            steps=steps,
            pods={"m-goldens-1-x": ("m-goldens-1", "Running", "worker-1")},
            conditions=pending,
        ),
    )
    narrator.tell(
        "m",
        _snap(
            jobs={"m-goldens-1": "Complete", "m-check-1": "Running"},
            steps=steps,
            pods={
                "m-goldens-1-x": ("m-goldens-1", "Succeeded", "worker-1"),
                "m-check-1-y": ("m-check-1", "Running", "worker-2"),
                "m-verify-z": ("m-verify", "Pending", "worker-2"),
            },
            deployments={"m-preview": (1, 0)},
            previews={"m-preview"},
            conditions=pending,
        ),
    )
    narrator.tell(
        "m",
        _snap(
            jobs={"m-goldens-1": "Complete", "m-check-1": "Complete"},
            steps=steps,
            deployments={"m-preview": (1, 1), "m-rev": (2, 2)},
            previews={"m-preview"},
            service=("rev", "10.96.0.10"),
            conditions=[
                {
                    "type": "Verified",
                    "status": "True",
                    "reason": "Verified",
                    "message": "all   checks\npassed",
                },
                {"type": "Progressing", "status": "True", "reason": "VerificationRunning"},
                {"type": "Degraded", "status": "False", "reason": "AsExpected"},
            ],
        ),
    )
    assert _told(capsys) == [
        "m: goldens Job m-goldens-1 created (registry.clef.test/clef-runtime:1.0)",
        "m: waiting for goldens Job m-goldens-1 (running clef-runtime goldens from the checkpoint"
        " on worker-1, Tesla-V100-SXM2-16GB)…",
        "m: goldens Job m-goldens-1 finished: Complete",
        "m: comparison Job m-check-1 created (registry.clef.test/clef-runtime:1.0)",
        "m: waiting for comparison Job m-check-1 (running clef-runtime endpoint-check against the"
        " preview on worker-2, no GPU)…",
        "m: verification pod m-verify-z scheduled on worker-2, starting",
        "m: preview m-preview created: the candidate's engine, 1 replica, no Service",
        "m: comparison Job m-check-1 finished: Complete",
        "m: preview m-preview Ready (1/1; no Service selects it)",
        "m: Deployment m-rev created (2 replicas, 2/2 available)",
        "m: Service now selects revision rev (ClusterIP 10.96.0.10)",
        "m: Verified=True (Verified): all checks passed",
    ]


def test_deployments_scaling_service_and_degraded_going_back(capsys: pytest.CaptureFixture[str]) -> None:
    degraded = {"type": "Degraded", "status": "True", "reason": "ServingUnavailable", "message": "x"}
    narrator = Narrator(
        {},
        {
            "m": _snap(
                deployments={"m-preview": (1, 1), "m-rev": (1, 1)},
                previews={"m-preview"},
                service=("rev", "10.96.0.10"),
                conditions=[degraded],
            )
        },
    )
    # The preview's annotations are gone once it is scaled to 0: still a preview to the narrator.
    narrator.tell(
        "m",
        _snap(
            deployments={"m-preview": (0, 0), "m-rev": (1, 0), "m-one": (1, 0)},
            service=("rev", "10.96.0.10"),
            conditions=[{**degraded, "status": "False", "reason": "AsExpected", "message": ""}],
        ),
    )
    narrator.tell(
        "m",
        _snap(
            deployments={"m-preview": (0, 0), "m-rev": (1, 0), "m-one": (1, 0)},
            service=("", "10.96.0.10"),
            conditions=[{**degraded, "status": "False", "reason": "AsExpected"}],
        ),
    )
    assert _told(capsys) == [
        "m: preview m-preview scaled to 0",
        "m: Deployment m-rev: 0/1 available",
        "m: Deployment m-one created (1 replica)",
        "m: Degraded=False (AsExpected)",
        "m: Service now selects revision (none) (ClusterIP 10.96.0.10)",
    ]


def test_nothing_is_told_when_nothing_changed(capsys: pytest.CaptureFixture[str]) -> None:
    snap = _snap(
        jobs={"j": "Running"},
        pods={"p": ("j", "Running", "worker-1")},
        deployments={"d": (1, 1)},
        service=("rev", "10.96.0.10"),
        conditions=[{"type": "Ready", "status": "True", "reason": "Ready"}],
    )
    narrator = Narrator({}, {"m": snap})
    narrator.tell("m", snap)
    assert _told(capsys) == []


def test_a_preview_first_seen_at_zero_replicas_is_told(capsys: pytest.CaptureFixture[str]) -> None:
    """A preview the narrator first sees already at 0 replicas (created and scaled down between two
    snapshots) is told as created at 0, not a KeyError on a Deployment it never saw."""
    narrator = Narrator({}, {"m": _snap(deployments={"m-rev": (1, 1)})})
    narrator.tell("m", _snap(deployments={"m-preview": (0, 0), "m-rev": (1, 1)}, previews={"m-preview"}))
    assert _told(capsys) == ["m: preview m-preview created at 0 replicas (no Service)"]
