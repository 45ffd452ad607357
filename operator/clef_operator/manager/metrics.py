"""Prometheus metrics: what one reconcile pass did, derived by a pure function from the status
before and after it and the planner's actions (`derive_pass`), and the exposition endpoint
(`/metrics`, with `/healthz` beside it) that `clef-operator run --metrics-bind-address` serves.

The planner stays pure and knows nothing of metrics; docs/operations.md ("Monitoring") lists each
metric and the queries to alert on.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, make_wsgi_app

from clef_operator import labels
from clef_operator.actions import Action, CreateService, PatchServiceSelector
from clef_operator.api import ClefModelStatus, Condition, VerificationRecord
from clef_operator.conditions import PROGRESSING, SERVING, VERIFIED, Why
from clef_operator.manager import probe_metrics
from clef_operator.observed import Observed

ROLLOUTS_STARTED = Counter(
    "clef_rollouts_started", "Rollouts started: Progressing turned True (a new spec or image to serve)."
)
ROLLOUTS_COMPLETED = Counter(
    "clef_rollouts_completed", "Rollouts completed: Progressing turned False with RolloutComplete."
)
ROLLOUTS_REJECTED = Counter(
    "clef_rollouts_rejected",
    "Rollouts halted: the candidate failed verification (reason: the Verified reason) or the Service"
    " is another's (ServiceConflict).",
    ["reason"],
)
VERIFICATIONS = Counter(
    "clef_verifications",
    "Finished verification steps, by suite, step (kernels|goldens|preview|endpoint), GPU class,"
    " outcome (Passed|Failed) and reason.",
    ["suite", "step", "gpu_class", "outcome", "reason"],
)
VERIFICATION_SECONDS = Histogram(
    "clef_verification_duration_seconds",
    "From the verification step's Job creation to its verdict.",
    ["suite", "step", "gpu_class", "outcome"],
    buckets=(5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200),
)
SWITCH_SECONDS = Histogram(
    "clef_candidate_available_to_switch_seconds",
    "From the candidate Deployment becoming available (the API server's timestamp) to the Service's"
    " selector switched to it.",
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
)
RECONCILES = Counter("clef_reconciles", "Reconcile passes finished (with or without an error).")
RECONCILE_ERRORS = Counter(
    "clef_reconcile_errors",
    "Reconcile passes that failed: exception (retried with backoff), rejected (the API server"
    " refused an action: ChildRejected), fenced (a write refused: this replica lost the Lease).",
    ["kind"],
)
QUEUE_DEPTH = Gauge(
    "clef_reconcile_queue_depth",
    "ClefModels queued for a pass (an event, a requeue) and waiting for a free worker.",
)
IN_PROGRESS = Gauge("clef_reconciles_in_progress", "Reconcile passes running now.")
MODELS = Gauge(
    "clef_models",
    "ClefModels the work queue knows (queued, in a pass, scheduled for a later one, or failing).",
)
PROGRESSING_SINCE = Gauge(
    "clef_rollout_progressing_since_timestamp_seconds",
    "When a model's Progressing condition turned True (Unix time); no series while it is not"
    " progressing.  time() minus it: how long the rollout has been going.",
    ["namespace", "name"],
)
SERVING_FAILED_SINCE = Gauge(
    "clef_serving_failed_since_timestamp_seconds",
    "When a model's Serving condition (spec.verification.watch) turned False: a serving pod's probe"
    " found wrong answers or it was cordoned (Unix time); no series otherwise.",
    ["namespace", "name"],
)
LEADER = Gauge(
    "clef_operator_leader",
    "1 while this replica holds the Lease (or runs without leader election), else 0.",
)
FENCE_IN_FORCE = Gauge(
    "clef_fence_in_force",
    "A standby's check of the API server's fence (clef-operator-fence): 1 when the API server refused"
    " its last dry-run write while another replica held the Lease, 0 when it admitted it (the fence"
    " does not cover this replica); -1 before its first check (and without leader election).",
)


# ------------------------------------------------------------------------------ the pure part


@dataclass(frozen=True)
class VerificationDone:
    suite: str
    gpu_class: str
    outcome: str
    reason: str
    seconds: float | None
    # kernels (the verify Job) or, in endpoint mode, goldens, preview or endpoint: each step writes
    # its own record, and a dashboard must not count a goldens record as a verified rollout.
    step: str = "kernels"


@dataclass(frozen=True)
class PassFacts:
    """What one pass changed, as metric updates."""

    started: bool = False
    completed: bool = False
    rejected: str = ""
    verifications: tuple[VerificationDone, ...] = ()
    switch_seconds: float | None = None


def _condition(status: ClefModelStatus, type_: str) -> Condition | None:
    return next((c for c in status.conditions if c.type == type_), None)


def _state(status: ClefModelStatus, type_: str) -> tuple[str, str]:
    c = _condition(status, type_)
    return (c.status.value, c.reason) if c is not None else ("", "")


def _rejection(after: ClefModelStatus) -> str:
    state, reason = _state(after, PROGRESSING)
    if state != "False":
        return ""
    if reason == Why.HALTED:
        return _state(after, VERIFIED)[1] or Why.HALTED
    return reason if reason == Why.SERVICE_CONFLICT else ""


def _record_id(r: VerificationRecord) -> tuple[str, str, str, str]:
    return (r.key, r.job, r.job_uid, r.run)


def _seconds(start: datetime | None, end: str) -> float | None:
    if start is None:
        return None
    try:
        finished = datetime.fromisoformat(end)
    except ValueError:
        return None
    return max((finished - start).total_seconds(), 0.0)


def new_verifications(
    before: ClefModelStatus, after: ClefModelStatus, observed: Observed
) -> tuple[VerificationDone, ...]:
    """Verdicts that this pass added to status (never ones read back from elsewhere: a restarted
    operator does not count a verdict twice, since it starts from the stored status)."""
    known = {_record_id(r) for r in before.verifications}
    out = []
    for r in after.verifications:
        if _record_id(r) in known or r.superseded:
            continue
        job = observed.job(r.job)
        out.append(
            VerificationDone(
                suite=r.suite.value,
                gpu_class=r.gpu_class or "unknown",
                outcome=r.verdict.value,
                reason=r.reason,
                seconds=_seconds(job.created_at if job else None, r.finished_at),
                step=r.step.value,
            )
        )
    return tuple(out)


def _selects(action: Action) -> str | None:
    """The revision a Service change makes the Service select (its active-revision annotation)."""
    if isinstance(action, PatchServiceSelector):
        return action.annotations.get(labels.SERVICE_ACTIVE_REVISION)
    if isinstance(action, CreateService):
        return (action.manifest["metadata"].get("annotations") or {}).get(labels.SERVICE_ACTIVE_REVISION)
    return None


def switch_seconds(actions: Iterable[Action], observed: Observed, now: datetime) -> float | None:
    """Time from the candidate's availability to the Service selecting it, when this pass switched
    the Service to another revision (or created it for the first one); a patch that puts back the
    active revision is not a switch."""
    current = observed.service.annotations.get(labels.SERVICE_ACTIVE_REVISION) if observed.service else None
    for action in actions:
        revision = _selects(action)
        if not revision or revision == current:
            continue
        d = observed.deployment(revision)
        if d is not None and d.available_at is not None:
            return max((now - d.available_at).total_seconds(), 0.0)
    return None


def derive_pass(
    before: ClefModelStatus,
    after: ClefModelStatus,
    actions: Iterable[Action],
    observed: Observed,
    now: datetime,
    refused: bool = False,
) -> PassFacts:
    """The metric updates of one pass: `before` is the stored status it started from, `after` the
    status it wrote, `actions` the planner's (all applied unless `refused`)."""
    was, _ = _state(before, PROGRESSING)
    is_, _ = _state(after, PROGRESSING)
    was_rejected, rejected = _rejection(before), _rejection(after)
    return PassFacts(
        started=is_ == "True" and was != "True",
        completed=is_ == "False"
        and _state(after, PROGRESSING)[1] == Why.COMPLETE
        and _state(before, PROGRESSING) != _state(after, PROGRESSING),
        rejected=rejected if rejected != was_rejected else "",
        verifications=new_verifications(before, after, observed),
        switch_seconds=None if refused else switch_seconds(actions, observed, now),
    )


