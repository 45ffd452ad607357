"""Probes of the serving revision (spec.verification.watch; docs/verification.md, "Watching the
serving revision"): a phase of the planner (`rollout`), pure.

Every Ready pod of the active revision, when that revision is the current spec's, is asked a few
of the signed goldens' prompts at its own address (never through a Service) by a CPU-only probe
Job (`endpoint.render_probe_job`), every `intervalSeconds`.  Everything is decided from observed
state, so an operator restarted at any point takes the same next step:

* **when**: a pod's newest probe Job was created `intervalSeconds` ago and has finished (no probe
  yet: at once).  One probe of a pod runs at a time;
* **what it found**: the newest finished probe Job of the pod, read like the comparison
  (`endpoint.judge_run`, `endpoint.goldens_read`: only the signed goldens count).  It is kept until
  a newer probe of the pod has finished; older ones, and those of pods that are gone, are deleted;
* **cordon-pod**: a pod whose newest finished probe found other tokens (or its engine failing a
  prompt) is withheld from the serving label (`children.label_verified_pods` takes it off, so no
  Service that selects on it sends it traffic) and is probed no more.  That failing Job is the
  record: it is kept while the pod lives, so the pod stays cordoned until it is deleted (its
  Deployment then makes a new one, which is probed at once).  Cordoning the last serving pod is
  done all the same (wrong answers are worse than none) and said so;
* **alert**: the same finding is the `Serving` condition and a Warning event, nothing more;
* **rollback**: cordon-pod, and a wrong finding on a pod of the active revision fails the pass it
  stands on in service (`Probes.failure`, `plan_rollback`), so that the next pass serves the
  rollback target; with none kept, the `Serving` condition says so (`NoRollbackTarget`).

The `Serving` condition says what the latest probes found, naming the pod, its node, the probe
Job and the first divergence (a pass names only pod and node, so that probes that keep passing
write no status); an event goes with each change of a failing finding (`previous` is the one in
status: at worst an event is said twice).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from clef_operator import labels
from clef_operator.actions import Action, CreateJob, DeleteJob, event
from clef_operator.api import ClefModelSpec, Condition, ConditionStatus, VerificationRecord, WatchPolicy
from clef_operator.conditions import SERVING, Reason, Stamp, Why, clause
from clef_operator.endpoint import Judged, goldens_read, judge_run, render_probe_job
from clef_operator.endpoint_flow import COMPARISON
from clef_operator.goldens import Trusted, check_signature, goldens_name
from clef_operator.observed import JobState, ModelRef, Observed, PodState
from clef_operator.plan_rollback import failure_record
from clef_operator.renderings import Renderings
from clef_operator.verification import Progress

# What a finished probe found.
PASSED, MISMATCH, ENGINE_ERROR, ERROR = "passed", "mismatch", "engine-error", "error"
# Findings that take a pod out of serving under policy cordon-pod (an error says nothing of the
# pod's answers: the probe itself could not judge).
WRONG = (MISMATCH, ENGINE_ERROR)
REASON_OF = {MISMATCH: Why.PROBE_MISMATCH, ENGINE_ERROR: Why.PROBE_ENGINE_ERROR, ERROR: Why.PROBE_ERROR}
# Policies under which a wrong finding takes the pod out of serving.
CORDONING = (WatchPolicy.CORDON_POD, WatchPolicy.ROLLBACK)


@dataclass(frozen=True)
class Finding:
    """The newest finished probe of one pod."""

    pod: PodState
    job: JobState
    found: str  # PASSED | MISMATCH | ENGINE_ERROR | ERROR
    summary: str

    def describe(self) -> str:
        if self.found == PASSED:
            # No Job name or time: a pass written alike every interval writes no status.
            return f"pod {self.pod.name} on node {self.pod.node_name or '(none)'}"
        at = self.job.created_at.isoformat() if self.job.created_at else "?"
        return (
            f"pod {self.pod.name} on node {self.pod.node_name or '(none)'} (probe Job {self.job.name},"
            f" started {at}): {self.summary}"
        )


@dataclass(frozen=True)
class ProbeReport:
    """What the probe metrics read of a pass (manager/probe_metrics.py): the newest finished probe
    of each probed pod, and the pods that serve now (Ready pods of the active revision, less the
    cordoned ones) whether probed or not."""

    findings: tuple[Finding, ...] = ()
    serving: tuple[PodState, ...] = ()


@dataclass(frozen=True)
class Probes:
    actions: tuple[Action, ...] = ()
    # Pods kept from the serving label (cordon-pod), by name: why, in words.
    withheld: Mapping[str, str] = field(default_factory=dict)
    serving: Condition | None = None
    requeue_after: float | None = None
    # Policy rollback: the signed record that fails the active revision's pass in service.
    failure: VerificationRecord | None = None
    report: ProbeReport = field(default_factory=ProbeReport)


def probe_jobs(observed: Observed) -> list[JobState]:
    return [j for j in observed.jobs if j.step == labels.STEP_PROBE]


def _round(job: JobState) -> int:
    text = job.annotations.get(labels.PROBE_ROUND, "")
    return int(text) if text.isdigit() else -1


def asked_pod(job: JobState, observed: Observed) -> PodState | None:
    """The serving pod a probe (or an in-place driver verification, `plan_endpoint_drivers`) Job
    asked, if it is still that pod at that address."""
    pod = observed.pod(job.annotations.get(labels.PROBE_POD_UID, ""))
    if pod is None or pod.deleting or pod.component != labels.COMPONENT_SERVING:
        return None
    return pod if pod.ip and job.annotations.get(labels.PROBE_POD_IP) == pod.ip else None


def signed_goldens(model: ModelRef, observed: Observed, name: str, secret: bytes) -> Trusted | None:
    """The goldens ConfigMap `name` if it is there and signed by the operator, else None."""
    cm = observed.config_map(name)
    if cm is None or cm.deleting:
        return None
    signed = check_signature(model, cm.labels.get(labels.GOLDENS_KEY, ""), cm, secret)
    return signed if isinstance(signed, Trusted) else None


def unstored(gname: str) -> str:
    """Why nothing can be asked with the current spec's goldens `gname` (not `signed_goldens`)."""
    return f"the goldens of the current spec ({gname}) are not stored and signed: re-verify to have them made"


