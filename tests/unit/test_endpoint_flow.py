"""Endpoint verification, step by step, through the pure planner: goldens -> preview ->
comparison -> promote, and every way each step fails closed (docs/verification.md, "Endpoint
verification"; operator/clef_operator/endpoint_flow.py)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
from dataclasses import replace
from typing import Any

import pytest
from clef_builders import GOOD, GOOD2, World, base_spec_dict, digest_for, kinds

from clef_contract.endpoint import (
    ENDPOINT_SCHEMA_VERSION,
)
from clef_contract.goldens import GoldensReport, build_goldens_report
from clef_operator import labels
from clef_operator.actions import CreateConfigMap, CreateDeployment, CreateJob, Event, ScaleDeployment
from clef_operator.api import ClefModelSpec, Step, Verdict
from clef_operator.conditions import Reason
from clef_operator.endpoint import check_job_name
from clef_operator.goldens import GOLDENS_FILE, MAX_STORED_BYTES, goldens_key, goldens_name
from clef_operator.observed import PodState
from clef_operator.plan_verification import floor_shortfalls
from clef_operator.render import engine_argv

RUNTIME = "registry.clef.test/clef-runtime:1.0"
V100 = "Tesla-V100-SXM2-16GB"
FILE = (json.dumps({"schemaVersion": "clef.riotpiao.com/goldens/v1", "prompts": ["x" * 200]}) + "\n").encode()


def endpoint_spec(image: str = GOOD, **endpoint: Any) -> ClefModelSpec:
    body = base_spec_dict(image=image)
    body["verification"] = {"mode": "endpoint", "endpoint": {"runtimeImage": RUNTIME, **endpoint}}
    return ClefModelSpec.model_validate(body)


def goldens_message(data: bytes = FILE, **changes: Any) -> str:
    report = GoldensReport(
        verdict="pass",
        summary="8 prompts, 576 tokens, kernel checks 61/61 (reduced sizes)",
        sha256="sha256:" + hashlib.sha256(data).hexdigest(),
        bytes=len(data),
        cache_key="sha256:" + "c" * 64,
        provenance={
            "checkpointDigest": "sha256:" + "d" * 64,
            "promptSetDigest": "sha256:" + "e" * 64,
            "runtimeVersion": "0.1.0",
            "dtype": "f16",
            "opSet": "triton",
            "gpuClass": V100,
            "kernelChecks": "61/61",
        },
        top_k=5,
        prompts=8,
        tokens=576,
    )
    if "dtype" in changes:
        changes["provenance"] = {**report.provenance, "dtype": changes.pop("dtype")}
    return build_goldens_report(replace(report, **changes))


SIGNED = "sha256:" + hashlib.sha256(FILE).hexdigest()  # what the goldens Job's file hashes to


def endpoint_message(
    verdict: str = "pass",
    error: str | None = None,
    divergence: Any = None,
    goldens: str | None = SIGNED,
    engine_error: dict[str, str] | None = None,
) -> str:
    return json.dumps(
        {
            "schemaVersion": ENDPOINT_SCHEMA_VERSION,
            "verdict": verdict,
            "summary": "prompts 7/7 exact, tokens 512/512 equal"
            if verdict == "pass"
            else "prompt chat-64 diverged",
            "failing": []
            if verdict != "fail"
            else [{"name": "chat-64", "op": "endpoint", "detail": "token 3"}],
            "suite": "endpoint",
            "dtype": "f16",
            "device": "engine at http://10.0.0.7:8000",
            "runtimeVersion": "0.1.0",
            "error": error,
            "dialect": "candle-vllm",
            "logprobs": "placeholder",
            "firstDivergence": divergence,
            "goldensSha256": goldens,
            "engineError": engine_error,
        }
    )


KEY_BAND = {
    "prompt": "chat-64",
    "position": 3,
    "expectedId": 17,
    "expectedText": " Paris",
    "gotId": 0,
    "gotText": "!",
    "goldenMargin": None,
    "nearTie": False,
}


def goldens_job(w: World) -> str:
    return goldens_name(w.model.name, goldens_key(w.spec))


def finish_goldens(w: World, log: bytes | None = None, message: str | None = None, exit_code: int = 0) -> str:
    job = goldens_job(w)
    w.finish_job(
        job, exit_code=exit_code, message=message if message is not None else goldens_message(), image=RUNTIME
    )
    pod = w.job_pod(job)
    w.logs[pod.uid] = log if log is not None else b"goldens: 8 prompts\n" + FILE + b"warning on stderr\n"
    return job


def preview(w: World) -> str:
    """The preview Deployment's revision (the one Deployment with the preview annotation)."""
    return next(d.revision for d in w.deployments.values() if labels.PREVIEW_FOR in d.annotations)


