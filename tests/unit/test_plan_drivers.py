"""Re-verify when the ground changes (`plan_drivers`, `render.driver_terms`): serving pods are
pinned to the driver versions a verdict covers, and a node of the GPU class with a driver no
verdict covers gets a kernels verification of the digest that passed, pinned to that driver,
before a pod of the model may land there."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest
from clef_builders import GOOD, World, digest_for, make_spec, passed_record

from clef_operator import labels
from clef_operator.actions import LabelPod
from clef_operator.api import ClefModelStatus, Toleration, Verdict
from clef_operator.observed import ModelRef, NodeState, PodState, Taint, node_versions
from clef_operator.plan_drivers import (
    covered_drivers,
    driver_key,
    eligible,
    pinned,
    satisfies,
    tolerates,
    uncovered,
)
from clef_operator.render import driver_terms, gpu_pin
from clef_operator.verdicts import collect_verdicts, sign

FULL = labels.NODE_DRIVER_VERSION
MAJOR, MINOR, REV = labels.NODE_DRIVER_PARTS
OLD, NEW = "550.127.05", "570.86.15"
V100 = "Tesla-V100-SXM2-16GB"
MODEL = ModelRef("clef-flash", "default", "uid-1", 1)
SECRET = b"clef-unit-test-verdict-key-32byte"


# ------------------------------------------------------------------------ the affinity


def _matches(terms: list[dict[str, Any]], node_labels: dict[str, str]) -> bool:
    """Kubernetes' rule for required node affinity: any term, every expression of it."""

    def holds(e: dict[str, Any]) -> bool:
        if e["operator"] == "In":
            return node_labels.get(e["key"]) in e["values"]
        assert e["operator"] == "DoesNotExist", e
        return e["key"] not in node_labels

    return any(all(holds(e) for e in t["matchExpressions"]) for t in terms)


# Every way a node may report its driver: the full label, the three parts, both, some parts, none.
NODE_LABELS = [
    {FULL: NEW},
    {FULL: OLD, MAJOR: "550", MINOR: "127", REV: "05"},
    {FULL: NEW, MAJOR: "550", MINOR: "127", REV: "05"},  # the parts are stale: the full label wins
    {MAJOR: "550", MINOR: "127", REV: "05"},
    {MAJOR: "570", MINOR: "86", REV: "15"},
    {MAJOR: "550", MINOR: "127"},
    {MAJOR: "550"},
    {},
]


def test_the_terms_admit_exactly_the_nodes_whose_driver_is_covered() -> None:
    values = [OLD, NEW, "", "535.1"]
    for n in range(1, len(values) + 1):
        for drivers in itertools.combinations(values, n):
            terms = driver_terms(drivers)
            for node in NODE_LABELS:
                expected = node_versions(node)[0] in drivers
                assert _matches(terms, node) == expected, (drivers, node)


def test_the_operators_rule_for_required_affinity_is_kubernetes_rule() -> None:
    """`satisfies` (what a running pod's node is held to) agrees with the reference above on every
    pin clef renders, and follows Kubernetes for NotIn and Exists, which it does not render."""
    values = [OLD, NEW, "", "535.1"]
    for n in range(1, len(values) + 1):
        for drivers in itertools.combinations(values, n):
            terms = driver_terms(drivers)
            for node in NODE_LABELS:
                assert satisfies(node, terms) == _matches(terms, node), (drivers, node)
    not_in = [{"matchExpressions": [{"key": FULL, "operator": "NotIn", "values": [OLD]}]}]
    exists = [{"matchExpressions": [{"key": FULL, "operator": "Exists"}]}]
    assert satisfies({FULL: NEW}, not_in) and not satisfies({FULL: OLD}, not_in) and satisfies({}, not_in)
    assert satisfies({FULL: OLD}, exists) and not satisfies({}, exists)
    assert not satisfies({FULL: OLD}, []), "no term: no node"


def test_a_version_that_is_not_three_parts_is_matched_by_the_full_label_only() -> None:
    terms = driver_terms(("560.35",))
    assert terms == [{"matchExpressions": [{"key": FULL, "operator": "In", "values": ["560.35"]}]}]


# ------------------------------------------------------------------------ which nodes


def _node(name: str, driver: str = NEW, product: str = V100, **changes: Any) -> NodeState:
    node_labels = {labels.NODE_GPU_PRODUCT: product}
    if driver:
        node_labels[FULL] = driver
    return replace(NodeState(name, node_labels), **changes)


