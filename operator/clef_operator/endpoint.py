"""Endpoint verification's children and how their outcomes are read (pure).

* the **preview**: the candidate's own Deployment at one replica, with the real engine argv, on
  the GPU class of a kernels pass (mode both) or where the spec schedules it.  No Service selects
  it: the stable Service selects the active revision by its revision label.
* the **comparison Job**: the runtime image, no GPU, `clef-runtime endpoint-check` against the
  preview pod's IP with the goldens ConfigMap mounted and, in its argv, the sha256 the operator
  signed for those goldens (`--goldens-sha256`): the check refuses other bytes before it asks
  anything, and its report names the digest it read.  Its verdict is read from the termination
  message of the pod that belongs to the Job's UID (`clef_contract.endpoint`); `goldens_read`
  accepts it only when that digest is the signed one.
* `judge_run`: a goldens or comparison Job, fail closed, in the words of its report.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from clef_contract.command import TERMINATION_LOG, TERMINATION_LOG_ENV
from clef_contract.endpoint import parse_endpoint_report
from clef_contract.goldens import parse_goldens_report
from clef_contract.report import ReportInvalid, ReportMissing
from clef_operator import labels
from clef_operator.api import ENGINE_DIALECT, ClefModelSpec, Engine, FailingCheck, Step
from clef_operator.conditions import Reason, Why
from clef_operator.goldens import GOLDENS_FILE, Trusted, endpoint_of
from clef_operator.observed import JobState, PodState
from clef_operator.render import (
    TMP_MOUNT,
    TMP_VOLUME,
    VERIFIER_CONTAINER_SECURITY,
    VERIFIER_POD_SECURITY,
    Owner,
    job_manifest,
    object_labels,
    placement,
)
from clef_operator.revision import REVERIFY_SUFFIX_LENGTH
from clef_operator.verification import Progress, pick_pod

CHECK_CONTAINER = "check"
GOLDENS_MOUNT = "/goldens"
MAX_FAILING = 5


def dialect_of(engine: Engine) -> str:
    """The API dialect of `engine` (spec.engine)."""
    return ENGINE_DIALECT[engine.value]


def check_job_name(model: str, key: str, run: str) -> str:
    """`<model>-check-<key>[-<run6>]`: at most 38 + 7 + 10 + 7 = 62 characters (a label value)."""
    name = f"{model}-check-{key}"
    return name + ("-" + run[:REVERIFY_SUFFIX_LENGTH] if run else "")


def preview_annotations(tag: str, key: str, since: datetime) -> dict[str, str]:
    """A preview: the candidate Deployment at one replica (the revision that would serve), marked
    as the preview of verification key `key` of spec.image `tag`, and when it started."""
    return {labels.IMAGE: tag, labels.PREVIEW_FOR: key, labels.PREVIEW_SINCE: since.isoformat()}


def preview_url(spec: ClefModelSpec, pod: PodState) -> str:
    return f"http://{pod.ip}:{spec.service.container_port}"


def comparison_argv(spec: ClefModelSpec, pod: PodState, goldens_sha256: str) -> list[str]:
    endpoint = endpoint_of(spec)
    return [
        "clef-runtime",
        "endpoint-check",
        "--url",
        preview_url(spec, pod),
        "--goldens",
        f"{GOLDENS_MOUNT}/{GOLDENS_FILE}",
        "--goldens-sha256",
        goldens_sha256,
        "--dialect",
        dialect_of(spec.engine),
        "--timeout",
        str(endpoint.request_timeout_seconds),
    ]


def render_comparison_job(
    owner: Owner, spec: ClefModelSpec, key: str, run: str, pod: PodState, goldens: Trusted
) -> dict[str, Any]:
    """CPU only (no GPU, no GPU runtime class): it talks HTTP to the preview pod.  It runs where
    the model's pods may run (spec.nodeSelector, spec.tolerations: `placement`)."""
    job_labels = {
        **object_labels(owner.name, labels.COMPONENT_VERIFICATION),
        labels.STEP: Step.ENDPOINT.value,
        labels.VERIFICATION_KEY: key,
    }
    annotations = {
        labels.IMAGE: spec.image,
        labels.PREVIEW_POD_UID: pod.uid,
        labels.PREVIEW_POD_IP: pod.ip,
        labels.PREVIEW_IMAGE_ID: pod.image_id,
        labels.GOLDENS_CONFIGMAP: goldens.name,
        labels.GOLDENS_SHA256: goldens.sha256,
    }
    if run:
        annotations[labels.REVERIFY_RUN] = run
    argv = comparison_argv(spec, pod, goldens.sha256)
    name = check_job_name(owner.name, key, run)
    return _check_job(owner, spec, name, job_labels, annotations, argv, goldens)