def start_preview_pod(w: World, rev: str, image: str | None = None, **changes: Any) -> PodState:
    image = image or w.spec.image
    pod = PodState(
        name=f"preview-{rev}",
        component=labels.COMPONENT_SERVING,
        revision=rev,
        phase="Running",
        ready=True,
        uid=f"uid-preview-{rev}",
        ip="10.0.0.7",
        image_id=image if "@sha256:" in image else f"{image.split(':')[0]}@{digest_for(image)}",
        node_name="worker-1",
        node_gpu_product=V100,
        node_gpu_memory_mib=16384,
        created_at=w.now,
    )
    pod = replace(pod, **changes)
    w.pods[pod.name] = pod
    return pod


def check_job(w: World) -> str:
    return check_job_name(w.model.name, w.status.verification_key or "", "")


def to_comparison(w: World) -> str:
    """From nothing to a running comparison Job; returns the preview revision."""
    w.step()  # goldens Job
    finish_goldens(w)
    w.step()  # store
    w.step()  # preview
    rev = preview(w)
    start_preview_pod(w, rev)
    w.step()  # comparison Job
    return rev


def test_goldens_preview_comparison_then_the_pinned_candidate_serves() -> None:
    w = World(endpoint_spec())
    plan = w.step()
    gjob = goldens_job(w)
    manifest = next(a.manifest for a in plan.actions if isinstance(a, CreateJob))
    pod = manifest["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert manifest["metadata"]["name"] == gjob
    assert container["image"] == RUNTIME and container["command"][:4] == [
        "clef-runtime",
        "goldens",
        "--checkpoint",
        "/clef/model",
    ]
    assert container["command"][6:8] == ["--out", "-"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # The checkpoint at clef's own path, whatever spec.model.path says (it could name the
    # verifier's site-packages).
    assert {"name": "model", "mountPath": "/clef/model", "readOnly": True} in container["volumeMounts"]
    assert w.condition("Verified")[0] == "Unknown"
    finish_goldens(w)
    plan = w.step()
    stored = next(a.manifest for a in plan.actions if isinstance(a, CreateConfigMap))
    assert gzip.decompress(base64.b64decode(stored["binaryData"][GOLDENS_FILE])) == FILE
    assert stored["immutable"] is True
    assert "GoldensStored" in w.event_reasons()
    assert w.status.verifications[0].step is Step.GOLDENS and not w.status.verifications[0].final
    plan = w.step()
    created = [a.manifest for a in plan.actions if isinstance(a, CreateDeployment)]
    assert len(created) == 1 and created[0]["spec"]["replicas"] == 1, "the preview: one replica"
    assert w.service is None, "no Service selects a preview"
    rev = preview(w)
    assert "CreateJob" not in kinds(w.step()), "no comparison before the preview is Ready"
    start_preview_pod(w, rev)
    plan = w.step()
    check = check_job(w)
    job = next(a.manifest for a in plan.actions if isinstance(a, CreateJob))
    spec = job["spec"]["template"]["spec"]
    assert job["metadata"]["name"] == check
    assert "runtimeClassName" not in spec and "nvidia.com/gpu" not in json.dumps(spec), (
        "the comparison needs no GPU"
    )
    argv = spec["containers"][0]["command"]
    assert argv[:2] == ["clef-runtime", "endpoint-check"]
    assert argv[argv.index("--url") + 1] == "http://10.0.0.7:8000"
    assert argv[argv.index("--dialect") + 1] == "candle-vllm"
    # The goldens, and /tmp for a read-only root (tests/unit/test_pod_security.py).
    assert spec["volumes"] == [
        {"name": "goldens", "configMap": {"name": gjob}},
        {"name": "tmp", "emptyDir": {}},
    ]
    assert w.status.verifications[0].step is Step.PREVIEW
    w.finish_job(check, message=endpoint_message(), image=RUNTIME)
    w.step()
    record = w.status.verifications[0]
    assert w.condition("Verified")[:2] == ("True", "Verified")
    assert record.step is Step.ENDPOINT and record.final and record.verdict is Verdict.PASSED
    assert record.digest == f"registry.clef.test/clef-runtime@{digest_for(GOOD)}", (
        "bound to the preview's imageID"
    )
    assert record.gpu_class == V100
    # The preview ran the tag; serving is pinned to the digest and the GPU class: another revision.
    candidate = w.status.candidate_revision
    assert candidate and candidate != rev
    assert w.deployments[f"clef-flash-{rev}"].replicas == 0, "the tag's preview gave its GPU back"
    w.settle()
    w.step()
    w.step()
    assert w.active_deployment() is not None and w.active_deployment().revision == candidate  # type: ignore[union-attr]
    assert w.condition("Ready")[0] == "True"


def test_mistralrs_is_asked_by_default_with_the_argv_that_serves_in_its_dialect() -> None:
    body = base_spec_dict(engine="mistralrs", gpuMemoryMiB=32768)
    body["verification"] = {"endpoint": {"runtimeImage": RUNTIME}}  # no mode: the engine's default
    w = World(ClefModelSpec.model_validate(body))
    w.step()  # goldens Job
    finish_goldens(w)
    w.step()  # store
    plan = w.step()
    (created,) = [a.manifest for a in plan.actions if isinstance(a, CreateDeployment)]
    command = created["spec"]["template"]["spec"]["containers"][0]["command"]
    # The preview is the serving preset itself: its prefix cache off, as it will serve.
    assert command == engine_argv(w.spec) and command[command.index("--prefix-cache-n") + 1] == "0"
    start_preview_pod(w, preview(w))
    plan = w.step()
    job = next(a.manifest for a in plan.actions if isinstance(a, CreateJob))
    argv = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert argv[:2] == ["clef-runtime", "endpoint-check"]
    assert argv[argv.index("--dialect") + 1] == "mistralrs"


def test_a_preview_of_the_digest_on_its_class_becomes_the_candidate_itself() -> None:
    image = f"registry.clef.test/clef-runtime@{digest_for(GOOD)}"
    body = base_spec_dict(image=image, replicas=2, nodeSelector={"nvidia.com/gpu.product": V100})
    body["verification"] = {"mode": "endpoint", "endpoint": {"runtimeImage": RUNTIME}}
    w = World(ClefModelSpec.model_validate(body))
    rev = to_comparison(w)
    w.finish_job(check_job(w), message=endpoint_message(), image=RUNTIME)
    plan = w.step()
    scale = next(a for a in plan.actions if isinstance(a, ScaleDeployment))
    assert scale.name == f"clef-flash-{rev}" and scale.replicas == 2
    assert scale.annotations[labels.PREVIEW_FOR] is None and scale.annotations[labels.VERDICT] == "Passed"
    assert "PreviewPromoted" in w.event_reasons()
    assert not any(isinstance(a, CreateDeployment) for a in plan.actions), "no second start"
    w.settle()
    w.step()
    w.step()
    assert w.active_deployment().revision == rev  # type: ignore[union-attr]


def serving_then_upgrade(image: str = GOOD2) -> World:
    """clef-flash served from GOOD (endpoint mode), then spec.image moves to `image`."""
    w = World(endpoint_spec())
    to_comparison(w)
    w.finish_job(check_job(w), message=endpoint_message(), image=RUNTIME)
    for _ in range(3):
        w.settle()
        w.step()
    assert w.condition("Ready")[0] == "True"
    w.spec = endpoint_spec(image)
    return w


def test_a_second_image_reuses_the_goldens() -> None:
    w = serving_then_upgrade()
    plan = w.step()
    assert not any(isinstance(a, CreateJob) for a in plan.actions), (
        "no goldens Job: the stored ones are trusted"
    )
    assert [
        a.manifest["metadata"]["annotations"][labels.PREVIEW_FOR]
        for a in plan.actions
        if isinstance(a, CreateDeployment)
    ]
    assert sum(1 for j in w.jobs.values() if j.step == "goldens") == 1


def test_a_key_band_fault_in_the_serving_engine_is_an_endpoint_mismatch() -> None:
    w = serving_then_upgrade()
    active = w.active_deployment()
    w.step()
    rev = preview(w)
    start_preview_pod(w, rev, image=GOOD2, name="preview-new", uid="uid-new", ip="10.0.0.8")
    w.step()
    check = check_job_name(w.model.name, w.status.verification_key or "", "")
    w.finish_job(check, exit_code=1, message=endpoint_message("fail", divergence=KEY_BAND), image=RUNTIME)
    w.step()
    status, reason, message = w.condition("Verified")
    assert (status, reason) == ("False", Reason.ENDPOINT_MISMATCH)
    assert "prompt chat-64, token 3" in message and "expected id 17" in message
    assert w.condition("Degraded")[:2] == ("True", Reason.ENDPOINT_MISMATCH)
    assert w.deployments[f"clef-flash-{rev}"].replicas == 0, "the preview goes to 0"
    assert w.active_deployment() == active and active is not None and active.replicas == 1, (
        "the old one serves"
    )
    assert w.condition("Ready")[0] == "True"


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (
            endpoint_message(
                "error", error="prompt chat-63: the engine's prompt has 70 tokens, the golden 63"
            ),
            Reason.ENDPOINT_CHECK_ERROR,
        ),
        ("not json", Reason.REPORT_INVALID),
        ("", Reason.CRASHED),
    ],
    ids=["template mismatch", "garbage", "no report"],
)
def test_a_comparison_that_could_not_judge_is_never_a_pass(message: str, reason: str) -> None:
    w = World(endpoint_spec())
    rev = to_comparison(w)
    w.finish_job(check_job(w), exit_code=2, message=message, image=RUNTIME)
    w.step()
    assert w.condition("Verified")[:2] == ("False", reason)
    assert w.deployments[f"clef-flash-{rev}"].replicas == 0
    assert w.service is None


