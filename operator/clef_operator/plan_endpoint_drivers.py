"""Re-verify when the ground changes, in modes endpoint and both (docs/verification.md, "The verdict
key and the ground it stood on"): the driver a serving pod runs on is verified in place, before the
pod serves.

The serving revision of these modes is the promoted preview, rendered before any node was chosen,
so it cannot be pinned to drivers as a kernels-mode revision is (`plan_drivers`).  The driver is
held at the serving label instead:

* **covered**: the comparison's pass names the driver of the preview pod's node (`nodeDriver`) and
  covers it; each pass that extends it covers one more (`plan_drivers.covered_by`, `driver_key`).
* **withheld** (`withheld_pods`): a serving pod of a revision whose verdict is an endpoint pass
  carries the serving label only on a node of a covered driver.  On another it is kept out of the
  Service (`children.label_verified_pods` never gives it the label, or takes it off with
  `PodCordoned`; `Degraded=True/UnverifiedDriver`), and so, silently, is a pod that has no node
  yet: no pod carries the label before its driver is known.
* **verified in place** (`plan_endpoint_drivers`): while the current key's verdict is a pass, the
  first uncovered driver (in version order) of a Ready withheld pod of that key's revisions gets
  the comparison Job against that pod at its own address (`endpoint.render_driver_check_job`: the
  signed goldens, their digest in the argv, judged as a probe is, `plan_watch.judge_check`), key
  `driver_key(key, pass, driver)`, one at a time.  A pass while the pod's node still reports that
  driver is a signed record that extends the pass: every pod on that driver serves, in the same
  reconcile pass.  A failure keeps them withheld and is not tried again until a new pass of the
  key.  Nothing is rendered again and no engine restarts.

Everything is read from observed state (the Jobs, the signed records), so a restarted operator
takes the same next step.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from clef_operator import labels
from clef_operator.actions import Action, CreateJob, DeleteJob, event
from clef_operator.api import ClefModelSpec, Step, Verdict, VerificationRecord
from clef_operator.conditions import clause
from clef_operator.endpoint import Judged, check_job_name, render_driver_check_job
from clef_operator.goldens import goldens_name
from clef_operator.observed import (
    DeploymentState,
    JobState,
    ModelRef,
    NodeState,
    Observed,
    PodState,
    node_versions,
)
from clef_operator.plan_drivers import UNKNOWN, Drivers, cancel_others, covered_by, driver_key, shown
from clef_operator.plan_watch import asked_pod, judge_check, signed_goldens, unstored
from clef_operator.renderings import Renderings
from clef_operator.verdicts import Verdicts, decode_verdict, is_trusted, sign
from clef_operator.verification import Progress

TERMINAL = ("Succeeded", "Failed")
UNPLACED = "it has no node yet: it serves once its node's driver is known and verified"
NOT_ASKED = (
    "it is not asked in place: its revision is not the one the current spec's pass promoted"
    " (it serves again only on a covered driver, or is replaced)"
)


@dataclass(frozen=True)
class Withheld:
    """Serving pods kept from the serving label: on a node whose driver no verification of their
    revision's pass covers (pod -> why, reported in Degraded), and those with no node yet."""

    unverified: Mapping[str, str] = field(default_factory=dict)
    unplaced: tuple[str, ...] = ()

    def every(self) -> dict[str, str]:
        return {**dict.fromkeys(self.unplaced, UNPLACED), **self.unverified}


def endpoint_base(required: bool, current: VerificationRecord | None) -> VerificationRecord | None:
    """The current key's pass when it is an endpoint pass (modes endpoint and both) with a digest
    and verification is `required` (spec.verification.required); else None."""
    if not required or current is None:
        return None
    if current.verdict is not Verdict.PASSED or current.step is not Step.ENDPOINT or not current.digest:
        return None
    return current


def _endpoint_pass(dep: DeploymentState, model: ModelRef, secret: bytes) -> VerificationRecord | None:
    """The signed endpoint pass a serving Deployment was promoted with (None: none, or a kernels one)."""
    if dep.deleting or labels.PREVIEW_FOR in dep.annotations:
        return None
    record = decode_verdict(dep.annotations)
    if record is None or record.verdict is not Verdict.PASSED or record.step is not Step.ENDPOINT:
        return None
    return record if is_trusted(secret, model, record) else None