def probe_job_name(model: str, pod_uid: str, round_: int) -> str:
    """`<model>-probe-<uid8>-<round>`: at most 38 + 7 + 8 + 6 = 59 characters (a label value)."""
    return f"{model}-probe-{pod_uid[:8]}-{round_ % 100000}"


def render_probe_job(
    owner: Owner, spec: ClefModelSpec, pod: PodState, goldens: Trusted, round_: int
) -> dict[str, Any]:
    """A probe of one serving pod (spec.verification.watch): the comparison Job asking `pod` at
    its own address `watch.prompts` of the goldens' prompts (the `round_`-th group), within one
    interval.  No TTL: the operator deletes it once a newer probe of the pod has finished (a
    cordoned pod's failing probe is kept while the pod lives: it is what keeps it cordoned)."""
    watch = spec.verification.watch
    assert watch is not None
    job_labels = {**object_labels(owner.name, labels.COMPONENT_VERIFICATION), labels.STEP: labels.STEP_PROBE}
    annotations = {
        labels.IMAGE: spec.image,
        labels.PROBE_POD_UID: pod.uid,
        labels.PROBE_POD_IP: pod.ip,
        labels.PROBE_IMAGE_ID: pod.image_id,
        labels.PROBE_ROUND: str(round_),
        labels.GOLDENS_CONFIGMAP: goldens.name,
        labels.GOLDENS_SHA256: goldens.sha256,
    }
    argv = comparison_argv(spec, pod, goldens.sha256)
    argv += ["--sample", str(watch.prompts), "--sample-round", str(round_)]
    name = probe_job_name(owner.name, pod.uid, round_)
    job = _check_job(owner, spec, name, job_labels, annotations, argv, goldens)
    job["spec"]["activeDeadlineSeconds"] = watch.interval_seconds
    del job["spec"]["ttlSecondsAfterFinished"]
    return job


def render_driver_check_job(
    owner: Owner, spec: ClefModelSpec, target: tuple[str, str], digest: str, pod: PodState, goldens: Trusted
) -> dict[str, Any]:
    """The in-place verification of a serving pod's driver (`plan_endpoint_drivers`; modes
    endpoint and both): the comparison Job asking `pod`, which runs `digest`, at its own address
    every prompt of the goldens, as the endpoint comparison asked the preview.  `target`: the
    driver it verifies and its key (`plan_drivers.driver_key`); step `driver`."""
    driver, dkey = target
    job_labels = {
        **object_labels(owner.name, labels.COMPONENT_VERIFICATION),
        labels.STEP: labels.STEP_DRIVER,
        labels.VERIFICATION_KEY: dkey,
    }
    annotations = {
        labels.IMAGE: spec.image,
        labels.PINNED_IMAGE: digest,
        labels.DRIVER: driver,
        labels.PROBE_POD_UID: pod.uid,
        labels.PROBE_POD_IP: pod.ip,
        labels.PROBE_IMAGE_ID: pod.image_id,
        labels.GOLDENS_CONFIGMAP: goldens.name,
        labels.GOLDENS_SHA256: goldens.sha256,
    }
    argv = comparison_argv(spec, pod, goldens.sha256)
    return _check_job(
        owner, spec, check_job_name(owner.name, dkey, ""), job_labels, annotations, argv, goldens
    )