def test_an_engine_that_fails_a_prompt_is_an_engine_error_naming_prompt_and_message() -> None:
    """Issue 38, item 5: an HTTP 5xx or a crash mid-answer is the engine's failure, its own reason,
    neither a numeric mismatch nor a check that could not run."""
    w = World(endpoint_spec())
    rev = to_comparison(w)
    said = {
        "prompt": "tokens-1",
        "message": "POST /v1/completions: HTTP 500: expect x to be transposed. See the root cause.",
    }
    message = endpoint_message(
        "error", error="the engine failed prompt tokens-1: HTTP 500", engine_error=said
    )
    w.finish_job(check_job(w), exit_code=3, message=message, image=RUNTIME)
    w.step()
    status, reason, text = w.condition("Verified")
    assert (status, reason) == ("False", Reason.ENGINE_ERROR)
    assert "prompt tokens-1" in text and "expect x to be transposed" in text, text
    assert ".." not in text, f"the engine's closing period and the operator's make two: {text}"
    assert w.condition("Degraded")[:2] == ("True", Reason.ENGINE_ERROR)
    assert w.deployments[f"clef-flash-{rev}"].replicas == 0
    assert w.service is None


def test_an_engine_that_dies_of_the_prompt_it_failed_is_an_engine_error_not_a_lost_preview() -> None:
    """Real vLLM's one-token crash: its engine core dies, the API server exits, and the preview
    pod is gone by the time the operator reads the comparison.  The report names the prompt and
    the engine's message, which `PreviewLost` would hide."""
    w = World(endpoint_spec())
    rev = to_comparison(w)
    said = {
        "prompt": "tokens-1",
        "message": "POST /v1/completions: HTTP 500: EngineCore encountered an issue",
    }
    message = endpoint_message(
        "error", error="the engine failed prompt tokens-1: HTTP 500", engine_error=said
    )
    w.finish_job(check_job(w), exit_code=3, message=message, image=RUNTIME)
    del w.pods[f"preview-{rev}"]
    w.step()
    status, reason, text = w.condition("Verified")
    assert (status, reason) == ("False", Reason.ENGINE_ERROR)
    assert "prompt tokens-1" in text and "EngineCore" in text and "gone" in text, text
    assert w.deployments[f"clef-flash-{rev}"].replicas == 0


def test_a_passing_report_with_a_failing_exit_code_is_not_a_pass() -> None:
    w = World(endpoint_spec())
    to_comparison(w)
    w.finish_job(check_job(w), exit_code=1, message=endpoint_message(), image=RUNTIME)
    w.step()
    assert w.condition("Verified")[:2] == ("False", Reason.CRASHED)


def test_a_preview_that_never_becomes_ready_fails_in_bounded_time() -> None:
    w = World(endpoint_spec(readyTimeoutSeconds=60))
    w.step()
    finish_goldens(w)
    w.step()
    w.step()
    rev = preview(w)
    start_preview_pod(w, rev, ready=False)
    plan = w.step()
    assert w.condition("Verified")[0] == "Unknown" and plan.requeue_after is not None
    w.advance(61)
    w.step()
    status, reason, message = w.condition("Verified")
    assert (status, reason) == ("False", Reason.PREVIEW_NOT_READY) and "60s" in message
    assert w.deployments[f"clef-flash-{rev}"].replicas == 0


def test_a_crash_looping_preview_fails_at_once_with_its_last_words() -> None:
    w = World(endpoint_spec())
    w.step()
    finish_goldens(w)
    w.step()
    w.step()
    rev = preview(w)
    start_preview_pod(
        w,
        rev,
        ready=False,
        waiting_reason="CrashLoopBackOff",
        restart_count=2,
        last_termination_message="CUDA error: out of memory",
    )
    w.step()
    status, reason, message = w.condition("Verified")
    assert (status, reason) == ("False", Reason.PREVIEW_CRASH_LOOP) and "out of memory" in message
    assert w.deployments[f"clef-flash-{rev}"].replicas == 0


def test_a_preview_pod_replaced_during_the_comparison_is_lost() -> None:
    w = World(endpoint_spec())
    rev = to_comparison(w)
    del w.pods[f"preview-{rev}"]
    start_preview_pod(w, rev, name="preview-2", uid="uid-2", ip="10.0.0.9")
    w.step()
    assert w.condition("Verified")[:2] == ("False", Reason.PREVIEW_LOST)
    assert check_job(w) not in w.jobs, "the comparison Job is deleted"


def stored_world() -> World:
    w = World(endpoint_spec())
    w.step()
    finish_goldens(w)
    w.step()
    return w


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (
            lambda cm: replace(
                cm, binary_data={GOLDENS_FILE: gzip.compress(FILE.replace(b"x", b"y"), mtime=0)}
            ),
            "is not the signed",
        ),
        (
            lambda cm: replace(
                cm,
                annotations={
                    **cm.annotations,
                    labels.GOLDENS_META: cm.annotations[labels.GOLDENS_META].replace("576", "577"),
                },
            ),
            "signature does not verify",
        ),
        (lambda cm: replace(cm, binary_data={}), "does not hold exactly"),
        (lambda cm: replace(cm, binary_data={GOLDENS_FILE: b"\x1f\x8bnot gzip"}), "corrupt"),
        (lambda cm: replace(cm, binary_data={GOLDENS_FILE: b"\0" * (MAX_STORED_BYTES + 1)}), "more than"),
    ],
    ids=["data edited", "annotation edited", "data missing", "corrupt", "oversized"],
)
def test_goldens_that_fail_a_check_are_never_trusted(edit: Any, why: str) -> None:
    w = stored_world()
    name = goldens_job(w)
    w.config_maps[name] = edit(w.config_maps[name])
    plan = w.step()
    status, reason, message = w.condition("Verified")
    assert (status, reason) == ("False", Reason.GOLDENS_UNTRUSTED) and why in message
    assert "DeleteConfigMap" in kinds(plan) and "GoldensUntrusted" in w.event_reasons()
    assert not any(d.replicas for d in w.deployments.values()), "no preview on untrusted goldens"
    # A re-verify makes new goldens with a new Job (the old one was deleted with them).
    assert name not in w.jobs
    w.model = replace(w.model, annotations={labels.REVERIFY: "1"})
    plan = w.step()
    assert any(isinstance(a, CreateJob) and a.manifest["metadata"]["name"] == name for a in plan.actions)


@pytest.mark.parametrize(
    ("log", "message", "why"),
    [
        (b"cut" + FILE[:50], None, "no line of"),
        (None, goldens_message(bytes=len(FILE) + 1), "no line of"),
        (None, goldens_message(dtype="bf16"), "dtype bf16"),
        (None, goldens_message(bytes=17 * 1024 * 1024), "more than"),
    ],
    ids=["log cut", "size mismatch", "another dtype", "too large"],
)
def test_goldens_output_that_does_not_match_its_report_is_invalid(
    log: bytes | None, message: str | None, why: str
) -> None:
    w = World(endpoint_spec())
    w.step()
    finish_goldens(w, log=log, message=message)
    plan = w.step()
    status, reason, text = w.condition("Verified")
    assert (status, reason) == ("False", Reason.GOLDENS_INVALID) and why in text
    assert "DeleteJob" in kinds(plan) and not w.config_maps


def test_a_goldens_report_that_is_garbage_is_report_invalid() -> None:
    w = World(endpoint_spec())
    w.step()
    finish_goldens(w, message="garbage")
    w.step()
    assert w.condition("Verified")[:2] == ("False", Reason.REPORT_INVALID)


def test_a_goldens_job_whose_kernels_fail_is_goldens_failed() -> None:
    w = World(endpoint_spec())
    w.step()
    fail = build_goldens_report(
        GoldensReport(
            "fail",
            "kernel checks 55/61: causal_conv1d: key channel band [32, 64) is zero",
            "",
            0,
            "",
            {},
            0,
            0,
            0,
            "kernel checks 55/61",
        )
    )
    finish_goldens(w, message=fail, exit_code=1)
    w.step()
    status, reason, message = w.condition("Verified")
    assert (status, reason) == ("False", Reason.GOLDENS_FAILED) and "key channel band" in message


def test_the_operator_restarted_at_any_step_converges() -> None:
    """Status lost at any step (an operator killed before its write) changes nothing that
    happens next: every step is decided from the children."""
    done = World(endpoint_spec())
    rev = to_comparison(done)
    done.finish_job(check_job(done), message=endpoint_message(), image=RUNTIME)
    done.step()
    fresh = replace(done, status=type(done.status)(), events=[])
    fresh.step()
    assert fresh.condition("Verified")[:2] == ("True", "Verified")
    assert fresh.status.verifications[0].step is Step.ENDPOINT
    assert fresh.deployments[f"clef-flash-{rev}"].replicas == 0


