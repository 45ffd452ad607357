"""Endpoint verification end to end on the local cluster (issue 16): the operator makes goldens
with the runtime image from a small real checkpoint, runs the candidate's engine as one preview
replica (the runner serves it for real on its own 127.x pod IP), and a CPU-only comparison Job
asks it the golden prompts.

One ClefModel, `flash` (candle-vllm dialect), tells the story test by test, in file order: a
correct candidate promoted; the key-band fault in the *serving* engine rejected with
EndpointMismatch while the old revision serves; a preview that never becomes Ready, and one that
crash-loops, failing closed in bounded time; the fixed image verified against the same goldens
(one goldens Job in all) with the operator killed during the comparison; a template mismatch
being an error; goldens edited by hand not trusted.  Throughout, a Service of the user's own that
selects on the serving label lists only pods that passed.  Small shapes: two chat prompts, a few new
tokens, the engine on the CPU.
"""

from __future__ import annotations

import base64
import gzip
import json
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from clef_devcluster.checkpoints import OTHER_TEMPLATE, write_chat_checkpoint
from clef_devcluster.config import ENGINE_IMAGE_PREFIX

from .conftest import Cluster, wait_for
from .operator_support import VERIFY_SECONDS, Models, OperatorProcess, delete_models, endpoint_model
from .watches import GaplessWatch, states

pytestmark = pytest.mark.cluster

ENGINE = f"{ENGINE_IMAGE_PREFIX}candle-vllm"
GOOD, BROKEN, FIXED = (f"{ENGINE}:{t}" for t in ("0.8.4", "0.9.0", "0.9.1"))
CRASH, NEVER_READY = f"{ENGINE}:crash", f"{ENGINE}:never-ready"
NAME = "flash"
READY_TIMEOUT = 45
STEP = "clef.riotpiao.com/verification-step"
KEY = "clef.riotpiao.com/verification-key"


@dataclass
class Story:
    cluster: Cluster
    namespace: str
    models: Models
    operator: OperatorProcess
    checkpoint: Path
    # What a Service of the user's own that selects on the serving label alone
    # (`clef.riotpiao.com/model=flash`) would select: the pods that match it, watched without gaps
    # for the whole module.  (Its EndpointSlices cannot show it here: the runner serves on loopback
    # pod IPs, which an EndpointSlice refuses to hold.)
    mine: GaplessWatch

    def pods_behind_mine(self) -> set[str]:
        """Every pod the selector matched, in any state the watched set went through."""
        return {name for state in states(self.mine.initial, self.mine.snapshot()) for name in state}

    def status(self) -> dict[str, Any]:
        return dict(self.models.get(NAME).get("status") or {})

    def jobs(self, step: str) -> list[client.V1Job]:
        return [j for j in self.models.jobs(NAME) if (j.metadata.labels or {}).get(STEP) == step]

    def deployment(self, rev: str) -> client.V1Deployment:
        return self.models.deployment_of(NAME, rev)

    def verified(self, status: str, reason: str, timeout: float = VERIFY_SECONDS) -> dict[str, Any]:
        return self.models.wait_condition(NAME, "Verified", status, reason, timeout=timeout)

    def previews(self) -> list[client.V1Deployment]:
        return [
            d
            for d in self.models.deployments(NAME)
            if "clef.riotpiao.com/preview-since" in (d.metadata.annotations or {})
            or (d.metadata.annotations or {}).get("clef.riotpiao.com/verdict") != "Passed"
        ]


def flash(checkpoint: Path, image: str) -> dict[str, Any]:
    return endpoint_model(NAME, checkpoint, image, READY_TIMEOUT)


