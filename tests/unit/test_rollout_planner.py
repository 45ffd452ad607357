"""The rollout planner over a table of observed states (DESIGN, "Rollout rules")."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from clef_builders import (
    FAULTY,
    GOOD,
    GOOD2,
    KEY_BAND_FAILURE,
    World,
    base_spec_dict,
    digest_for,
    kinds,
    make_spec,
    report,
)

from clef_operator import labels
from clef_operator.actions import CreateJob, DeleteJob, Event, PatchServiceSelector, ScaleDeployment
from clef_operator.api import ClefModelSpec, ClefModelStatus
from clef_operator.observed import PodState, ServiceState


def switch_to(w: World, image: str, **job: object) -> None:
    """Change spec.image and take the new image through verification, start and switch."""
    w.spec = w.spec.model_copy(update={"image": image})
    w.step()
    w.finish_job(**job)  # type: ignore[arg-type]
    w.step()
    w.settle()
    w.step()
    w.step()  # the pass after the switch (requeued at once) reports it


def assert_service_selects_available(w: World) -> None:
    dep = w.active_deployment()
    assert dep is not None, "the Service selects no Deployment of this model"
    assert dep.is_available() and dep.available_replicas > 0, f"{dep.name} is selected but not available"


# ---------------------------------------------------------------------------- first deploy


def test_first_deploy_verifies_then_serves_pinned_digest():
    w = World(make_spec())
    p = w.step()
    assert kinds(p) == ["CreateJob"]
    assert w.condition("Verified")[:2] == ("Unknown", "VerificationPending")
    assert w.condition("Ready")[:2] == ("False", "NoActiveRevision")
    assert w.condition("Progressing")[0] == "True"
    job = w.manifests[w.current_job()]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["imagePullPolicy"] == "Always"
    assert container["command"][:2] == ["clef-runtime", "verify"]

    w.finish_job()
    p = w.step()
    assert kinds(p) == ["CreateDeployment"]
    dep = next(iter(w.deployments.values()))
    image = w.manifests[dep.name]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"registry.clef.test/clef-runtime@{digest_for(GOOD)}"
    assert w.condition("Verified")[:2] == ("True", "Verified")
    assert w.service is None, "no Service before the candidate is available"

    w.step()
    assert w.service is None, "still not available: no switch"
    w.settle()
    p = w.step()
    assert kinds(p) == ["CreateService"]
    assert "ServiceSwitched" in w.event_reasons()
    assert p.requeue_after == 0, "the switch is reported by the next pass, at once"
    assert w.condition("Ready")[:2] == ("False", "NoActiveRevision"), "nothing served when the pass began"
    assert w.step().actions == ()
    assert w.condition("Ready")[:2] == ("True", "Available")
    assert w.status.active_revision == dep.revision
    assert w.status.candidate_revision is None
    assert w.step().actions == (), "steady state plans nothing"
    assert w.condition("Progressing")[:2] == ("False", "RolloutComplete")
    assert w.condition("Degraded")[:2] == ("False", "AsExpected")


def test_new_passing_image_is_blue_green_and_old_goes_to_zero_after_delay():
    w = World(make_spec())
    w.deploy_first()
    old = w.active_deployment()
    assert old is not None

    w.spec = w.spec.model_copy(update={"image": GOOD2})
    w.step()
    assert_service_selects_available(w)
    w.finish_job()
    w.step()
    assert w.status.candidate_revision is not None
    assert_service_selects_available(w)
    assert w.active_deployment() == w.deployments[old.name] or w.active_deployment().name == old.name
    w.settle()
    p = w.step()
    assert [a for a in p.actions if isinstance(a, PatchServiceSelector)], "switch is one selector patch"
    assert w.status.active_revision == old.revision, "status names what the Service selected"
    p = w.step()
    new = w.active_deployment()
    assert new is not None and new.name != old.name
    assert w.service is not None and w.service.owned
    assert_service_selects_available(w)
    assert w.deployments[old.name].replicas == 1, "old keeps running during scaleDownDelaySeconds"
    assert w.condition("Progressing")[:2] == ("True", "ScaleDownPending")
    assert p.requeue_after == pytest.approx(30)

    w.advance(29)
    assert not [a for a in w.step().actions if isinstance(a, ScaleDeployment)]
    w.advance(1)
    p = w.step()
    assert ScaleDeployment(old.name, 0, {labels.SCALE_DOWN_AT: None}) in p.actions
    assert "RevisionScaledDown" in w.event_reasons()
    w.settle()
    w.step()
    assert w.condition("Progressing")[:2] == ("False", "RolloutComplete")
    assert old.name in w.deployments, "kept at 0 for rollback"


def test_failing_image_holds_candidate_and_old_keeps_serving():
    w = World(make_spec())
    w.deploy_first()
    old = w.active_deployment()
    w.spec = w.spec.model_copy(update={"image": FAULTY})
    w.step()
    w.finish_job(exit_code=1, message=report("fail", failing=KEY_BAND_FAILURE, summary="token ids 0/420"))
    p = w.step()
    assert "CreateDeployment" not in kinds(p)
    status, reason, message = w.condition("Verified")
    assert (status, reason) == ("False", "KernelMismatch")
    assert "causal_conv1d" in message and "key channel band" in message
    assert "held at 0" in message and "reverify" in message
    assert w.condition("Degraded")[:2] == ("True", "KernelMismatch")
    assert w.condition("Ready")[:2] == ("True", "Available")
    assert w.condition("Progressing")[:2] == ("False", "VerificationFailed")
    assert w.active_deployment() == old
    assert w.status.candidate_revision is None
    assert "VerificationFailed" in w.event_reasons()
    record = w.status.verifications[0]
    assert record.failing[0].op == "causal_conv1d"
    # No retry loop: the verdict stands until the spec or the reverify annotation changes.
    w.jobs.clear()
    assert kinds(w.step()) == []


def test_job_pull_error_fails_closed_and_frees_the_job():
    w = World(make_spec())
    w.step()
    job = w.current_job()
    w.set_job_pod(
        job, waiting_reason="ErrImagePull", waiting_message='failed to pull "registry.clef.test/x": not found'
    )
    p = w.step()
    assert DeleteJob(job) in p.actions
    assert w.condition("Verified")[:2] == ("False", "ImagePullFailed")
    assert "not found" in w.condition("Verified")[2]
    assert not any(isinstance(a, CreateJob) for a in w.step().actions), "a decided verdict is not re-run"
    assert w.deployments == {}


def test_job_timeout_fails_closed():
    w = World(make_spec(verification={"timeoutSeconds": 60}))
    w.step()
    job = w.current_job()
    w.set_job_pod(job, phase="Running")
    w.jobs[job] = replace(
        w.jobs[job],
        failed=True,
        failed_reason="DeadlineExceeded",
        failed_message="Job was active longer than specified deadline",
    )
    w.step()
    status, reason, message = w.condition("Verified")
    assert (status, reason) == ("False", "VerificationTimeout")
    assert "60s" in message
    assert w.deployments == {}


def test_unschedulable_verification_pod_surfaces_the_scheduler_message():
    w = World(make_spec(gpus=4))
    w.step()
    msg = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available"
    w.set_job_pod(w.current_job(), unschedulable_message=msg)
    w.step()
    assert w.condition("Verified")[:2] == ("Unknown", "Unschedulable")
    assert msg in w.condition("Verified")[2]
    assert w.condition("Degraded")[:2] == ("True", "Unschedulable")
    assert msg in w.condition("Degraded")[2]


@pytest.mark.parametrize(
    ("exit_code", "message", "image_id", "reason"),
    [
        (0, "", None, "ReportMissing"),
        (0, "not json at all", None, "ReportInvalid"),
        (0, report(schemaVersion="clef.riotpiao.com/verify-report/v0"), None, "ReportInvalid"),
        (0, report(suite="full"), None, "ReportInvalid"),
        (0, report(dtype="bf16"), None, "ReportInvalid"),
        (0, report(), "", "ImageDigestUnknown"),
        (2, report("error", error="no CUDA device and CLEF_VERIFY_DEVICE unset"), None, "VerificationError"),
        (137, "", None, "VerificationCrashed"),
        (1, report("fail", failing=KEY_BAND_FAILURE), None, "KernelMismatch"),
        (1, report(), None, "VerificationCrashed"),
    ],
    ids=[
        "missing",
        "not-json",
        "old-schema",
        "other-suite",
        "other-dtype",
        "no-digest",
        "error",
        "oom",
        "fail",
        "pass-but-failed",
    ],
)
def test_only_a_valid_passing_report_verifies(exit_code, message, image_id, reason):
    w = World(make_spec())
    w.step()
    w.finish_job(exit_code=exit_code, message=message, image_id=image_id)
    w.step()
    assert w.condition("Verified")[:2] == ("False", reason)
    assert w.deployments == {}
    assert w.condition("Degraded")[:2] == ("True", reason)


def test_rollback_to_a_verified_revision_needs_no_job():
    w = World(make_spec())
    w.deploy_first()
    first = w.active_deployment()
    switch_to(w, GOOD2)
    w.advance(30)
    w.step()
    w.settle()
    assert w.deployments[first.name].replicas == 0

    w.spec = w.spec.model_copy(update={"image": GOOD})
    p = w.step()
    assert not any(isinstance(a, CreateJob) for a in p.actions)
    assert ScaleDeployment(first.name, 1, {labels.SCALE_DOWN_AT: None}) in p.actions
    w.settle()
    w.step()
    assert w.active_deployment().name == first.name


def test_rollback_survives_a_lost_status():
    """Verdicts also live on the Deployments: an operator that lost the status still rolls back
    without a Job."""
    w = World(make_spec())
    w.deploy_first()
    first = w.active_deployment()
    switch_to(w, GOOD2)
    w.status = ClefModelStatus()
    w.spec = w.spec.model_copy(update={"image": GOOD})
    p = w.step()
    assert not any(isinstance(a, CreateJob) for a in p.actions)
    w.settle()
    w.step()
    assert w.active_deployment().name == first.name
    assert w.condition("Verified")[:2] == ("True", "Verified")


def test_reverify_annotation_runs_a_new_job_and_a_new_digest_gets_its_own_revision():
    w = World(make_spec(image="registry.clef.test/clef-runtime:sm70"))
    w.deploy_first()
    first = w.active_deployment()
    first_job = w.status.verification_job
    # CI republished :sm70; nothing changes until someone asks for a re-verify.
    assert w.step().actions == ()
    w.model = replace(w.model, annotations={labels.REVERIFY: "2"})
    p = w.step()
    new_job = w.current_job()
    assert new_job != first_job and new_job.startswith(first_job)
    assert "ReverifyRequested" in [e.reason for e in p.actions if isinstance(e, Event)]
    assert w.active_deployment() == first, "the old digest keeps serving while re-verifying"
    w.finish_job(image_id="registry.clef.test/clef-runtime@" + digest_for("republished"))
    w.step()
    w.settle()
    w.step()
    second = w.active_deployment()
    assert second.name != first.name
    image = w.manifests[second.name]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.endswith(digest_for("republished"))


def test_reverify_onto_a_failing_digest_keeps_serving_the_verified_digest():
    w = World(make_spec(image="registry.clef.test/clef-runtime:sm70"))
    w.deploy_first()
    first = w.active_deployment()
    w.model = replace(w.model, annotations={labels.REVERIFY: "now"})
    w.step()
    w.finish_job(exit_code=1, message=report("fail", failing=KEY_BAND_FAILURE))
    w.step()
    assert w.condition("Verified")[:2] == ("False", "KernelMismatch")
    assert w.active_deployment() == first
    assert w.condition("Ready")[:2] == ("True", "Available")
    assert w.status.active_image is not None and w.status.active_image.endswith(digest_for(w.spec.image))


def test_reverify_of_the_same_digest_changes_nothing_that_serves():
    w = World(make_spec())
    w.deploy_first()
    first = w.active_deployment()
    w.model = replace(w.model, annotations={labels.REVERIFY: "x"})
    w.step()
    w.finish_job()
    p = w.step()
    assert kinds(p) == []
    assert w.active_deployment() == first


def test_recreate_stops_old_before_starting_new():
    w = World(make_spec(rollout={"strategy": "Recreate"}))
    w.deploy_first()
    old = w.active_deployment()
    w.spec = w.spec.model_copy(update={"image": GOOD2})
    w.step()
    w.finish_job()
    p = w.step()
    assert kinds(p) == ["ScaleDeployment"]
    assert ScaleDeployment(old.name, 0, {labels.SCALE_DOWN_AT: None}) in p.actions
    assert w.condition("Progressing")[:2] == ("True", "StoppingOldRevision")
    p = w.step()
    assert kinds(p) == [], "wait until the old pods are gone"
    w.settle()
    p = w.step()
    assert kinds(p) == ["CreateDeployment"]
    w.settle()
    p = w.step()
    assert kinds(p) == ["PatchServiceSelector"]
    assert w.active_deployment().name != old.name


def test_hand_edited_selector_is_put_back():
    w = World(make_spec())
    w.deploy_first()
    active = w.active_deployment()
    w.service = replace(w.service, selector={"app": "something-else"})
    p = w.step()
    assert (
        PatchServiceSelector(
            "clef-serve",
            labels.selector("clef-flash", active.revision),
            {labels.SERVICE_MODEL: "clef-flash", labels.SERVICE_ACTIVE_REVISION: active.revision},
        )
        in p.actions
    )
    assert "SelectorRestored" in w.event_reasons()
    assert w.step().actions == ()


def test_deleted_active_deployment_is_recreated():
    w = World(make_spec())
    w.deploy_first()
    active = w.active_deployment()
    del w.deployments[active.name]
    p = w.step()
    assert kinds(p) == ["CreateDeployment"]
    assert "RevisionRecreated" in w.event_reasons()
    assert not any(isinstance(a, CreateJob) for a in p.actions), "the verdict on record still stands"
    w.settle()
    assert w.step().actions == ()
    assert w.active_deployment().name == active.name


def test_deleted_service_is_recreated():
    w = World(make_spec())
    w.deploy_first()
    active = w.active_deployment()
    w.service = None
    p = w.step()
    assert kinds(p) == ["CreateService"]
    assert w.active_deployment() == active


def test_existing_service_is_adopted_selector_only():
    w = World(make_spec(service={"name": "clef-serve", "adopt": True}))
    w.service = ServiceState(name="clef-serve", selector={"app": "old-predictor"}, cluster_ip="10.96.7.7")
    w.step()
    w.finish_job()
    w.step()
    w.settle()
    p = w.step()
    assert kinds(p) == ["PatchServiceSelector"], "adopted, never recreated"
    assert "ServiceAdopted" in w.event_reasons()
    assert w.service.cluster_ip == "10.96.7.7"
    assert w.status.service_adopted is True
    assert_service_selects_available(w)


def test_service_of_another_model_is_a_conflict_not_a_takeover():
    w = World(make_spec())
    w.service = ServiceState(
        name="clef-serve", selector={labels.MODEL: "coder"}, annotations={labels.SERVICE_MODEL: "coder"}
    )
    w.step()
    w.finish_job()
    w.step()
    w.settle()
    p = w.step()
    assert not [a for a in p.actions if isinstance(a, PatchServiceSelector)]
    assert w.condition("Degraded")[:2] == ("True", "ServiceConflict")


def test_spec_change_during_verification_cancels_the_old_job():
    w = World(make_spec())
    w.step()
    first = w.current_job()
    w.spec = w.spec.model_copy(update={"image": GOOD2})
    p = w.step()
    assert DeleteJob(first) in p.actions
    assert "VerificationCancelled" in w.event_reasons()
    assert w.current_job() != first


def test_revision_history_limit_deletes_the_oldest():
    w = World(make_spec(rollout={"scaleDownDelaySeconds": 0, "revisionHistoryLimit": 1}))
    w.deploy_first()
    names = [w.active_deployment().name]
    for image in (GOOD2, "registry.clef.test/clef-runtime:1.2"):
        w.advance(10)
        switch_to(w, image)
        w.settle()
        w.step()
        names.append(w.active_deployment().name)
    w.step()
    assert names[0] not in w.deployments, "beyond revisionHistoryLimit"
    assert names[1] in w.deployments and w.deployments[names[1]].replicas == 0
    assert "RevisionDeleted" in w.event_reasons()


def test_crash_looping_serving_pod_reaches_the_conditions():
    w = World(make_spec())
    w.deploy_first()
    active = w.active_deployment()
    w.deployments[active.name] = replace(active, available_replicas=0, ready_replicas=0)
    w.pods["engine-0"] = PodState(
        name=f"{active.name}-abc-xyz",
        component=labels.COMPONENT_SERVING,
        revision=active.revision,
        waiting_reason="CrashLoopBackOff",
        restart_count=5,
        last_termination_message="thread 'main' panicked: libcuda.so.1: cannot open shared object file",
    )
    w.step()
    assert w.condition("Ready")[:2] == ("False", "RevisionUnavailable")
    assert "libcuda.so.1" in w.condition("Ready")[2]
    assert w.condition("Degraded")[:2] == ("True", "CrashLoopBackOff")


def test_unschedulable_candidate_reaches_progressing_and_degraded():
    w = World(make_spec())
    w.deploy_first()
    w.spec = w.spec.model_copy(update={"image": GOOD2})
    w.step()
    w.finish_job()
    w.step()
    rev = w.status.candidate_revision
    msg = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    w.pods["cand"] = PodState(
        name="cand", component=labels.COMPONENT_SERVING, revision=rev, unschedulable_message=msg
    )
    w.step()
    assert w.condition("Progressing")[:2] == ("True", "CandidateStarting")
    assert msg in w.condition("Progressing")[2]
    assert w.condition("Degraded")[:2] == ("True", "Unschedulable")
    assert w.condition("Ready")[:2] == ("True", "Available"), "the old revision still serves"


def test_verification_not_required_serves_the_tag_as_written():
    w = World(make_spec(verification={"required": False}))
    p = w.step()
    assert kinds(p) == ["CreateDeployment"]
    dep = next(iter(w.deployments.values()))
    assert w.manifests[dep.name]["spec"]["template"]["spec"]["containers"][0]["image"] == GOOD
    assert w.condition("Verified")[:2] == ("Unknown", "VerificationNotRequired")


def test_parked_model_is_ready_with_zero_replicas():
    w = World(make_spec(replicas=0))
    w.deploy_first()
    assert w.condition("Ready")[:2] == ("True", "Parked")
    assert w.status.gpus_requested == 0


def test_scaling_replicas_does_not_make_a_new_revision():
    w = World(make_spec())
    w.deploy_first()
    active = w.active_deployment()
    w.spec = w.spec.model_copy(update={"replicas": 3})
    p = w.step()
    assert kinds(p) == ["ScaleDeployment"]
    assert w.deployments[active.name].replicas == 3


def test_a_candidate_the_spec_moved_away_from_before_serving_is_stopped():
    w = World(make_spec())
    w.step()
    w.finish_job()
    w.step()
    first = next(iter(w.deployments))
    w.spec = w.spec.model_copy(update={"image": GOOD2})
    p = w.step()
    assert ScaleDeployment(first, 0, {labels.SCALE_DOWN_AT: None}) in p.actions


def _run_with_restarts(w: World, drop_status_at: set[int]) -> World:
    """Drive a blue-green rollout of GOOD2, 'restarting' (planning twice from the same observed
    state, or losing status) at chosen steps."""
    w.spec = w.spec.model_copy(update={"image": GOOD2})
    for i in range(12):
        if i in drop_status_at:
            w.status = ClefModelStatus()
        w.plan()  # a plan that was computed and then lost (operator killed before acting)
        w.step()
        assert_service_selects_available(w)
        if i == 1:
            w.finish_job()
        if i >= 3:
            w.settle()
        if i >= 5:
            w.advance(15)
    return w


@pytest.mark.parametrize("drop_at", [set(), {0}, {1}, {2}, {3}, {4}, {6}, {2, 4, 8}])
def test_restart_at_any_step_converges(drop_at):
    w = World(make_spec())
    w.deploy_first()
    _run_with_restarts(w, drop_at)
    active = w.active_deployment()
    image = w.manifests[active.name]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.endswith(digest_for(GOOD2))
    assert [d.name for d in w.deployments.values() if d.replicas > 0] == [active.name]
    assert w.condition("Ready")[:2] == ("True", "Available")
    assert w.condition("Progressing")[:2] == ("False", "RolloutComplete")
    jobs = [a for a in w.events if a.reason == "VerificationStarted"]
    assert len(jobs) == 2, "one Job per image, however often the operator restarts"


def test_status_round_trips_through_the_wire_format():
    w = World(make_spec())
    w.deploy_first()
    wire = w.status.to_wire()
    assert "activeRevision" in wire and "kvCacheTokens" in wire and "gpuMemoryMiB" in wire
    assert ClefModelStatus.model_validate(json.loads(json.dumps(wire))) == w.status


def test_coverage_findings_lead_the_failure_message():
    """The runtime lists error sizes before the coverage finding; the on-call engineer should
    read "key channel band [a, b) is zero" first."""
    w = World(make_spec())
    w.step()
    failing = [
        {
            "name": "causal_conv1d/prefill y: rel_rms",
            "op": "causal_conv1d",
            "detail": "rel_rms 0.437 > 0.001",
        },
        {
            "name": "causal_conv1d/prefill y: coverage",
            "op": "causal_conv1d",
            "detail": "causal_conv1d: key channel band [32, 64) is zero",
        },
    ]
    w.finish_job(exit_code=1, message=report("fail", failing=failing))
    w.step()
    message = w.condition("Verified")[2]
    assert message.index("key channel band") < message.index("rel_rms 0.437")
    assert w.status.verifications[0].failing[0].name.endswith("coverage")


def test_deleted_active_deployment_is_recreated_while_a_failed_candidate_is_held():
    """The current spec names the faulty image, so the serving revision can only be rebuilt from
    the spec it was made from (status.activeSpec)."""
    w = World(make_spec())
    w.deploy_first()
    active = w.active_deployment()
    w.spec = w.spec.model_copy(update={"image": FAULTY})
    w.step()
    w.finish_job(exit_code=1, message=report("fail", failing=KEY_BAND_FAILURE))
    w.step()
    del w.deployments[active.name]
    p = w.step()
    assert kinds(p) == ["CreateDeployment"]
    assert "RevisionRecreated" in w.event_reasons()
    rebuilt = w.manifests[active.name]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert rebuilt.endswith(digest_for(GOOD)), "rebuilt as it was, not from the faulty spec"
    assert w.condition("Ready")[:2] == ("False", "RevisionUnavailable")
    w.settle()
    w.step()
    assert w.active_deployment().name == active.name
    assert w.condition("Ready")[:2] == ("True", "Available")
    assert w.condition("Verified")[:2] == ("False", "KernelMismatch")


def test_an_unverified_first_deploy_writes_its_status_three_times():
    """Each status write is a custom-resource write the API server validates; at 1,000 models
    they are what the operator adds to the control plane's own work (issue 19's load test).  One
    pass per event the operator's watches deliver: the model, its Deployment created, the
    Deployment available, the Service created, then resyncs."""
    body = base_spec_dict()
    body["verification"] = {"required": False, "mode": "kernels"}
    w = World(ClefModelSpec.model_validate(body))
    writes = []
    for settle_after in (False, True, False, False, False):
        before = w.status
        w.step()
        writes.append(w.status != before)
        if settle_after:
            w.settle()
    assert w.condition("Ready")[:2] == ("True", "Available")
    # created (waiting 0/1), Service switching, Ready: the pass that sees the new Deployment
    # says the same as the one that made it
    assert writes == [True, False, True, True, False]


def test_a_hijacked_service_is_put_back_and_ready_says_so_meanwhile():
    """Rule 12: whatever was done to clef's Service (selector pointed elsewhere, clef's annotations
    stripped with it, the Service deleted), the pass that sees it puts it back, and its status,
    written before the actions, does not call the model Ready; the next pass does."""
    for hijack in ("selector", "annotations-stripped", "annotations-stripped-selector-kept", "deleted"):
        w = World(make_spec())
        w.deploy_first()
        active = w.active_deployment()
        assert w.service is not None
        if hijack == "deleted":
            w.service = None
        elif hijack == "annotations-stripped-selector-kept":
            w.service = replace(w.service, selector={**w.service.selector, "app": "hijack"}, annotations={})
        else:
            stripped = {} if hijack == "annotations-stripped" else w.service.annotations
            w.service = replace(w.service, selector={"app": "hijack"}, annotations=stripped)
        p = w.step()
        assert kinds(p) in (["PatchServiceSelector"], ["CreateService"]), (hijack, kinds(p))
        assert w.condition("Ready")[:2] == ("False", "ServiceRestoring"), hijack
        w.settle()
        assert w.step().actions == (), hijack
        assert w.condition("Ready")[:2] == ("True", "Available"), hijack
        assert w.active_deployment() == active


def test_a_service_pointed_at_a_preview_never_makes_it_the_active_revision():
    """A preview (the unverified candidate at one replica) is never what serves, even when its
    revision is in the Service's selector and annotations."""
    w = World(make_spec())
    w.deploy_first()
    active = w.active_deployment()
    assert w.service is not None
    preview = replace(active, name="clef-flash-p", revision="p", annotations={labels.PREVIEW_FOR: "k"})
    w.deployments[preview.name] = preview
    w.service = replace(
        w.service,
        selector=labels.selector("clef-flash", "p"),
        annotations={labels.SERVICE_MODEL: "clef-flash", labels.SERVICE_ACTIVE_REVISION: "p"},
    )
    p = w.step()
    assert w.condition("Ready")[:2] == ("False", "ServiceRestoring")
    switched = [a for a in p.actions if isinstance(a, PatchServiceSelector)]
    assert [a.selector for a in switched] == [labels.selector("clef-flash", active.revision)], p.actions


