"""Leader election through a `coordination.k8s.io/v1` Lease, and the fence that keeps a replica
that cannot prove it leads from writing anything.

Two (or more) replicas run; the one holding the Lease reconciles, the others only watch the Lease.
The rules (docs/operations.md, "Running two replicas"):

* **Acquire.**  A candidate takes the Lease when it has no holder, or when the record has not
  changed for a full lease duration *as measured on the candidate's own monotonic clock* from the
  moment it first saw that record (`may_acquire`): it never compares its clock with the holder's
  timestamps.  The write is a compare-and-swap on the Lease's resourceVersion, so two candidates
  cannot both win.
* **Fence.**  The leader renews every retry period.  Each successful renew opens the fence until
  `renew deadline` after the moment the renew was *sent* (monotonic clock), which is shorter than
  the lease duration a newcomer waits from the moment it *saw* that renew: the old leader has
  stopped writing before anyone else may start.  Every write the operator makes (the Kubernetes
  client's `FencedApiClient`, kopf's session through `fence_trace`) checks the fence right before
  it is sent and is refused (`Fenced`) once it is closed.  A paused process (SIGSTOP, a VM freeze)
  resumes with its deadline in the past, so its first write after resuming is refused.
* **Lost.**  A renew that finds another holder, or loses the compare-and-swap to one, closes the
  fence for good and ends the process (`EXIT_LOST_LEASE`): the reconcile workers, in-flight
  passes included, are abandoned; whatever they were doing is re-planned from observed state
  by the new leader (every pass is level-triggered).  The pod restarts as a standby.
* **Release.**  On a clean stop (SIGTERM, a rolling update) the fence is closed first, then the
  Lease is handed back with no holder, so a standby takes over at its next poll instead of after a
  lease duration.

What the client's fence cannot cover: a request already checked and on its way when the process
froze, or held up by the network, that arrives after a standby took over.  The API server closes
that gap (kustomize/base/admission.yaml, `clef-operator-fence`): a write from a replica's token,
which names its pod, is admitted only while the Lease names that pod as holder (identity `<pod>`
or `<pod>_<suffix>`, as `default_identity` makes it).  Takeover is a write of the Lease, so
nothing the old leader sent is admitted after it, whenever it arrives.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("clef.leader")

LEASE_NAME = "clef-operator"
# The process exits with this status when it learns that another replica holds the Lease.
EXIT_LOST_LEASE = 75
# HTTP methods that only read (everything else is a write and needs the fence open).
READS = frozenset({"GET", "HEAD", "OPTIONS"})


class Fenced(RuntimeError):
    """A write refused because this replica cannot prove it holds the Lease."""


@dataclass(frozen=True)
class LeaseTiming:
    """Durations of the election, in seconds (client-go's defaults: 15, 10, 2)."""

    duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.retry_period > 0:
            raise ValueError(f"--leader-elect-retry-period: must be > 0, not {self.retry_period}")
        if not self.renew_deadline > self.retry_period:
            raise ValueError(
                f"--leader-elect-renew-deadline ({self.renew_deadline}) must exceed"
                f" --leader-elect-retry-period ({self.retry_period}): a leader needs a retry before its deadline"
            )
        if not self.duration > self.renew_deadline:
            raise ValueError(
                f"--leader-elect-lease-duration ({self.duration}) must exceed --leader-elect-renew-deadline"
                f" ({self.renew_deadline}): the old leader must stop writing before a newcomer may start"
            )


class Fence:
    """Whether this process may write now.  Open for good when there is no election (one replica);
    with one, open until a monotonic deadline that each successful renew moves."""

    def __init__(self) -> None:
        self._until = math.inf
        self._lock = threading.Lock()

    def open_until(self, deadline: float) -> None:
        with self._lock:
            self._until = deadline

    def close(self) -> None:
        with self._lock:
            self._until = -math.inf

    def may_write(self) -> bool:
        return time.monotonic() < self._until

    def check(self, method: str, what: str) -> None:
        if method.upper() not in READS and not self.may_write():
            raise Fenced(f"refused {method.upper()} {what}: this replica cannot prove it holds the Lease")


FENCE = Fence()


class FencedApiClient(client.ApiClient):
    """The Kubernetes client with every write checked against the fence just before it is sent."""

    def __init__(self, fence: Fence = FENCE, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fence = fence

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        self.fence.check(method, url)
        return super().call_api(method, url, *args, **kwargs)


def fence_trace(fence: Fence = FENCE) -> Any:
    """An aiohttp TraceConfig that refuses kopf's writes the same way (it makes none with no resource
    handler; the fence holds should that change)."""
    import aiohttp

    async def on_start(_session: Any, _ctx: Any, params: Any) -> None:
        fence.check(params.method, str(params.url.path))

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_start)
    return trace


# ------------------------------------------------------------------------------ the pure rules


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    duration_seconds: int
    transitions: int
    resource_version: str


def may_acquire(
    record: LeaseRecord | None, identity: str, seen_since: float, now: float, timing: LeaseTiming
) -> bool:
    """Whether `identity` may take the Lease at monotonic time `now`, having seen `record` unchanged
    since `seen_since` (also monotonic).  The wait is the longer of the holder's declared duration
    and our own, so a holder configured with a longer lease is not cut short."""
    if record is None or not record.holder or record.holder == identity:
        return True
    return now - seen_since >= max(float(record.duration_seconds), timing.duration)


def micro_time(t: datetime) -> str:
    """A MicroTime as the API server writes it (RFC 3339, microseconds, Z)."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_body(
    name: str, namespace: str, identity: str, timing: LeaseTiming, prior: LeaseRecord | None, now: datetime
) -> dict[str, Any]:
    """The Lease after `identity` took or renewed it (resourceVersion of `prior`: compare-and-swap)."""
    taking = prior is None or prior.holder != identity
    transitions = 0 if prior is None else prior.transitions + (1 if taking and prior.holder else 0)
    spec: dict[str, Any] = {
        "holderIdentity": identity,
        "leaseDurationSeconds": math.ceil(timing.duration),
        "renewTime": micro_time(now),
        "leaseTransitions": transitions,
    }
    if taking:
        spec["acquireTime"] = micro_time(now)
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if prior is not None:
        meta["resourceVersion"] = prior.resource_version
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}


_IDENTITY = ""


def set_identity(value: str) -> None:
    """This replica's name in the Lease, its events and its User-Agent."""
    global _IDENTITY
    _IDENTITY = value


def identity() -> str:
    return _IDENTITY


def user_agent() -> str:
    """`clef-operator/VERSION (IDENTITY)`: the API server's audit log tells replicas apart by it."""
    from clef_operator import __version__

    return f"clef-operator/{__version__}" + (f" ({_IDENTITY})" if _IDENTITY else "")


def identity_refused(identity: str, hostname: str, in_a_pod: bool) -> str:
    """Why `--leader-elect-identity` cannot be used, or "".  In a pod the API server admits a
    replica's writes only while the Lease's holder is the pod's name or starts with it and "_"
    (the fence policy); any other identity would have every write refused."""
    if not identity or not in_a_pod or identity == hostname or identity.startswith(hostname + "_"):
        return ""
    return (
        f"--leader-elect-identity: {identity!r} must be the pod's name ({hostname!r}) or start with"
        f" {hostname + '_'!r}: the API server admits a replica's writes only while the Lease names its pod"
    )


def default_identity() -> str:
    """The pod's name (its hostname) and a random suffix: a restarted container is a new candidate."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


# ------------------------------------------------------------------------------ the elector


def _record(lease: Any) -> LeaseRecord:
    spec = lease.spec
    return LeaseRecord(
        holder=(spec.holder_identity if spec else None) or "",
        duration_seconds=(spec.lease_duration_seconds if spec else None) or 0,
        transitions=(spec.lease_transitions if spec else None) or 0,
        resource_version=lease.metadata.resource_version or "",
    )


def _as_lease(body: dict[str, Any]) -> Any:
    """The client takes plain dicts where its signatures name model classes (and sends the
    MicroTime strings exactly as written)."""
    return body


def _exit_lost(reason: str) -> None:
    log.critical("lost the Lease (%s): exiting; this replica restarts as a standby", reason)
    logging.shutdown()
    os._exit(EXIT_LOST_LEASE)


FENCE_POLICY = "clef-operator-fence"


def fence_refused(error: ApiException | None) -> bool | None:
    """What a standby's dry-run write says of the fence: refused by it (True), admitted (False: the
    policy is not installed, this replica's token names no pod, or the API server's Lease informer
    is frozen, as after its binding was deleted: kubernetes/kubernetes#130887), or neither (None:
    refused for another reason, or no answer)."""
    if error is None:
        return False
    if error.status == 403 and FENCE_POLICY in str(error.body or ""):
        return True
    return None


def fence_probe(api: client.ApiClient, namespace: str) -> Callable[[], bool | None]:
    """A dry-run Event (nothing is stored) written to `namespace` as this replica, judged by
    `fence_refused`."""
    core = client.CoreV1Api(api)
    body: Any = {
        "metadata": {"generateName": "clef-fence-check-", "namespace": namespace},
        "involvedObject": {"kind": "Namespace", "name": namespace, "namespace": namespace},
        "reason": "FenceCheck",
        "message": "a standby's dry run: the API server must refuse it (clef-operator-fence)",
    }

    def probe() -> bool | None:
        try:
            core.create_namespaced_event(namespace, body, dry_run="All", _request_timeout=10)
        except ApiException as e:
            return fence_refused(e)
        except Exception:  # the API server unreachable: nothing learnt
            return None
        return fence_refused(None)

    return probe


class Elector:
    """Campaigns for the Lease, then renews it, on a thread of its own (so a busy event loop never
    delays a renew).  Talks to the API server with an unfenced client: renewing is what reopens
    the fence."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        identity: str,
        timing: LeaseTiming,
        name: str = LEASE_NAME,
        fence: Fence = FENCE,
        on_lost: Callable[[str], None] = _exit_lost,
        on_change: Callable[[bool], None] = lambda leading: None,
        check_fence: Callable[[], bool | None] | None = None,
        on_fence: Callable[[bool], None] = lambda in_force: None,
    ) -> None:
        self.leases = client.CoordinationV1Api(api)
        self.namespace, self.name, self.identity, self.timing = namespace, name, identity, timing
        self.fence, self.on_lost, self.on_change = fence, on_lost, on_change
        # A standby checks, once a lease duration, that the API server refuses its writes.
        self.check_fence, self.on_fence = check_fence, on_fence
        self._fence_checked = -math.inf
        self._fence_said: bool | None = None
        self._holder = ""
        # A request that hangs must not hold up the next round (the fence closes meanwhile).
        self._timeout = max(timing.retry_period, timing.renew_deadline / 2)
        self.leading = threading.Event()
        self.stopping = threading.Event()
        self.last_tick = time.monotonic()
        self._seen: tuple[str, float] = ("", 0.0)  # (resourceVersion, monotonic time first seen)
        self._thread = threading.Thread(target=self._run, name="clef-leader-election", daemon=True)
        fence.close()

    def start(self) -> None:
        self._thread.start()

    def healthy(self) -> bool:
        """The election thread is alive and went round its loop recently."""
        stale = time.monotonic() - self.last_tick > self.timing.duration + self.timing.retry_period
        return self._thread.is_alive() and not stale

    def _run(self) -> None:
        log.info(
            "campaigning for Lease %s/%s as %s (duration %.0fs, renew deadline %.0fs, retry %.0fs)",
            self.namespace, self.name, self.identity, self.timing.duration,
            self.timing.renew_deadline, self.timing.retry_period,
        )  # fmt: skip
        while not self.stopping.is_set() and not self._attempt():
            self._standby_check()
            self.stopping.wait(self.timing.retry_period)
        if self.stopping.is_set():
            return
        log.info("leading: acquired Lease %s/%s as %s", self.namespace, self.name, self.identity)
        self.leading.set()
        self.on_change(True)
        fenced = False
        while not self.stopping.wait(self.timing.retry_period):
            renewed = self._attempt()
            if renewed and fenced:
                log.info("renewed the Lease: writing again")
            elif not renewed and not fenced and not self.fence.may_write() and not self.stopping.is_set():
                log.warning("could not renew the Lease before the deadline: every write is refused")
            fenced = not renewed and not self.fence.may_write()

    def _standby_check(self) -> None:
        """While another replica holds the Lease: does the API server refuse this one's writes?"""
        now = time.monotonic()
        due = now - self._fence_checked >= self.timing.duration
        if self.check_fence is None or not self._holder or self._holder == self.identity or not due:
            return
        self._fence_checked = now
        in_force = self.check_fence()
        if in_force is None:
            return
        self.on_fence(in_force)
        if not in_force and self._fence_said is not False:
            log.error(
                "the API server admitted a dry-run write of this standby while %s holds the Lease:"
                " the fence (%s) does not cover this replica. Not installed, a token bound to no pod,"
                " or its Lease informer frozen (a deleted binding, kubernetes/kubernetes#130887:"
                " restart kube-apiserver)",
                self._holder, FENCE_POLICY,
            )  # fmt: skip
        elif in_force and self._fence_said is False:
            log.info("the API server refuses this standby's writes again (%s)", FENCE_POLICY)
        self._fence_said = in_force

    def _attempt(self) -> bool:
        """One acquire-or-renew; True when we hold the Lease afterwards."""
        self.last_tick = time.monotonic()
        try:
            lease: Any = self.leases.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._timeout
            )
            record: LeaseRecord | None = _record(lease)
        except ApiException as e:
            if e.status != 404:
                log.warning("reading Lease %s/%s: %s %s", self.namespace, self.name, e.status, e.reason)
                return False
            record = None
        except Exception as e:  # the API server unreachable: a renew simply did not happen
            log.warning("reading Lease %s/%s: %s", self.namespace, self.name, e)
            return False
        now = time.monotonic()
        self._holder = record.holder if record is not None else ""
        if record is not None and record.resource_version != self._seen[0]:
            self._seen = (record.resource_version, now)
        if self.leading.is_set() and (record is None or record.holder != self.identity):
            self._lost(f"held by {record.holder if record else 'nobody (deleted)'}")
            return False
        if not may_acquire(record, self.identity, self._seen[1], now, self.timing):
            return False
        return self._write(record)

    def _write(self, record: LeaseRecord | None) -> bool:
        sent = time.monotonic()
        body = lease_body(self.name, self.namespace, self.identity, self.timing, record, datetime.now(UTC))
        try:
            if record is None:
                self.leases.create_namespaced_lease(
                    self.namespace, _as_lease(body), _request_timeout=self._timeout
                )
            else:
                self.leases.replace_namespaced_lease(
                    self.name, self.namespace, _as_lease(body), _request_timeout=self._timeout
                )
        except ApiException as e:
            if e.status == 409:  # another candidate wrote first: look again next round
                if self.leading.is_set():
                    self._lost("another replica wrote the Lease")
                return False
            log.warning("writing Lease %s/%s: %s %s", self.namespace, self.name, e.status, e.reason)
            return False
        except Exception as e:
            log.warning("writing Lease %s/%s: %s", self.namespace, self.name, e)
            return False
        self.fence.open_until(sent + self.timing.renew_deadline)
        return True

    def _lost(self, reason: str) -> None:
        self.fence.close()
        self.leading.clear()
        self.on_change(False)
        self.on_lost(reason)

    def release(self) -> None:
        """Stop renewing, stop writing, and hand the Lease back so a standby takes over at once."""
        self.stopping.set()
        self.fence.close()
        if not self.leading.is_set():
            return
        self.leading.clear()
        self.on_change(False)
        # A renew in flight would change the Lease under the hand-back (a 409): let it land first.
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self._timeout + 1)
        self.fence.close()
        for _ in range(3):
            try:
                if self._hand_back():
                    log.info("released Lease %s/%s", self.namespace, self.name)
                return
            except ApiException as e:
                # A conflict (409): read the Lease again and retry; anything else: give up.
                if e.status != 409:
                    log.warning(
                        "could not release Lease %s/%s: %s %s", self.namespace, self.name, e.status, e.reason
                    )
                    return
            except Exception as e:  # the standby then waits a lease duration instead
                log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, e)
                return
        log.warning("could not release Lease %s/%s: it kept changing", self.namespace, self.name)

    def _hand_back(self) -> bool:
        """The Lease with no holder, if this replica holds it (True when written)."""
        lease: Any = self.leases.read_namespaced_lease(
            self.name, self.namespace, _request_timeout=self._timeout
        )
        record = _record(lease)
        if record.holder != self.identity:
            return False
        body = lease_body(self.name, self.namespace, self.identity, self.timing, record, datetime.now(UTC))
        # No holder: a standby may take it at its next poll (`may_acquire`).
        body["spec"].update(holderIdentity=None, leaseDurationSeconds=1)
        self.leases.replace_namespaced_lease(
            self.name, self.namespace, _as_lease(body), _request_timeout=self._timeout
        )
        return True
