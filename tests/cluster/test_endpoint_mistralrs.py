"""Engine mistralrs end to end on the local cluster: a ClefModel that names mistral.rs 0.8.1 and
sets no verification mode is verified by asking its engine (the default), from one preview
replica that runs the preset's own argv (its prefix cache off), in the mistralrs dialect.  The
runner serves the engine image's `mistralrs serve` argv with `clef-runtime serve --dialect
mistralrs`, which refuses a checkpoint outside Qwen3.5's image-and-text layout as mistral.rs
does, so the weights volume holds that layout (`write_image_text_layout`).  A clean image is
promoted; a build with the key-band fault in its GDN conv is held with EndpointMismatch while the
clean revision keeps serving.  The setup is test_endpoint_mode.py's (`endpoint_model`).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from clef_devcluster.checkpoints import write_chat_checkpoint, write_image_text_layout
from clef_devcluster.config import ENGINE_IMAGE_PREFIX

from .conftest import Cluster
from .operator_support import VERIFY_SECONDS, Models, endpoint_model, operator_running

pytestmark = pytest.mark.cluster

ENGINE = f"{ENGINE_IMAGE_PREFIX}mistralrs"
CLEAN, FAULTY = f"{ENGINE}:0.8.1", f"{ENGINE}:0.8.1-conv_key_band_zero"
NAME = "flash-rs"
READY_TIMEOUT = 60
STEP = "clef.riotpiao.com/verification-step"


@pytest.fixture(scope="module")
def image_text_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mistralrs")
    return write_image_text_layout(write_chat_checkpoint(root / "text"), root / "clef-flash")


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_mistralrs_is_promoted_clean_and_held_with_a_faulty_engine(
    cluster: Cluster, namespace: str, tmp_path: Path, image_text_checkpoint: Path
) -> None:
    table = cluster.image_table()
    for image in (CLEAN, FAULTY):
        entry = table.lookup(image)
        assert entry is not None and entry.dialect == "mistralrs", f"{image} is not a mistralrs serve image"
    body = endpoint_model(
        NAME, image_text_checkpoint, CLEAN, READY_TIMEOUT, engine="mistralrs", gpuMemoryMiB=16384
    )
    del body["spec"]["verification"]["mode"]  # mistralrs's default: endpoint
    with operator_running(cluster, namespace, tmp_path) as operator:
        models = Models(cluster, namespace, operator)
        started = time.monotonic()
        models.create(body)
        models.wait_condition(NAME, "Ready", "True", "Available", timeout=VERIFY_SECONDS)
        print(f"mistralrs: endpoint verification and rollout in {time.monotonic() - started:.0f}s")
        status = models.get(NAME)["status"]
        final = status["verifications"][0]
        assert [r["step"] for r in status["verifications"][:3]] == ["endpoint", "preview", "goldens"]
        assert final["final"] and final["verdict"] == "Passed" and final["reason"] == "Verified", final
        # What serves is what was verified: the preset's argv, its prefix cache off.
        active = models.deployment_of(NAME, status["activeRevision"])
        command = active.spec.template.spec.containers[0].command
        assert command[:4] == ["mistralrs", "serve", "-m", "/models/clef-flash"], command
        assert _flag(command, "--prefix-cache-n") == "0" and _flag(command, "--dtype") == "f16"
        (check,) = [j for j in models.jobs(NAME) if (j.metadata.labels or {}).get(STEP) == "endpoint"]
        argv = check.spec.template.spec.containers[0].command
        assert argv[:2] == ["clef-runtime", "endpoint-check"] and _flag(argv, "--dialect") == "mistralrs"

        started = time.monotonic()
        models.set_image(NAME, FAULTY)
        verified = models.wait_condition(
            NAME, "Verified", "False", "EndpointMismatch", timeout=VERIFY_SECONDS
        )
        print(f"mistralrs with the key-band fault: EndpointMismatch in {time.monotonic() - started:.0f}s")
        assert "prompt" in verified["message"] and "token" in verified["message"], verified["message"]
        held = models.get(NAME)["status"]
        assert held["activeRevision"] == status["activeRevision"], "the clean revision keeps serving"
        assert models.condition(NAME, "Ready")["status"] == "True"
        assert models.condition(NAME, "Degraded")["reason"] == "EndpointMismatch"