def _serving(
    model: ModelRef, observed: Observed, base: VerificationRecord | None, secret: bytes
) -> Iterator[tuple[PodState, VerificationRecord]]:
    """Live serving pods of revisions promoted by an endpoint pass, each with the pass its drivers
    hang on: `base` (the current pass) for revisions of its key, else the one on their Deployment."""
    passes: dict[str, VerificationRecord] = {}
    for d in observed.deployments:
        record = _endpoint_pass(d, model, secret)
        if record is not None:
            passes[d.revision] = base if base is not None and record.key == base.key else record
    for p in observed.pods:
        found = passes.get(p.revision)
        if found is None or p.component != labels.COMPONENT_SERVING or p.deleting or p.phase in TERMINAL:
            continue
        yield p, found


def driver_of(pod: PodState, nodes: Mapping[str, NodeState]) -> str:
    """The driver the pod's node reports now ("" unknown)."""
    node = nodes.get(pod.node_name)
    return node.driver if node is not None else pod.node_driver


def withheld_pods(
    model: ModelRef,
    required: bool,
    observed: Observed,
    records: Iterable[VerificationRecord],
    current: VerificationRecord | None,
    secret: bytes,
    in_place: tuple[str, ...] | None = None,
    unasked: str = "",
) -> Withheld:
    """The serving pods of endpoint-verified revisions that may not carry the serving label:
    `records` are the signed verdicts known (this pass's new one included), `current` the current
    key's verdict, `in_place` what it covers when known and `unasked` why its pods cannot be asked
    now (`Drivers`).  Nothing is withheld where verification is not `required`."""
    if not required:
        return Withheld()
    records = tuple(records)
    nodes = {n.name: n for n in observed.nodes}
    base = endpoint_base(required, current)
    covered: dict[tuple[str, str], tuple[str, ...]] = {}
    if base is not None and in_place is not None:
        covered[(base.key, base.job_uid)] = in_place
    unverified: dict[str, str] = {}
    unplaced: list[str] = []
    for pod, held_by in _serving(model, observed, base, secret):
        if not pod.node_name:
            unplaced.append(pod.name)
            continue
        ours = (held_by.key, held_by.job_uid)
        if ours not in covered:
            covered[ours] = covered_by(held_by.key, held_by, records)
        driver = driver_of(pod, nodes)
        if driver not in covered[ours]:
            said = _unverified(pod, driver, held_by, covered[ours])
            if held_by is not base:
                unverified[pod.name] = f"{said}; {NOT_ASKED}"
            else:
                unverified[pod.name] = _why(said, driver, held_by, records, unasked)
    return Withheld(unverified, tuple(sorted(unplaced)))


def _unverified(pod: PodState, driver: str, held_by: VerificationRecord, covered: tuple[str, ...]) -> str:
    return (
        f"node {pod.node_name} reports driver {shown(driver)}, on which {held_by.digest} was never verified"
        f" (verified: {', '.join(shown(d) for d in covered)})"
    )


def _why(
    said: str, driver: str, base: VerificationRecord, records: tuple[VerificationRecord, ...], unasked: str
) -> str:
    """What happens next to a withheld pod of the current pass (`said`: why it is withheld)."""
    dkey = driver_key(base.key, base, driver)
    done = next((r for r in records if r.key == dkey and r.final), None)
    if done is None and unasked:
        return f"{said}; it cannot be asked in place: {unasked}"
    if done is None:
        return f"{said}; a comparison Job asks it the goldens in place before it serves"
    if done.verdict is Verdict.PASSED:
        return (
            f"{said}; its verification (Job {done.job}) ended on a node that then reported driver"
            f" {shown(done.node_driver or UNKNOWN)}: it does not serve there until a re-verification passes"
        )
    return (
        f"{said}; its verification (Job {done.job}) failed: {done.reason}: {clause(done.summary)}. It does not"
        " serve there until a re-verification passes"
    )


