"""`kubectl logs` for the pods the runner runs: their output kept as a kubelet keeps it, and the
kubelet's log endpoint, which the API server calls for `GET .../pods/<pod>/log`.

Capture: a container's stdout and stderr are two pipes, each read line by line (a line is never
split, however long) and appended in the order read to two files: the plain log that people read
(`logs/verify/<ns>_<pod>_<container>[.<restart>].log`, both streams merged, exactly what `logs`
returns) and a record file beside it (`.cri`: `<RFC 3339 time> <stdout|stderr> F|P <line>`, the
CRI log format) from which the endpoint answers `timestamps`, `sinceTime`/`sinceSeconds` and
`stream`.

Endpoint: HTTPS on 127.0.0.1 with a leaf of the cluster CA, clients must present a certificate
of that CA (the API server's --kubelet-client-certificate).  GET
/containerLogs/<namespace>/<pod>/<container> with the API server's parameters: tailLines,
limitBytes, previous, timestamps, sinceSeconds, sinceTime, follow, stream.
"""

from __future__ import annotations

import contextlib
import logging
import re
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO
from urllib.parse import parse_qs, unquote, urlsplit

log = logging.getLogger("clef.runner")

_PATH = re.compile(r"^/containerLogs/([^/]+)/([^/]+)/([^/]+)$")


