"""Probes of the serving revision (spec.verification.watch, `plan_watch`): when a probe runs, what
it asks, how its finding is read, and what each policy does, stepped through the pure planner."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from clef_builders import GOOD, World, base_spec_dict, digest_for
from test_endpoint_flow import (
    KEY_BAND,
    RUNTIME,
    V100,
    check_job,
    endpoint_message,
    start_preview_pod,
    to_comparison,
)

from clef_operator import labels
from clef_operator.actions import CreateJob, DeleteJob, Event, LabelPod
from clef_operator.api import ClefModelSpec
from clef_operator.observed import JobState

INTERVAL = 120
IMAGE = f"registry.clef.test/clef-runtime@{digest_for(GOOD)}"


def watched_spec(replicas: int = 2, **watch: Any) -> ClefModelSpec:
    body = base_spec_dict(image=IMAGE, replicas=replicas, nodeSelector={"nvidia.com/gpu.product": V100})
    body["verification"] = {
        "mode": "endpoint",
        "endpoint": {"runtimeImage": RUNTIME},
        "watch": {"intervalSeconds": INTERVAL, "prompts": 2, **watch},
    }
    return ClefModelSpec.model_validate(body)


def serving(replicas: int = 2, **watch: Any) -> tuple[World, str]:
    """clef-flash verified and served from the promoted preview, with `replicas` Ready pods."""
    w = World(watched_spec(replicas, **watch))
    rev = to_comparison(w)
    w.finish_job(check_job(w), message=endpoint_message(), image=RUNTIME)
    w.step()
    preview = f"preview-{rev}"
    w.pods[preview] = replace(w.pods[preview], revision_of=w.model.name)
    for i in range(1, replicas):
        start_preview_pod(w, rev, name=f"serving-{i}", uid=f"uid-serving-{i}", ip=f"10.0.0.{20 + i}",
                          node_name=f"worker-{i + 1}", revision_of=w.model.name, image=IMAGE)  # fmt: skip
    w.settle()
    w.step()
    w.step()
    assert w.condition("Ready")[0] == "True"
    return w, rev


def probes(w: World) -> dict[str, JobState]:
    return {n: j for n, j in w.jobs.items() if j.step == labels.STEP_PROBE}


def probe_of(w: World, pod: str, finished: bool | None = None) -> str:
    uid = w.pods[pod].uid
    found = [
        n
        for n, j in probes(w).items()
        if j.annotations[labels.PROBE_POD_UID] == uid and (finished is None or j.finished == finished)
    ]
    assert len(found) == 1, found
    return found[0]


def answer(w: World, job: str, message: str | None = None, exit_code: int = 0) -> None:
    w.finish_job(job, message=message or endpoint_message(), image=RUNTIME, exit_code=exit_code)


def wrong_answer() -> str:
    return endpoint_message("fail", divergence=KEY_BAND)


def test_every_serving_pod_is_probed_at_its_own_address_with_the_signed_goldens() -> None:
    w, _ = serving()
    pods = {p.name: p for p in w.pods.values() if p.component == labels.COMPONENT_SERVING}
    assert len(probes(w)) == 2, "one probe per Ready serving pod, at once"
    for name, pod in pods.items():
        job = probe_of(w, name)
        manifest = w.manifests[job]
        argv = manifest["spec"]["template"]["spec"]["containers"][0]["command"]
        assert argv[:2] == ["clef-runtime", "endpoint-check"]
        assert argv[argv.index("--url") + 1] == f"http://{pod.ip}:8000", "the pod, never the Service"
        assert argv[argv.index("--sample") + 1] == "2" and argv[argv.index("--sample-round") + 1] == "0"
        goldens = manifest["metadata"]["annotations"][labels.GOLDENS_CONFIGMAP]
        signed = manifest["metadata"]["annotations"][labels.GOLDENS_SHA256]
        assert argv[argv.index("--goldens-sha256") + 1] == signed
        assert w.config_maps[goldens].annotations[labels.GOLDENS_META].find(signed) >= 0
        assert manifest["spec"]["activeDeadlineSeconds"] == INTERVAL
        assert "ttlSecondsAfterFinished" not in manifest["spec"], "kept until a newer probe finished"
        pod_spec = manifest["spec"]["template"]["spec"]
        asked = [c.get("resources", {}) for c in pod_spec["containers"]]
        assert not any("nvidia.com/gpu" in str(r) for r in asked), "a probe asks for no GPU"
        assert "runtimeClassName" not in pod_spec, "nor the GPU runtime"
        assert w.pods[name].serving_label == w.model.name
    assert w.condition("Serving")[:2] == ("Unknown", "ProbePending")


def test_probes_pass_then_come_again_after_the_interval_and_older_ones_go() -> None:
    w, _ = serving()
    first = {n: probe_of(w, n) for n in ("serving-1", *(p for p in w.pods if p.startswith("preview-")))}
    for job in first.values():
        answer(w, job)
    w.step()
    status, reason, message = w.condition("Serving")
    assert (status, reason) == ("True", "Consistent") and "2 serving pod(s)" in message
    w.advance(INTERVAL - 1)
    plan = w.step()
    assert not any(isinstance(a, CreateJob) for a in plan.actions), "not before the interval"
    assert 0 < (plan.requeue_after or 0) <= 1, "the pass is requeued for the next probe"
    w.advance(1)
    plan = w.step()
    created = [a.manifest for a in plan.actions if isinstance(a, CreateJob)]
    assert len(created) == 2
    argv = created[0]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert argv[argv.index("--sample-round") + 1] == "1", "the next prompts in turn"
    assert set(first.values()) <= set(probes(w)), "the last finished probe stays until a newer one finishes"
    for name in first:
        answer(w, probe_of(w, name, finished=False))
    plan = w.step()
    assert {a.name for a in plan.actions if isinstance(a, DeleteJob)} == set(first.values())
    assert w.condition("Serving")[:2] == ("True", "Consistent")


def test_alert_reports_a_wrong_answer_once_and_the_pod_keeps_serving() -> None:
    w, rev = serving()
    bad = f"preview-{rev}"
    answer(w, probe_of(w, "serving-1"))
    answer(w, probe_of(w, bad), wrong_answer(), exit_code=1)
    plan = w.step()
    status, reason, message = w.condition("Serving")
    assert (status, reason) == ("False", "ProbeMismatch")
    assert f"pod {bad} on node worker-1" in message and "prompt chat-64, token 3" in message
    assert "expected id 17" in message and "the engine said 0" in message
    said = [a for a in plan.actions if isinstance(a, Event) and a.reason == "ProbeFailed"]
    assert len(said) == 1 and said[0].type == "Warning"
    assert not any(isinstance(a, LabelPod) for a in plan.actions)
    assert w.pods[bad].serving_label == w.model.name, "alert only reports"
    plan = w.step()
    assert not any(isinstance(a, Event) and a.reason == "ProbeFailed" for a in plan.actions), "said once"
    w.advance(INTERVAL)
    plan = w.step()
    assert len([a for a in plan.actions if isinstance(a, CreateJob)]) == 2, "alert: the bad pod is probed on"


def test_cordon_pod_takes_exactly_the_failing_pod_out_of_serving_for_good() -> None:
    w, rev = serving(policy="cordon-pod")
    bad = f"preview-{rev}"
    answer(w, probe_of(w, "serving-1"))
    answer(w, probe_of(w, bad), wrong_answer(), exit_code=1)
    plan = w.step()
    removed = [a for a in plan.actions if isinstance(a, LabelPod)]
    assert removed == [LabelPod(bad, {labels.MODEL: None})]
    assert w.pods[bad].serving_label == "" and w.pods["serving-1"].serving_label == w.model.name
    cordoned = next(a for a in plan.actions if isinstance(a, Event) and a.reason == "PodCordoned")
    assert bad in cordoned.message and "1 pod(s) still carry it" in cordoned.message
    status, reason, message = w.condition("Serving")
    assert (status, reason) == ("False", "PodCordoned")
    assert "1 pod(s) of revision" in message and f"delete pod {bad}" in message
    # Never labelled again, never probed again, its failing probe kept as the record.
    record = probe_of(w, bad)
    for _ in range(3):
        w.advance(INTERVAL)
        plan = w.step()
        assert not any(isinstance(a, LabelPod) for a in plan.actions)
        for job in [j for j in probes(w) if not w.jobs[j].finished]:
            assert w.jobs[job].annotations[labels.PROBE_POD_UID] != w.pods[bad].uid
            answer(w, job)
    assert probe_of(w, bad) == record
    assert w.condition("Serving")[1] == "PodCordoned"
    # Deleted, its record goes with it, and the rest is consistent.
    del w.pods[bad]
    plan = w.step()
    assert DeleteJob(record) in plan.actions
    w.step()
    assert w.condition("Serving")[:2] == ("True", "Consistent")


def test_cordoning_the_last_serving_pod_is_done_and_said() -> None:
    w, rev = serving(replicas=1, policy="cordon-pod")
    bad = f"preview-{rev}"
    answer(w, probe_of(w, bad), wrong_answer(), exit_code=1)
    plan = w.step()
    assert LabelPod(bad, {labels.MODEL: None}) in plan.actions, "fail closed: no answer beats a wrong one"
    cordoned = next(a for a in plan.actions if isinstance(a, Event) and a.reason == "PodCordoned")
    assert "nothing serves now" in cordoned.message
    assert "no pod of clef-flash serves now" in w.condition("Serving")[2]


def test_switching_alert_to_cordon_pod_cordons_on_the_finding_at_hand() -> None:
    w, rev = serving()
    bad = f"preview-{rev}"
    answer(w, probe_of(w, "serving-1"))
    answer(w, probe_of(w, bad), wrong_answer(), exit_code=1)
    w.step()
    assert w.pods[bad].serving_label == w.model.name
    w.spec = watched_spec(policy="cordon-pod")
    plan = w.step()
    assert [a for a in plan.actions if isinstance(a, LabelPod)] == [LabelPod(bad, {labels.MODEL: None})]


def test_an_engine_error_cordons_and_a_probe_that_cannot_judge_does_not() -> None:
    w, rev = serving(policy="cordon-pod")
    bad = f"preview-{rev}"
    failed = {"prompt": "chat-64", "message": "500 Internal Server Error: CUDA error: illegal address"}
    said = endpoint_message("error", error="the engine failed prompt chat-64: HTTP 500", engine_error=failed)
    answer(w, probe_of(w, bad), said, exit_code=3)
    answer(w, probe_of(w, "serving-1"), endpoint_message("error", error="connection refused"), exit_code=2)
    plan = w.step()
    assert [a for a in plan.actions if isinstance(a, LabelPod)] == [LabelPod(bad, {labels.MODEL: None})]
    message = w.condition("Serving")[2]
    assert "CUDA error: illegal address" in message


def test_a_probe_of_other_goldens_is_never_a_pass() -> None:
    w, rev = serving(policy="cordon-pod")
    other = endpoint_message(goldens="sha256:" + "0" * 64)
    answer(w, probe_of(w, f"preview-{rev}"), other)
    answer(w, probe_of(w, "serving-1"))
    w.step()
    status, reason, message = w.condition("Serving")
    assert (status, reason) == ("Unknown", "ProbeError") and "GoldensUntrusted" in message
    assert not any(p.serving_label == "" for p in w.pods.values() if p.component == labels.COMPONENT_SERVING)


def test_nothing_is_probed_while_another_revision_than_the_current_specs_serves() -> None:
    w, _ = serving()
    for job in list(probes(w)):
        answer(w, job)
    w.step()
    body = watched_spec().model_dump(by_alias=True, mode="json", exclude_none=True)
    body["kvFraction"] = 0.25  # a new revision, being verified
    w.spec = ClefModelSpec.model_validate(body)
    w.advance(INTERVAL)
    plan = w.step()
    assert not any(isinstance(a, CreateJob) and a.manifest["metadata"]["labels"].get(labels.STEP) == "probe"
                   for a in plan.actions)  # fmt: skip
    assert w.condition("Serving")[:2] == ("Unknown", "NotProbed")


def test_without_watch_there_is_no_serving_condition_and_probes_go() -> None:
    w, _ = serving()
    body = watched_spec().model_dump(by_alias=True, mode="json", exclude_none=True)
    del body["verification"]["watch"]
    w.spec = ClefModelSpec.model_validate(body)
    running = set(probes(w))
    assert running
    plan = w.step()
    assert {a.name for a in plan.actions if isinstance(a, DeleteJob)} == running
    w.step()
    assert all(c.type != "Serving" for c in w.status.conditions)


def test_probes_passing_again_are_said_once_and_a_first_pass_is_not() -> None:
    w, rev = serving()
    bad = f"preview-{rev}"
    answer(w, probe_of(w, "serving-1"))
    answer(w, probe_of(w, bad))
    plan = w.step()
    assert w.condition("Serving")[1] == "Consistent"
    assert not [a for a in plan.actions if isinstance(a, Event) and a.reason.startswith("Probe")], (
        "nothing to say"
    )
    w.advance(INTERVAL)
    w.step()
    answer(w, probe_of(w, "serving-1", finished=False))
    answer(w, probe_of(w, bad, finished=False), wrong_answer(), exit_code=1)
    w.step()
    assert w.condition("Serving")[1] == "ProbeMismatch"
    w.advance(INTERVAL)
    w.step()
    for name in ("serving-1", bad):
        answer(w, probe_of(w, name, finished=False))
    plan = w.step()
    said = [a.reason for a in plan.actions if isinstance(a, Event)]
    assert w.condition("Serving")[1] == "Consistent" and said.count("ProbesConsistent") == 1, said
    plan = w.step()
    assert "ProbesConsistent" not in [a.reason for a in plan.actions if isinstance(a, Event)]