def _targets(
    model: ModelRef, observed: Observed, base: VerificationRecord, covered: tuple[str, ...], secret: bytes
) -> dict[str, list[PodState]]:
    """Ready pods of `base`'s key at an address on a node of an uncovered driver, by driver (in
    version order), each list by name."""
    nodes = {n.name: n for n in observed.nodes}
    out: dict[str, list[PodState]] = {}
    for pod, found in _serving(model, observed, base, secret):
        if found is not base or not pod.node_name or not (pod.ready and pod.ip and pod.phase == "Running"):
            continue
        driver = driver_of(pod, nodes)
        if driver not in covered:
            out.setdefault(driver, []).append(pod)
    return {d: sorted(pods, key=lambda p: p.name) for d, pods in sorted(out.items())}


def plan_endpoint_drivers(
    model: ModelRef,
    rendered: Renderings,
    spec: ClefModelSpec,
    observed: Observed,
    verdicts: Verdicts,
    current: VerificationRecord | None,
    now: datetime,
    secret: bytes,
) -> Drivers:
    """While `current` (the current key's verdict) is an endpoint pass: the in-place verification
    of the first uncovered driver a Ready withheld pod of its key runs on, created, judged or
    signed; driver Jobs no longer wanted are stopped.  Serving is pinned to nothing (`covered`
    None): what holds a pod is its serving label (`withheld_pods`)."""
    base = endpoint_base(spec.verification.required, current)
    wanted = ""
    out = Drivers()
    covered: tuple[str, ...] | None = None
    if base is not None:
        covered = covered_by(base.key, base, verdicts.known)
        targets = _targets(model, observed, base, covered, secret)
        jobs = _driver_jobs(observed)
        # A finished Job is judged first (it costs nothing), then drivers in version order.
        finished = sorted(d for d, j in jobs.items() if j.finished)
        for driver in dict.fromkeys([*finished, *targets]):
            dkey = driver_key(base.key, base, driver)
            if any(r.key == dkey and r.final for r in verdicts.known):
                continue  # concluded without covering it: until a new pass of the key, not again
            if driver not in targets and jobs[driver].key != dkey:
                continue  # a finished Job of another pass's
            wanted = check_job_name(model.name, dkey, "")
            out = _drive(
                _Ctx(model, rendered, spec, observed, now, secret), base, driver, targets.get(driver, [])
            )
            if _covers(out.new_record, base, driver):
                covered = tuple(sorted({*covered, driver}))
            break
    return replace(out, actions=(*out.actions, *cancel_others(observed, wanted)), in_place=covered)


def _driver_jobs(observed: Observed) -> dict[str, JobState]:
    """The in-place driver verifications there are, by the driver each verifies (a kernels-mode
    driver Job names none)."""
    return {
        j.annotations[labels.DRIVER]: j
        for j in observed.jobs
        if j.step == labels.STEP_DRIVER and not j.deleting and labels.DRIVER in j.annotations
    }


def _covers(record: VerificationRecord | None, base: VerificationRecord, driver: str) -> bool:
    """Whether this pass's record of `driver`'s verification (key `driver_key`) extends `base`
    (`plan_drivers.covered_by`'s rule, its key known)."""
    return (
        record is not None
        and record.verdict is Verdict.PASSED
        and (record.node_driver or UNKNOWN) == driver
        and record.digest == base.digest
        and record.gpu_class == base.gpu_class
    )


@dataclass(frozen=True)
class _Ctx:
    model: ModelRef
    rendered: Renderings
    spec: ClefModelSpec
    observed: Observed
    now: datetime
    secret: bytes


