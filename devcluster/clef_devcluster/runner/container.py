"""One container as the runner reports it: its status, its termination message, and ending its
process group, with the kubelet's limits and semantics."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# kubelet's limits: the message is cut at 4 KiB; the log fallback takes at most 80 lines / 2 KiB.
TERMINATION_MESSAGE_LIMIT = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_termination_message(path: Path, log_path: Path, policy: str | None, exit_code: int) -> str:
    try:
        data = path.read_bytes()[:TERMINATION_MESSAGE_LIMIT]
    except OSError:
        data = b""
    if not data.strip() and policy == "FallbackToLogsOnError" and exit_code != 0:
        try:
            lines = log_path.read_bytes().splitlines(keepends=True)[-FALLBACK_LOG_LINES:]
        except OSError:
            lines = []
        data = b"".join(lines)[-FALLBACK_LOG_BYTES:]
    return data.decode("utf-8", errors="ignore")


@dataclass
class ContainerState:
    """One container's status as the runner reports it (the kubelet's ContainerStatus)."""

    name: str
    image: str
    image_id: str = ""
    container_id: str = ""
    restart_count: int = 0
    state: dict[str, Any] = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict[str, Any] = field(default_factory=dict)
    # What the container's probes say (None: it has no such probe, so running is enough).
    probe_started: bool | None = None
    probe_ready: bool | None = None

    @property
    def running(self) -> bool:
        return "running" in self.state

    @property
    def started(self) -> bool:
        return self.running and self.probe_started is not False

    @property
    def ready(self) -> bool:
        return self.started and self.probe_ready is not False

    @property
    def terminated(self) -> dict[str, Any] | None:
        t = self.state.get("terminated")
        return t if isinstance(t, dict) else None

    def to_status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "image": self.image,
            "imageID": self.image_id,
            "containerID": self.container_id or None,
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }


def kill_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            # The leader is gone; helpers it left in the group go too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue
