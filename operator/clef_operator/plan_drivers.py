"""Re-verify when the ground changes: the driver versions a verdict covers, and the verification of
a driver it does not cover yet (docs/verification.md, "The verdict key and the ground").

A verdict (kernels mode) passed on one node, which reported a driver version (`observed.
node_versions`: GPU feature discovery's labels; "" for a node that reports none).  Its serving pods
are pinned to the drivers it *covers* (`covered_drivers`: required node affinity,
`render.driver_affinity`), so a pod never lands on a node whose driver no verification ran on.  A
schedulable node of the verdict's GPU class with a driver not covered (a new node, a driver
upgraded in place) gets a verification first (`plan_drivers`): the kernels Job of the same spec,
running the digest that passed, pinned to that GPU class and that driver.  Its pass widens the set,
which renders a new serving revision (the pin is part of the pod spec) that rolls out as any other.

Each such verification has a key of its own (`driver_key`: the spec's key, the Job UID of the pass
it extends, the driver), so a re-verify request (a new pass) starts the set again from the new
pass's driver, and a failed driver stays failed until then: nodes of that driver never serve the
model meanwhile.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from clef_operator import labels
from clef_operator.actions import Action, CreateJob, DeleteJob, event
from clef_operator.api import (
    ClefModelSpec,
    Toleration,
    Verdict,
    VerificationMode,
    VerificationRecord,
    effective_mode,
)
from clef_operator.observed import ModelRef, NodeState, Observed
from clef_operator.plan_verification import judge_job
from clef_operator.render import (
    driver_affinity,
    gpu_pin,
    job_manifest,
    object_labels,
    verifier_pull_policy,
)
from clef_operator.renderings import Renderings
from clef_operator.revision import job_name, short_hash
from clef_operator.verdicts import Verdicts, sign
from clef_operator.verification import Progress

UNKNOWN = ""


def shown(driver: str) -> str:
    return driver or "(not reported)"


def driver_key(key: str, base: VerificationRecord, driver: str) -> str:
    """The key of the verification of `driver` that extends the pass `base` of `key`."""
    return short_hash({"key": key, "extends": base.job_uid, "digest": base.digest, "driver": driver})


def pinned(spec: ClefModelSpec, mode: VerificationMode | None = None) -> bool:
    """Whether serving pods of `spec` (of verification mode `mode`, where the pass has it) are
    pinned to covered drivers: kernels mode, verification required.  (Endpoint mode promotes its
    preview, rendered before any node is known: not yet.)"""
    return spec.verification.required and (mode or effective_mode(spec)) is VerificationMode.KERNELS


def base_pass(verdicts: Verdicts, key: str) -> VerificationRecord | None:
    """The pass of `key` serving is pinned by: the newest final one (superseded or not, like
    `Verdicts.gpu_class`: a revision that still serves stays where it was pinned)."""
    return next(
        (r for r in verdicts.known if r.key == key and r.verdict is Verdict.PASSED and r.final and r.digest),
        None,
    )


def _extends(r: VerificationRecord, key: str, base: VerificationRecord) -> bool:
    return (
        r.verdict is Verdict.PASSED
        and r.final
        and r.digest == base.digest
        and r.gpu_class == base.gpu_class
        and r.key == driver_key(key, base, r.node_driver or UNKNOWN)
    )


def covered_drivers(
    spec: ClefModelSpec,
    key: str,
    verdicts: Verdicts,
    base: VerificationRecord | None = None,
    mode: VerificationMode | None = None,
) -> tuple[str, ...] | None:
    """The drivers serving pods of `spec` (verification key `key`) may run on: the driver of its
    pass (`base`, else `base_pass`) and of each pass that extends it; None where nothing is
    pinned (`pinned`, no pass)."""
    if not pinned(spec, mode):
        return None
    base = base or base_pass(verdicts, key)
    if base is None:
        return None
    return covered_by(key, base, verdicts.known)


def covered_by(key: str, base: VerificationRecord, records: Iterable[VerificationRecord]) -> tuple[str, ...]:
    """The driver of the pass `base` of `key` and of each of `records` that extends it, sorted."""
    found = {base.node_driver or UNKNOWN}
    found |= {r.node_driver or UNKNOWN for r in records if _extends(r, key, base)}
    return tuple(sorted(found))


def tolerates(tolerations: Iterable[Toleration], taint: Any) -> bool:
    """Kubernetes' rule: some toleration matches the taint's key (or has none, with Exists), its
    value (Equal) and its effect (or has none)."""
    for t in tolerations:
        if t.effect and t.effect != taint.effect:
            continue
        if t.operator == "Exists" and (not t.key or t.key == taint.key):
            return True
        if t.operator == "Equal" and t.key == taint.key and (t.value or "") == taint.value:
            return True
    return False


def eligible(spec: ClefModelSpec, selector: Mapping[str, str], node: NodeState) -> bool:
    """A node the model's serving pods could be scheduled to, driver aside: not cordoned, of
    `selector` (spec.nodeSelector and the GPU class, `render.gpu_pin`), every NoSchedule/NoExecute
    taint tolerated."""
    if node.unschedulable:
        return False
    if any(node.labels.get(k) != v for k, v in selector.items()):
        return False
    return all(tolerates(spec.tolerations, t) for t in node.taints if t.effect in ("NoSchedule", "NoExecute"))


def uncovered(
    spec: ClefModelSpec, gpu_class: str | None, nodes: Iterable[NodeState], covered: tuple[str, ...]
) -> dict[str, list[str]]:
    """Drivers of eligible nodes (of `gpu_class`) that no verdict covers, each with its nodes
    (sorted)."""
    selector = gpu_pin(spec, gpu_class)
    out: dict[str, list[str]] = {}
    for n in sorted(nodes, key=lambda n: n.name):
        if eligible(spec, selector, n) and n.driver not in covered:
            out.setdefault(n.driver, []).append(n.name)
    return dict(sorted(out.items()))


def satisfies(node_labels: Mapping[str, str], terms: Iterable[Mapping[str, Any]]) -> bool:
    """Kubernetes' rule for required node affinity: some term whose every expression holds (the
    operators clef renders, In and DoesNotExist, and their opposites NotIn and Exists)."""

    def holds(e: Mapping[str, Any]) -> bool:
        value, op = node_labels.get(e["key"]), e["operator"]
        if op in ("In", "NotIn"):
            return (value in e.get("values", ())) == (op == "In")
        if op in ("Exists", "DoesNotExist"):
            return (value is not None) == (op == "Exists")
        return False  # Gt/Lt: never rendered by clef; a pod pinned so is not vouched for

    return any(all(holds(e) for e in t.get("matchExpressions", ())) for t in terms)


def _required_terms(template: Mapping[str, Any] | None) -> list[Mapping[str, Any]] | None:
    affinity = ((template or {}).get("spec") or {}).get("affinity") or {}
    required = (affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    return None if required is None else list(required.get("nodeSelectorTerms") or ())


def off_their_drivers(observed: Observed) -> dict[str, str]:
    """Serving pods whose node no longer satisfies the driver pin of their revision's pod template
    (the scheduler checks required node affinity only when it places a pod: a driver upgraded under
    a running pod, whose engine restarts on it, is never seen): pod name -> why.  They lose the
    serving label (`children.label_verified_pods`), and get it back when their node reports a
    driver their revision covers again; a node of the GPU class with an uncovered driver gets its
    verification (`plan_drivers`), whose pass widens the pin into a new revision that replaces them."""
    nodes = {n.name: n for n in observed.nodes}
    templates = {d.revision: d.template for d in observed.deployments}
    pins: dict[str, list[Mapping[str, Any]] | None] = {}
    out: dict[str, str] = {}
    for p in observed.pods:
        node = nodes.get(p.node_name)
        if (
            p.component != labels.COMPONENT_SERVING
            or p.deleting
            or node is None
            or p.revision not in templates
        ):
            continue
        if p.revision not in pins:
            pins[p.revision] = _required_terms(templates[p.revision])
        terms = pins[p.revision]
        if terms is not None and not satisfies(node.labels, terms):
            out[p.name] = (
                f"node {node.name} now reports driver {shown(node.driver)}, which no verification of"
                f" revision {p.revision} ran on; the driver is verified before it serves there again"
            )
    return out


def render_driver_job(
    rendered: Renderings, spec: ClefModelSpec, base: VerificationRecord, driver: str, dkey: str
) -> dict[str, Any]:
    """The kernels Job of `spec` (its verification pod as the pass rendered it) of key `dkey`
    (`driver_key`), running the digest `base` passed with (clef's verifier runs in the serving
    image) on its GPU class, pinned to nodes of `driver`."""
    owner = rendered.owner
    pod = copy.deepcopy(rendered.verification_pod)
    container = pod["containers"][0]
    if not spec.verification.image and base.digest:
        container["image"] = base.digest
        container["imagePullPolicy"] = verifier_pull_policy(base.digest)
    pod["nodeSelector"] = gpu_pin(spec, base.gpu_class)
    pod["affinity"] = driver_affinity((driver,))
    job_labels = {
        **object_labels(owner.name, labels.COMPONENT_VERIFICATION),
        labels.REVISION: dkey,
        labels.VERIFICATION_KEY: dkey,
        labels.STEP: labels.STEP_DRIVER,
    }
    annotations = {labels.IMAGE: spec.image, labels.PINNED_IMAGE: base.digest or ""}
    return job_manifest(owner, job_name(owner.name, dkey, ""), job_labels, annotations, spec, pod)


@dataclass(frozen=True)
class Drivers:
    """What this pass does about drivers: the set serving is pinned to (None: no pin), a new
    signed record of a driver verification, its actions."""

    covered: tuple[str, ...] | None = None
    new_record: VerificationRecord | None = None
    actions: tuple[Action, ...] = ()
    recheck: float | None = None
    # Modes endpoint and both (`plan_endpoint_drivers`): the drivers the current pass covers, this
    # pass's record included; serving pods are held to them by the serving label, not pinned.
    in_place: tuple[str, ...] | None = None
    # Why a withheld pod of the current pass cannot be asked in place now ("" it can).
    unasked: str = ""


def plan_drivers(
    model: ModelRef,
    rendered: Renderings,
    spec: ClefModelSpec,
    observed: Observed,
    verdicts: Verdicts,
    current: VerificationRecord | None,
    now: datetime,
    secret: bytes,
) -> Drivers:
    """The drivers serving is pinned to, and, while `current` (the current key's verdict, maybe
    reached on this pass) is a pass, the verification of the first uncovered driver of an
    eligible node that has none concluded (one at a time)."""
    base = current if current is not None and current.verdict is Verdict.PASSED else None
    key = rendered.key
    covered = covered_drivers(spec, key, verdicts, base, rendered.mode)
    wanted = ""
    out = Drivers(covered)
    if covered is not None and base is not None:
        for driver, nodes in uncovered(spec, base.gpu_class, observed.nodes, covered).items():
            dkey = driver_key(key, base, driver)
            if any(r.key == dkey and r.final for r in verdicts.known):
                continue  # concluded without covering it: until a new pass of `key`, not again
            wanted = job_name(model.name, dkey, "")
            out = _drive(model, rendered, spec, base, (driver, dkey), nodes, observed, now, secret, covered)
            break
    return Drivers(out.covered, out.new_record, (*out.actions, *cancel_others(observed, wanted)), out.recheck)


def _drive(
    model: ModelRef,
    rendered: Renderings,
    spec: ClefModelSpec,
    base: VerificationRecord,
    target: tuple[str, str],
    nodes: list[str],
    observed: Observed,
    now: datetime,
    secret: bytes,
    covered: tuple[str, ...],
) -> Drivers:
    driver, dkey = target
    manifest = render_driver_job(rendered, spec, base, driver, dkey)
    name = manifest["metadata"]["name"]
    job = observed.job(name)
    where = f"driver {shown(driver)} (node {', '.join(nodes)})"
    if job is None:
        said = event(
            "DriverVerificationStarted",
            f"{where} has no verdict for {base.digest} on {base.gpu_class}; verified drivers:"
            f" {', '.join(shown(d) for d in covered)}; Job {name} verifies it before the model serves there",
        )
        return Drivers(covered, actions=(CreateJob(manifest), said))
    if job.deleting:
        return Drivers(covered)
    judged, recheck = judge_job(spec, observed, job, now)
    if isinstance(judged, Progress):
        return Drivers(covered, recheck=recheck)
    record = sign(secret, model, judged.record.model_copy(update={"run": "", "generation": model.generation}))
    stop = (DeleteJob(name),) if judged.stop_job else ()
    ran_on = shown(record.node_driver or UNKNOWN)
    if record.verdict is Verdict.PASSED and ran_on == shown(driver):
        said = event(
            "DriverVerified", f"{base.digest} passed on {where}: {record.summary}; the model may serve there"
        )
    elif record.verdict is Verdict.PASSED:
        said = event(
            "DriverVerificationFailed",
            f"{base.digest}: Job {name} was pinned to {where} but its node reported driver {ran_on} when it"
            " finished (relabelled meanwhile); that driver stays unverified until a re-verification passes",
            warning=True,
        )
    else:
        said = event(
            "DriverVerificationFailed",
            f"{base.digest} on {where}: {record.reason}: {record.summary}; the model does not serve on that"
            " driver until a re-verification passes",
            warning=True,
        )
    return Drivers(covered, record, (*stop, said))


def cancel_others(observed: Observed, wanted: str) -> tuple[Action, ...]:
    """Driver verifications no longer wanted (the pass they extend was superseded, the node went)."""
    return tuple(
        DeleteJob(j.name)
        for j in observed.jobs
        if j.step == labels.STEP_DRIVER and j.name != wanted and not j.finished and not j.deleting
    )