def test_an_adopted_service_with_an_unnamed_port_is_a_conflict_unless_it_is_clefs_port():
    """Two ports need a name each (the API server refuses the patch otherwise): a conflict that
    says so, no write; an unnamed port already on clef's numbers is simply replaced."""
    unnamed = ({"port": 80, "targetPort": 8080, "protocol": "TCP"},)
    w = World(make_spec(service={"name": "clef-serve", "adopt": True}))
    w.service = ServiceState(name="clef-serve", selector={"app": "old"}, ports=unnamed)
    w.step()
    w.finish_job()
    for _ in range(3):
        p = w.step()
        w.settle()
        assert not [a for a in p.actions if type(a).__name__.startswith(("PatchService", "CreateService"))]
    degraded = w.condition("Degraded")
    assert degraded[:2] == ("True", "ServiceConflict") and "80->8080" in degraded[2], degraded
    same = ({"port": 8000, "targetPort": 8000, "protocol": "TCP"},)
    w = World(make_spec(service={"name": "clef-serve", "adopt": True}))
    w.service = ServiceState(name="clef-serve", selector={"app": "old"}, ports=same)
    w.step()
    w.finish_job()
    w.step()
    w.settle()
    w.step()
    assert "ServiceAdopted" in w.event_reasons()
    assert w.condition("Degraded")[0] == "False"


