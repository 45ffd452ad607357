"""Prometheus metrics of the probes of the serving revision (spec.verification.watch): when each
serving pod last passed its probe, how long probes take, and how many failed.

A probe's result lives in its Job (plan_watch: the newest finished probe of a pod is kept, older
ones are deleted), not in status, so the metrics of a pass are derived by a pure function
(`derive_probes`) from what the previous pass of the same model left (`Seen`, held in this
process) and the pass's `ProbeReport`:

* a finished probe is counted once: the pass that first sees its Job counts it, and the Jobs
  counted are remembered (one per probed pod: only the newest finished probe is kept).  The first
  pass of a model in this process (a start, a failover) counts none of the probes it finds
  finished, as they may have been counted by the process before it;
* a pod's last pass is the finish time of its newest finished probe when that passed; a failing
  probe keeps the time remembered (the passed Job it follows has been deleted);
* a pod's series goes as soon as it no longer serves: not Ready, deleted, cordoned, or of a
  revision the Service no longer selects; a deleted model's series go with it (`forget`).

docs/operations.md ("Monitoring") lists the metrics and the alerts on them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from prometheus_client import Counter, Gauge, Histogram

from clef_operator.observed import JobState
from clef_operator.plan_watch import ENGINE_ERROR, ERROR, MISMATCH, PASSED, ProbeReport

FAILED = (MISMATCH, ENGINE_ERROR, ERROR)

LAST_PASS = Gauge(
    "clef_probe_last_pass_timestamp_seconds",
    "When a serving pod's newest passed probe finished (Unix time); one series per serving pod,"
    " removed once the pod no longer serves (not Ready, deleted, cordoned, or its revision replaced).",
    ["namespace", "model", "pod", "node"],
)
FAILURES = Counter(
    "clef_probe_failures",
    "Finished probes of a model's serving pods that did not pass: mismatch (other tokens),"
    " engine-error (the engine failed a prompt), error (the probe could not judge).",
    ["namespace", "model", "found"],
)
DURATION = Histogram(
    "clef_probe_duration_seconds",
    "From a probe Job's creation to its finish (the Job controller's time): the probe pod's start"
    " and its prompts; by what it found (passed, mismatch, engine-error, error).",
    ["found"],
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600),
)


@dataclass(frozen=True)
class LastPass:
    node: str
    at: float  # Unix time


@dataclass(frozen=True)
class Seen:
    """A model's probe series as a pass left them: each serving pod's last pass (by pod name) and
    the finished probe Jobs already counted."""

    last_pass: Mapping[str, LastPass] = field(default_factory=dict)
    counted: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ProbeDone:
    found: str  # PASSED | MISMATCH | ENGINE_ERROR | ERROR
    seconds: float | None


@dataclass(frozen=True)
class ProbeFacts:
    """One pass's updates: the series to hold (`seen.last_pass`), those to remove (pod, node), and
    the probes that finished since the previous pass."""

    seen: Seen
    removed: tuple[tuple[str, str], ...] = ()
    done: tuple[ProbeDone, ...] = ()


def job_id(job: JobState) -> str:
    return f"{job.name}/{job.uid}"


def _seconds(job: JobState) -> float | None:
    if job.created_at is None or job.finished_at is None:
        return None
    return max((job.finished_at - job.created_at).total_seconds(), 0.0)


def _timestamp(at: datetime | None) -> float | None:
    return at.timestamp() if at is not None else None


def derive_probes(before: Seen | None, report: ProbeReport) -> ProbeFacts:
    """`before`: what the previous pass of this model left, None when this process has not seen
    the model yet (nothing is counted then; see the module's docstring)."""
    known = before or Seen()
    findings = {f.pod.uid: f for f in report.findings}
    last: dict[str, LastPass] = {}
    for pod in report.serving:
        f = findings.get(pod.uid)
        passed_at = _timestamp(f.job.finished_at) if f is not None and f.found == PASSED else None
        kept = known.last_pass.get(pod.name)
        if passed_at is not None:
            last[pod.name] = LastPass(pod.node_name, passed_at)
        elif kept is not None and kept.node == pod.node_name:
            last[pod.name] = kept
    removed = tuple(
        (name, lp.node)
        for name, lp in sorted(known.last_pass.items())
        if name not in last or last[name].node != lp.node
    )
    done: tuple[ProbeDone, ...] = ()
    if before is not None:
        done = tuple(
            ProbeDone(f.found, _seconds(f.job))
            for f in report.findings
            if job_id(f.job) not in before.counted
        )
    counted = frozenset(job_id(f.job) for f in report.findings)
    return ProbeFacts(Seen(last, counted), removed, done)


# ------------------------------------------------------------------------------ the shell

_SEEN: dict[tuple[str, str], Seen] = {}
_LOCK = threading.Lock()


def record(namespace: str, model: str, report: ProbeReport) -> ProbeFacts:
    """Derive and apply one pass's probe metrics (a model is in one pass at a time)."""
    key = (namespace, model)
    with _LOCK:
        before = _SEEN.get(key)
    facts = derive_probes(before, report)
    for pod, node in facts.removed:
        with contextlib.suppress(KeyError):
            LAST_PASS.remove(namespace, model, pod, node)
    for pod, lp in facts.seen.last_pass.items():
        LAST_PASS.labels(namespace=namespace, model=model, pod=pod, node=lp.node).set(lp.at)
    for d in facts.done:
        if d.found in FAILED:
            FAILURES.labels(namespace=namespace, model=model, found=d.found).inc()
        if d.seconds is not None:
            DURATION.labels(found=d.found).observe(d.seconds)
    with _LOCK:
        _SEEN[key] = facts.seen
    return facts


def forget(namespace: str, model: str) -> None:
    """A deleted model: its series and what this process remembered of it go."""
    with _LOCK:
        seen = _SEEN.pop((namespace, model), None)
    for pod, lp in (seen.last_pass if seen is not None else {}).items():
        with contextlib.suppress(KeyError):
            LAST_PASS.remove(namespace, model, pod, lp.node)
    for found in FAILED:
        with contextlib.suppress(KeyError):
            FAILURES.remove(namespace, model, found)
