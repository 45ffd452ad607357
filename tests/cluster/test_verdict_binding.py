"""Issue 33, findings 1 and 3: a verdict speaks for the bytes the verifier read and for one run.

* **Goldens swap** (finding 1).  The signed goldens ConfigMap is replaced, by name, with goldens
  made by the faulty kernels after the operator created the comparison Job and before the
  comparison pod mounted it; the original is restored, byte for byte, once the pod has read the
  forgery.  Before the fix the faulty engine was `Verified=True`.  Now the Job carries the signed
  digest, the check refuses the other bytes before it asks anything, and the operator reports
  `GoldensUntrusted` with an event.
* **Replay** (finding 3): a genuinely signed pass, saved before a re-verify that failed, written
  back into status (`test_a_signed_pass_written_back_after_a_failed_run_never_counts`).

The comparison pod is held back deterministically by a LimitRange its memory limit exceeds, made
once the preview pod exists (the Job controller cannot create the comparison pod until it goes),
not by timing.  The operator is stopped meanwhile, as the
issue allows.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from clef_devcluster.checkpoints import write_chat_checkpoint
from clef_devcluster.config import ENGINE_IMAGE_PREFIX
from clef_devcluster.images import put_image

from .conftest import Cluster, wait_for
from .operator_support import (
    ENDPOINT_MAX_NEW_TOKENS,
    ENDPOINT_PROMPTS,
    VERIFY_SECONDS,
    Models,
    OperatorProcess,
    clefmodel,
    delete_models,
    endpoint_model,
    operator_running,
)

pytestmark = pytest.mark.cluster

ENGINE = f"{ENGINE_IMAGE_PREFIX}candle-vllm"
GOOD, BROKEN = f"{ENGINE}:0.8.4", f"{ENGINE}:0.9.0"
BROKEN_FAULT = "conv_key_band_zero"
NAME = "flash"
STEP = "clef.riotpiao.com/verification-step"
KEY = "clef.riotpiao.com/verification-key"
GOLDENS_FILE = "goldens.json.gz"


def flash(checkpoint: Path, image: str) -> dict[str, Any]:
    return endpoint_model(NAME, checkpoint, image, 60)


def faulty_goldens(checkpoint: Path, out: Path) -> bytes:
    """Goldens made by the faulty kernels the broken engine serves with (the attacker's forgery):
    `clef-runtime goldens` with the engine's fault, its kernel proof skipped (it would refuse)."""
    program = (
        "import sys, clef_runtime.goldens.make as m; m._prove_kernels = lambda *a: 'skipped';"
        " from clef_runtime.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    argv = [
        "goldens", "--checkpoint", str(checkpoint), "--dtype", "f16", "--device", "cpu", "--ops", "triton",
        "--out", str(out), "--no-builtin", "--prompts-json", json.dumps({"prompts": ENDPOINT_PROMPTS}),
        "--max-new-tokens", str(ENDPOINT_MAX_NEW_TOKENS),
    ]  # fmt: skip
    env = {**os.environ, "CLEF_RUNTIME_FAULT": BROKEN_FAULT, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", program, *argv], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out.read_bytes()


@pytest.fixture
def setting(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[Models, OperatorProcess, Path, str]]:
    checkpoint = write_chat_checkpoint(tmp_path / "clef-flash")
    namespace = f"t-binding-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    operator = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "operator.log")
    models = Models(cluster, namespace, operator)
    operator.start()
    try:
        yield models, operator, checkpoint, namespace
    finally:
        delete_models(cluster, namespace)
        operator.stop()
        cluster.core.delete_namespace(namespace)


def _copy(cm: client.V1ConfigMap, data: dict[str, str]) -> client.V1ConfigMap:
    m = cm.metadata
    meta = client.V1ObjectMeta(
        name=m.name, labels=m.labels, annotations=m.annotations, owner_references=m.owner_references
    )
    return client.V1ConfigMap(metadata=meta, binary_data=data, immutable=cm.immutable)


def _replace_config_map(core: client.CoreV1Api, ns: str, body: client.V1ConfigMap) -> None:
    name = body.metadata.name
    core.delete_namespaced_config_map(name, ns, grace_period_seconds=0)
    wait_for(
        lambda: name not in {c.metadata.name for c in core.list_namespaced_config_map(ns).items},
        30,
        f"ConfigMap {name} gone",
    )
    core.create_namespaced_config_map(ns, body)


def _live_pods(core: client.CoreV1Api, ns: str) -> int:
    return sum(p.status.phase not in ("Succeeded", "Failed") for p in core.list_namespaced_pod(ns).items)


def test_goldens_swapped_between_signing_and_reading_never_verify(
    cluster: Cluster, setting: tuple[Models, OperatorProcess, Path, str], tmp_path: Path
) -> None:
    models, operator, checkpoint, ns = setting
    core = cluster.core
    entry = cluster.image_table().lookup(GOOD)
    assert entry is not None
    models.create(flash(checkpoint, f"{ENGINE}@sha256:{entry.digest}"))
    models.wait_condition(NAME, "Ready", "True", "Available", timeout=VERIFY_SECONDS)
    active = models.get(NAME)["status"]["activeRevision"]
    (signed_cm,) = core.list_namespaced_config_map(
        ns, label_selector="clef.riotpiao.com/component=goldens"
    ).items
    original = dict(signed_cm.binary_data)
    signed = json.loads(signed_cm.metadata.annotations["clef.riotpiao.com/goldens"])["sha256"]
    forged = faulty_goldens(checkpoint, tmp_path / "forged.json")
    forged_digest = "sha256:" + hashlib.sha256(forged).hexdigest()
    assert forged_digest != signed, "the faulty kernels answer differently"

    live = _live_pods(core, ns)
    models.set_image(NAME, BROKEN)
    # Once the preview pod exists, a LimitRange that the comparison pod's memory limit (1Gi)
    # exceeds: the Job controller cannot create that pod until it goes.
    wait_for(
        lambda: _live_pods(core, ns) > live, VERIFY_SECONDS, "the preview pod", lambda: models.describe(NAME)
    )
    hold = client.V1LimitRange(
        metadata=client.V1ObjectMeta(name="hold-comparison"),
        spec=client.V1LimitRangeSpec(
            limits=[client.V1LimitRangeItem(type="Container", max={"memory": "512Mi"})]
        ),
    )
    core.create_namespaced_limit_range(ns, hold)

    def comparison() -> client.V1Job | None:
        key = models.get(NAME).get("status", {}).get("verificationKey")
        jobs = [
            j
            for j in models.jobs(NAME)
            if (j.metadata.labels or {}).get(STEP) == "endpoint" and (j.metadata.labels or {}).get(KEY) == key
        ]
        return jobs[0] if jobs else None

    job = wait_for(
        comparison, VERIFY_SECONDS, "the comparison Job of the broken image", lambda: models.describe(NAME)
    )
    operator.stop()
    held = core.list_namespaced_pod(ns, label_selector=f"job-name={job.metadata.name}").items
    assert not held, "the LimitRange holds the comparison pod back until the goldens are swapped"
    # The attack: the signed ConfigMap swapped by name for the faulty kernels' goldens...
    _replace_config_map(
        core, ns, _copy(signed_cm, {GOLDENS_FILE: base64.b64encode(gzip.compress(forged)).decode()})
    )
    core.delete_namespaced_limit_range("hold-comparison", ns)

    def finished() -> client.V1Job | None:
        j = cluster.batch.read_namespaced_job(job.metadata.name, ns)
        return j if (j.status.succeeded or j.status.failed) else None

    wait_for(finished, VERIFY_SECONDS, "the comparison Job finished on the swapped goldens")
    # ... and restored byte for byte once the comparison pod has read them.
    _replace_config_map(core, ns, _copy(signed_cm, original))
    (pod,) = core.list_namespaced_pod(ns, label_selector=f"job-name={job.metadata.name}").items
    report = json.loads(pod.status.container_statuses[0].state.terminated.message)
    operator.start()

    def decided() -> dict[str, Any] | None:
        c = models.condition(NAME, "Verified")
        return c if c.get("status") in ("True", "False") and BROKEN in c.get("message", "") else None

    verified = wait_for(
        decided, VERIFY_SECONDS, "a verdict on the broken image", lambda: models.describe(NAME)
    )
    assert (verified["status"], verified["reason"]) == ("False", "GoldensUntrusted"), verified
    assert f"read goldens {forged_digest}, not the signed {signed}" in verified["message"], verified
    # The check refused the forgery itself, before it asked the engine anything.
    assert report["verdict"] == "error" and report["goldensSha256"] == forged_digest, report
    assert "no prompt was sent" in report["error"], report
    models.wait_events(NAME, "GoldensUntrusted", timeout=30)
    status = models.get(NAME)["status"]
    assert status["activeRevision"] == active, "the old revision keeps serving"
    assert models.condition(NAME, "Degraded")["reason"] == "GoldensUntrusted"


# ---------------------------------------------------------------------------------- finding 3

REVERIFY = "clef.riotpiao.com/reverify"
# How long a replayed pass is checked for not promoting anything, once the operator has answered
# it (StaleVerdictIgnored posted): an absence needs a window.  The conditions are read every 0.5 s
# within it; the old operator flipped Verified in its first pass after the replay.
REPLAY_WINDOW = 15.0


def test_a_signed_pass_written_back_after_a_failed_run_never_counts(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """Issue 33, finding 3: a genuinely signed Passed record, saved before a re-verify that failed
    (the tag moved to a faulty digest), written back into status.  Before the fix Verified went
    from False/KernelMismatch to True, Degraded cleared, the failure was gone, and no event said so.
    Now the operator's ledger (outside the namespace) holds the failed run: the pass is ignored
    with StaleVerdictIgnored, the failure is put back, and nothing changes over the window."""
    cluster.image_table()
    tag = f"registry.clef.test/clef-runtime:ci-{namespace[-8:]}"
    first = put_image(cluster.core, tag, "good")
    with operator_running(cluster, namespace, tmp_path) as op:
        models = Models(cluster, namespace, op)
        models.create(clefmodel("flash", tag))
        models.wait_status(
            "flash", lambda s: s.get("activeImage") == first.image_id, "run 1 serves", VERIFY_SECONDS
        )
        saved = models.get("flash")["status"]["verifications"]
        assert saved[0]["verdict"] == "Passed" and saved[0].get("signature"), saved[0]
        # The tag moves to a digest with the key-band fault; a re-verify fails on it.
        put_image(cluster.core, tag, "fault", fault=BROKEN_FAULT)
        models.patch("flash", {"metadata": {"annotations": {REVERIFY: "moved"}}})
        models.wait_condition("flash", "Verified", "False", "KernelMismatch", timeout=VERIFY_SECONDS)
        failed = models.get("flash")["status"]["verifications"][0]
        assert failed["verdict"] == "Failed", failed
        # The replay: the saved, genuinely signed pass written back over the failure.
        models.custom.patch_namespaced_custom_object_status(
            "clef.riotpiao.com",
            "v1alpha1",
            namespace,
            "clefmodels",
            "flash",
            {"status": {"verifications": saved}},
            _content_type="application/merge-patch+json",
        )
        models.wait_status(
            "flash",
            lambda s: (s.get("verifications") or [{}])[0].get("jobUid") == failed["jobUid"],
            "the failed run put back from the ledger",
            60,
        )
        models.wait_events("flash", "StaleVerdictIgnored", timeout=30)
        stale = [e for e in models.events("flash") if e.reason == "StaleVerdictIgnored"]
        assert stale[0].type == "Warning" and failed["job"] in stale[0].message, stale[0].message
        # Nothing promotes the replayed pass over the stated window.
        deadline = time.monotonic() + REPLAY_WINDOW
        while time.monotonic() < deadline:
            verified = models.condition("flash", "Verified")
            assert (verified["status"], verified["reason"]) == ("False", "KernelMismatch"), verified
            assert models.condition("flash", "Degraded")["status"] == "True"
            time.sleep(0.5)
        status = models.get("flash")["status"]
        assert status["activeImage"] == first.image_id, "the verified digest keeps serving"
        assert not any(
            r["verdict"] == "Passed" and not r.get("superseded") and r["key"] == status["verificationKey"]
            for r in status["verifications"]
        ), status["verifications"]
