"""Verdicts the planner may rely on, their signatures, and their one encoding on Deployments.

A verdict is kept twice: in `status.verifications` and in the annotations of every serving
Deployment created from it.  Either survives the loss of the other, so a rollback to a revision
that passed needs no Job even when the ClefModel's status was lost (rollout rule 1).

Both are caches that anyone allowed to patch them can write, so neither is evidence by itself: a
verdict counts only when it carries the HMAC (`sign`) of the operator's key, over everything it
speaks for (the model's identity, the verification key, the serving image and digest, the GPU
class, dtype, suite, verifier, the Job's name and UID, the re-verify run).  One that does not is
ignored and dropped, with one `UntrustedVerdictIgnored` event (docs/operations.md, "What clef
trusts").  A record superseded by a re-verify request no longer counts; a Deployment made under an
earlier run does not bring the old verdict back.

A signature proves the operator wrote a record, not that it is still the truth: a genuinely
signed `Passed` saved before a failing re-verify and written back into status would replay it.
So the **ledger** decides which run of a key is the latest: the operator's own record, one
ConfigMap per model in the operator's namespace (`ledger_name`), which a namespace editor cannot
write.  It holds the latest final record of each key and is written before status.  A final
record in status counts only when it is the ledger's; a pass of an earlier run, or one the
ledger never saw, is ignored with a `StaleVerdictIgnored` event; a ledger record missing from
status (erased) is put back.  A failed run for a key therefore stays failed until a newer run
of that key passes.  Records name the run (Job, Job UID, re-verify run) and the model's
generation, all signed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from clef_operator import labels
from clef_operator.api import (
    ClefModelSpec,
    ClefModelStatus,
    Dtype,
    Step,
    Suite,
    Verdict,
    VerificationRecord,
    Verifier,
)
from clef_operator.conditions import Reason
from clef_operator.observed import DeploymentState, JobState, ModelRef
from clef_operator.revision import job_name

# The verdict annotation of a Deployment rolled out without verification.
NOT_REQUIRED = "NotRequired"
MAX_SUMMARY = 256
# status.observedReverify holds at most 256 characters; a longer request value is kept as its hash.
MAX_MARKER = 128
MAX_IGNORED = 16


# ------------------------------------------------------------------------------ scope


def verifier_of(spec: ClefModelSpec) -> Verifier:
    """A verification image or command of the user's own makes the verifier theirs, not clef's."""
    v = spec.verification
    return Verifier.CUSTOM if v.image or v.command else Verifier.CLEF


def reverify_marker(token: str) -> str:
    """What status.observedReverify keeps of a re-verify value: the value, or its sha256 when too
    long to store (the CRD bounds the field; an unbounded value would make every status write fail)."""
    if len(token) <= MAX_MARKER:
        return token
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def fresh_run(
    model: ModelRef,
    token: str,
    runs: int,
    deployments: Iterable[DeploymentState],
    jobs: Iterable[JobState],
) -> tuple[int, str]:
    """The run for a request acted on now: the first from `runs` on that no child of the model
    carries.  status.reverifyRuns is a cache; lost, the count starts again and (token, count)
    could name an earlier run, whose Job or Deployment would answer a request it never saw."""
    taken = {d.annotations.get(labels.REVERIFY_RUN, "") for d in deployments}
    names = {(j.key, j.name) for j in jobs}
    while True:
        run = run_id(token, runs)
        if run not in taken and not any(name == job_name(model.name, key, run) for key, name in names):
            return runs, run
        runs += 1  # at most one step per child: each (token, count) names a different run


def run_id(token: str, runs: int) -> str:
    """The re-verify run: a new one for every request acted on, also for a value seen before
    (1 -> 2 -> 1 is three runs); empty while none was ever requested."""
    if not token and runs == 0:
        return ""
    return hashlib.sha256(f"{reverify_marker(token)}#{runs}".encode()).hexdigest()[:12]


# ------------------------------------------------------------------------------ signatures


def signing_payload(model: ModelRef, record: VerificationRecord) -> bytes:
    """The canonical JSON of what a verdict speaks for.  Fields that only describe (summary,
    failing checks, device) are left out: changing them changes no decision."""
    fields: dict[str, str | bool | int] = {
        "namespace": model.namespace,
        "name": model.name,
        "uid": model.uid,
        "key": record.key,
        "image": record.image,
        "digest": record.digest or "",
        "gpuClass": record.gpu_class or "",
        "dtype": record.dtype.value,
        "suite": record.suite.value,
        "verifier": record.verifier.value,
        "verdict": record.verdict.value,
        "reason": record.reason,
        "job": record.job,
        "jobUid": record.job_uid,
        "finishedAt": record.finished_at,
        "run": record.run,
        "superseded": record.superseded,
    }
    # Only where they differ from their defaults, so that verdicts signed before these fields
    # existed still verify.
    if record.step is not Step.KERNELS:
        fields["step"] = record.step.value
    if record.generation is not None:
        fields["generation"] = record.generation
    if not record.final:
        fields["final"] = False
    # What a pass covers (plan_drivers, plan_endpoint_drivers): a driver edited in would serve.
    if record.node_driver:
        fields["nodeDriver"] = record.node_driver
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def sign(secret: bytes, model: ModelRef, record: VerificationRecord) -> VerificationRecord:
    digest = hmac.new(secret, signing_payload(model, record), hashlib.sha256).hexdigest()
    return record.model_copy(update={"signature": digest})


def is_trusted(secret: bytes, model: ModelRef, record: VerificationRecord) -> bool:
    """Signed by the operator's key, for this model, as it stands (constant-time comparison)."""
    if not record.signature:
        return False
    expected = hmac.new(secret, signing_payload(model, record), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, record.signature)