def _check_job(
    owner: Owner,
    spec: ClefModelSpec,
    name: str,
    job_labels: dict[str, str],
    annotations: dict[str, str],
    argv: list[str],
    goldens: Trusted,
) -> dict[str, Any]:
    container = {
        "name": CHECK_CONTAINER,
        "image": endpoint_of(spec).runtime_image,
        "imagePullPolicy": "IfNotPresent",
        "command": argv,
        "env": [{"name": TERMINATION_LOG_ENV, "value": TERMINATION_LOG}],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "volumeMounts": [{"name": "goldens", "mountPath": GOLDENS_MOUNT, "readOnly": True}, dict(TMP_MOUNT)],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "securityContext": copy.deepcopy(VERIFIER_CONTAINER_SECURITY),
    }
    pod_spec = {
        **placement(spec),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Never",
        "securityContext": copy.deepcopy(VERIFIER_POD_SECURITY),
        "containers": [container],
        "volumes": [{"name": "goldens", "configMap": {"name": goldens.name}}, dict(TMP_VOLUME)],
    }
    return job_manifest(owner, name, job_labels, annotations, spec, pod_spec)


# ------------------------------------------------------------------------------ judging Jobs


@dataclass(frozen=True)
class Judged:
    """A finished goldens or comparison Job, fail closed."""

    passed: bool
    reason: str
    summary: str
    failing: tuple[FailingCheck, ...] = ()
    device: str | None = None
    runtime_version: str | None = None
    pod: PodState | None = None
    stop_job: bool = False
    goldens_sha256: str | None = None  # the goldens a comparison read, as its report says


@dataclass(frozen=True)
class Read:
    """What a report said, in the terms of `Judged`."""

    verdict: str
    summary: str
    failing: tuple[FailingCheck, ...] = ()
    device: str | None = None
    runtime_version: str | None = None
    goldens_sha256: str | None = None
    reason: str | None = None  # a reason of its own, in place of the JobKind's for the verdict


def read_comparison(message: str | None, dialect: str) -> Read:
    report = parse_endpoint_report(message)
    c = report.compact
    if report.dialect != dialect and c.verdict != "error":
        raise ReportInvalid(f"the report is for dialect {report.dialect}, the Job asked in {dialect}")
    failing = tuple(
        FailingCheck(name=f.name, op=f.op, detail=f.detail[:1024]) for f in c.failing[:MAX_FAILING]
    )
    e = report.engine_error
    if e is not None:
        return Read(
            "error",
            f"the preview's engine failed prompt {e.prompt}: {e.message}",
            device=c.device or None,
            runtime_version=c.runtime_version or None,
            goldens_sha256=report.goldens_sha256,
            reason=Reason.ENGINE_ERROR,
        )
    summary = c.summary if c.verdict != "error" else f"endpoint-check could not run: {c.error}"
    d = report.first_divergence
    if c.verdict == "fail" and d is not None:
        summary = (
            f"prompt {d.prompt}, token {d.position}: expected id {d.expected_id} ({d.expected_text!r}),"
            f" the engine said {d.got_id} ({d.got_text!r}); {c.summary}"
        )
    return Read(
        c.verdict, summary, failing, c.device or None, c.runtime_version or None, report.goldens_sha256
    )


def read_goldens(message: str | None) -> Read:
    report = parse_goldens_report(message)
    if report.verdict == "fail":
        return Read(
            "fail",
            f"the runtime image's kernels fail their own checks, so it made no goldens: {report.summary}",
        )
    if report.verdict == "error":
        return Read("error", f"clef-runtime goldens could not run: {report.error}")
    return Read("pass", report.summary, runtime_version=report.provenance.get("runtimeVersion") or None)


@dataclass(frozen=True)
class JobKind:
    """How to read one kind of Job: its report, and the reasons of its outcomes."""

    what: str  # "goldens" | "comparison"
    read: Callable[[str | None], Read]
    mismatch: str  # the reason of a `fail` report
    error: str  # the reason of an `error` report


