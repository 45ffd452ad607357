"""Issue 13: routes by which an unverified image could serve while Verified=True, and the verdict
defects found with them.  Each test drives the operator (a real process) through the real API
server and the stand-in kubelet; each failed on the operator before the fix (see the issue)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from clef_devcluster.images import put_image

from .conftest import Cluster, wait_for
from .operator_support import (
    HANG_IMAGE,
    IMAGE_10,
    IMAGE_11,
    KEY_BAND_IMAGE,
    VERIFY_SECONDS,
    Models,
    OperatorProcess,
    clefmodel,
    delete_models,
    image_of,
    model_watch,
    operator_running,
)
from .watches import GaplessWatch, states

pytestmark = pytest.mark.cluster

GPU_PRODUCT = "nvidia.com/gpu.product"
REVERIFY = "clef.riotpiao.com/reverify"
SERVED = VERIFY_SECONDS + 120
# How long an absence is watched for after the pass that would have broken it: that pass and the
# ones its own writes wake come within about a second of each other on the local cluster.
WINDOW_SECONDS = 5


def digest_ref(cluster: Cluster, image: str) -> str:
    """`repo@sha256:...` of a tag in the image table (what a kubelet reports as imageID)."""
    entry = cluster.image_table().lookup(image)
    assert entry is not None, image
    return entry.image_id


def serving_images(models: Models, model: str) -> set[str]:
    return {
        image_of(d)
        for d in models.deployments(model)
        if (d.metadata.labels or {}).get("clef.riotpiao.com/component") == "serving"
    }


def job_names(models: Models, model: str) -> list[str]:
    return sorted(j.metadata.name for j in models.jobs(model))


# ---------------------------------------------------------------------------------- route 1


def test_a_new_serving_image_needs_its_own_verdict_with_a_verification_image(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """verification.image set, then spec.image changed to a broken image: the old verdict was
    reused (the key hashed only the verification pod) and the broken image served at once."""
    good, broken = digest_ref(cluster, IMAGE_10), digest_ref(cluster, KEY_BAND_IMAGE)
    with operator_running(cluster, namespace, tmp_path) as op:
        models = Models(cluster, namespace, op)
        models.create(clefmodel("flash", good, verification={"image": IMAGE_10, "timeoutSeconds": 600}))
        models.wait_condition("flash", "Ready", "True", "Available", timeout=SERVED)
        first_jobs = job_names(models, "flash")
        models.set_image("flash", broken)
        wait_for(
            lambda: len(job_names(models, "flash")) > len(first_jobs),
            30,
            "a verification Job for the new serving image",
            lambda: models.describe("flash"),
        )
        assert broken not in serving_images(models, "flash"), "nothing serves before its own verdict"
        assert models.get("flash")["status"]["activeImage"] == good
        # The verifier is the user's own image: its pass is reported as theirs, not clef's.
        verified = models.wait_condition("flash", "Verified", "True", timeout=SERVED)
        assert verified["reason"] == "CustomVerifierPassed", verified
        assert broken in verified["message"] and "user-supplied verifier" in verified["message"]


# ---------------------------------------------------------------------------------- route 2


def _forge_pass(models: Models, name: str, image: str) -> None:
    status = models.get(name)["status"]
    forged = {
        "key": status["verificationKey"],
        "image": image,
        "digest": image,
        "gpuClass": "Tesla-V100-SXM2-16GB",
        "dtype": "f16",
        "suite": "kernels",
        "verdict": "Passed",
        "reason": "Verified",
        "summary": "forged",
        "job": status["verificationJob"],
        "finishedAt": "2026-01-01T00:00:00+00:00",
    }
    models.custom.patch_namespaced_custom_object_status(
        "clef.riotpiao.com",
        "v1alpha1",
        models.ns,
        "clefmodels",
        name,
        {"status": {"verifications": [forged]}},
        _content_type="application/merge-patch+json",
    )


def test_a_passed_record_written_into_status_never_promotes(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """Anyone allowed to patch the status subresource wrote a Passed record: after an operator
    restart the (never verified) image served with zero Jobs."""
    hang = digest_ref(cluster, HANG_IMAGE)
    op = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "operator.log")
    models = Models(cluster, namespace, op)
    op.start()
    try:
        models.create(clefmodel("flash", hang))
        models.wait_status("flash", lambda s: bool(s.get("verificationJob")), "a verification Job", 60)
        op.stop()
        _forge_pass(models, "flash", hang)
        with GaplessWatch(
            cluster.apps.list_namespaced_deployment, namespace, label_selector="clef.riotpiao.com/model=flash"
        ) as deployments:
            op.start()
            wait_for(
                lambda: (
                    "UntrustedVerdictIgnored" in models.event_reasons("flash") or models.deployments("flash")
                ),
                60,
                "the restarted operator to act on the forged verdict",
                lambda: models.describe("flash"),
            )
            # The forgery served from the restarted operator's first pass; the window covers it and
            # the passes its status write and event wake.
            time.sleep(WINDOW_SECONDS)
        created = [c.name for c in deployments.snapshot()]
        assert not deployments.initial and not created, f"nothing serves on a forged verdict: {created}"
        assert "UntrustedVerdictIgnored" in models.event_reasons("flash")
        status = models.get("flash")["status"]
        assert all(r.get("summary") != "forged" for r in status.get("verifications", []))
        assert models.condition("flash", "Verified").get("status") != "True"
        assert models.condition("flash", "Ready").get("status") != "True"
    finally:
        if not op.alive():
            op.start()
        delete_models(cluster, namespace)
        op.stop()


# ---------------------------------------------------------------------------------- route 4


def test_serving_is_pinned_to_the_gpu_class_that_passed(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """No nodeSelector, two GPU classes (worker-1: V100, worker-2: L4): serving pods must land
    only on the class the verification pod ran on."""
    cluster.image_table()
    with operator_running(cluster, namespace, tmp_path) as op:
        models = Models(cluster, namespace, op)
        models.create(clefmodel("flash", IMAGE_10, nodeSelector={}, replicas=2))
        models.wait_condition("flash", "Ready", "True", "Available", timeout=SERVED)
        status = models.get("flash")["status"]
        passed_on = status["verifications"][0]["gpuClass"]
        assert passed_on in ("Tesla-V100-SXM2-16GB", "NVIDIA-L4")
        dep = models.deployment_of("flash", status["activeRevision"])
        assert (dep.spec.template.spec.node_selector or {}).get(GPU_PRODUCT) == passed_on
        pods: list[Any] = cluster.core.list_namespaced_pod(
            namespace, label_selector=f"clef.riotpiao.com/revision={status['activeRevision']}"
        ).items
        assert pods
        for pod in pods:
            node: Any = cluster.core.read_node(pod.spec.node_name)
            assert node.metadata.labels[GPU_PRODUCT] == passed_on, pod.metadata.name
        assert passed_on in models.condition("flash", "Verified")["message"]


# ---------------------------------------------------------------------------------- route 5


def test_an_overridden_verification_command_is_not_reported_as_clefs_pass(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """verification.command overridden: Verified=True said `Verified`, "passed the kernels suite",
    whatever the command checked."""
    cluster.image_table()
    with operator_running(cluster, namespace, tmp_path) as op:
        models = Models(cluster, namespace, op)
        body = clefmodel("flash", IMAGE_10)
        body["spec"]["verification"]["command"] = ["clef-runtime", "verify"]
        models.create(body)
        verified = models.wait_condition("flash", "Verified", "True", timeout=SERVED)
        assert verified["reason"] == "CustomVerifierPassed", verified
        assert "user-supplied verifier" in verified["message"]
        assert "passed the kernels suite" not in verified["message"]
        assert models.get("flash")["status"]["verifications"][0]["verifier"] == "custom"


# ---------------------------------------------------------------------------------- provenance


def test_a_stray_pod_with_the_jobs_label_does_not_supply_the_digest(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """The pod that speaks for a Job was chosen by label and creation time: a newer pod carrying
    the Job's name supplied the pinned digest."""
    real, stray = digest_ref(cluster, IMAGE_10), digest_ref(cluster, IMAGE_11)
    op = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "operator.log")
    models = Models(cluster, namespace, op)
    op.start()
    try:
        models.create(clefmodel("flash", IMAGE_10))
        status = models.wait_status("flash", lambda s: bool(s.get("verificationJob")), "a Job", 60)
        op.stop()
        job = status["verificationJob"]
        job_obj: Any = wait_for(
            lambda: next((j for j in models.jobs("flash") if j.metadata.name == job), None), 30, "the Job"
        )
        wait_for(
            lambda: (models.cluster.batch.read_namespaced_job(job, namespace).status.succeeded or 0) > 0,
            VERIFY_SECONDS,
            "the real verification to finish",
        )
        template = job_obj.spec.template
        template.spec.containers[0].image = IMAGE_11
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=f"{job}-stray",
                labels={
                    **(template.metadata.labels or {}),
                    "job-name": job,
                    "batch.kubernetes.io/job-name": job,
                },
            ),
            spec=template.spec,
        )
        cluster.core.create_namespaced_pod(namespace, pod)

        def stray_done() -> bool:
            p: Any = cluster.core.read_namespaced_pod(f"{job}-stray", namespace)
            return p.status.phase in ("Succeeded", "Failed")

        wait_for(stray_done, VERIFY_SECONDS, "the stray pod to finish")
        op.start()
        models.wait_condition("flash", "Ready", "True", "Available", timeout=SERVED)
        status = models.get("flash")["status"]
        assert status["activeImage"] == real, f"the Job's own pod names the digest, not {stray}"
    finally:
        if not op.alive():
            op.start()
        delete_models(cluster, namespace)
        op.stop()


