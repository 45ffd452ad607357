"""Bad ClefModels are refused by the API server itself, each with a message naming the field
(issue 6, test 8).  Created with dryRun, so nothing is stored."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_operator.api import GROUP, PLURAL, VERSION

from .conftest import Cluster
from .operator_support import clefmodel

pytestmark = pytest.mark.cluster

Body = dict[str, Any]


def spec(**changes: Any) -> Callable[[Body], None]:
    def mutate(body: Body) -> None:
        body["spec"].update(changes)

    return mutate


def nested(path: str, value: Any) -> Callable[[Body], None]:
    def mutate(body: Body) -> None:
        node = body
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        if value is KeyError:
            node.pop(last)
        else:
            node[last] = value

    return mutate


ARCH = "spec.model.architecture"
CASES: list[tuple[str, Callable[[Body], None], str]] = [
    ("negative GPUs", spec(gpus=-1), "spec.gpus"),
    ("zero GPUs", spec(gpus=0), "spec.gpus"),
    ("too many GPUs", spec(gpus=17), "spec.gpus"),
    ("kvFraction above 0.95", spec(kvFraction=1.4), "spec.kvFraction"),
    ("kvFraction zero", spec(kvFraction=0), "spec.kvFraction"),
    ("kvFraction negative", spec(kvFraction=-0.1), "spec.kvFraction"),
    ("unknown dtype", spec(dtype="fp8"), "spec.dtype"),
    ("unknown engine", spec(engine="tgi"), "spec.engine"),
    ("TP not dividing the heads", spec(gpus=3, tensorParallel=3), "spec.tensorParallel"),
    ("TP not dividing gpus", spec(gpus=1, tensorParallel=2), "spec.tensorParallel"),
    (
        "GDN head sharding the engine cannot do",
        lambda b: b["spec"].update(
            engine="vllm",
            gpus=4,
            tensorParallel=4,
            gpuMemoryMiB=32768,
            model={**b["spec"]["model"], "architecture": {"linearNumKeyHeads": 6, "linearNumValueHeads": 12}},
        ),
        "spec.tensorParallel",
    ),
    ("candle-vllm with pipeline parallelism", spec(gpus=4, tensorParallel=2), "spec.tensorParallel"),
    ("vllm without GPU memory", spec(engine="vllm"), "spec.gpuMemoryMiB"),
    ("KV heads not dividing heads", nested(f"{ARCH}.numKeyValueHeads", 5), f"{ARCH}.numKeyValueHeads"),
    (
        "attention interval beyond the layers",
        nested(f"{ARCH}.fullAttentionInterval", 64),
        f"{ARCH}.fullAttentionInterval",
    ),
    ("service name not a DNS label", nested("spec.service.name", "Clef_Serve"), "spec.service.name"),
    ("service name too long", nested("spec.service.name", "s" * 64), "spec.service.name"),
    ("service port out of range", nested("spec.service.port", 70000), "spec.service.port"),
    ("missing service", nested("spec.service", KeyError), "spec.service"),
    ("image with a space", spec(image="registry.clef.test/clef runtime:1.0"), "spec.image"),
    ("oversized image", spec(image="registry.clef.test/" + "a" * 600), "spec.image"),
    ("relative model path", nested("spec.model.path", "models/clef-flash"), "spec.model.path"),
    (
        "two volume sources",
        nested("spec.model.volume", {"pvc": {"claimName": "weights"}, "hostPath": {"path": "/srv"}}),
        "spec.model.volume",
    ),
    ("negative replicas", spec(replicas=-1), "spec.replicas"),
    ("empty runtimeClassName", spec(runtimeClassName=""), "spec.runtimeClassName"),
    ("GPUs in resources", nested("spec.resources", {"limits": {"nvidia.com/gpu": "2"}}), "spec.resources"),
    ("bad env name", spec(env=[{"name": "1BAD", "value": "x"}]), "spec.env[0].name"),
    ("duplicate env", spec(env=[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]), "spec.env[1]"),
    ("too many args", spec(args=["--x"] * 65), "spec.args"),
    ("oversized arg", spec(args=["x" * 1025]), "spec.args[0]"),
    (
        "toleration Exists with a value",
        spec(tolerations=[{"key": "gpu", "operator": "Exists", "value": "v"}]),
        "spec.tolerations[0]",
    ),
    (
        "too many node selector labels",
        spec(nodeSelector={f"k{i}": "v" for i in range(33)}),
        "spec.nodeSelector",
    ),
    ("unknown suite", nested("spec.verification.suite", "all"), "spec.verification.suite"),
    ("timeout too short", nested("spec.verification.timeoutSeconds", 5), "spec.verification.timeoutSeconds"),
    ("unknown strategy", nested("spec.rollout.strategy", "Canary"), "spec.rollout.strategy"),
    (
        "history too long",
        nested("spec.rollout.revisionHistoryLimit", 11),
        "spec.rollout.revisionHistoryLimit",
    ),
    ("model name too long", nested("metadata.name", "m" * 39), "metadata.name"),
]


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 25


def test_the_base_model_is_valid(cluster: Cluster, namespace: str) -> None:
    api = client.CustomObjectsApi(cluster.api)
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, clefmodel("valid"), dry_run="All")


@pytest.mark.parametrize(("what", "mutate", "field"), CASES, ids=[c[0] for c in CASES])
def test_invalid_model_is_rejected_naming_the_field(
    cluster: Cluster, namespace: str, what: str, mutate: Callable[[Body], None], field: str
) -> None:
    body = copy.deepcopy(clefmodel("invalid"))
    mutate(body)
    api = client.CustomObjectsApi(cluster.api)
    with pytest.raises(ApiException) as caught:
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body, dry_run="All")
    assert caught.value.status == 422, caught.value.body
    message = json.loads(caught.value.body)["message"]
    assert field in message, f"{what}: the message does not name {field}: {message}"