def test_tolerations_follow_kubernetes_matching() -> None:
    taint = Taint("pool", "gpu", "NoSchedule")
    cases = [
        ([], False),
        ([Toleration(key="pool", operator="Equal", value="gpu")], True),
        ([Toleration(key="pool", operator="Equal", value="cpu")], False),
        ([Toleration(key="pool", operator="Exists")], True),
        ([Toleration(operator="Exists")], True),
        ([Toleration(key="pool", operator="Exists", effect="NoExecute")], False),
        ([Toleration(key="pool", operator="Exists", effect="NoSchedule")], True),
        ([Toleration(key="other", operator="Exists")], False),
    ]
    for tolerations, expected in cases:
        assert tolerates(tolerations, taint) is expected, tolerations


def test_only_schedulable_nodes_of_the_class_and_selector_that_the_model_tolerates_are_eligible() -> None:
    spec = make_spec(nodeSelector={"pool": "a"})
    good = _node("n", labels={labels.NODE_GPU_PRODUCT: V100, "pool": "a", FULL: NEW})
    assert eligible(spec, gpu_pin(spec, V100), good)
    assert not eligible(spec, gpu_pin(spec, "NVIDIA-L4"), good), "another GPU class"
    assert not eligible(spec, gpu_pin(spec, V100), replace(good, labels={labels.NODE_GPU_PRODUCT: V100})), (
        "no pool label"
    )
    assert not eligible(spec, gpu_pin(spec, V100), replace(good, unschedulable=True)), "cordoned"
    tainted = replace(good, taints=(Taint("pool", "gpu", "NoSchedule"),))
    assert not eligible(spec, gpu_pin(spec, V100), tainted)
    assert eligible(
        spec, gpu_pin(spec, V100), replace(tainted, taints=(Taint("pool", "gpu", "PreferNoSchedule"),))
    )
    tolerant = make_spec(nodeSelector={"pool": "a"}, tolerations=[{"key": "pool", "operator": "Exists"}])
    assert eligible(tolerant, gpu_pin(tolerant, V100), tainted)


def test_uncovered_drivers_name_their_nodes() -> None:
    nodes = [_node("b", NEW), _node("a", NEW), _node("c", OLD), _node("d", ""), _node("e", NEW, "NVIDIA-L4")]
    assert uncovered(make_spec(), V100, nodes, (OLD,)) == {"": ["d"], NEW: ["a", "b"]}
    assert uncovered(make_spec(), V100, nodes, (OLD, NEW, "")) == {}


# ------------------------------------------------------------------------ what a verdict covers


def _verdicts(*records: Any) -> Any:
    status = ClefModelStatus(verifications=[sign(SECRET, MODEL, r) for r in records])
    return collect_verdicts(MODEL, "k1", status, (), SECRET)


def test_a_pass_covers_its_own_driver_and_those_of_the_passes_that_extend_it() -> None:
    spec = make_spec()
    base = passed_record("k1", node_driver=OLD)
    extends = passed_record(driver_key("k1", base, NEW), node_driver=NEW, job_uid="uid-d")
    assert covered_drivers(spec, "k1", _verdicts(base)) == (OLD,)
    assert covered_drivers(spec, "k1", _verdicts(extends, base)) == (OLD, NEW)
    unlabelled = passed_record("k1")
    assert covered_drivers(spec, "k1", _verdicts(unlabelled)) == ("",), "no label: one unknown value"
    # What does not extend this pass covers nothing: another digest, another class, another pass,
    # a driver other than its key's, a failure.
    others = [
        extends.model_copy(update={"digest": "registry.clef.test/clef-runtime@" + digest_for("x")}),
        extends.model_copy(update={"gpu_class": "NVIDIA-L4"}),
        passed_record(driver_key("k1", base.model_copy(update={"job_uid": "u2"}), NEW), node_driver=NEW),
        extends.model_copy(update={"node_driver": "535.1"}),
        extends.model_copy(update={"verdict": Verdict.FAILED, "reason": "KernelMismatch"}),
    ]
    for other in others:
        assert covered_drivers(spec, "k1", _verdicts(other, base)) == (OLD,), other


def test_nothing_is_pinned_without_a_pass_or_outside_kernels_mode() -> None:
    base = passed_record("k1", node_driver=OLD)
    assert covered_drivers(make_spec(), "k1", _verdicts()) is None
    assert not pinned(make_spec(verification={"required": False}))
    assert covered_drivers(make_spec(verification={"required": False}), "k1", _verdicts(base)) is None
    assert pinned(make_spec())


# ------------------------------------------------------------------------ the planner


def _deployed(driver: str = OLD) -> World:
    w = World(make_spec(), nodes=[_node("worker-1", driver)])
    w.step()
    job = w.finish_job()
    w.set_job_pod(job, node_driver=driver)
    w.step()
    w.settle()
    w.step()
    w.step()
    return w