def judge_run(kind: JobKind, job: JobState, pods: list[PodState], timeout: int) -> Progress | Judged:
    """The state of a goldens or comparison Job: Judged when it is over (or decided), else Progress."""
    pod = pick_pod(pods)
    problem = pod.problem() if pod is not None else None
    if pod is not None and not job.finished and problem is not None and problem.reason == Why.IMAGE_PULL:
        return Judged(
            False, Reason.IMAGE_PULL_FAILED, f"{kind.what} Job: {problem.message}", pod=pod, stop_job=True
        )
    if job.failed and job.failed_reason == "DeadlineExceeded":
        where = f"; {problem.message}" if problem is not None else ""
        return Judged(
            False, Reason.TIMEOUT, f"the {kind.what} Job did not finish within {timeout}s{where}", pod=pod
        )
    if job.finished:
        return _judge_finished(kind, job, pod)
    if pod is None:
        return Progress(Reason.PENDING, f"{kind.what} Job {job.name} created; waiting for its pod")
    if problem is not None and problem.reason == Why.UNSCHEDULABLE:
        return Progress(Reason.UNSCHEDULABLE, f"{kind.what} {problem.message}")
    if problem is not None and problem.reason == Why.CONTAINER_ERROR:
        return Progress(Reason.CONTAINER_CONFIG, f"{kind.what} {problem.message}")
    if pod.phase == "Running" or pod.terminated:
        return Progress(Reason.RUNNING, f"{kind.what} Job {job.name} is running")
    return Progress(Reason.PENDING, f"{kind.what} pod {pod.name} is starting")


def _judge_finished(kind: JobKind, job: JobState, pod: PodState | None) -> Judged:
    if pod is None or not pod.terminated:
        return Judged(
            False, Reason.REPORT_MISSING, f"the {kind.what} Job finished but its pod (and report) is gone"
        )
    try:
        read = kind.read(pod.termination_message)
    except ReportMissing as exc:
        return Judged(
            False, Reason.REPORT_MISSING if job.complete else Reason.CRASHED, f"{kind.what}: {exc}", pod=pod
        )
    except ReportInvalid as exc:
        return Judged(False, Reason.REPORT_INVALID, f"{kind.what}: {exc}", pod=pod)
    if read.verdict == "pass" and (job.failed or pod.exit_code != 0):
        return Judged(
            False,
            Reason.CRASHED,
            f"the {kind.what} report says pass but the exit code is {pod.exit_code}",
            pod=pod,
        )
    reason = read.reason or (
        Reason.VERIFIED if read.verdict == "pass" else kind.mismatch if read.verdict == "fail" else kind.error
    )
    return Judged(
        read.verdict == "pass",
        reason,
        read.summary,
        read.failing,
        read.device,
        read.runtime_version,
        pod,
        goldens_sha256=read.goldens_sha256,
    )


def goldens_read(judged: Judged, job_command: tuple[str, ...], goldens: Trusted) -> Judged:
    """A finished comparison speaks for the signed goldens only if the Job was given their digest
    and its report says it read exactly those bytes.  Anything else (the ConfigMap swapped or
    edited between signing and reading, a Job made for other goldens, a report that names none)
    fails closed as GoldensUntrusted, whatever the report's verdict."""
    signed = goldens.sha256
    argv = list(job_command)
    given = argv[argv.index("--goldens-sha256") + 1] if "--goldens-sha256" in argv[:-1] else None
    if given != signed:
        why = f"was given goldens digest {given or 'none'}, not the signed {signed} of {goldens.name}"
    elif judged.goldens_sha256 is None:
        if judged.passed:
            why = f"reported no goldens digest; the signed one is {signed}"
        else:
            return judged  # it failed before it read any goldens: its own reason says why
    elif judged.goldens_sha256 != signed:
        why = (
            f"read goldens {judged.goldens_sha256}, not the signed {signed} of {goldens.name}: the"
            " goldens changed between signing and reading"
        )
    else:
        return judged
    return replace(
        judged,
        passed=False,
        reason=Reason.GOLDENS_UNTRUSTED,
        summary=f"the comparison {why} (its report said {judged.reason}: {judged.summary})"[:1024],
        failing=(),
    )