def test_mode_both_runs_the_kernels_first_and_previews_their_digest() -> None:
    body = base_spec_dict(image=GOOD)
    body["verification"] = {"mode": "both", "endpoint": {"runtimeImage": RUNTIME}}
    w = World(ClefModelSpec.model_validate(body))
    plan = w.step()
    verify = next(a.manifest for a in plan.actions if isinstance(a, CreateJob))
    assert verify["spec"]["template"]["spec"]["containers"][0]["command"][:2] == ["clef-runtime", "verify"]
    w.finish_job(verify["metadata"]["name"])
    plan = w.step()
    assert w.condition("Verified")[0] == "Unknown" and plan.requeue_after == 0.0
    kernels = w.status.verifications[0]
    assert kernels.step is Step.KERNELS and not kernels.final
    w.step()  # goldens
    finish_goldens(w)
    w.step()
    plan = w.step()
    dep = next(a.manifest for a in plan.actions if isinstance(a, CreateDeployment))
    pod = dep["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == kernels.digest, (
        "the preview runs the digest that passed the kernels"
    )
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == V100
    rev = dep["metadata"]["labels"][labels.REVISION]
    start_preview_pod(w, rev)
    w.step()
    w.finish_job(check_job(w), message=endpoint_message(), image=RUNTIME)
    w.step()
    assert w.condition("Verified")[:2] == ("True", "Verified")
    assert w.status.candidate_revision == rev, "the preview is the candidate: no second start"


def test_step_records_are_written_once() -> None:
    w = World(endpoint_spec())
    to_comparison(w)
    w.step()
    w.step()
    steps = [r.step for r in w.status.verifications]
    assert steps.count(Step.PREVIEW) == 1 and steps.count(Step.GOLDENS) == 1


def test_a_verification_below_the_floor_says_so() -> None:
    """Issue 33, finding 9: prompts that cannot be shown to cross one 64-token chunk of the delta
    rule leave the state carried between chunks unchecked: the pass says so, naming the floor."""
    short = endpoint_spec(builtinPrompts="none", prompts=[{"name": "q", "text": "2+2?"}], maxNewTokens=4)
    assert floor_shortfalls(short) and "64-token chunk" in floor_shortfalls(short)[0]
    assert "longest is 4 bytes" in floor_shortfalls(short)[0]
    long_text = "Summarise the history of the printing press in Europe, from Gutenberg onwards."
    assert len(long_text.encode()) > 64
    assert (
        floor_shortfalls(endpoint_spec(builtinPrompts="none", prompts=[{"name": "q", "text": long_text}]))
        == []
    )
    assert floor_shortfalls(endpoint_spec()) == [], "the built-in set has 65-, 1001- and 8197-token prompts"
    w = World(short)
    to_comparison(w)
    w.finish_job(check_job(w), message=endpoint_message(), image=RUNTIME)
    w.step()
    status, reason, message = w.condition("Verified")
    assert (status, reason) == ("True", "Verified") and "Weaker than clef's floor" in message, message


# ------------------------------------------------------------------- issue 33, finding 1


def test_the_comparison_job_is_given_the_signed_goldens_digest() -> None:
    w = World(endpoint_spec())
    to_comparison(w)
    job = w.jobs[check_job(w)]
    argv = list(job.command)
    assert argv[argv.index("--goldens-sha256") + 1] == SIGNED
    assert job.annotations[labels.GOLDENS_SHA256] == SIGNED


SWAPPED = "sha256:" + "f" * 64


@pytest.mark.parametrize(
    ("message", "exit_code", "says"),
    [
        (endpoint_message(goldens=SWAPPED), 0, f"read goldens {SWAPPED}, not the signed {SIGNED}"),
        (
            endpoint_message("error", error="--goldens-sha256: ... no prompt was sent", goldens=SWAPPED),
            2,
            f"read goldens {SWAPPED}, not the signed {SIGNED}",
        ),
    ],
    ids=["a pass on other goldens", "the check refused other goldens"],
)
def test_goldens_that_changed_between_signing_and_reading_fail_closed(
    message: str, exit_code: int, says: str
) -> None:
    w = World(endpoint_spec())
    rev = to_comparison(w)
    w.finish_job(check_job(w), exit_code=exit_code, message=message, image=RUNTIME)
    plan = w.step()
    status, reason, text = w.condition("Verified")
    assert (status, reason) == ("False", Reason.GOLDENS_UNTRUSTED), text
    assert says in text and "changed between signing and reading" in text
    assert w.condition("Degraded")[:2] == ("True", Reason.GOLDENS_UNTRUSTED)
    events = [a for a in plan.actions if isinstance(a, Event)]
    assert any(e.reason == "GoldensUntrusted" and SWAPPED in e.message for e in events), events
    assert w.deployments[f"clef-flash-{rev}"].replicas == 0 and w.service is None