# ---------------------------------------------------------------------------------- re-verify


def _reverify(models: Models, name: str, value: str) -> None:
    models.patch(name, {"metadata": {"annotations": {REVERIFY: value}}})


def test_reverify_1_2_1_is_three_runs_and_never_rolls_back_to_an_old_job(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """1 -> 2 -> 1 re-judged the hour-old Job of request 1 and rolled serving back to its digest."""
    cluster.image_table()
    tag = f"registry.clef.test/clef-runtime:ci-{namespace[-8:]}"
    first = put_image(cluster.core, tag, "good")
    with operator_running(cluster, namespace, tmp_path) as op:
        models = Models(cluster, namespace, op)
        body = clefmodel("flash", tag)
        body["metadata"]["annotations"] = {REVERIFY: "1"}
        models.create(body)
        models.wait_status("flash", lambda s: s.get("activeImage") == first.image_id, "run 1 serves", SERVED)
        second = put_image(cluster.core, tag, "good")
        _reverify(models, "flash", "2")
        models.wait_status("flash", lambda s: s.get("activeImage") == second.image_id, "run 2 serves", SERVED)
        jobs = job_names(models, "flash")
        with model_watch(cluster, namespace, "flash") as watched:
            _reverify(models, "flash", "1")
            wait_for(
                lambda: len(job_names(models, "flash")) > len(jobs),
                30,
                "a third Job for the third request",
                lambda: models.describe("flash"),
            )
            models.wait_status(
                "flash",
                lambda s: (
                    s.get("observedReverify") == "1"
                    and s.get("verifications", [{}])[0].get("job") not in jobs
                ),
                "run 3 judged",
                SERVED,
            )
            # The roll-back this guards against came with the pass that judged the run; the window
            # covers that pass and the ones its writes wake (each within a second here).
            time.sleep(WINDOW_SECONDS)
        served = [
            ((m.get("status") or {}).get("activeImage"))
            for state in states(watched.initial, watched.snapshot())
            for m in state.values()
        ]
        assert served and set(served) == {second.image_id}, f"never back to run 1's digest: {served}"


def test_a_reverify_value_longer_than_status_can_hold_still_runs(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """A value over 256 characters could not be written to status.observedReverify: every status
    patch failed and the model was stuck."""
    cluster.image_table()
    with operator_running(cluster, namespace, tmp_path) as op:
        models = Models(cluster, namespace, op)
        models.create(clefmodel("flash", IMAGE_10))
        models.wait_condition("flash", "Ready", "True", "Available", timeout=SERVED)
        jobs = job_names(models, "flash")
        _reverify(models, "flash", "r" * 300)
        wait_for(
            lambda: len(job_names(models, "flash")) > len(jobs),
            30,
            "a Job for the re-verify request",
            lambda: models.describe("flash"),
        )
        status = models.wait_status(
            "flash", lambda s: bool(s.get("observedReverify")), "the request recorded", 30
        )
        assert len(status["observedReverify"]) <= 256
        models.wait_status(
            "flash",
            lambda s: s.get("verifications", [{}])[0].get("job") not in jobs,
            "the re-verification judged",
            SERVED,
        )
        assert models.condition("flash", "Verified")["status"] == "True"