# ---------------------------------------------------------------------------- scale-down hold


def _scaled_up_after_a_switch(w: World) -> tuple[str, str]:
    """A revision switch, then spec.replicas 1 -> 2 before the old revision's scale-down is due:
    the active revision has 1/2 available.  Returns (old Deployment, active revision)."""
    w.deploy_first()
    old = w.active_deployment().name
    switch_to(w, GOOD2)
    assert w.deployments[old].replicas == 1, "the old revision keeps its pods until the delay"
    w.spec = w.spec.model_copy(update={"replicas": 2})
    w.step()
    active = w.active_deployment()
    assert active.replicas == 2 and active.available_replicas == 1
    return old, active.revision


def test_an_older_revision_gives_its_gpus_back_when_the_active_ones_pod_waits_for_them():
    w = World(make_spec())
    old, rev = _scaled_up_after_a_switch(w)
    msg = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    w.pods["new"] = PodState(
        name="new", component=labels.COMPONENT_SERVING, revision=rev, unschedulable_message=msg
    )
    w.advance(31)
    p = w.step()
    assert ScaleDeployment(old, 0, {labels.SCALE_DOWN_AT: None}) in p.actions
    scaled = [e for e in p.actions if isinstance(e, Event) and e.reason == "RevisionScaledDown"]
    assert scaled and "waiting to be scheduled" in scaled[0].message and msg in scaled[0].message
    assert w.condition("Progressing")[1] != "ScaleDownHeld"


@pytest.mark.parametrize(
    "unschedulable",
    ["", "0/1 nodes are available: 1 node(s) were unschedulable."],
    ids=["starting", "cordoned"],
)
def test_an_older_revision_keeps_its_pods_while_the_active_one_is_short_for_another_reason(
    unschedulable: str,
):
    w = World(make_spec())
    old, rev = _scaled_up_after_a_switch(w)
    if unschedulable:
        w.pods["new"] = PodState(
            name="new", component=labels.COMPONENT_SERVING, revision=rev, unschedulable_message=unschedulable
        )
    w.advance(31)
    p = w.step()
    assert not any(isinstance(a, ScaleDeployment) and a.name == old for a in p.actions)
    assert w.condition("Progressing")[:2] == ("True", "ScaleDownHeld")
    assert "1/2 replicas available" in w.condition("Progressing")[2]
