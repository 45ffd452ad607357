"""Watch policy rollback (docs/verification.md, "Watching the serving revision"), pure.

A probe that finds the serving revision answering wrong fails that revision's verdict *in
service*: the operator signs a record of step `probe`, verdict Failed, for the verification key
and re-verify run of the pass the revision stood on, and makes it the ledger's latest run of
that key (the pass stays in status as history, marked superseded).  From then on the planner
reads that key as failed, as if its Job had failed: the spec that names the image is no longer
verified, until a re-verify request (a new run) or another spec passes.

What serves then is the **rollback target**: the revision, among the serving Deployments kept
(at 0, within revisionHistoryLimit), whose own signed pass still counts (the ledger's latest run
of its key, not superseded, not failed in service) on the GPU class of the failed verdict, the
newest pass first.  It is served as it was made (its template as its annotation records it), so
the rollback needs no Job.  With no such revision, nothing is rolled back: the failing pods are
cordoned as under cordon-pod, the rest keep serving and being probed, and the Serving condition
says so (`NoRollbackTarget`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from clef_operator import labels
from clef_operator.api import Step, Verdict, VerificationRecord, WatchPolicy, WatchSpec
from clef_operator.children import rendered_template
from clef_operator.observed import DeploymentState, ModelRef
from clef_operator.plan_verification import Desired
from clef_operator.verdicts import Verdicts, decode_verdict, sign
from clef_operator.verification import Verification


def failed_in_service(record: VerificationRecord | None) -> VerificationRecord | None:
    """The record, when it is a failure in service (a probe's)."""
    if record is not None and record.step is Step.PROBE and record.verdict is Verdict.FAILED:
        return record
    return None


def served_verdict(dep: DeploymentState | None, verdicts: Verdicts) -> VerificationRecord | None:
    """The pass a serving Deployment stands on, while it still counts (signed, the ledger's latest
    run of its key, not superseded: `Verdicts.passed`), for the very digest it runs."""
    derived = decode_verdict(dep.annotations) if dep is not None else None
    if derived is None:
        return None
    passed = verdicts.passed(derived.key)
    return passed if passed is not None and passed.digest == derived.digest else None


@dataclass(frozen=True)
class Target:
    """A kept revision to roll back to, as it was made."""

    revision: str
    image: str
    verdict: VerificationRecord
    manifest: dict[str, Any]


def rollback_target(
    deployments: Iterable[DeploymentState], verdicts: Verdicts, failed: VerificationRecord
) -> Target | None:
    """The newest kept revision, other than the failed key's, verified on the failed verdict's GPU
    class and still counting; None when none is kept."""
    found: list[Target] = []
    for d in deployments:
        if d.deleting:
            continue
        verdict = served_verdict(d, verdicts)
        if verdict is None or verdict.key == failed.key or verdict.gpu_class != failed.gpu_class:
            continue
        template = rendered_template(d, {})
        if template is None or not verdict.digest:
            continue  # a template clef cannot vouch for is not served again
        manifest = {
            "metadata": {"labels": {labels.REVISION: d.revision}, "annotations": dict(d.annotations)},
            "spec": {"template": template},
        }
        found.append(Target(d.revision, verdict.digest, verdict, manifest))
    found.sort(key=lambda t: (t.verdict.finished_at, t.revision), reverse=True)
    return found[0] if found else None


def failure_record(
    secret: bytes,
    model: ModelRef,
    passed: VerificationRecord,
    reason: str,
    summary: str,
    job: str,
    job_uid: str,
    now: datetime,
) -> VerificationRecord:
    """The signed record that fails `passed` in service: same key, run, image, digest and GPU class;
    the probe Job that found it; final, so that it is the ledger's latest run of the key."""
    return sign(
        secret,
        model,
        passed.model_copy(
            update={
                "verdict": Verdict.FAILED,
                "step": Step.PROBE,
                "reason": reason,
                "summary": summary[:1024],
                "job": job,
                "job_uid": job_uid,
                "finished_at": now.isoformat(),
                "final": True,
                "superseded": False,
                "failing": [],
                "signature": "",
            }
        ),
    )


def with_failure(
    secret: bytes, model: ModelRef, records: Sequence[VerificationRecord], failure: VerificationRecord
) -> list[VerificationRecord]:
    """status.verifications with `failure` first and the pass it fails kept as history, re-signed
    as superseded (so that it is not read as a newer pass than the ledger's failure)."""
    out = [failure]
    for r in records:
        if r.key == failure.key and r.run == failure.run and r.verdict is Verdict.PASSED and not r.superseded:
            r = sign(secret, model, r.model_copy(update={"superseded": True}))
        out.append(r)
    return out


def roll_back(
    watch: WatchSpec | None,
    deployments: Iterable[DeploymentState],
    verdicts: Verdicts,
    verification: Verification,
    desired: Desired,
) -> Desired:
    """Under policy rollback, a current key failed in service gives the rollback target as the
    desired revision (none kept: no revision, as for any failure), and says why (`failed`).
    `watch`: spec.verification.watch."""
    failed = failed_in_service(verification.record)
    if failed is None or watch is None or watch.policy is not WatchPolicy.ROLLBACK:
        return desired
    target = rollback_target(deployments, verdicts, failed)
    if target is None:
        return Desired(failed=failed)
    return Desired(target.revision, target.image, target.manifest, failed=failed)
