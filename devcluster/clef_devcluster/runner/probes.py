"""Probes as a kubelet runs them: startup first (liveness and readiness wait for it), then
readiness and liveness, each on its own period, thresholds counted over consecutive results.

httpGet (2xx/3xx is success, against the pod's address unless the probe names a host) and
tcpSocket are run; an exec probe is not (the runner has no container to exec into): it fails,
saying so, so that a pod never reads Ready on a check that did not happen.
"""

from __future__ import annotations

import socket
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
KINDS = ("startup", "readiness", "liveness")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # The kubelet counts a redirect as success without following it off the pod.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def resolve_port(port: int | str, container: Obj) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"port {port!r} is not a named port of container {container.get('name')}")


@dataclass
class Probe:
    kind: str
    action: Obj  # httpGet / tcpSocket / exec, as in the spec
    port: int | None
    period: float = 10.0
    timeout: float = 1.0
    initial_delay: float = 0.0
    success_threshold: int = 1
    failure_threshold: int = 3
    # consecutive results and the verdict they add up to (None: not decided yet)
    successes: int = 0
    failures: int = 0
    verdict: bool | None = None
    last_message: str = ""
    next_due: float = field(default=0.0)

    @classmethod
    def from_spec(cls, kind: str, spec: Obj | None, container: Obj) -> Probe | None:
        if not spec:
            return None
        action: Obj = {k: spec[k] for k in ("httpGet", "tcpSocket", "exec", "grpc") if k in spec}
        port = None
        for k in ("httpGet", "tcpSocket"):
            if k in action:
                port = resolve_port(action[k]["port"], container)
        return cls(
            kind=kind,
            action=action,
            port=port,
            period=float(spec.get("periodSeconds") or 10),
            timeout=float(spec.get("timeoutSeconds") or 1),
            initial_delay=float(spec.get("initialDelaySeconds") or 0),
            # Liveness and startup probes must have successThreshold 1 (API validation).
            success_threshold=int(spec.get("successThreshold") or 1),
            failure_threshold=int(spec.get("failureThreshold") or 3),
        )

    def record(self, ok: bool, message: str = "") -> bool | None:
        """Count one result; returns the verdict when this result changes it, else None."""
        self.last_message = message
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            flip = self.successes >= self.success_threshold and self.verdict is not True
            if flip:
                self.verdict = True
                return True
        else:
            self.failures, self.successes = self.failures + 1, 0
            flip = self.failures >= self.failure_threshold and self.verdict is not False
            if flip:
                self.verdict = False
                return False
        return None

    def reset(self, now: float) -> None:
        """A new container: nothing counted, first probe after initialDelaySeconds."""
        self.successes = self.failures = 0
        self.verdict = None
        self.next_due = now + self.initial_delay


def run_probe(probe: Probe, pod_ip: str) -> tuple[bool, str]:
    """One probe now: (success, what failed)."""
    if "httpGet" in probe.action:
        return _http(probe, pod_ip)
    if "tcpSocket" in probe.action:
        host = probe.action["tcpSocket"].get("host") or pod_ip
        try:
            with socket.create_connection((host, int(probe.port or 0)), timeout=probe.timeout):
                return True, ""
        except OSError as e:
            return False, f"dial tcp {host}:{probe.port}: {e}"
    return False, f"{', '.join(probe.action) or 'this'} probe is not supported by the local runner"


def _http(probe: Probe, pod_ip: str) -> tuple[bool, str]:
    get = probe.action["httpGet"]
    host = get.get("host") or pod_ip
    scheme = str(get.get("scheme") or "HTTP").lower()
    path = get.get("path") or "/"
    url = f"{scheme}://{host}:{probe.port}{path if path.startswith('/') else '/' + path}"
    request = urllib.request.Request(url, headers={"User-Agent": "kube-probe/clef-runner"})
    for h in get.get("httpHeaders") or []:
        request.add_header(h["name"], h["value"])
    context = None
    if scheme == "https":
        # The kubelet does not verify a probe's certificate either.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        with (
            _OPENER.open(request, timeout=probe.timeout)
            if context is None
            else urllib.request.urlopen(request, timeout=probe.timeout, context=context) as response
        ):
            status = int(response.status)
    except urllib.error.HTTPError as e:
        status = int(e.code)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return False, f"Get {url!r}: {reason}"
    if 200 <= status < 400:
        return True, ""
    return False, f"HTTP probe failed with statuscode: {status}"


@dataclass
class ProbeSet:
    """A container's probes and what they say now: started, ready, or to be killed."""

    startup: Probe | None
    readiness: Probe | None
    liveness: Probe | None

    @classmethod
    def for_container(cls, container: Obj) -> ProbeSet:
        return cls(*(Probe.from_spec(k, container.get(f"{k}Probe"), container) for k in KINDS))

    @property
    def any(self) -> bool:
        return any(p is not None for p in (self.startup, self.readiness, self.liveness))

    def reset(self, now: float) -> None:
        for p in (self.startup, self.readiness, self.liveness):
            if p is not None:
                p.reset(now)

    @property
    def started(self) -> bool:
        return self.startup is None or self.startup.verdict is True

    @property
    def ready(self) -> bool:
        if not self.started:
            return False
        return self.readiness is None or self.readiness.verdict is True

    def due(self, now: float) -> list[Probe]:
        """The probes to run now: only startup until it has succeeded."""
        active = [self.startup] if not self.started else [self.readiness, self.liveness]
        return [p for p in active if p is not None and p.next_due <= now]

    def tick(self, pod_ip: str, now: float | None = None) -> tuple[bool, str | None]:
        """Run what is due.  Returns (whether started/ready changed, why to kill the container)."""
        now = time.monotonic() if now is None else now
        before = (self.started, self.ready)
        for probe in self.due(now):
            ok, message = run_probe(probe, pod_ip)
            probe.next_due = now + probe.period
            verdict = probe.record(ok, message)
            if verdict is False and probe.kind in ("startup", "liveness"):
                return True, f"Container failed {probe.kind} probe, will be restarted: {message}"
            if verdict is True and probe.kind == "startup":
                # Readiness and liveness start once startup has succeeded (their initial delay
                # still counts from the container's start).
                for p in (self.readiness, self.liveness):
                    if p is not None:
                        p.next_due = max(p.next_due, now)
        return (self.started, self.ready) != before, None