def read_probe(
    model: ModelRef, spec: ClefModelSpec, observed: Observed, job: JobState, pod: PodState, secret: bytes
) -> Finding | None:
    """A finished probe, fail closed (None while it runs): a pass only with the signed goldens."""
    judged = judge_check(model, spec, observed, job, job_deadline(spec), secret)
    if isinstance(judged, Progress):
        return None
    if judged.passed:
        found = PASSED
    elif judged.reason == Reason.ENDPOINT_MISMATCH:
        found = MISMATCH
    elif judged.reason == Reason.ENGINE_ERROR:
        found = ENGINE_ERROR
    else:
        found = ERROR
    summary = judged.summary if found != ERROR else f"{judged.reason}: {judged.summary}"
    return Finding(pod, job, found, summary)


def judge_check(
    model: ModelRef, spec: ClefModelSpec, observed: Observed, job: JobState, timeout: int, secret: bytes
) -> Progress | Judged:
    """A comparison Job that asked a serving pod (a probe, an in-place driver verification), read
    like the comparison and fail closed: a pass only with the signed goldens whose digest it was
    given and read."""
    judged = judge_run(COMPARISON(spec), job, observed.pods_of_job(job), timeout)
    if isinstance(judged, Progress):
        return judged
    goldens = signed_goldens(model, observed, job.annotations.get(labels.GOLDENS_CONFIGMAP, ""), secret)
    if goldens is None:
        return Judged(False, Reason.GOLDENS_UNTRUSTED, "the goldens it was given are gone or not signed")
    return goldens_read(judged, job.command, goldens)


def job_deadline(spec: ClefModelSpec) -> int:
    watch = spec.verification.watch
    return watch.interval_seconds if watch is not None else spec.verification.timeout_seconds


@dataclass(frozen=True)
class _Pod:
    """One serving pod's probes: its newest finished one read, the one running, the rest."""

    pod: PodState
    jobs: tuple[JobState, ...]  # by round
    finding: Finding | None
    running: JobState | None


def _pods(
    model: ModelRef, spec: ClefModelSpec, observed: Observed, secret: bytes
) -> tuple[dict[str, _Pod], list[JobState]]:
    """The probed pods (by UID) and the probe Jobs whose pod is gone."""
    by_pod: dict[str, list[JobState]] = {}
    orphans: list[JobState] = []
    for job in probe_jobs(observed):
        if job.deleting:
            continue
        pod = asked_pod(job, observed)
        if pod is None:
            orphans.append(job)
        else:
            by_pod.setdefault(pod.uid, []).append(job)
    out: dict[str, _Pod] = {}
    for uid, jobs in by_pod.items():
        jobs.sort(key=_round)
        pod = observed.pod(uid)
        assert pod is not None
        finished = [j for j in jobs if j.finished]
        running = next((j for j in reversed(jobs) if not j.finished), None)
        finding = read_probe(model, spec, observed, finished[-1], pod, secret) if finished else None
        out[uid] = _Pod(pod, tuple(jobs), finding, running)
    return out, orphans


def _eligible(observed: Observed, model: ModelRef, revision: str) -> list[PodState]:
    """The pods a probe asks: Ready serving pods of `revision` at an address."""
    return [
        p
        for p in observed.pods_of_revision(revision)
        if p.revision_of == model.name and p.ready and p.ip and not p.deleting and p.phase == "Running"
    ]


def plan_probes(
    at: Stamp,
    model: ModelRef,
    rendered: Renderings,
    spec: ClefModelSpec,
    observed: Observed,
    probed_revision: str,
    active_revision: str,
    previous: Condition | None,
    secret: bytes,
    rollback: Rollback | None = None,
) -> Probes:
    """`probed_revision`: the revision whose pods may be probed when it is the active one (the
    current spec's, the rollback target, or under rollback with no target the one that failed);
    `rollback`: what policy rollback stands on (None under the other policies)."""
    watch = spec.verification.watch
    if watch is None:
        return Probes(actions=tuple(DeleteJob(j.name) for j in probe_jobs(observed) if not j.deleting))
    now = at.now
    pods, orphans = _pods(model, spec, observed, secret)
    actions: list[Action] = [DeleteJob(j.name) for j in orphans]
    withheld: dict[str, str] = {}
    for p in pods.values():
        f = p.finding
        if watch.policy in CORDONING and f is not None and f.found in WRONG:
            withheld[p.pod.name] = f"its probe failed: {f.describe()}"
    # Older finished probes go once a newer one has finished; a cordoned pod keeps only its record.
    for p in pods.values():
        keep = {p.finding.job.name} if p.finding else set()
        if p.pod.name not in withheld and p.running is not None:
            keep.add(p.running.name)
        actions += [DeleteJob(j.name) for j in p.jobs if j.name not in keep]

    why_not = _why_not_probed(spec, probed_revision, active_revision)
    gname = goldens_name(model.name, rendered.goldens)
    goldens = signed_goldens(model, observed, gname, secret)
    if not why_not and goldens is None:
        why_not = unstored(gname)
    waits: list[float] = []
    eligible = [] if why_not else _eligible(observed, model, active_revision)
    for pod in eligible:
        if pod.name in withheld:
            continue
        probed = pods.get(pod.uid)
        if probed is not None and probed.running is not None:
            continue
        newest = probed.jobs[-1] if probed is not None and probed.jobs else None
        due = (
            newest.created_at + timedelta(seconds=watch.interval_seconds)
            if newest and newest.created_at
            else now
        )
        if due > now:
            waits.append((due - now).total_seconds())
            continue
        assert goldens is not None
        round_ = _round(newest) + 1 if newest is not None else 0
        actions.append(CreateJob(render_probe_job(rendered.owner, spec, pod, goldens, round_)))
    serving = _condition(at, model, spec, observed, active_revision, pods, eligible, withheld, why_not)
    failure = None
    if rollback is not None:
        serving = rollback.condition(at, active_revision, serving)
        failure = _failure(at, model, rollback, active_revision, pods, secret)
    said = _said(serving, previous)
    # The pods that serve, probed or not (no probe now, e.g. goldens gone, leaves their last pass).
    serves = (
        eligible if not why_not else _eligible(observed, model, active_revision) if active_revision else []
    )
    return Probes(
        actions=(*actions, *said),
        withheld=withheld,
        serving=serving,
        requeue_after=0.0 if failure is not None else (min(waits) if waits else None),
        failure=failure,
        report=ProbeReport(
            tuple(p.finding for p in pods.values() if p.finding is not None),
            tuple(p for p in serves if p.name not in withheld),
        ),
    )


