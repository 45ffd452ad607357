"""Watch policy rollback end to end (issue 37): `flash` is verified and served from a correct
candle-vllm image (revision A), then moved to an image whose engine answers its first FAULT_AFTER
generation requests right and every later one with the key-band fault (revision B).  B passes its
comparison (two requests) and its first probe (two more); the promoted preview pod's second probe,
one interval later, is answered wrongly.  Under policy rollback that fails B's verdict in service
(a signed `probe` record), and A, kept at 0 by revisionHistoryLimit, serves again: a scale-up and
a selector switch, with no verification Job.
"""

from __future__ import annotations

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

from .conftest import Cluster
from .operator_support import VERIFY_SECONDS, Models, OperatorProcess, delete_models
from .test_watch import FAULT_AFTER, INTERVAL, NAME, PROBE_STEP, flash

pytestmark = pytest.mark.cluster

ENGINE = f"{ENGINE_IMAGE_PREFIX}candle-vllm"
GOOD = f"{ENGINE}:0.8.4"
GOES_BAD = f"{ENGINE}:0.8.4-goes-bad-rollback"
STEP = "clef.riotpiao.com/verification-step"


@pytest.fixture(scope="module")
def models(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Models, Path, Cluster]]:
    table = cluster.image_table()  # a missing harness runner is a stated skip
    entry = table.lookup(GOOD)
    assert entry is not None and entry.kind == "serve", f"{GOOD} is not a serve image in the table"
    root = tmp_path_factory.mktemp("watch-rollback")
    checkpoint = write_chat_checkpoint(root / "clef-flash")
    namespace = f"t-rollback-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    operator = OperatorProcess(cluster.kubeconfig, namespace, root / "operator.log")
    operator.start()
    try:
        yield Models(cluster, namespace, operator), checkpoint, cluster
    finally:
        delete_models(cluster, namespace)
        operator.stop()
        cluster.core.delete_namespace(namespace)


def _verification_jobs(models: Models) -> set[str]:
    return {j.metadata.name for j in models.jobs(NAME) if (j.metadata.labels or {}).get(STEP) != "probe"}


def test_a_revision_that_goes_bad_is_rolled_back_to_the_previous_one_without_a_job(
    models: tuple[Models, Path, Cluster],
) -> None:
    m, checkpoint, cluster = models
    entry = cluster.image_table().lookup(GOOD)
    assert entry is not None
    started = time.monotonic()
    m.create(flash(checkpoint, f"{ENGINE}@sha256:{entry.digest}", policy="rollback"))
    m.wait_condition(NAME, "Ready", "True", "Available", timeout=VERIFY_SECONDS)
    m.wait_condition(NAME, "Serving", "True", "Consistent", timeout=INTERVAL)
    first = m.get(NAME)["status"]
    a = first["activeRevision"]
    # The pass names the driver and CUDA runtime its node reports (GPU feature discovery's labels;
    # one node per GPU class in the dev cluster).
    passed = next(r for r in first["verifications"] if r["step"] == "endpoint")
    node = next(
        n.metadata.labels
        for n in cluster.core.list_node().items
        if n.metadata.labels.get("nvidia.com/gpu.product") == passed["gpuClass"]
    )
    assert passed.get("nodeDriver") == node["nvidia.com/cuda.driver-version.full"], passed
    assert passed.get("nodeCudaRuntime") == node["nvidia.com/cuda.runtime-version.full"], passed
    print(f"revision {a} verified, served and probed: {time.monotonic() - started:.0f}s")

    bad = put_image(cluster.core, GOES_BAD, "serve", dialect="candle-vllm",
                    fault="conv_key_band_zero", fault_after=FAULT_AFTER)  # fmt: skip
    m.set_image(NAME, f"{ENGINE}@sha256:{bad.digest}")
    status = m.wait_status(
        NAME,
        lambda s: s.get("activeRevision") not in (None, a) and _ready(s),
        "the new image to serve",
        timeout=VERIFY_SECONDS,
    )
    b = status["activeRevision"]
    jobs_before = _verification_jobs(m)
    switched_at = time.monotonic()
    print(f"revision {b} serves: {time.monotonic() - started:.0f}s")

    # Its preview pod's second probe (one interval on) is answered wrongly; then A serves again.
    status = m.wait_status(
        NAME,
        lambda s: s.get("activeRevision") == a,
        f"revision {a} to serve again",
        timeout=2 * INTERVAL + 90,
    )
    print(f"rolled back {time.monotonic() - switched_at:.0f}s after {b} began serving")
    failed = status["verifications"][0]
    assert (failed["step"], failed["verdict"]) == ("probe", "Failed"), failed
    assert failed["reason"] in ("ProbeMismatch", "ProbeEngineError") and failed["job"].startswith(
        f"{NAME}-probe-"
    )
    assert failed["key"] == status["verificationKey"], "the current spec's key failed in service"
    verified = m.condition(NAME, "Verified")
    assert (verified["status"], verified["reason"]) == ("False", failed["reason"]), verified
    assert "failed in service" in verified["message"]
    assert _verification_jobs(m) <= jobs_before, "the rollback ran no verification Job"
    m.wait_events(NAME, "ProbeFailed", "ServiceSwitched")
    # A serves from pods of its own, probed as any serving revision.
    consistent = m.wait_condition(NAME, "Serving", "True", "Consistent", timeout=INTERVAL + 30)
    assert f"revision {a}" in consistent["message"], consistent
    probes = cluster.batch.list_namespaced_job(m.ns, label_selector=PROBE_STEP).items
    assert probes, "A's pods are probed"


def _ready(status: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True" and c["reason"] == "Available"
        for c in status.get("conditions", [])
    )
