"""Judging a verification Job: fail closed.

`Verified` comes from exactly one path: the Job has condition Complete, its pod terminated with
exit code 0, the pod's termination message parses as a v1 compact report whose verdict is `pass`
for the suite and dtype the Job asked for, and the pod's `imageID` names a digest to pin.  Every
other outcome is a failure with a reason saying which, or is still running.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from clef_contract.report import CompactReport, FailingEntry, ReportInvalid, ReportMissing, parse_report
from clef_operator.actions import Action
from clef_operator.api import (
    ClefModelSpec,
    FailingCheck,
    Verdict,
    VerificationRecord,
    Verifier,
)
from clef_operator.conditions import Reason, Why
from clef_operator.observed import JobState, PodProblem, PodState
from clef_operator.render import verification_image, verify_argv
from clef_operator.revision import pinned_reference
from clef_operator.verdicts import verifier_of

MAX_FAILING = 5


@dataclass(frozen=True)
class Progress:
    """Something not concluded yet (a verification, a candidate's rollout): the reason for its
    condition, and what the on-call engineer should know."""

    reason: str
    message: str


@dataclass(frozen=True)
class Outcome:
    """A concluded verification.  `stop_job` when the Job is still active but already decided
    (an image that cannot be pulled would otherwise hold its GPU until the deadline)."""

    record: VerificationRecord
    stop_job: bool = False


class VerificationState(Enum):
    NOT_REQUIRED = "not required"
    RUNNING = "running"
    PASSED = "passed"
    FAILED = "failed"


@dataclass(frozen=True)
class Verification:
    """Where the current spec's verification stands.  `record` is the verdict (PASSED, FAILED),
    `progress` why it is still RUNNING; `new_record` a verdict reached on this pass, for status."""

    state: VerificationState
    job: str
    record: VerificationRecord | None = None
    progress: Progress | None = None
    new_record: VerificationRecord | None = None
    actions: tuple[Action, ...] = ()
    # Endpoint mode: records of steps passed on this pass (goldens made, preview ready, the kernels
    # of mode both), for status; the preview revision that must keep its replica; the Jobs of the
    # current spec besides `job` (goldens, comparison), which are not cancelled.
    step_records: tuple[VerificationRecord, ...] = ()
    preview: str = ""
    jobs: tuple[str, ...] = ()
    # Look again this soon (a preview's deadline, a step just taken); None: on the next event.
    recheck: float | None = None
    # The words of a pass, for the Verified condition (`plan_verification.pass_message`).
    message: str = ""

    @property
    def passed(self) -> VerificationRecord | None:
        return self.record if self.state is VerificationState.PASSED else None


def pick_pod(pods: list[PodState]) -> PodState | None:
    """The pod that speaks for the Job: a terminated one if any, else the newest."""
    if not pods:
        return None
    terminated = [p for p in pods if p.terminated]
    pool = terminated or pods
    return max(pool, key=lambda p: (p.created_at or datetime.min, p.name))


@dataclass(frozen=True)
class _Case:
    """One Job being judged: what every verdict on it records."""

    spec: ClefModelSpec
    job: JobState
    pod: PodState | None
    now: datetime

    def record(
        self,
        verdict: Verdict,
        reason: str,
        summary: str,
        report: CompactReport | None = None,
        digest: str | None = None,
    ) -> VerificationRecord:
        pod = self.pod
        failing = []
        if report is not None:
            failing = [
                FailingCheck(name=f.name, op=f.op, detail=f.detail[:1024])
                for f in _most_telling(report)[:MAX_FAILING]
            ]
        return VerificationRecord(
            key=self.job.key,
            image=self.spec.image,
            digest=digest,
            gpu_class=(pod.node_gpu_product or None) if pod else None,
            gpu_memory_mib=pod.node_gpu_memory_mib if pod else None,
            node_driver=(pod.node_driver or None) if pod else None,
            node_cuda_runtime=(pod.node_cuda_runtime or None) if pod else None,
            dtype=self.spec.dtype,
            suite=self.spec.verification.suite,
            verdict=verdict,
            reason=reason,
            summary=summary[:1024],
            failing=failing,
            device=(report.device or None) if report else None,
            runtime_version=(report.runtime_version or None) if report else None,
            job=self.job.name,
            job_uid=self.job.uid,
            finished_at=self.now.isoformat(),
            verifier=verifier_of(self.spec),
        )

    def fail(
        self, reason: str, summary: str, report: CompactReport | None = None, stop_job: bool = False
    ) -> Outcome:
        return Outcome(self.record(Verdict.FAILED, reason, summary, report), stop_job=stop_job)


def _most_telling(report: CompactReport) -> list[FailingEntry]:
    """Coverage findings ("key channel band [a, b) is zero") say what is broken; error sizes only
    that something is.  They go first, into the condition and the record."""
    return sorted(report.failing, key=lambda f: "coverage" not in f.name)


def _report_failure(report: CompactReport) -> tuple[str, str]:
    if report.verdict == "fail":
        checks = "; ".join(f.detail or f.name for f in _most_telling(report)[:MAX_FAILING])
        return Reason.KERNEL_MISMATCH, f"{report.summary} — failing: {checks}" if report.summary else checks
    return Reason.ERROR, f"verify could not run: {report.error}"


def _pull_summary(spec: ClefModelSpec, pod: PodState) -> str:
    return (
        f"cannot pull {verification_image(spec)}: "
        + f"{pod.waiting_reason}: {pod.waiting_message}".rstrip(": ")
    )


def _refused_summary(job: JobState) -> str:
    return (
        f"the API server refuses the pod of Job {job.name} (the Job controller's FailedCreate):"
        f" {job.pods_refused}. Fix the spec or the cluster (create the RuntimeClass, raise the quota)"
    )


def _crash_summary(pod: PodState, problem: str) -> str:
    parts = [f"exit code {pod.exit_code}"]
    if pod.terminated_reason:
        parts.append(pod.terminated_reason)
    return f"verification container ended ({', '.join(parts)}) without a valid report: {problem}"


def _is(problem: PodProblem | None, reason: str) -> bool:
    return problem is not None and problem.reason == reason


def judge(spec: ClefModelSpec, job: JobState, pods: list[PodState], now: datetime) -> Progress | Outcome:
    """The state of one verification Job, fail-closed."""
    pod = pick_pod(pods)
    problem = pod.problem() if pod is not None else None
    case = _Case(spec, job, pod, now)
    if pod is not None and not job.finished and _is(problem, Why.IMAGE_PULL):
        # Decided already: the Job is stopped so it does not hold its GPU until the deadline.
        return case.fail(Reason.IMAGE_PULL_FAILED, _pull_summary(spec, pod), stop_job=True)
    if pod is None and not job.finished and job.pods_refused:
        # Decided already: the Job controller retries with back-off, and each try is refused the
        # same way until someone changes the spec or the cluster.
        return case.fail(Reason.POD_REJECTED, _refused_summary(job), stop_job=True)
    if job.failed:
        return _judge_failed(case, problem)
    if job.complete:
        return _judge_complete(case)
    return _progress(spec, job, pod, problem)


def _judge_failed(case: _Case, problem: PodProblem | None) -> Outcome:
    """A failed Job never verifies; the reason says how it failed."""
    spec, job, pod = case.spec, case.job, case.pod
    if job.failed_reason == "DeadlineExceeded":
        where = ""
        if pod is not None and not pod.terminated:
            if _is(problem, Why.UNSCHEDULABLE):
                where = f"; the pod was never scheduled: {pod.unschedulable_message}"
            elif _is(problem, Why.IMAGE_PULL):
                return case.fail(Reason.IMAGE_PULL_FAILED, _pull_summary(spec, pod))
        return case.fail(
            Reason.TIMEOUT,
            f"verification did not finish within spec.verification.timeoutSeconds"
            f" ({spec.verification.timeout_seconds}s){where}",
        )
    if pod is None:
        return case.fail(
            Reason.CRASHED,
            f"Job failed ({job.failed_reason}: {job.failed_message}) and its pod is gone",
        )
    if pod.reason == "Evicted" or (pod.phase == "Failed" and not pod.terminated):
        return case.fail(
            Reason.CRASHED,
            f"verification pod {pod.phase.lower()}: {pod.reason} {pod.message}".strip(),
        )
    try:
        report = parse_report(pod.termination_message)
    except ReportMissing as exc:
        return case.fail(Reason.CRASHED, _crash_summary(pod, str(exc)))
    except ReportInvalid as exc:
        return case.fail(Reason.REPORT_INVALID, _crash_summary(pod, str(exc)))
    if report.verdict == "pass":
        return case.fail(
            Reason.CRASHED,
            _crash_summary(pod, "the report says pass but the Job failed"),
            report,
        )
    reason, summary = _report_failure(report)
    return case.fail(reason, summary, report)


def _judge_complete(case: _Case) -> Outcome:
    """The one path to a pass: exit 0, a valid passing report for what was asked, a digest."""
    spec, pod = case.spec, case.pod
    if pod is None or not pod.terminated:
        return case.fail(
            Reason.REPORT_MISSING,
            "the Job completed but its verification pod (and its report) is gone",
        )
    try:
        report = parse_report(pod.termination_message)
    except ReportMissing as exc:
        return case.fail(Reason.REPORT_MISSING, str(exc))
    except ReportInvalid as exc:
        return case.fail(Reason.REPORT_INVALID, str(exc))
    if report.verdict != "pass":
        reason, summary = _report_failure(report)
        return case.fail(reason, summary, report)
    asked = (spec.verification.suite.value, spec.dtype.value)
    if (report.suite, report.dtype) != asked:
        return case.fail(
            Reason.REPORT_INVALID,
            f"the report is for suite {report.suite} dtype {report.dtype}, the Job asked for suite"
            f" {asked[0]} dtype {asked[1]}",
            report,
        )
    if pod.exit_code != 0:
        return case.fail(
            Reason.CRASHED,
            _crash_summary(pod, "the report says pass but the exit code is not 0"),
            report,
        )
    digest = pinned_reference(verification_image(spec), pod.image_id)
    if digest is not None and spec.verification.image:
        # The verdict speaks for what serves: spec.image, a digest reference (admission requires
        # one with a separate verification image), not the verifier's own image.
        digest = spec.image
    if digest is None:
        return case.fail(
            Reason.DIGEST_UNKNOWN,
            f"verification passed but the pod reported no image digest (imageID {pod.image_id!r}),"
            " so there is nothing to pin serving to",
            report,
        )
    # A verifier of the user's own says pass in its own words: never in those of clef's checks.
    reason = Reason.VERIFIED if verifier_of(spec) is Verifier.CLEF else Reason.CUSTOM_VERIFIER_PASSED
    return Outcome(case.record(Verdict.PASSED, reason, report.summary, report, digest))


def _progress(
    spec: ClefModelSpec, job: JobState, pod: PodState | None, problem: PodProblem | None
) -> Progress:
    """A Job still running: where it stands, and what holds it up."""
    if pod is None:
        return Progress(Reason.PENDING, f"Job {job.name} created; waiting for its pod")
    if problem is not None and problem.reason == Why.UNSCHEDULABLE:
        return Progress(Reason.UNSCHEDULABLE, f"verification {problem.message}")
    if problem is not None and problem.reason == Why.CONTAINER_ERROR:
        return Progress(Reason.CONTAINER_CONFIG, f"verification {problem.message}")
    if pod.phase == "Running" or pod.terminated:
        return Progress(
            Reason.RUNNING,
            f"Job {job.name} is running `{' '.join(verify_argv(spec))}` in {verification_image(spec)}",
        )
    detail = f" ({pod.waiting_reason})" if pod.waiting_reason else ""
    return Progress(Reason.PENDING, f"verification pod {pod.name} is starting{detail}")