def stamp(t: datetime | None = None) -> str:
    return (t or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Record:
    time: str
    stream: str
    line: bytes  # with its newline, if it had one


def parse_records(data: bytes) -> list[Record]:
    """Records of a `.cri` file: `<time> <stream> <F|P> <content>` per line, F for a line that
    ended with a newline, P for one that did not (the output's last, unfinished line)."""
    out = []
    for raw in data.split(b"\n"):
        head = raw.split(b" ", 3)
        if len(head) < 4:
            continue
        newline = b"\n" if head[2] == b"F" else b""
        out.append(Record(head[0].decode(), head[1].decode(), head[3] + newline))
    return out


def record_line(stream: str, line: bytes, when: str | None = None) -> bytes:
    tag, content = (b"F", line[:-1]) if line.endswith(b"\n") else (b"P", line)
    return f"{when or stamp()} {stream} ".encode() + tag + b" " + content + b"\n"


class OutputCapture:
    """Reads a container's two pipes into its plain log and its record file."""

    def __init__(self, plain: Path, records: Path) -> None:
        self.plain = plain.open("ab")
        self.records = records.open("ab")
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def start(self, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        for name, pipe in (("stdout", stdout), ("stderr", stderr)):
            t = threading.Thread(target=self._pump, args=(name, pipe), daemon=True, name=f"log-{name}")
            t.start()
            self.threads.append(t)

    def _pump(self, stream: str, pipe: IO[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):
            for line in iter(pipe.readline, b""):
                with self.lock:
                    # A stream's last line without its newline (only at its end) is closed in the
                    # plain log, so the other stream's next line does not run on from it.  The
                    # record keeps the bytes as written.
                    self.plain.write(line if line.endswith(b"\n") else line + b"\n")
                    self.plain.flush()
                    self.records.write(record_line(stream, line))
                    self.records.flush()
        with contextlib.suppress(OSError):
            pipe.close()

    def close(self, timeout: float = 5.0) -> bool:
        """Once the process has ended: the rest of its output, then the files closed.  A reader
        still blocked after `timeout` (a grandchild holding the pipe) is left behind.  Whether
        all the output was read."""
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self.lock:
            self.plain.close()
            self.records.close()
        return not any(t.is_alive() for t in self.threads)


@dataclass(frozen=True)
class LogQuery:
    tail_lines: int | None = None
    limit_bytes: int | None = None
    previous: bool = False
    timestamps: bool = False
    since: datetime | None = None
    follow: bool = False
    stream: str | None = None  # "stdout" | "stderr" | None (both)

    @classmethod
    def parse(cls, query: str, now: datetime | None = None) -> LogQuery:
        q = {k: v[-1] for k, v in parse_qs(query).items()}

        def number(name: str) -> int | None:
            if name not in q:
                return None
            value = int(q[name])
            if value < 0:
                raise ValueError(f"{name} must not be negative")
            return value

        since = None
        if "sinceTime" in q:
            since = datetime.fromisoformat(q["sinceTime"].replace("Z", "+00:00"))
        elif (seconds := number("sinceSeconds")) is not None:
            since = (now or datetime.now(UTC)) - timedelta(seconds=seconds)
        stream = {"Stdout": "stdout", "Stderr": "stderr", "All": None}.get(q.get("stream", "All"), "bad")
        if stream == "bad":
            raise ValueError("stream must be Stdout, Stderr or All")
        return cls(
            tail_lines=number("tailLines"),
            limit_bytes=number("limitBytes"),
            previous=q.get("previous") == "true",
            timestamps=q.get("timestamps") == "true",
            since=since,
            follow=q.get("follow") == "true",
            stream=stream,
        )


def select(records: list[Record], query: LogQuery) -> bytes:
    """What the kubelet answers for these records: filtered by stream and time, the last
    tailLines, timestamps prefixed if asked, cut at limitBytes."""
    chosen = [r for r in records if query.stream is None or r.stream == query.stream]
    if query.since is not None:
        since = query.since
        chosen = [r for r in chosen if datetime.fromisoformat(r.time.replace("Z", "+00:00")) >= since]
    if query.tail_lines is not None:
        chosen = chosen[-query.tail_lines :] if query.tail_lines else []
    out = b"".join((f"{r.time} ".encode() if query.timestamps else b"") + r.line for r in chosen)
    return out if query.limit_bytes is None else out[: query.limit_bytes]


@dataclass
class ContainerLogs:
    """One container's runs, oldest first, and whether it runs now."""

    runs: list[Path]  # record files
    running: bool = False
    waiting: str = ""


class LogIndex:
    """Which record files belong to which pod's container; kept after a pod finishes (a Job's
    logs are read after it completed) until the pod is deleted."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pods: dict[tuple[str, str], dict[str, ContainerLogs]] = {}

    def started(self, namespace: str, pod: str, container: str, records: Path) -> None:
        with self.lock:
            logs = self.pods.setdefault((namespace, pod), {}).setdefault(container, ContainerLogs([]))
            logs.runs.append(records)
            logs.running, logs.waiting = True, ""

    def stopped(self, namespace: str, pod: str, container: str) -> None:
        with self.lock:
            logs = self.pods.get((namespace, pod), {}).get(container)
            if logs is not None:
                logs.running = False

    def waiting(self, namespace: str, pod: str, container: str, reason: str) -> None:
        with self.lock:
            logs = self.pods.setdefault((namespace, pod), {}).setdefault(container, ContainerLogs([]))
            logs.waiting = reason

    def forget(self, namespace: str, pod: str) -> None:
        with self.lock:
            self.pods.pop((namespace, pod), None)

    def lookup(self, namespace: str, pod: str, container: str) -> ContainerLogs | None:
        with self.lock:
            logs = self.pods.get((namespace, pod), {}).get(container)
            return ContainerLogs(list(logs.runs), logs.running, logs.waiting) if logs else None


class LogError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def choose_run(logs: ContainerLogs | None, namespace: str, pod: str, container: str, previous: bool) -> Path:
    """The record file a request means, or the kubelet's error for it."""
    if logs is None:
        raise LogError(
            404, f'pod "{pod}" in namespace "{namespace}" has no container "{container}" on this runner'
        )
    if previous:
        if len(logs.runs) < 2:
            raise LogError(400, f'previous terminated container "{container}" in pod "{pod}" not found')
        return logs.runs[-2]
    if not logs.runs:
        reason = logs.waiting or "ContainerCreating"
        raise LogError(400, f'container "{container}" in pod "{pod}" is waiting to start: {reason}')
    return logs.runs[-1]


class KubeletEndpoint:
    """The HTTPS server the API server's log requests reach."""

    def __init__(self, index: LogIndex, certfile: Path, keyfile: Path, cafile: Path, port: int = 0) -> None:
        self.index = index
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(certfile), str(keyfile))
        context.load_verify_locations(str(cafile))
        context.verify_mode = ssl.CERT_REQUIRED
        handler = _handler(self._answer)
        self.server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.server.daemon_threads = True
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="kubelet-endpoint")

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, path: str, query: str) -> Iterator[bytes]:
        m = _PATH.match(path)
        if not m:
            raise LogError(404, f"{path}: not served by the clef runner (only /containerLogs/...)")
        namespace, pod, container = (unquote(g) for g in m.groups())
        try:
            q = LogQuery.parse(query)
        except ValueError as e:
            raise LogError(400, f"bad log query: {e}") from None
        run = choose_run(self.index.lookup(namespace, pod, container), namespace, pod, container, q.previous)
        return self._stream(run, q, lambda: self._still_running(namespace, pod, container, run))

    def _still_running(self, namespace: str, pod: str, container: str, run: Path) -> bool:
        logs = self.index.lookup(namespace, pod, container)
        return bool(logs and logs.running and logs.runs and logs.runs[-1] == run)

    @staticmethod
    def _stream(run: Path, q: LogQuery, running: Callable[[], bool]) -> Iterator[bytes]:
        data = run.read_bytes() if run.exists() else b""
        first = select(parse_records(data), q)
        yield first
        if not q.follow or q.previous:
            return
        sent, offset = len(first), len(data)
        # follow: new records until the container stops (limitBytes still counts).
        while True:
            alive = running()
            data = run.read_bytes() if run.exists() else b""
            tail = data[offset:]
            cut = tail.rfind(b"\n") + 1
            if cut:
                chunk = select(parse_records(tail[:cut]), LogQuery(timestamps=q.timestamps, stream=q.stream))
                if q.limit_bytes is not None:
                    chunk = chunk[: max(0, q.limit_bytes - sent)]
                offset += cut
                sent += len(chunk)
                if chunk:
                    yield chunk
            if not alive or (q.limit_bytes is not None and sent >= q.limit_bytes):
                return
            time.sleep(0.2)


def _handler(answer: Callable[[str, str], Iterator[bytes]]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/healthz":
                self._send(200, b"ok")
                return
            try:
                chunks = answer(url.path, url.query)
                first = next(chunks)
            except LogError as e:
                self._send(e.status, str(e).encode())
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for chunk in _chain(first, chunks):
                    if chunk:
                        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args: object) -> None:
            log.debug("kubelet endpoint: " + fmt, *args)

    return Handler


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest
