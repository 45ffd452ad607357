"""Where the operator's pods may run: every pod clef creates for a model (serving, preview,
kernels and model verification, goldens, the comparison Job) carries the model's spec.nodeSelector
and spec.tolerations (docs/api.md), so a model kept on a tainted or labelled pool has all of its
pods there.  Only the pods that use the GPU get spec.runtimeClassName; the comparison Job asks
the preview over HTTP and uses neither a GPU nor the GPU runtime class.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from clef_builders import make_spec, verification_job

from clef_operator import labels
from clef_operator.api import ClefModelSpec
from clef_operator.endpoint import preview_annotations, render_comparison_job
from clef_operator.goldens import Trusted, goldens_key, render_goldens_job
from clef_operator.observed import PodState
from clef_operator.render import Owner, render_deployment

OWNER = Owner("clef-flash", "homelab", "uid-1")
PINNED = "registry.clef.test/engines/candle-vllm@sha256:" + "a" * 64
RUNTIME = "registry.clef.test/clef-runtime:1.0"
POOL = {"pool.example.com/name": "llm", "kubernetes.io/arch": "amd64"}
TOLERATIONS = [
    {"key": "pool.example.com/llm", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "clef.test/real-node", "operator": "Equal", "value": "true", "effect": "NoExecute",
     "tolerationSeconds": 30},
]  # fmt: skip
GPU_CLASS = "Tesla-V100-SXM2-16GB"
KINDS = ["serving", "preview", "verify-kernels", "verify-model", "goldens", "comparison"]


def _endpoint_spec(**overrides: Any) -> ClefModelSpec:
    endpoint = {"mode": "endpoint", "endpoint": {"runtimeImage": RUNTIME}}
    return make_spec(verification=endpoint, **overrides)


def pods_of(spec: ClefModelSpec, model_suite: ClefModelSpec) -> dict[str, dict[str, Any]]:
    """The pod spec of every kind of pod the operator creates for `spec` (an endpoint-mode
    spec; `model_suite` is the same model verified with suite `model`)."""
    preview_pod = PodState(
        name="p", component="serving", uid="pod-uid", ip="10.0.0.7", image_id="x@sha256:" + "b" * 64
    )
    goldens = Trusted("clef-flash-goldens", {"sha256": "c" * 64})
    since = datetime(2026, 12, 4, tzinfo=UTC)
    pod = lambda m: m["spec"]["template"]["spec"]  # noqa: E731
    return {
        "serving": pod(render_deployment(OWNER, spec, PINNED, 2, {}, GPU_CLASS)),
        "preview": pod(
            render_deployment(OWNER, spec, PINNED, 1, preview_annotations(spec.image, "k", since))
        ),
        "verify-kernels": pod(verification_job(OWNER, spec, "")),
        "verify-model": pod(verification_job(OWNER, model_suite, "")),
        "goldens": pod(render_goldens_job(OWNER, spec, goldens_key(spec))),
        "comparison": pod(render_comparison_job(OWNER, spec, "k", "", preview_pod, goldens)),
    }


def _constrained() -> dict[str, dict[str, Any]]:
    spec = _endpoint_spec(nodeSelector=POOL, tolerations=TOLERATIONS)
    model_suite = make_spec(nodeSelector=POOL, tolerations=TOLERATIONS, verification={"suite": "model"})
    return pods_of(spec, model_suite)


def test_every_kind_of_pod_is_rendered() -> None:
    """The list above is every pod the operator makes: each kind has its own containers."""
    pods = _constrained()
    assert sorted(pods) == sorted(KINDS)
    names = {kind: tuple(c["name"] for c in pod["containers"]) for kind, pod in pods.items()}
    assert names["comparison"] != names["verify-kernels"] != names["serving"], names


@pytest.mark.parametrize("kind", KINDS)
def test_every_pod_carries_the_models_node_selector_and_tolerations(kind: str) -> None:
    pod = _constrained()[kind]
    assert pod["tolerations"] == TOLERATIONS, pod.get("tolerations")
    selector = pod["nodeSelector"]
    assert {k: selector.get(k) for k in POOL} == POOL, selector
    # Serving adds the GPU class its verdict passed on, and nothing else; the others add nothing.
    extra = {k: v for k, v in selector.items() if k not in POOL}
    assert extra == ({labels.NODE_GPU_PRODUCT: GPU_CLASS} if kind == "serving" else {}), extra


@pytest.mark.parametrize("kind", KINDS)
def test_an_unconstrained_model_adds_no_placement(kind: str) -> None:
    pod = pods_of(_endpoint_spec(), make_spec(verification={"suite": "model"}))[kind]
    assert "tolerations" not in pod
    assert pod.get("nodeSelector", {}) == ({labels.NODE_GPU_PRODUCT: GPU_CLASS} if kind == "serving" else {})


def test_only_the_gpu_pods_take_the_runtime_class() -> None:
    for kind, pod in _constrained().items():
        gpus = [c.get("resources", {}).get("limits", {}).get(labels.GPU_RESOURCE) for c in pod["containers"]]
        if kind == "comparison":
            assert "runtimeClassName" not in pod and gpus == [None], (pod.get("runtimeClassName"), gpus)
        else:
            assert pod["runtimeClassName"] == "nvidia" and all(gpus), (
                kind,
                pod.get("runtimeClassName"),
                gpus,
            )
