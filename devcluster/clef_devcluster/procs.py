"""Processes the harness started, recorded so that `down` ends exactly those and nothing else.

A pid alone is not an identity (pids are reused), so each record also keeps the process's start
time from /proc/<pid>/stat; a pid whose start time differs is someone else's process and is left
alone.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    starttime: int
    # A verification command runs in its own session; its whole process group goes with it.
    group: bool = False


def proc_starttime(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 2 (comm) is in parentheses and may contain spaces; fields after it are plain.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def record(name: str, pid: int, *, group: bool = False) -> ProcessRecord:
    start = proc_starttime(pid)
    if start is None:
        raise RuntimeError(f"{name} (pid {pid}) exited immediately")
    return ProcessRecord(name, pid, start, group)


def is_alive(rec: ProcessRecord) -> bool:
    if proc_starttime(rec.pid) != rec.starttime:
        return False
    try:
        state = Path(f"/proc/{rec.pid}/stat").read_text()
    except OSError:
        return False
    # A zombie has exited; only its parent's wait() is missing.
    return state[state.rindex(")") + 2] != "Z"


def _signal(rec: ProcessRecord, sig: int) -> None:
    try:
        if rec.group:
            os.killpg(rec.pid, sig)
        else:
            os.kill(rec.pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError as e:
        raise RuntimeError(f"not allowed to signal {rec.name} (pid {rec.pid})") from e


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg(…, 0) also succeeds for a group of zombies, which are as good as gone.
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def stop(records: list[ProcessRecord], *, grace: float = 10.0) -> list[ProcessRecord]:
    """SIGTERM the live ones, wait up to `grace` seconds, SIGKILL what remains.  Returns survivors."""

    def alive(r: ProcessRecord) -> bool:
        return is_alive(r) or (
            r.group and proc_starttime(r.pid) in (None, r.starttime) and group_alive(r.pid)
        )

    live = [r for r in records if alive(r)]
    for r in live:
        _signal(r, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = [r for r in live if alive(r)]
    for r in live:
        _signal(r, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = [r for r in live if alive(r)]
    return live


def free_port() -> int:
    # Bound and released at once: the component binds it a moment later.  A collision is possible
    # in principle and shows up as a component failing to start, which `up` reports with its log.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening_ports() -> set[int]:
    """Every TCP port some process on this machine listens on (IPv4 and IPv6)."""
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def port_accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class ProcessLedger:
    """The records of one state directory, kept in a JSON file that survives the caller."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[ProcessRecord]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return []
        return [ProcessRecord(**r) for r in data]

    def save(self, records: list[ProcessRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(r) for r in records], indent=1))
        tmp.replace(self.path)

    def add(self, rec: ProcessRecord) -> None:
        self.save([*self.load(), rec])

    def remove(self, pid: int) -> None:
        self.save([r for r in self.load() if r.pid != pid])