def fingerprint(record: VerificationRecord) -> str:
    """Names a record in events and status.ignoredVerdicts (never the signature itself)."""
    wire = json.dumps(record.to_wire(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(wire.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------ annotations


def encode_verdict(
    image: str, pinned_image: str, run: str, passed: VerificationRecord | None
) -> dict[str, str]:
    """The annotations of a serving Deployment of `image` pinned to `pinned_image`, created in
    re-verify `run`, from the (signed) verdict `passed` (None: verification was not required)."""
    out = {labels.IMAGE: image, labels.PINNED_IMAGE: pinned_image, labels.REVERIFY_RUN: run}
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
            labels.VERIFICATION_JOB_UID: passed.job_uid,
            labels.VERIFIER: passed.verifier.value,
            labels.VERDICT_SIGNATURE: passed.signature,
            labels.VERIFICATION_STEP: passed.step.value,
        }
    )
    # The run the verdict was reached in, which is not always the run the Deployment is made in.
    out[labels.REVERIFY_RUN] = passed.run
    if passed.gpu_class:
        out[labels.GPU_CLASS] = passed.gpu_class
    if passed.generation is not None:
        out[labels.VERIFIED_GENERATION] = str(passed.generation)
    if passed.node_driver:
        out[labels.VERIFIED_NODE_DRIVER] = passed.node_driver
    return out


def decode_verdict(annotations: Mapping[str, str]) -> VerificationRecord | None:
    """The passing verdict a serving Deployment was created from; None when it records none (not
    required, or annotations someone broke: a verdict that cannot be read never counts)."""
    a = annotations
    if a.get(labels.VERDICT) != Verdict.PASSED.value:
        return None
    try:
        verifier = Verifier(a.get(labels.VERIFIER, Verifier.CLEF.value))
        return VerificationRecord(
            key=a[labels.VERIFICATION_KEY],
            image=a[labels.IMAGE],
            digest=a[labels.PINNED_IMAGE],
            gpu_class=a.get(labels.GPU_CLASS) or None,
            dtype=Dtype(a[labels.VERIFIED_DTYPE]),
            suite=Suite(a[labels.VERIFIED_SUITE]),
            verdict=Verdict.PASSED,
            reason=Reason.VERIFIED if verifier is Verifier.CLEF else Reason.CUSTOM_VERIFIER_PASSED,
            summary=a.get(labels.VERDICT_SUMMARY, ""),
            job=a.get(labels.VERIFICATION_JOB, ""),
            job_uid=a.get(labels.VERIFICATION_JOB_UID, ""),
            finished_at=a.get(labels.VERIFIED_AT, ""),
            verifier=verifier,
            run=a.get(labels.REVERIFY_RUN, ""),
            signature=a.get(labels.VERDICT_SIGNATURE, ""),
            step=Step(a.get(labels.VERIFICATION_STEP, Step.KERNELS.value)),
            generation=int(a[labels.VERIFIED_GENERATION]) if labels.VERIFIED_GENERATION in a else None,
            node_driver=a.get(labels.VERIFIED_NODE_DRIVER) or None,
        )
    except (KeyError, ValueError):
        return None


# ------------------------------------------------------------------------------ collecting


@dataclass(frozen=True)
class Ignored:
    """A verdict that did not verify: where it was found, for the event."""

    fingerprint: str
    where: str
    record: VerificationRecord
    stale: str = ""  # signed, but not the ledger's latest run of its key: why (empty: unsigned)


@dataclass(frozen=True)
class Verdicts:
    """What the planner knows about verification keys.

    `records` is what status keeps (newest first, all signed); `known` adds the signed verdicts
    read back from Deployments; `current` is the verdict that answers the current spec's key, if
    one still counts (`run`: the re-verify run a new Job belongs to).  `reverify_requested` is a re-verify request
    seen for the first time; `ignored` the verdicts that did not verify."""

    records: tuple[VerificationRecord, ...]
    known: tuple[VerificationRecord, ...]
    current: VerificationRecord | None
    reverify_requested: bool
    run: str = ""
    runs: int = 0
    marker: str = ""
    ignored: tuple[Ignored, ...] = ()
    announced: tuple[str, ...] = ()
    # The ledger after this pass's re-verify request (None: the caller keeps none, as in tests of
    # the signatures alone).
    ledger: Mapping[str, VerificationRecord] | None = None

    def passed(self, key: str) -> VerificationRecord | None:
        return next(
            (
                r
                for r in self.known
                if r.key == key and r.verdict is Verdict.PASSED and r.final and not r.superseded
            ),
            None,
        )

    def step_passed(self, key: str, step: Step) -> VerificationRecord | None:
        """A pass of one step of the current key's verification (not superseded): where an
        unfinished verification stands, e.g. the kernels of mode both."""
        concluded = self.ledger.get(key) if self.ledger is not None else None
        return next(
            (
                r
                for r in self.records
                if r.key == key
                and r.step is step
                and r.verdict is Verdict.PASSED
                and not r.superseded
                # A step of a run that has concluded since belongs to that run, not to a new one.
                and (concluded is None or _after(r, concluded))
            ),
            None,
        )

    def gpu_memory_mib(self, key: str) -> int | None:
        """The GPU memory of the node a verdict for `key` ran on (what the KV estimate needs)."""
        return next((r.gpu_memory_mib for r in self.known if r.key == key and r.gpu_memory_mib), None)

    def gpu_class(self, key: str) -> str | None:
        """The GPU class a pass for `key` was reached on: what its serving pods are pinned to
        (superseded or not: a revision that still serves stays where it was pinned)."""
        return next(
            (
                r.gpu_class
                for r in self.known
                if r.key == key and r.verdict is Verdict.PASSED and r.final and r.gpu_class
            ),
            None,
        )

    def new_ignored(self) -> tuple[Ignored, ...]:
        """Ignored verdicts not yet announced (status.ignoredVerdicts lists those that were)."""
        return tuple(i for i in self.ignored if i.fingerprint not in self.announced)

    def ignored_fingerprints(self) -> list[str]:
        """status.ignoredVerdicts: the newest first, bounded."""
        out: list[str] = []
        for f in [*(i.fingerprint for i in self.ignored), *self.announced]:
            if f not in out:
                out.append(f)
        return out[:MAX_IGNORED]


def collect_verdicts(
    model: ModelRef,
    key: str,
    status: ClefModelStatus,
    deployments: Iterable[DeploymentState],
    secret: bytes,
    jobs: Iterable[JobState] = (),
    ledger: Mapping[str, VerificationRecord] | None = None,
) -> Verdicts:
    """Rule 1 (and 7): the signed verdicts recorded in status and on Deployments, minus what a
    re-verify request (a new value of the annotation: a new run, `fresh_run`) voided for the
    current `key`.  With the `ledger` (the operator's record of the latest final run per key),
    final records count only as the ledger has them (`reconcile_with_ledger`)."""
    deployments = tuple(deployments)
    token = model.reverify_token
    marker = reverify_marker(token)
    requested = marker != (status.observed_reverify or "")
    runs = status.reverify_runs or 0
    if requested:
        runs, run = fresh_run(model, token, runs + 1, deployments, jobs)
    else:
        run = run_id(token, runs)
    ignored: list[Ignored] = []
    records: list[VerificationRecord] = []
    for r in status.verifications:
        if not is_trusted(secret, model, r):
            ignored.append(Ignored(fingerprint(r), "status.verifications", r))
        elif requested and r.key == key and not r.superseded:
            # Re-signed: a hand edit that clears `superseded` would void the signature.
            records.append(sign(secret, model, r.model_copy(update={"superseded": True})))
        else:
            records.append(r)
    if ledger is not None:
        ledger = {
            k: (
                sign(secret, model, r.model_copy(update={"superseded": True}))
                if requested and k == key and not r.superseded
                else r
            )
            for k, r in ledger.items()
        }
        records, stale = reconcile_with_ledger(records, ledger)
        ignored += stale
    known = list(records)
    for d in deployments:
        derived = decode_verdict(d.annotations)
        if derived is None or any(r.key == derived.key and r.digest == derived.digest for r in known):
            continue
        if not is_trusted(secret, model, derived):
            ignored.append(Ignored(fingerprint(derived), f"Deployment {d.name}", derived))
            continue
        if derived.key == key and derived.run != run:
            continue  # reached in an earlier run: superseded by the re-verify request
        if ledger is not None and not _same_run(derived, ledger.get(derived.key)):
            continue  # not the latest run of its key: only the ledger's counts
        known.append(derived)
    # A pass of one step (goldens, preview, the kernels of mode both) does not conclude.
    current = next((r for r in known if r.key == key and not r.superseded and r.final), None)
    if ledger is not None:
        latest = ledger.get(key)
        current = latest if latest is not None and not latest.superseded else None
    if current is not None and current not in records:
        records.insert(0, current)
    return Verdicts(
        tuple(records),
        tuple(known),
        current,
        reverify_requested=requested and bool(token),
        run=run,
        runs=runs,
        marker=marker,
        ignored=tuple(ignored),
        announced=tuple(status.ignored_verdicts),
        ledger=ledger,
    )


# ------------------------------------------------------------------------------ the ledger

LEDGER_PREFIX = "clef-ledger-"
MAX_LEDGER_KEYS = 64


def ledger_name(model: ModelRef) -> str:
    """The model's ledger ConfigMap in the operator's namespace: by UID (a model deleted and made
    again under the same name starts a new one)."""
    return LEDGER_PREFIX + model.uid


def _same_run(a: VerificationRecord, b: VerificationRecord | None) -> bool:
    return b is not None and (a.key, a.job, a.job_uid, a.run, a.verdict, a.finished_at) == (
        b.key,
        b.job,
        b.job_uid,
        b.run,
        b.verdict,
        b.finished_at,
    )


def _after(a: VerificationRecord, b: VerificationRecord) -> bool:
    """`a` finished after `b` (both are the operator's ISO times in UTC)."""
    return a.finished_at > b.finished_at


def reconcile_with_ledger(
    records: list[VerificationRecord], ledger: Mapping[str, VerificationRecord]
) -> tuple[list[VerificationRecord], list[Ignored]]:
    """The signed status records, re-derived from the ledger: a final record that is the ledger's
    latest run of its key is replaced by the ledger's copy (its `superseded` is the ledger's); a
    failure of an earlier run and a superseded pass stay as history (they promote nothing); any
    other final pass (an earlier run's, or one the ledger never saw) is ignored, and so is a
    failure the ledger never saw.  A ledger record missing from status is put back, in order."""
    kept: list[VerificationRecord] = []
    ignored: list[Ignored] = []
    for r in records:
        latest = ledger.get(r.key)
        if not r.final:
            kept.append(r)
        elif _same_run(r, latest):
            assert latest is not None
            kept.append(latest)
        elif latest is not None and not _after(r, latest) and (r.verdict is Verdict.FAILED or r.superseded):
            kept.append(r)
        else:
            if latest is None:
                why = f"the operator's ledger holds no run of key {r.key}"
            else:
                why = (
                    f"the latest run of key {r.key} in the operator's ledger is Job {latest.job}"
                    f" ({latest.verdict.value}, {latest.reason}, finished {latest.finished_at})"
                )
            ignored.append(Ignored(fingerprint(r), "status.verifications", r, stale=why))
    for latest in ledger.values():
        if any(_same_run(r, latest) for r in kept):
            continue
        at = next((i for i, r in enumerate(kept) if _after(latest, r)), len(kept))
        kept.insert(at, latest)
    return kept, ignored


def ledger_after(
    ledger: Mapping[str, VerificationRecord], new: VerificationRecord | None
) -> dict[str, VerificationRecord]:
    """The ledger with the final record `new` as the latest run of its key (at most
    MAX_LEDGER_KEYS keys: the oldest go)."""
    out = dict(ledger)
    if new is not None and new.final:
        out[new.key] = new
    if len(out) > MAX_LEDGER_KEYS:
        newest = sorted(out.values(), key=lambda r: r.finished_at, reverse=True)[:MAX_LEDGER_KEYS]
        out = {r.key: r for r in newest}
    return out


def encode_ledger(ledger: Mapping[str, VerificationRecord]) -> dict[str, str]:
    """The ledger ConfigMap's data: one key per verification key, its record's canonical JSON."""
    return {
        k: json.dumps(r.to_wire(), sort_keys=True, separators=(",", ":")) for k, r in sorted(ledger.items())
    }


def decode_ledger(
    data: Mapping[str, str], secret: bytes, model: ModelRef
) -> tuple[dict[str, VerificationRecord], list[str]]:
    """The ledger's records that parse, are final, are filed under their own key and carry this
    operator's signature for this model; and what was wrong with the others (for the log)."""
    out: dict[str, VerificationRecord] = {}
    problems: list[str] = []
    for k, text in data.items():
        try:
            r = VerificationRecord.model_validate_json(text)
        except ValueError as e:
            problems.append(f"{k}: not a verification record ({str(e)[:200]})")
            continue
        if r.key != k or not r.final or not is_trusted(secret, model, r):
            problems.append(f"{k}: not a final record of key {k} signed by this operator's key")
            continue
        out[k] = r
    return out, problems