def _other_template(checkpoint: Path) -> None:
    """`<checkpoint>/other/`: the same weights and tokenizer under another chat template (no think
    block): an engine started on it renders the golden prompts to other tokens."""
    other = checkpoint / "other"
    other.mkdir()
    for f in checkpoint.iterdir():
        if f.is_file():
            shutil.copy(f, other / f.name)
    config = json.loads((other / "tokenizer_config.json").read_text())
    config["chat_template"] = OTHER_TEMPLATE
    (other / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def story(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    table = cluster.image_table()
    for image in (GOOD, BROKEN, FIXED, CRASH, NEVER_READY):
        entry = table.lookup(image)
        assert entry is not None and entry.kind == "serve", f"{image} is not a serve image in the table"
    root = tmp_path_factory.mktemp("endpoint")
    checkpoint = write_chat_checkpoint(root / "clef-flash")
    _other_template(checkpoint)
    namespace = f"t-endpoint-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    operator = OperatorProcess(cluster.kubeconfig, namespace, root / "operator.log")
    models = Models(cluster, namespace, operator)
    watch = GaplessWatch(
        cluster.core.list_namespaced_pod, namespace, label_selector=f"clef.riotpiao.com/model={NAME}"
    )
    operator.start()
    try:
        with watch:
            yield Story(cluster, namespace, models, operator, checkpoint, watch)
    finally:
        delete_models(cluster, namespace)
        operator.stop()
        cluster.core.delete_namespace(namespace)


def test_a_correct_candle_vllm_candidate_is_promoted(story: Story) -> None:
    """By digest, on a pinned GPU class: the preview is the very revision that serves."""
    models = story.models
    entry = story.cluster.image_table().lookup(GOOD)
    assert entry is not None
    pinned = f"{ENGINE}@sha256:{entry.digest}"
    started = time.monotonic()
    models.create(flash(story.checkpoint, pinned))
    models.wait_condition(NAME, "Ready", "True", "Available", timeout=VERIFY_SECONDS)
    print(f"first endpoint verification and rollout: {time.monotonic() - started:.0f}s")
    status = story.status()
    records = status["verifications"]
    assert [r["step"] for r in records[:3]] == ["endpoint", "preview", "goldens"], records
    final = records[0]
    assert final["final"] and final["verdict"] == "Passed" and final["reason"] == "Verified"
    assert final["digest"] == pinned, "bound to the digest the preview pod ran"
    assert final["digest"] == records[1]["digest"] and final["gpuClass"] == records[1]["gpuClass"]
    # Serving is pinned to that digest, on that GPU class.
    active = story.deployment(status["activeRevision"])
    pod = active.spec.template.spec
    assert pod.containers[0].image == final["digest"]
    assert pod.node_selector["nvidia.com/gpu.product"] == final["gpuClass"]
    # The comparison asked the preview's pod IP and needed no GPU.
    (check,) = story.jobs("endpoint")
    spec = check.spec.template.spec
    argv = spec.containers[0].command
    assert (
        argv[:2] == ["clef-runtime", "endpoint-check"] and argv[argv.index("--dialect") + 1] == "candle-vllm"
    )
    assert argv[argv.index("--url") + 1].startswith("http://127.")
    assert spec.runtime_class_name is None and not (spec.containers[0].resources.limits or {}).get(
        "nvidia.com/gpu"
    )
    assert len(story.jobs("goldens")) == 1
    # The preview was rendered as the revision to serve, so it was scaled up in place.
    assert [d.metadata.name for d in models.deployments(NAME)] == [active.metadata.name]
    assert "clef.riotpiao.com/preview-for" not in (active.metadata.annotations or {})
    assert active.metadata.annotations["clef.riotpiao.com/verification-step"] == "endpoint"
    models.wait_events(
        NAME, "GoldensStarted", "GoldensStored", "PreviewStarted", "ComparisonStarted", "PreviewPromoted"
    )
    # Issue 33, finding 5: a Service of the user's own that selects on the serving label gets the
    # promoted pod once it passed, and never a goldens or comparison pod.
    serving = [p.metadata.name for p in story.cluster.core.list_namespaced_pod(
        story.namespace, label_selector=f"clef.riotpiao.com/revision={status['activeRevision']}").items]  # fmt: skip
    assert len(serving) == 1, serving
    wait_for(lambda: story.pods_behind_mine() == set(serving), 30, f"mine to select {serving}",
             lambda: str(story.pods_behind_mine()))  # fmt: skip


def test_the_key_band_fault_in_the_serving_engine_is_an_endpoint_mismatch(story: Story) -> None:
    models = story.models
    active = story.status()["activeRevision"]
    models.set_image(NAME, BROKEN)
    verified = story.verified("False", "EndpointMismatch")
    assert "prompt" in verified["message"] and "token" in verified["message"], verified["message"]
    status = story.status()
    assert status["activeRevision"] == active, "the old revision keeps serving"
    # A tag: the preview ran it, and its record names the digest it resolved to.
    assert status["verifications"][1]["step"] == "preview"
    assert status["verifications"][1]["digest"].startswith(f"{ENGINE}@sha256:")
    assert models.condition(NAME, "Ready")["status"] == "True"
    assert models.condition(NAME, "Degraded")["reason"] == "EndpointMismatch"
    wait_for(
        lambda: all(
            (d.spec.replicas or 0) == 0
            for d in models.deployments(NAME)
            if d.metadata.name != f"{NAME}-{active}"
        ),
        60,
        "the broken preview at 0",
        lambda: models.describe(NAME),
    )
    assert len(story.jobs("goldens")) == 1, "the same goldens answered"
    # Issue 33, finding 5: the broken preview was asked, became Ready and was scaled to 0; a
    # Service of the user's own that selects on the serving label never listed it.
    history = list(states(story.mine.initial, story.mine.caught_up()))
    behind = {name for state in history for name in state}
    assert behind and all(p.startswith(f"{NAME}-{active}-") for p in behind), behind
    # The serving pod (on a node with a driver label) kept the serving label while the new image
    # was verified: held to the driver its own pass ran on, carried on its Deployment.
    first = next(i for i, state in enumerate(history) if state)
    assert all(history[first:]), "a moment with no pod behind the serving label during the upgrade"


@pytest.mark.parametrize(
    ("image", "reason"),
    [(NEVER_READY, "PreviewNotReady"), (CRASH, "PreviewCrashLoop")],
    ids=["never Ready", "crash loop"],
)
def test_a_preview_that_cannot_serve_fails_closed_in_bounded_time(
    story: Story, image: str, reason: str
) -> None:
    models = story.models
    active = story.status()["activeRevision"]
    started = time.monotonic()
    models.set_image(NAME, image)
    # Bounded: the preview's readyTimeoutSeconds (a crash loop fails sooner), plus the operator's
    # reaction; nothing waits for a Job deadline.
    story.verified("False", reason, timeout=READY_TIMEOUT + 90)
    print(f"{reason} after {time.monotonic() - started:.0f}s")
    assert story.status()["activeRevision"] == active
    assert not story.jobs("endpoint") or all(
        (j.metadata.labels or {}).get(KEY) != story.status()["verificationKey"]
        for j in story.jobs("endpoint")
    ), "no comparison against a preview that never served"


def test_the_fixed_image_reuses_the_goldens_with_the_operator_killed_during_the_comparison(
    story: Story,
) -> None:
    models = story.models
    before = story.status()["activeRevision"]
    models.set_image(NAME, FIXED)

    def comparing() -> bool:
        key = story.status().get("verificationKey")
        return any((j.metadata.labels or {}).get(KEY) == key for j in story.jobs("endpoint"))

    wait_for(
        comparing, VERIFY_SECONDS, "the comparison Job of the fixed image", lambda: models.describe(NAME)
    )
    story.operator.kill()

    def finished() -> bool:
        key = story.status().get("verificationKey")
        return any(
            (j.metadata.labels or {}).get(KEY) == key and (j.status.succeeded or j.status.failed)
            for j in story.jobs("endpoint")
        )

    # The comparison ends while no operator runs; its verdict must still be read afterwards.
    wait_for(
        finished, VERIFY_SECONDS, "the comparison finished without an operator", lambda: models.describe(NAME)
    )
    story.operator.start()
    models.wait_status(
        NAME,
        lambda s: s.get("activeRevision") not in (None, before),
        "the fixed image serving",
        VERIFY_SECONDS,
    )
    assert models.condition(NAME, "Verified")["reason"] == "Verified"
    assert len(story.jobs("goldens")) == 1, "one goldens Job for four images"


def test_an_engine_that_renders_another_template_is_an_error_not_a_pass(story: Story) -> None:
    models = story.models
    active = story.status()["activeRevision"]
    # The same image, started on a directory whose chat template differs (its --w wins).
    models.patch(NAME, {"spec": {"args": ["--w", "/models/clef-flash/other/"]}})
    verified = story.verified("False", "EndpointCheckError")
    assert "could not run" in verified["message"], verified["message"]
    assert story.status()["activeRevision"] == active


def _another_first_answer(goldens: bytes) -> bytes:
    """`goldens` with the last digit of the first token id after the first `"ids":[` changed."""
    start = goldens.index(b'"ids":[') + len(b'"ids":[')
    end = start
    while goldens[end : end + 1].isdigit():
        end += 1
    digit = goldens[end - 1 : end]
    other = b"1" if digit != b"1" else b"2"
    return goldens[: end - 1] + other + goldens[end:]


def test_goldens_edited_by_hand_are_not_trusted(story: Story) -> None:
    models, core, ns = story.models, story.cluster.core, story.namespace
    (cm,) = core.list_namespaced_config_map(ns, label_selector="clef.riotpiao.com/component=goldens").items
    data = gzip.decompress(base64.b64decode(cm.binary_data["goldens.json.gz"]))
    # Someone "fixes" the goldens to what another engine answers: the first golden token of the
    # first prompt becomes another id (same length, so only the bytes tell).
    forged = _another_first_answer(data)
    assert len(forged) == len(data) and json.loads(forged) != json.loads(data)
    core.delete_namespaced_config_map(cm.metadata.name, ns)
    body = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(
            name=cm.metadata.name,
            labels=cm.metadata.labels,
            annotations=cm.metadata.annotations,
            owner_references=cm.metadata.owner_references,
        ),
        binary_data={"goldens.json.gz": base64.b64encode(gzip.compress(forged)).decode()},
    )
    core.create_namespaced_config_map(ns, body)
    active = story.status()["activeRevision"]
    models.patch(NAME, {"metadata": {"annotations": {"clef.riotpiao.com/reverify": "edited-goldens"}}})
    verified = story.verified("False", "GoldensUntrusted", timeout=120)
    assert "is not the signed" in verified["message"], verified["message"]
    # The event goes with the actions, after the status that says it.
    wait_for(lambda: "GoldensUntrusted" in models.event_reasons(NAME), 30, "the GoldensUntrusted event")
    wait_for(
        lambda: (
            not core.list_namespaced_config_map(
                ns, label_selector="clef.riotpiao.com/component=goldens"
            ).items
        ),
        60,
        "the untrusted goldens deleted",
    )
    assert story.status()["activeRevision"] == active and models.condition(NAME, "Ready")["status"] == "True"
