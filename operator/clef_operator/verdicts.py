"""Verdicts the planner may rely on, and their one encoding on serving Deployments.

A verdict is kept twice: in `status.verifications` and in the annotations of every serving
Deployment created from it.  Either survives the loss of the other, so a rollback to a revision
that passed needs no Job even when the ClefModel's status was lost (rollout rule 1).  Status is a
cache: a record superseded by a re-verify request no longer counts, and a Deployment made before
that request does not bring the old verdict back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from clef_operator import labels
from clef_operator.api import ClefModelStatus, Dtype, Suite, Verdict, VerificationRecord
from clef_operator.conditions import Reason
from clef_operator.observed import DeploymentState

# The verdict annotation of a Deployment rolled out without verification.
NOT_REQUIRED = "NotRequired"
MAX_SUMMARY = 256


def encode_verdict(
    image: str, pinned_image: str, token: str, passed: VerificationRecord | None
) -> dict[str, str]:
    """The annotations of a serving Deployment of `image` pinned to `pinned_image`, created under
    re-verify `token`, from the verdict `passed` (None: verification was not required)."""
    out = {labels.IMAGE: image, labels.PINNED_IMAGE: pinned_image, labels.REVERIFY_TOKEN: token}
    if passed is None:
        out[labels.VERDICT] = NOT_REQUIRED
        return out
    out.update(
        {
            labels.VERIFICATION_KEY: passed.key,
            labels.VERDICT: Verdict.PASSED.value,
            labels.VERDICT_SUMMARY: passed.summary[:MAX_SUMMARY],
            labels.VERIFIED_SUITE: passed.suite.value,
            labels.VERIFIED_DTYPE: passed.dtype.value,
            labels.VERIFIED_AT: passed.finished_at,
            labels.VERIFICATION_JOB: passed.job,
        }
    )
    if passed.gpu_class:
        out[labels.GPU_CLASS] = passed.gpu_class
    return out


def decode_verdict(annotations: Mapping[str, str]) -> VerificationRecord | None:
    """The passing verdict a serving Deployment was created from; None when it records none (not
    required, or annotations someone broke: a verdict that cannot be read never counts)."""
    a = annotations
    if a.get(labels.VERDICT) != Verdict.PASSED.value:
        return None
    try:
        return VerificationRecord(
            key=a[labels.VERIFICATION_KEY],
            image=a[labels.IMAGE],
            digest=a[labels.PINNED_IMAGE],
            gpu_class=a.get(labels.GPU_CLASS) or None,
            dtype=Dtype(a[labels.VERIFIED_DTYPE]),
            suite=Suite(a[labels.VERIFIED_SUITE]),
            verdict=Verdict.PASSED,
            reason=Reason.VERIFIED,
            summary=a.get(labels.VERDICT_SUMMARY, ""),
            job=a.get(labels.VERIFICATION_JOB, ""),
            finished_at=a.get(labels.VERIFIED_AT, ""),
        )
    except (KeyError, ValueError):
        return None


@dataclass(frozen=True)
class Verdicts:
    """What the planner knows about verification keys.

    `records` is what status keeps (newest first); `known` adds the verdicts read back from
    Deployments; `current` is the verdict that answers the current spec's key, if one still
    counts.  `reverify_requested` is a re-verify request seen for the first time."""

    records: tuple[VerificationRecord, ...]
    known: tuple[VerificationRecord, ...]
    current: VerificationRecord | None
    reverify_requested: bool

    def passed(self, key: str) -> VerificationRecord | None:
        return next((r for r in self.known if r.key == key and r.verdict is Verdict.PASSED), None)

    def gpu_memory_mib(self, key: str) -> int | None:
        """The GPU memory of the node a verdict for `key` ran on (what the KV estimate needs)."""
        return next((r.gpu_memory_mib for r in self.known if r.key == key and r.gpu_memory_mib), None)


def collect_verdicts(
    key: str, token: str, status: ClefModelStatus, deployments: Iterable[DeploymentState]
) -> Verdicts:
    """Rule 1 (and 7): the verdicts recorded in status and on Deployments, minus what a re-verify
    request (a new `token`) voided for the current `key`."""
    records = list(status.verifications)
    requested = token != (status.observed_reverify or "")
    if requested:
        records = [r.model_copy(update={"superseded": True}) if r.key == key else r for r in records]
    known = list(records)
    for d in deployments:
        derived = decode_verdict(d.annotations)
        if derived is None or any(r.key == derived.key and r.digest == derived.digest for r in known):
            continue
        if derived.key == key and d.annotations.get(labels.REVERIFY_TOKEN, "") != token:
            continue  # made before the re-verify request: its verdict is superseded too
        known.append(derived)
    current = next((r for r in known if r.key == key and not r.superseded), None)
    if current is not None and current not in records:
        records.insert(0, current)
    return Verdicts(tuple(records), tuple(known), current, reverify_requested=requested and bool(token))