def _drive(ctx: _Ctx, base: VerificationRecord, driver: str, pods: list[PodState]) -> Drivers:
    """The in-place verification of `driver` against the first of `pods`: created, or judged."""
    dkey = driver_key(base.key, base, driver)
    name = check_job_name(ctx.model.name, dkey, "")
    job = ctx.observed.job(name)
    if job is None:
        return _start(ctx, base, driver, dkey, pods[0]) if pods else Drivers()
    if job.deleting:
        return Drivers()
    asked = asked_pod(job, ctx.observed)
    if asked is None:
        # The pod it asked is gone or moved: its verdict could not be tied to a node; another pod
        # of that driver is asked once this Job is gone.
        return Drivers(actions=(DeleteJob(name),))
    judged = judge_check(
        ctx.model, ctx.spec, ctx.observed, job, ctx.spec.verification.timeout_seconds, ctx.secret
    )
    if isinstance(judged, Progress):
        return Drivers()
    return _concluded(ctx, base, (driver, dkey), job.name, job.uid, asked, judged)


def _start(ctx: _Ctx, base: VerificationRecord, driver: str, dkey: str, pod: PodState) -> Drivers:
    gname = goldens_name(ctx.model.name, ctx.rendered.goldens)
    goldens = signed_goldens(ctx.model, ctx.observed, gname, ctx.secret)
    if goldens is None:
        return Drivers(unasked=unstored(gname))  # nothing to ask with: the pods stay withheld
    assert base.digest is not None
    manifest = render_driver_check_job(
        ctx.rendered.owner, ctx.spec, (driver, dkey), base.digest, pod, goldens
    )
    said = event(
        "DriverVerificationStarted",
        f"pod {pod.name} runs on node {pod.node_name}, driver {shown(driver)}, on which {base.digest} was never"
        f" verified; Job {manifest['metadata']['name']} asks it the goldens in place before it serves",
    )
    return Drivers(actions=(CreateJob(manifest), said))


def _concluded(
    ctx: _Ctx,
    base: VerificationRecord,
    target: tuple[str, str],
    job: str,
    job_uid: str,
    pod: PodState,
    judged: Judged,
) -> Drivers:
    """The signed record of a finished in-place verification, and what is said of it."""
    driver, dkey = target
    node = next((n for n in ctx.observed.nodes if n.name == pod.node_name), None)
    ran_on, cuda = (
        node_versions(node.labels) if node is not None else (pod.node_driver, pod.node_cuda_runtime)
    )
    record = VerificationRecord(
        key=dkey,
        image=ctx.spec.image,
        digest=base.digest,
        gpu_class=pod.node_gpu_product or None,
        gpu_memory_mib=pod.node_gpu_memory_mib,
        node_driver=ran_on or None,
        node_cuda_runtime=cuda or None,
        dtype=ctx.spec.dtype,
        suite=ctx.spec.verification.suite,
        verdict=Verdict.PASSED if judged.passed else Verdict.FAILED,
        reason=judged.reason,
        summary=judged.summary[:1024],
        failing=list(judged.failing),
        device=judged.device,
        runtime_version=judged.runtime_version,
        job=job,
        job_uid=job_uid,
        finished_at=ctx.now.isoformat(),
        step=Step.ENDPOINT,
        final=True,
        generation=ctx.model.generation,
    )
    record = sign(ctx.secret, ctx.model, record)
    stop = (DeleteJob(job),) if judged.stop_job else ()
    return Drivers(new_record=record, actions=(*stop, _said(base, driver, job, pod, record)))


def _said(
    base: VerificationRecord, driver: str, job: str, pod: PodState, record: VerificationRecord
) -> Action:
    where = f"driver {shown(driver)} (pod {pod.name} on node {pod.node_name})"
    ran_on = shown(record.node_driver or UNKNOWN)
    if record.verdict is Verdict.PASSED and ran_on == shown(driver):
        return event(
            "DriverVerified",
            f"{base.digest} answered the goldens on {where}: {record.summary}; its pods on that driver serve",
        )
    if record.verdict is Verdict.PASSED:
        return event(
            "DriverVerificationFailed",
            f"{base.digest}: Job {job} asked the pod on {where} but its node reported driver {ran_on} when it"
            " finished (relabelled meanwhile); that driver stays unverified until a re-verification passes",
            warning=True,
        )
    return event(
        "DriverVerificationFailed",
        f"{base.digest} on {where}: {record.reason}: {record.summary}; its pods on that driver stay out of"
        " serving until a re-verification passes",
        warning=True,
    )