def _affinity(w: World, revision: str | None = None) -> list[dict[str, Any]]:
    dep = (
        w.active_deployment()
        if revision is None
        else next(d for d in w.deployments.values() if d.revision == revision)
    )
    assert dep is not None
    manifest = w.manifests[dep.name]
    pod = manifest["spec"]["template"]["spec"]
    terms: list[dict[str, Any]] = pod["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    return terms


def _driver_jobs(w: World) -> list[str]:
    return [j.name for j in w.jobs.values() if j.step == labels.STEP_DRIVER]


def test_serving_pods_are_pinned_to_the_driver_the_verification_ran_on() -> None:
    w = _deployed()
    assert w.condition("Ready")[0] == "True"
    assert _affinity(w) == driver_terms((OLD,))
    assert _driver_jobs(w) == []


def test_a_new_driver_is_verified_before_a_revision_may_run_there_and_its_pass_widens_the_pin() -> None:
    w = _deployed()
    old_revision = w.active_deployment().revision  # type: ignore[union-attr]
    w.nodes.append(_node("worker-9", NEW))
    plan = w.step()
    [job] = _driver_jobs(w)
    assert "DriverVerificationStarted" in w.event_reasons()
    assert not any(type(a).__name__ == "CreateDeployment" for a in plan.actions), "nothing serves there yet"
    pod = w.manifests[job]["spec"]["template"]["spec"]
    passed = next(r for r in w.status.verifications if r.key != w.jobs[job].key)
    assert pod["containers"][0]["image"] == passed.digest, "the digest that passed, not the tag"
    assert pod["nodeSelector"][labels.NODE_GPU_PRODUCT] == V100
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ] == driver_terms((NEW,))
    # Still running: a pass of the spec's key never depends on it, and the revision stays pinned.
    w.step()
    assert _affinity(w) == driver_terms((OLD,))
    w.finish_job(job)
    w.set_job_pod(job, node_driver=NEW)
    w.step()
    assert "DriverVerified" in w.event_reasons()
    record = w.status.verifications[0]
    assert (record.key, record.node_driver, record.verdict) == (w.jobs[job].key, NEW, Verdict.PASSED)
    assert w.ledger is not None and record.key in w.ledger
    # The wider pin is another pod spec: another revision, rolled out as any other.
    w.settle()
    w.step()
    w.settle()
    w.step()
    w.step()
    active = w.active_deployment()
    assert active is not None and active.revision != old_revision
    assert _affinity(w) == driver_terms((OLD, NEW))
    assert _driver_jobs(w) == [job], "no second verification of a covered driver"


def _new_driver_verified(exit_code: int = 0, ran_on: str = NEW) -> tuple[World, str]:
    """A model served on OLD, a node of NEW added, and its driver Job finished (`exit_code`) on a
    node that reported `ran_on` at the end: (the world, the Job)."""
    w = _deployed()
    w.nodes.append(_node("worker-9", NEW))
    w.step()
    [job] = _driver_jobs(w)
    w.finish_job(job, exit_code=exit_code, message="" if exit_code else None)
    w.set_job_pod(job, node_driver=ran_on)
    return w, job


@pytest.mark.parametrize(
    ("exit_code", "ran_on"),
    [(1, NEW), (0, "535.1")],
    ids=["the-verification-failed", "it-passed-on-a-node-relabelled-meanwhile"],
)
def test_a_driver_not_verified_stays_unverified_and_is_not_tried_again(exit_code: int, ran_on: str) -> None:
    """A failed run, or a pass on a node whose driver changed before it finished (it covers only
    what it ran on), leaves NEW unverified: judged once, never re-run, serving still pinned to OLD."""
    w, job = _new_driver_verified(exit_code, ran_on)
    w.step()
    assert "DriverVerificationFailed" in w.event_reasons()
    for _ in range(3):
        w.step()
    assert _driver_jobs(w) == [job], "not tried again"
    assert w.event_reasons().count("DriverVerificationFailed") == 1, "judged once"
    assert _affinity(w) == driver_terms((OLD,))


def test_an_unlabelled_node_is_one_unknown_driver_and_gets_its_own_verification() -> None:
    w = _deployed()
    w.nodes.append(_node("bare", ""))
    w.step()
    [job] = _driver_jobs(w)
    pod = w.manifests[job]["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == driver_terms(("",))


def test_ineligible_nodes_get_no_verification() -> None:
    w = _deployed()
    w.nodes += [
        _node("other-class", NEW, "NVIDIA-L4"),
        _node("cordoned", NEW, unschedulable=True),
        _node("tainted", NEW, taints=(Taint("dedicated", "x", "NoExecute"),)),
    ]
    w.step()
    assert _driver_jobs(w) == []


def test_one_driver_at_a_time_and_a_verification_no_longer_wanted_is_stopped() -> None:
    w = _deployed()
    w.nodes += [_node("a", NEW), _node("b", "535.1")]
    w.step()
    [first] = _driver_jobs(w)
    assert w.manifests[first]["spec"]["template"]["spec"]["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": driver_terms(("535.1",))}
        }
    }, "sorted: 535.1 first"
    w.nodes = [n for n in w.nodes if n.name != "b"]
    plan = w.step()
    assert any(type(a).__name__ == "DeleteJob" and a.name == first for a in plan.actions)  # type: ignore[attr-defined]
    assert len(_driver_jobs(w)) == 1 and _driver_jobs(w) != [first]