@dataclass(frozen=True)
class Rollback:
    """Policy rollback: the pass the active revision stands on (None once it failed in service),
    the current key's failure in service, and the rollback target ("" when none is kept)."""

    active_verdict: VerificationRecord | None
    failed: VerificationRecord | None
    target: str

    def condition(self, at: Stamp, active_revision: str, probed: Condition) -> Condition:
        """Serving while a failure in service holds: rolling back, or nothing to roll back to;
        once the target serves, what its own probes find."""
        f = self.failed
        if f is None or (self.target and self.target == active_revision):
            return probed
        failed = f"verification key {f.key} ({f.digest or f.image}) failed in service: {clause(f.summary)}"
        if self.target:
            return at.condition(
                SERVING,
                ConditionStatus.FALSE,
                Why.ROLLING_BACK,
                f"{failed}. Policy rollback: moving to revision {self.target}, the newest kept revision verified on"
                f" {f.gpu_class or 'the same GPU class'}",
            )
        return at.condition(
            SERVING,
            ConditionStatus.FALSE,
            Why.NO_ROLLBACK_TARGET,
            f"{failed}. Policy rollback: no kept revision is verified on {f.gpu_class or 'this GPU class'}, so"
            f" nothing is rolled back: failing pods are cordoned as under cordon-pod and revision"
            f" {active_revision or '(none)'} keeps serving from the others. Probes say: {probed.reason}:"
            f" {probed.message}",
        )


def _failure(
    at: Stamp,
    model: ModelRef,
    rollback: Rollback,
    active_revision: str,
    pods: Mapping[str, _Pod],
    secret: bytes,
) -> VerificationRecord | None:
    """The record that fails the active revision's pass in service: on the first wrong finding
    of one of its pods by a probe started after the pass (once failed, the pass no longer counts,
    so it is not failed twice; the finding that failed an earlier run does not fail a new one)."""
    verdict = rollback.active_verdict
    if verdict is None:
        return None
    wrong = sorted(
        (
            p.finding
            for p in pods.values()
            if p.pod.revision == active_revision
            and p.finding is not None
            and p.finding.found in WRONG
            and p.finding.job.created_at is not None
            and p.finding.job.created_at.isoformat() >= verdict.finished_at
        ),
        key=lambda f: (f.found != MISMATCH, f.job.name),
    )
    if not wrong:
        return None
    f = wrong[0]
    return failure_record(
        secret,
        model,
        verdict,
        REASON_OF[f.found],
        f.describe(),
        f.job.name,
        f.job.uid,
        at.now,
    )


def _why_not_probed(spec: ClefModelSpec, desired_revision: str, active_revision: str) -> str:
    if not active_revision:
        return "no revision serves yet"
    if active_revision != desired_revision:
        return (
            f"the revision that serves ({active_revision}) is not the current spec's (it is being verified,"
            " or failed): probes ask the current spec's goldens"
        )
    return ""


