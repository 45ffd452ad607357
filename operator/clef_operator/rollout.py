"""The rollout planner: the rollout rules of clef, as a sequence of named phases.

    plan_rollout(model, spec, observed, status, now) -> Plan(actions, status, requeue_after)

It decides from observed state only (the children, the Service, and the verdicts recorded in
status and on Deployments), never from memory of what it did before, so an operator restarted at
any moment computes the same next step.  A pass first renders what the spec alone gives, once
(`renderings`: the verification pod and key, the tag's serving pod, the goldens key), and hands
that to the phases, which render none of it again.  Each phase is a pure function that returns a
frozen value; `plan_rollout` runs them in order and joins their actions.  The phases live beside it:
`plan_verification` (2, 3), `plan_service` (4, and the Service switch of 5), `plan_revisions`
(5, 6), `plan_status` (7, 8).  The rules, and the one function that keeps each
(docs/architecture.md, "The planner"):

1. `verdicts.collect_verdicts`: the current spec has a verification key.  A verdict for that key
   (in status, or on a serving Deployment created from it) that was not superseded by a re-verify
   request is reused: a rollback to a revision that passed needs no Job.
2. `drive_verification`: otherwise the Job `<model>-verify-<key>` is created, or judged when it
   exists (fail closed: `verification.judge`); Jobs of other keys are deleted.
3. `desired_revision`: a pass pins serving to the digest the verification pod ran; the serving
   revision is the hash of the serving pod rendered with that digest.  A failure (or a Job still
   running) gives no revision to serve: no Deployment is created for the candidate.
   `children.revert_drift`: a serving Deployment's pod template edited outside clef is put back.
4. `active_revision`: what serves is what the Service says.  A deleted active Deployment is
   recreated (from the spec it was made from); someone else's change to the selector or the
   `http` port is put back.  A Service this model may not drive (not created by clef and not
   adopted with spec.service.adopt, or another owner's) is a conflict and stays untouched.
5. `move_towards_desired`: BlueGreen: create (or scale up) the candidate, wait until every
   replica is available, then patch the Service selector in one patch (an adopted Service: only
   its selector, its `http` port and clef's annotations change); the switch is reported by the
   next pass, requeued at once.  Recreate: first scale the active revision to 0 and wait for its
   pods to go (the pods themselves, terminating ones included: `_holding_gpus`), then the
   same.  The Service never selects a revision that is not available while another one serves.
   A model in Service conflict scales its serving Deployments to 0.
6. `retire_old_revisions`: revisions that no longer serve are scaled to 0
   `scaleDownDelaySeconds` after they were first seen not serving (recorded on them as an
   annotation, so it survives restarts), never while the active revision lacks available
   replicas; only `revisionHistoryLimit` of them are kept at 0, older ones are deleted.
7. `derive_conditions`: stuck pods (unschedulable, crash-looping, unpullable:
   `observed.PodState.problem`) surface in the conditions with the scheduler's or the container's
   own message; a failed verification is `Degraded=True` while `Ready` still reflects the active
   revision.  No timer ever promotes anything.
8. `build_status`: status reports what happened, after it happened: the active revision is the
   one the Service selected when the pass began.

DESIGN.md's "Rollout rules" in the same terms: 1 and 7 (reuse, rollback without a Job) ->
`collect_verdicts`; 2 (Job, fail closed) -> `drive_verification`; 3 and 4 (scale up, one
selector patch) -> `move_towards_desired`; 5 (delay, history) -> `retire_old_revisions`; 6
(failure holds the candidate) -> `desired_revision`, its conditions -> `derive_conditions`; 8
(digests) -> `desired_revision`; 9 (nothing stuck silently) -> `derive_conditions`; 10 (a verdict
speaks for what it checked) -> `verification.judge` and `verdicts` (scope, signatures), pinning
serving pods to the GPU class that passed -> `desired_revision`, and to the driver versions a
verdict covers, verifying a driver it does not cover first -> `plan_drivers`, reverting
pod-template drift -> `children.revert_drift`; 11
(status after the fact) -> `derive_conditions` and `build_status`; 13 (verified once is not
verified forever: probes of the serving revision) -> `plan_watch.plan_probes`, and its policy
rollback (a failure in service, then the newest kept revision verified on the GPU class) ->
`plan_rollback.roll_back`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from clef_operator.actions import Action
from clef_operator.api import (
    ClefModelSpec,
    ClefModelStatus,
    VerificationMode,
    VerificationRecord,
    WatchPolicy,
)
from clef_operator.children import label_verified_pods, revert_drift
from clef_operator.conditions import SERVING, Stamp
from clef_operator.observed import ModelRef, Observed
from clef_operator.plan_drivers import off_their_drivers, plan_drivers
from clef_operator.plan_endpoint_drivers import plan_endpoint_drivers, withheld_pods
from clef_operator.plan_revisions import move_towards_desired, retire_old_revisions, stop_stale_previews
from clef_operator.plan_rollback import roll_back, served_verdict, with_failure
from clef_operator.plan_service import active_revision
from clef_operator.plan_status import MAX_RECORDS, build_status, derive_conditions
from clef_operator.plan_verification import Desired, desired_revision, drive_verification
from clef_operator.plan_watch import ProbeReport, Rollback, plan_probes
from clef_operator.render import Owner
from clef_operator.renderings import renderings
from clef_operator.verdicts import collect_verdicts, ledger_after


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    status: ClefModelStatus
    requeue_after: float | None = None
    # The model's ledger to write before status, when it changed (verdicts.py, "the ledger").
    ledger: dict[str, VerificationRecord] | None = None
    # What the probes of the serving revision found, for their metrics (manager/probe_metrics.py).
    probes: ProbeReport = field(default_factory=ProbeReport)


def plan_rollout(
    model: ModelRef,
    spec: ClefModelSpec,
    observed: Observed,
    status: ClefModelStatus,
    now: datetime,
    verdict_key: bytes,
) -> Plan:
    """The phases in order; the actions are theirs, in the same order (status goes first: the
    pass (`reconcile`) writes it before applying any action).  `verdict_key` is the operator's HMAC key:
    verdicts it did not sign never count (verdicts.py)."""
    owner = Owner(model.name, model.namespace, model.uid)
    rendered = renderings(owner, spec)
    key = rendered.key
    verdicts = collect_verdicts(
        model, key, status, observed.deployments, verdict_key, observed.jobs, observed.ledger
    )
    verification = drive_verification(model, rendered, spec, observed, verdicts, now, verdict_key)
    # Kernels mode pins serving pods to covered drivers; endpoint and both verify a driver in place.
    driven = plan_drivers if rendered.mode is VerificationMode.KERNELS else plan_endpoint_drivers
    drivers = driven(model, rendered, spec, observed, verdicts, verification.passed, now, verdict_key)
    desired = desired_revision(rendered, spec, verification, verdicts.run, drivers.covered)
    desired = roll_back(spec.verification.watch, observed.deployments, verdicts, verification, desired)
    drift = revert_drift(observed, _known_templates(desired))
    active = active_revision(model, owner, spec, observed, status, verdicts, desired)
    move = move_towards_desired(model, owner, spec, observed, desired, active)
    previews = stop_stale_previews(observed, {verification.preview, desired.revision, move.active_revision})
    retired = retire_old_revisions(spec, observed, move, now, {verification.preview, *previews.stopped})
    stamp = Stamp(now, model.generation)
    previous = next((c for c in status.conditions if c.type == SERVING), None)
    watch = spec.verification.watch
    rollback = None
    if watch is not None and watch.policy is WatchPolicy.ROLLBACK:
        rollback = Rollback(
            served_verdict(move.active_deployment, verdicts), desired.failed, desired.revision
        )
    # With nothing to roll back to, the revision that failed in service is still probed.
    probed = desired.revision or (move.active_revision if desired.failed is not None else "")
    probes = plan_probes(
        stamp, model, rendered, spec, observed, probed, move.active_revision, previous, verdict_key, rollback
    )
    known = (*verdicts.known, *((drivers.new_record,) if drivers.new_record is not None else ()))
    required = spec.verification.required
    held = withheld_pods(
        model, required, observed, known, verification.passed, verdict_key, drivers.in_place, drivers.unasked
    )
    off_driver = {**off_their_drivers(observed), **held.unverified}
    serving_labels = label_verified_pods(
        model,
        spec.verification.required,
        observed,
        verdict_key,
        {**held.every(), **off_driver, **probes.withheld},
    )
    conditions = replace(
        derive_conditions(
            stamp, model, spec, observed, verification, active, move, retired, drift, off_driver
        ),
        serving=probes.serving,
    )
    new_status = build_status(
        model, spec, key, observed, status, verdicts, verification, desired, active, move, conditions
    )
    # Drift is reverted first: a revision is never scaled up or switched to with a foreign template.
    actions = (
        *verification.actions,
        *drivers.actions,
        *drift.actions,
        # Before any switch: the Service selects a revision's pods by the serving label.
        *serving_labels,
        *active.actions,
        *move.actions,
        *previews.actions,
        *retired.actions,
        *probes.actions,
    )
    # A switch made in this pass is reported by the next one, which comes at once.
    waits = [
        w
        for w in (retired.requeue_after, verification.recheck, drivers.recheck, probes.requeue_after)
        if w is not None
    ]
    requeue = 0.0 if move.switching else (min(waits) if waits else None)
    ledger = None
    if verdicts.ledger is not None:
        ledger = ledger_after(verdicts.ledger, verification.new_record)
        ledger = ledger_after(ledger, drivers.new_record)
        if probes.failure is not None:
            ledger = ledger_after(ledger, probes.failure)
        ledger = None if ledger == observed.ledger else ledger
    if drivers.new_record is not None:
        records = [drivers.new_record, *new_status.verifications]
        new_status = new_status.model_copy(update={"verifications": records[:MAX_RECORDS]})
    if probes.failure is not None:
        records = with_failure(verdict_key, model, new_status.verifications, probes.failure)
        new_status = new_status.model_copy(update={"verifications": records[:MAX_RECORDS]})
    return Plan(actions, new_status, requeue, ledger, probes.report)


def _known_templates(desired: Desired) -> dict[str, Mapping[str, Any]]:
    if desired.manifest is None:
        return {}
    return {desired.revision: desired.manifest["spec"]["template"]}