def test_a_reverify_starts_the_set_again_from_the_new_pass() -> None:
    w, job = _new_driver_verified()
    w.step()
    w.model = replace(w.model, annotations={labels.REVERIFY: "1"})
    w.step()
    spec_job = w.current_job()
    assert w.jobs[spec_job].step == ""
    w.finish_job(spec_job)
    w.set_job_pod(spec_job, node_driver=OLD)
    w.step()
    # The new pass covers its own driver; the old extension speaks for the old pass only.
    [again] = [j for j in _driver_jobs(w) if j != job]
    assert w.jobs[again].key != w.jobs[job].key
    assert GOOD in w.jobs[again].annotations[labels.IMAGE]


def _widened() -> World:
    w, _job = _new_driver_verified()
    for _ in range(2):
        w.step()
        w.settle()
    w.step()
    w.step()
    assert _affinity(w) == driver_terms((OLD, NEW))
    return w


def test_a_deleted_active_revision_is_recreated_with_the_drivers_it_was_pinned_to() -> None:
    w = _widened()
    active = w.active_deployment()
    assert active is not None
    w.spec = w.spec.model_copy(update={"image": "registry.clef.test/clef-runtime:1.0-conv_key_band_zero"})
    w.step()
    w.finish_job(w.current_job(), exit_code=1, message="")
    w.step()
    del w.deployments[active.name]
    w.manifests.pop(active.name)
    w.step()
    assert "RevisionRecreated" in w.event_reasons()
    assert _affinity(w, active.revision) == driver_terms((OLD, NEW)), "the same revision, as it was"


# ------------------------------------------------------------------------ a driver changed under a pod


def _serving_on(w: World, node: str = "worker-1") -> str:
    """A Ready pod of the active revision on `node`, labelled by clef; its name."""
    active = w.active_deployment()
    assert active is not None
    name = f"{active.name}-abc12"
    w.pods[name] = PodState(
        name=name, component=labels.COMPONENT_SERVING, revision=active.revision, phase="Running",
        ready=True, uid="uid-serving", ip="10.0.0.9", node_name=node, revision_of=w.model.name,
    )  # fmt: skip
    w.step()
    assert w.pods[name].serving_label == w.model.name
    return name


def _relabel(w: World, node: str, driver: str) -> None:
    w.nodes = [_node(node, driver) if n.name == node else n for n in w.nodes]


def test_a_pod_whose_node_driver_changes_under_it_leaves_the_service_until_the_driver_is_verified() -> None:
    w = _deployed()
    pod = _serving_on(w)
    _relabel(w, "worker-1", NEW)
    plan = w.step()
    assert LabelPod(pod, {labels.MODEL: None}) in plan.actions
    assert w.pods[pod].serving_label == ""
    assert "PodCordoned" in w.event_reasons()
    status, reason, message = w.condition("Degraded")
    assert (status, reason) == ("True", "UnverifiedDriver")
    assert pod in message and "worker-1" in message and NEW in message, message
    [job] = _driver_jobs(w)
    assert w.manifests[job]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"] == driver_terms((NEW,)), "its driver is verified"
    for _ in range(2):
        w.step()
    assert w.pods[pod].serving_label == "", "never given back while the driver is not covered"
    assert w.event_reasons().count("PodCordoned") == 1
    # The node goes back to the driver the revision was verified on: the pod serves again.
    _relabel(w, "worker-1", OLD)
    w.step()
    assert w.pods[pod].serving_label == w.model.name
    assert w.condition("Degraded")[:2] == ("False", "AsExpected")


def test_pods_on_nodes_of_covered_drivers_and_unpinned_models_keep_serving() -> None:
    w = _deployed()
    pod = _serving_on(w)
    w.nodes.append(_node("worker-9", NEW))  # another node's driver: verified, but nobody moves
    w.step()
    assert w.pods[pod].serving_label == w.model.name
    assert w.condition("Degraded")[0] == "False"
    unpinned = World(make_spec(verification={"required": False}), nodes=[_node("worker-1", OLD)])
    unpinned.step()
    unpinned.settle()
    unpinned.step()
    free = _serving_on(unpinned)
    _relabel(unpinned, "worker-1", NEW)
    unpinned.step()
    assert unpinned.pods[free].serving_label == unpinned.model.name, "no pin: no driver to hold it to"
