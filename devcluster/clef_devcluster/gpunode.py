"""A fake (kwok) GPU node of a test's own: a GPU product and a taint that only that test's pods
tolerate, so that no other pod lands there."""

from __future__ import annotations

from typing import Any

from .config import KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE


def kwok_gpu_node(
    name: str,
    *,
    product: str,
    taint: str,
    gpus: int,
    memory_mib: int,
    room: dict[str, str],
    labels: dict[str, str] | None = None,
    addresses: list[dict[str, str]] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the Node, its status): `gpus` GPUs of `product` with `memory_mib` each, tainted with
    `taint`=true:NoSchedule; `room` is the rest of its capacity (cpu, memory, pods); `labels` are
    added to the GPU labels, `addresses` to its Hostname address."""
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_VALUE},
            "labels": {
                "kubernetes.io/hostname": name,
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.memory": str(memory_mib),
                **(labels or {}),
            },
        },
        "spec": {"taints": [{"key": taint, "value": "true", "effect": "NoSchedule"}]},
    }
    capacity = {**room, "nvidia.com/gpu": str(gpus)}
    status = {
        "capacity": capacity,
        "allocatable": capacity,
        "addresses": [*(addresses or []), {"type": "Hostname", "address": name}],
    }
    return node, status