def progressing_since(status: ClefModelStatus) -> float | None:
    """When Progressing turned True (its lastTransitionTime), or None when it is not True."""
    return _turned(status, PROGRESSING, "True")


def serving_failed_since(status: ClefModelStatus) -> float | None:
    """When Serving turned False (probes found a pod answering wrongly), or None otherwise."""
    return _turned(status, SERVING, "False")


def _turned(status: ClefModelStatus, type_: str, value: str) -> float | None:
    c = _condition(status, type_)
    if c is None or c.status.value != value:
        return None
    try:
        return datetime.fromisoformat(c.last_transition_time.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def record_model(namespace: str, name: str, status: ClefModelStatus | None) -> None:
    """The model's progressing-since series: set while it progresses, removed otherwise (and when
    the model is gone: `status` None, with its probe series), so nothing is kept for a model that
    no longer exists."""
    if status is None:
        probe_metrics.forget(namespace, name)
    for gauge, since in (
        (PROGRESSING_SINCE, progressing_since(status) if status is not None else None),
        (SERVING_FAILED_SINCE, serving_failed_since(status) if status is not None else None),
    ):
        if since is not None:
            gauge.labels(namespace=namespace, name=name).set(since)
        else:
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, name)


def record_pass(facts: PassFacts) -> None:
    if facts.started:
        ROLLOUTS_STARTED.inc()
    if facts.completed:
        ROLLOUTS_COMPLETED.inc()
    if facts.rejected:
        ROLLOUTS_REJECTED.labels(reason=facts.rejected).inc()
    for v in facts.verifications:
        common = {"suite": v.suite, "step": v.step, "gpu_class": v.gpu_class, "outcome": v.outcome}
        VERIFICATIONS.labels(**common, reason=v.reason).inc()
        if v.seconds is not None:
            VERIFICATION_SECONDS.labels(**common).observe(v.seconds)
    if facts.switch_seconds is not None:
        SWITCH_SECONDS.observe(facts.switch_seconds)


# ------------------------------------------------------------------------------ the endpoint


def parse_bind_address(value: str) -> tuple[str, int]:
    """`HOST:PORT` or `:PORT` (all interfaces)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--metrics-bind-address: expected HOST:PORT or :PORT, not {value!r}")
    return (host.strip("[]") or "0.0.0.0", int(port))


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes every few seconds: no log
        pass


def serve(address: tuple[str, int], healthy: Callable[[], bool]) -> WSGIServer:
    """`/metrics` (the default registry) and `/healthz` (200 while `healthy()`), on a daemon thread."""
    metrics_app = make_wsgi_app(REGISTRY)

    def app(environ: Mapping[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/healthz":
            ok = healthy()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else b"unhealthy\n"]
        return metrics_app(environ, start_response)

    server = make_server(address[0], address[1], app, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="clef-metrics", daemon=True).start()
    return server
