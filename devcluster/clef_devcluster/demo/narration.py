"""How the demo speaks: timestamped lines, and a Narrator that turns two snapshots of a ClefModel
into one line per change."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from .snapshot import Snapshot


def clock() -> str:
    return time.strftime("%H:%M:%S")


def say(message: str) -> None:
    print(f"[{clock()}] {message}", flush=True)


def detail(message: str) -> None:
    print(f"           {message}", flush=True)


def heading(title: str) -> None:
    print(f"\n── {title} " + "─" * max(4, 78 - len(title)), flush=True)


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


_DIGEST = re.compile(r"@sha256:([0-9a-f]{12})[0-9a-f]{52}")


def short(text: str, limit: int = 200) -> str:
    """One line, digests abbreviated (`@sha256:82003baffba5…`), at most `limit` characters."""
    text = _DIGEST.sub(r"@sha256:\1…", " ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"


_JOBS = {
    "goldens": "goldens Job",
    "endpoint": "comparison Job",
    "probe": "probe Job",
    "verify": "verification Job",
}
_RUNS = {
    "goldens": "clef-runtime goldens from the checkpoint",
    "endpoint": "clef-runtime endpoint-check against the preview",
    "probe": "clef-runtime endpoint-check against a serving pod",
    "verify": "clef-runtime verify",
}
# CPU-only Jobs: they ask an engine over HTTP.
_NO_GPU = ("endpoint", "probe")

_TOLD_ELSEWHERE: dict[str, set[tuple[str, str]]] = {
    "Verified": {("Unknown", "VerificationPending"), ("Unknown", "VerificationRunning")},
    "Progressing": {
        ("True", "VerificationPending"),
        ("True", "VerificationRunning"),
        ("False", "VerificationFailed"),
    },
    "Degraded": {("False", "AsExpected")},
}


@dataclass
class Narrator:
    """Prints what changed between two snapshots of a model, one line per change."""

    node_gpus: dict[str, str]
    last: dict[str, Snapshot] = field(default_factory=dict)

    def tell(self, name: str, snap: Snapshot) -> None:
        before = self.last.get(name)
        self.last[name] = snap
        for line in changes(f"{name}:", before, snap, self.node_gpus):
            say(line)


def changes(who: str, before: Snapshot | None, snap: Snapshot, node_gpus: dict[str, str]) -> list[str]:
    """One line per change from `before` (None: nothing seen yet) to `snap`, each starting `who`."""
    return [
        *_job_lines(who, before, snap),
        *_pod_lines(who, before, snap, node_gpus),
        *_deployment_lines(who, before, snap),
        *_service_lines(who, before, snap),
        *_condition_lines(who, before, snap),
    ]


def _job_lines(who: str, before: Snapshot | None, snap: Snapshot) -> list[str]:
    """Jobs created, and Jobs finished."""
    old_jobs = before.jobs if before else {}
    lines = []
    for job, state in snap.jobs.items():
        what = _JOBS.get(snap.job_steps.get(job, ""), "verification Job")
        if job not in old_jobs:
            lines.append(f"{who} {what} {job} created ({snap.job_images.get(job, '?')})")
        elif old_jobs[job] != state and state in ("Complete", "Failed"):
            lines.append(f"{who} {what} {job} finished: {state}")
    return lines


def _pod_lines(who: str, before: Snapshot | None, snap: Snapshot, node_gpus: dict[str, str]) -> list[str]:
    """Verification pods scheduled, and running: what their Job runs and where."""
    old_pods = before.pods if before else {}
    lines = []
    for pod, (job, phase, node) in snap.pods.items():
        if old_pods.get(pod, ("", "", ""))[1:] == (phase, node):
            continue
        if phase == "Running":
            gpu = node_gpus.get(node, "")
            step = snap.job_steps.get(job, "verify")
            where = f"on {node}, no GPU" if step in _NO_GPU else f"on {node}{', ' + gpu if gpu else ''}"
            lines.append(
                f"{who} waiting for {_JOBS.get(step, 'verification Job')} {job} (running {_RUNS.get(step, step)} {where})…"
            )
        elif phase == "Pending" and node:
            lines.append(f"{who} verification pod {pod} scheduled on {node}, starting")
    return lines


def _deployment_lines(who: str, before: Snapshot | None, snap: Snapshot) -> list[str]:
    """Previews and Deployments created, ready, scaled."""
    old_deps = before.deployments if before else {}
    # A preview loses its annotations when it goes to 0 or is promoted: still a preview here.
    previews = snap.previews | (before.previews if before else set())
    lines = []
    for dep, now in snap.deployments.items():
        if old_deps.get(dep) == now:
            continue
        line = (
            _preview_line(who, dep, now, old_deps)
            if dep in previews
            else _serving_line(who, dep, now, old_deps.get(dep))
        )
        if line:
            lines.append(line)
    return lines


def _preview_line(
    who: str, dep: str, now: tuple[int, int], old_deps: dict[str, tuple[int, int]]
) -> str | None:
    """A preview that changed (the candidate's engine, which no Service selects)."""
    replicas, available = now
    if available and replicas:
        return f"{who} preview {dep} Ready ({available}/{replicas}; no Service selects it)"
    if dep not in old_deps:
        if replicas:
            return f"{who} preview {dep} created: the candidate's engine, {replicas} replica, no Service"
        return f"{who} preview {dep} created at 0 replicas (no Service)"
    if replicas != old_deps[dep][0]:
        return f"{who} preview {dep} scaled to {replicas}"
    return None


def _serving_line(who: str, dep: str, now: tuple[int, int], old: tuple[int, int] | None) -> str:
    """A Deployment (not a preview) created (`old` None), or whose replicas or available changed."""
    replicas, available = now
    if old is None:
        ready = f", {available}/{replicas} available" if available else ""
        return f"{who} Deployment {dep} created ({replicas} replica{'s' if replicas != 1 else ''}{ready})"
    return f"{who} Deployment {dep}: {available}/{replicas} available"


def _service_lines(who: str, before: Snapshot | None, snap: Snapshot) -> list[str]:
    """The Service's selector moved to another revision."""
    old_svc = before.service if before else None
    if snap.service and (old_svc is None or old_svc[0] != snap.service[0]):
        rev, ip = snap.service
        return [f"{who} Service now selects revision {rev or '(none)'} (ClusterIP {ip})"]
    return []


def _condition_lines(who: str, before: Snapshot | None, snap: Snapshot) -> list[str]:
    """Conditions whose status or reason changed, but for what the other lines tell already."""
    lines = []
    for type_ in ("Verified", "Progressing", "Ready", "Degraded", "Serving"):
        new = snap.condition(type_)
        old = before.condition(type_) if before else {}
        key = (new.get("status"), new.get("reason"))
        if not new or key == (old.get("status"), old.get("reason")):
            continue
        # Degraded going back to False is news; its steady False is not.
        cleared = type_ == "Degraded" and old.get("status") == "True"
        if key in _TOLD_ELSEWHERE.get(type_, ()) and not cleared:
            continue
        message = short(new.get("message", ""))
        lines.append(f"{who} {type_}={new['status']} ({new['reason']})" + (f": {message}" if message else ""))
    return lines