def test_a_comparison_job_given_other_goldens_never_passes() -> None:
    w = World(endpoint_spec())
    to_comparison(w)
    name = check_job(w)
    job = w.jobs[name]
    argv = list(job.command)
    argv[argv.index("--goldens-sha256") + 1] = SWAPPED
    w.jobs[name] = replace(job, command=tuple(argv))
    w.finish_job(name, exit_code=0, message=endpoint_message(goldens=SWAPPED), image=RUNTIME)
    w.step()
    status, reason, text = w.condition("Verified")
    assert (status, reason) == ("False", Reason.GOLDENS_UNTRUSTED)
    assert f"was given goldens digest {SWAPPED}" in text


def test_the_serving_label_goes_on_a_preview_only_once_it_is_promoted() -> None:
    """Issue 33, finding 5: a user's Service selecting `clef.riotpiao.com/model=<name>` must not
    get the preview while it is being asked.  Its pod is created without the serving label; the
    label comes with the promotion, before the Service switches to it."""
    from clef_operator.actions import CreateService, LabelPod

    image = f"registry.clef.test/clef-runtime@{digest_for(GOOD)}"
    body = base_spec_dict(image=image, nodeSelector={"nvidia.com/gpu.product": V100})
    body["verification"] = {"mode": "endpoint", "endpoint": {"runtimeImage": RUNTIME}}
    w = World(ClefModelSpec.model_validate(body))
    rev = to_comparison(w)
    for _ in range(2):
        assert not [a for a in w.step().actions if isinstance(a, LabelPod)], "no label while previewed"
    assert w.pods[f"preview-{rev}"].serving_label == ""
    w.finish_job(check_job(w), message=endpoint_message(), image=RUNTIME)
    promoted = w.step()
    assert "PreviewPromoted" in w.event_reasons()
    assert not any(isinstance(a, LabelPod) for a in promoted.actions), "the verdict is written first"
    w.settle()
    switched = w.step()
    order = [type(a).__name__ for a in switched.actions if isinstance(a, (LabelPod, CreateService))]
    assert order == ["LabelPod", "CreateService"], switched.actions
    assert w.pods[f"preview-{rev}"].serving_label == "clef-flash"
    assert w.service is not None and w.service.selector[labels.MODEL] == "clef-flash"
    # A second replica the ReplicaSet makes later gets it too, and nothing is labelled twice.
    start_preview_pod(w, rev, name=f"second-{rev}")
    again = w.step()
    assert [a.name for a in again.actions if isinstance(a, LabelPod)] == [f"second-{rev}"]
    assert not [a for a in w.step().actions if isinstance(a, LabelPod)]


def test_a_failed_preview_never_gets_the_serving_label() -> None:
    w = serving_then_upgrade()
    active = w.active_deployment()
    assert active is not None
    served = start_preview_pod(w, active.revision, image=GOOD, name="serving-0", uid="uid-0", ip="10.0.0.6")
    w.step()
    assert w.pods["serving-0"].serving_label == "clef-flash", "a pod of the verified revision"
    rev = preview(w)
    start_preview_pod(w, rev, image=GOOD2, name="preview-new", uid="uid-new", ip="10.0.0.8")
    w.step()
    check = check_job_name(w.model.name, w.status.verification_key or "", "")
    w.finish_job(check, exit_code=1, message=endpoint_message("fail", divergence=KEY_BAND), image=RUNTIME)
    for _ in range(3):
        w.settle()
        w.step()
    assert w.condition("Verified")[1] == Reason.ENDPOINT_MISMATCH
    assert w.pods["preview-new"].serving_label == ""
    assert w.pods[served.name].serving_label == "clef-flash"
