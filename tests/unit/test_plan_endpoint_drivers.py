"""Re-verify when the ground changes in modes endpoint and both (`plan_endpoint_drivers`): a serving
pod on a node whose driver the endpoint pass does not cover never carries the serving label until
a comparison Job asked that very pod the goldens in place and passed, stepped through the pure
planner (`World`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from clef_builders import World, base_spec_dict, digest_for
from test_endpoint_flow import (
    KEY_BAND,
    RUNTIME,
    SIGNED,
    V100,
    check_job,
    endpoint_message,
    finish_goldens,
    preview,
    start_preview_pod,
)

from clef_operator import labels
from clef_operator.actions import CreateDeployment, CreateJob, LabelPod, ReplaceTemplate
from clef_operator.api import ClefModelSpec, Step, Verdict
from clef_operator.endpoint import check_job_name
from clef_operator.observed import NodeState
from clef_operator.plan_drivers import driver_key

FULL = labels.NODE_DRIVER_VERSION
OLD, NEW, OTHER = "550.127.05", "570.86.15", "535.1"
IMAGE = f"registry.clef.test/clef-runtime@{digest_for('registry.clef.test/clef-runtime:1.0-good')}"


def _spec(mode: str = "endpoint") -> ClefModelSpec:
    body = base_spec_dict(image=IMAGE, replicas=2, nodeSelector={labels.NODE_GPU_PRODUCT: V100})
    body["verification"] = {"mode": mode, "endpoint": {"runtimeImage": RUNTIME}}
    return ClefModelSpec.model_validate(body)


def _node(name: str, driver: str) -> NodeState:
    return NodeState(name, {labels.NODE_GPU_PRODUCT: V100, FULL: driver})


def _served(mode: str = "endpoint") -> tuple[World, str]:
    """clef-flash verified (mode `mode`) on a preview pod on worker-1 (driver OLD), promoted and
    serving: (the world, the revision)."""
    w = World(_spec(mode), nodes=[_node("worker-1", OLD)])
    if mode == "both":
        w.step()  # the kernels Job
        w.finish_job(w.current_job(), image_id=IMAGE)
        w.step()
    w.step()  # goldens Job
    finish_goldens(w)
    w.step()  # store
    w.step()  # preview
    rev = preview(w)
    start_preview_pod(w, rev, node_driver=OLD, revision_of=w.model.name)
    w.step()  # comparison Job
    w.finish_job(check_job(w), message=endpoint_message(), image=RUNTIME)
    w.step()
    w.settle()
    w.step()
    w.step()
    assert w.condition("Ready")[0] == "True", w.condition("Ready")
    assert w.pods[f"preview-{rev}"].serving_label == w.model.name
    return w, rev


def _land(w: World, rev: str, name: str, node: str, driver: str, **changes: Any) -> str:
    """A new pod of `rev` (scale-up, rescheduling) bound to `node`, which reports `driver`."""
    if node and all(n.name != node for n in w.nodes):
        w.nodes.append(_node(node, driver))
    fields = {
        "uid": f"uid-{name}",
        "ip": f"10.0.0.{30 + len(w.pods)}",
        "node_name": node,
        "node_driver": driver,
    }
    start_preview_pod(w, rev, name=name, revision_of=w.model.name, image=IMAGE, **{**fields, **changes})
    return name


def _driver_jobs(w: World) -> list[str]:
    return sorted(n for n, j in w.jobs.items() if j.step == labels.STEP_DRIVER)


def _pass(w: World) -> Any:
    return next(
        r for r in w.status.verifications if r.step is Step.ENDPOINT and r.key == w.status.verification_key
    )


def test_the_pass_names_the_driver_of_the_preview_pods_node_and_serving_is_not_pinned() -> None:
    w, _rev = _served()
    passed = _pass(w)
    assert (passed.verdict, passed.node_driver) == (Verdict.PASSED, OLD)
    active = w.active_deployment()
    assert active is not None
    assert "affinity" not in w.manifests[active.name]["spec"]["template"]["spec"], (
        "not pinned: held by the label"
    )
    assert _driver_jobs(w) == []


def test_a_new_pod_on_an_uncovered_driver_never_gets_the_label_and_is_asked_in_place() -> None:
    w, rev = _served()
    pod = _land(w, rev, "serving-1", "worker-2", NEW)
    plan = w.step()
    assert w.pods[pod].serving_label == "", "withheld before anything ran on its driver"
    assert not any(isinstance(a, LabelPod) and a.name == pod for a in plan.actions)
    assert not any(isinstance(a, (CreateDeployment, ReplaceTemplate)) for a in plan.actions), "no re-render"
    status, reason, message = w.condition("Degraded")
    assert (status, reason) == ("True", "UnverifiedDriver")
    assert pod in message and "worker-2" in message and NEW in message, message
    [job] = _driver_jobs(w)
    passed = _pass(w)
    assert job == check_job_name(w.model.name, driver_key(passed.key, passed, NEW), "")
    manifest = next(a.manifest for a in plan.actions if isinstance(a, CreateJob))
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    argv = container["command"]
    assert container["image"] == RUNTIME and argv[:2] == ["clef-runtime", "endpoint-check"]
    assert argv[argv.index("--url") + 1] == f"http://{w.pods[pod].ip}:{w.spec.service.container_port}", (
        "the pod itself"
    )
    assert argv[argv.index("--goldens-sha256") + 1] == SIGNED, "the signed goldens' digest"
    assert "--sample" not in argv, "every prompt, as the comparison"
    assert manifest["metadata"]["labels"][labels.STEP] == labels.STEP_DRIVER
    assert "DriverVerificationStarted" in w.event_reasons()
    # The preview pod, on the covered driver, keeps serving.
    assert w.pods[f"preview-{rev}"].serving_label == w.model.name
    # Still running: nothing changes, and one Job only.
    for _ in range(2):
        w.step()
    assert _driver_jobs(w) == [job] and w.pods[pod].serving_label == ""


def _asked(w: World, rev: str) -> tuple[str, str]:
    pod = _land(w, rev, "serving-1", "worker-2", NEW)
    w.step()
    [job] = _driver_jobs(w)
    return pod, job


def test_a_pass_extends_the_verdict_and_every_pod_on_that_driver_serves() -> None:
    w, rev = _served()
    pod, job = _asked(w, rev)
    w.finish_job(job, message=endpoint_message(), image=RUNTIME)
    plan = w.step()
    assert LabelPod(pod, {labels.MODEL: w.model.name}) in plan.actions, "labelled in the pass that judged it"
    assert "DriverVerified" in w.event_reasons()
    record = w.status.verifications[0]
    passed = _pass(w)
    assert (record.key, record.verdict, record.node_driver) == (
        driver_key(passed.key, passed, NEW),
        Verdict.PASSED,
        NEW,
    )
    assert (record.digest, record.gpu_class, record.job) == (passed.digest, passed.gpu_class, job)
    assert record.signature, "signed like any verdict"
    assert w.ledger is not None and w.ledger[record.key] == record
    assert w.condition("Degraded")[:2] == ("False", "AsExpected")
    # Another pod on that driver serves with no second Job.
    other = _land(w, rev, "serving-2", "worker-3", NEW)
    w.step()
    assert w.pods[other].serving_label == w.model.name
    assert _driver_jobs(w) == [job]


def test_a_failure_keeps_the_pods_withheld_and_is_not_tried_again() -> None:
    w, rev = _served()
    pod, job = _asked(w, rev)
    w.finish_job(job, exit_code=1, message=endpoint_message("fail", divergence=KEY_BAND), image=RUNTIME)
    w.step()
    for _ in range(3):
        w.step()
    assert w.event_reasons().count("DriverVerificationFailed") == 1, "judged once"
    assert _driver_jobs(w) == [job], "not tried again"
    assert w.pods[pod].serving_label == ""
    status, reason, message = w.condition("Degraded")
    assert (status, reason) == ("True", "UnverifiedDriver")
    assert "failed" in message and "EndpointMismatch" in message, message
    assert w.pods[f"preview-{rev}"].serving_label == w.model.name, "the verified pod keeps serving"


def test_a_pass_on_a_node_relabelled_meanwhile_covers_nothing() -> None:
    w, rev = _served()
    pod, job = _asked(w, rev)
    w.finish_job(job, message=endpoint_message(), image=RUNTIME)
    w.nodes = [_node("worker-2", OTHER) if n.name == "worker-2" else n for n in w.nodes]
    w.step()
    assert "DriverVerificationFailed" in w.event_reasons()
    assert w.status.verifications[0].node_driver == OTHER
    for _ in range(2):
        w.step()
    assert w.pods[pod].serving_label == ""


def test_a_driver_changed_under_a_running_pod_takes_it_out_and_says_nothing_serves() -> None:
    w, rev = _served()
    serving = f"preview-{rev}"
    w.nodes = [_node("worker-1", NEW)]
    plan = w.step()
    assert LabelPod(serving, {labels.MODEL: None}) in plan.actions
    assert "PodCordoned" in w.event_reasons()
    status, reason, message = w.condition("Degraded")
    assert (status, reason) == ("True", "UnverifiedDriver")
    assert message.startswith("no pod of clef-flash serves now"), message
    [job] = _driver_jobs(w)
    argv = w.jobs[job].command
    assert argv[argv.index("--url") + 1].startswith(f"http://{w.pods[serving].ip}:")
    w.finish_job(job, message=endpoint_message(), image=RUNTIME)
    w.step()
    assert w.pods[serving].serving_label == w.model.name, "verified in place: it serves again"
    assert w.condition("Degraded")[0] == "False"


def test_a_pod_with_no_node_yet_gets_no_label() -> None:
    w, rev = _served()
    pod = _land(w, rev, "pending-1", "", "", phase="Pending", ready=False, ip="")
    w.step()
    assert w.pods[pod].serving_label == ""
    assert w.condition("Degraded")[0] == "False", "not a problem: it is being placed"
    w.nodes.append(_node("worker-1b", OLD))
    w.pods[pod] = replace(
        w.pods[pod], node_name="worker-1b", node_driver=OLD, phase="Running", ready=True, ip="10.0.0.77"
    )
    w.step()
    assert w.pods[pod].serving_label == w.model.name, "bound to a covered driver: it serves"


def test_a_pod_gone_before_its_verification_concluded_leaves_it_to_another() -> None:
    w, rev = _served()
    pod, job = _asked(w, rev)
    other = _land(w, rev, "serving-2", "worker-3", NEW)
    del w.pods[pod]
    plan = w.step()
    assert job not in w.jobs and not any(isinstance(a, CreateJob) for a in plan.actions), "deleted first"
    w.step()
    [again] = _driver_jobs(w)
    argv = w.jobs[again].command
    assert argv[argv.index("--url") + 1].startswith(f"http://{w.pods[other].ip}:")


def test_a_restarted_operator_takes_the_same_next_step() -> None:
    """Every decision is read from observed state: planning again from the same state (what a
    restarted operator sees) decides the same, at each point of the story."""
    w, rev = _served()
    _land(w, rev, "serving-1", "worker-2", NEW)
    for finish in (False, True, False):
        again = w.plan()
        assert again.actions == w.plan().actions and again.status == w.plan().status
        w.step()
        if finish:
            [job] = _driver_jobs(w)
            w.finish_job(job, message=endpoint_message(), image=RUNTIME)
    # Concluded: the record is the memory; no Job is made again and the label stays.
    [job] = _driver_jobs(w)
    del w.jobs[job]
    w.step()
    assert _driver_jobs(w) == [] and w.pods["serving-1"].serving_label == w.model.name


def test_mode_both_is_held_alike() -> None:
    w, rev = _served("both")
    assert [r.step for r in w.status.verifications[:2]] == [Step.ENDPOINT, Step.PREVIEW]
    pod, job = _asked(w, rev)
    assert w.pods[pod].serving_label == ""
    w.finish_job(job, message=endpoint_message(), image=RUNTIME)
    w.step()
    assert w.pods[pod].serving_label == w.model.name


def test_goldens_gone_the_pod_stays_withheld_and_the_condition_says_it_cannot_be_asked() -> None:
    w, rev = _served()
    [goldens] = [n for n, cm in w.config_maps.items() if labels.GOLDENS_KEY in cm.labels]
    del w.config_maps[goldens]
    pod = _land(w, rev, "serving-1", "worker-2", NEW)
    for _ in range(2):
        w.step()
    assert _driver_jobs(w) == [], "nothing to ask with"
    assert w.pods[pod].serving_label == ""
    status, reason, message = w.condition("Degraded")
    assert (status, reason) == ("True", "UnverifiedDriver")
    assert f"cannot be asked in place: the goldens of the current spec ({goldens}) are not stored" in message
    assert "a comparison Job asks it" not in message, message


def test_a_pod_of_a_revision_the_current_pass_did_not_promote_is_withheld_and_not_asked() -> None:
    w, rev = _served()
    changed = w.spec.model_dump(by_alias=True, exclude_none=True)
    changed["dtype"] = "bf16" if w.spec.dtype != "bf16" else "f16"
    w.spec = ClefModelSpec.model_validate(changed)  # a new key: its verification starts
    pod = _land(w, rev, "serving-1", "worker-2", NEW)
    w.step()
    assert _driver_jobs(w) == [], "only the current pass's pods are asked"
    assert w.pods[pod].serving_label == ""
    status, reason, message = w.condition("Degraded")
    assert (status, reason) == ("True", "UnverifiedDriver")
    assert "not asked in place: its revision is not the one the current spec's pass promoted" in message
    assert w.pods[f"preview-{rev}"].serving_label == w.model.name, "the verified pod keeps serving"