def _condition(
    at: Stamp,
    model: ModelRef,
    spec: ClefModelSpec,
    observed: Observed,
    active_revision: str,
    pods: Mapping[str, _Pod],
    eligible: list[PodState],
    withheld: Mapping[str, str],
    why_not: str,
) -> Condition:
    """Serving: the worst of what the latest probes of the active revision's pods found."""
    mine = [p for p in pods.values() if p.pod.revision == active_revision]
    cordoned = [p.finding for p in mine if p.pod.name in withheld and p.finding is not None]
    findings = [p.finding for p in mine if p.finding is not None and p.pod.name not in withheld]
    wrong = [f for f in findings if f.found in WRONG]
    errors = [f for f in findings if f.found == ERROR]
    if cordoned:
        left = [p for p in eligible if p.name not in withheld]
        if left:
            serves = f"{len(left)} pod(s) of revision {active_revision} still serve ({', '.join(p.name for p in left[:4])})"
        else:
            serves = f"no pod of {model.name} serves now: clients get no answer rather than a wrong one (fail closed)"
        text = "; ".join(f.describe() for f in cordoned[:3])
        names = " ".join(f.pod.name for f in cordoned[:3])
        return at.condition(
            SERVING,
            ConditionStatus.FALSE,
            Why.POD_CORDONED,
            f"cordoned (serving label {labels.MODEL} removed, probed no more): {text}. {serves}. Check the node,"
            f" then delete the pod to have it replaced: kubectl -n {model.namespace} delete pod {names}"
            + _also(wrong),
        )
    if wrong:
        worst = next((f for f in wrong if f.found == MISMATCH), wrong[0])
        return at.condition(
            SERVING,
            ConditionStatus.FALSE,
            REASON_OF[worst.found],
            "; ".join(f.describe() for f in wrong[:3])
            + ". Policy alert: the pod keeps serving; set spec.verification.watch.policy: cordon-pod to take"
            " such a pod out of serving",
        )
    if errors:
        return at.condition(
            SERVING,
            ConditionStatus.UNKNOWN,
            Why.PROBE_ERROR,
            "a probe could not judge: " + "; ".join(f.describe() for f in errors[:3]),
        )
    if why_not:
        return at.condition(SERVING, ConditionStatus.UNKNOWN, Why.NOT_PROBED, f"nothing is probed: {why_not}")
    passed = [f for f in findings if f.found == PASSED and f.pod.uid in {p.uid for p in eligible}]
    pending = [p for p in eligible if p.uid not in {f.pod.uid for f in passed}]
    if pending or not eligible:
        names = ", ".join(p.name for p in pending[:4]) or f"no Ready pod of revision {active_revision}"
        return at.condition(
            SERVING, ConditionStatus.UNKNOWN, Why.PROBE_PENDING, f"waiting for the first probe of: {names}"
        )
    return at.condition(
        SERVING,
        ConditionStatus.TRUE,
        Why.CONSISTENT,
        f"{len(passed)} serving pod(s) of revision {active_revision} answered their latest probe as the"
        " goldens say: " + "; ".join(f.describe() for f in passed[:4]),
    )


def _also(wrong: list[Finding]) -> str:
    return (" Also failing: " + "; ".join(f.describe() for f in wrong[:2])) if wrong else ""


def _said(serving: Condition, previous: Condition | None) -> tuple[Action, ...]:
    """An event for each change of a failing finding, and one when probes pass again after one
    (none for the first pending or pass: 1,000 models starting post nothing)."""
    if previous is not None and (previous.status, previous.reason, previous.message) == (
        serving.status,
        serving.reason,
        serving.message,
    ):
        return ()
    if serving.status is ConditionStatus.FALSE or serving.reason == Why.PROBE_ERROR:
        return (event("ProbeFailed", f"{serving.reason}: {serving.message}", warning=True),)
    if (
        serving.status is ConditionStatus.TRUE
        and previous is not None
        and (previous.status is ConditionStatus.FALSE or previous.reason == Why.PROBE_ERROR)
    ):
        return (event("ProbesConsistent", serving.message),)
    return ()
