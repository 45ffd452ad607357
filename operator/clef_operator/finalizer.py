"""clef's finalizer on every ClefModel: what a pass does about it, and the patches that add and
remove it (pure; `reconcile.reconcile` sends them).

A deleted ClefModel's Deployments, Jobs and goldens go with it (owner references), but a Service it
adopted outlives it and must be handed back first (`Kube.release_service`), so each model carries
the finalizer until that is done.  The name is the one kopf used when it ran clef's deletion
handler, so a ClefModel created under an older operator is finalized the same way.

Both patches are JSON patches that test the resourceVersion the decision was made on: a concurrent
change (another writer's finalizer, a user's edit) fails the patch instead of being overwritten,
and the pass is retried from the newer version.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from clef_operator import labels

FINALIZER = f"{labels.PREFIX}/finalizer"


class Step(enum.Enum):
    ADD = "add"  # not deleted, no finalizer yet: add it, then reconcile
    RECONCILE = "reconcile"  # not deleted, finalizer held
    RELEASE = "release"  # deleted, finalizer held: hand the Service back, then remove it
    WAIT = "wait"  # deleted, finalizer not (or no longer) held: nothing is left to do


def step(meta: Mapping[str, Any]) -> Step:
    held = FINALIZER in (meta.get("finalizers") or ())
    if meta.get("deletionTimestamp"):
        return Step.RELEASE if held else Step.WAIT
    return Step.RECONCILE if held else Step.ADD


def _precondition(meta: Mapping[str, Any]) -> dict[str, Any]:
    version = meta.get("resourceVersion")
    if not version:
        raise ValueError("metadata.resourceVersion: required to patch the finalizer safely")
    return {"op": "test", "path": "/metadata/resourceVersion", "value": version}


def add_patch(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Add the finalizer (after any others), if `meta` is still the current version."""
    add: dict[str, Any]
    if meta.get("finalizers"):
        add = {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}
    else:
        add = {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}
    return [_precondition(meta), add]


def remove_patch(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Remove every copy of the finalizer and nothing else, if `meta` is still the current
    version (indexes from the end, so that each stays valid)."""
    held = list(meta.get("finalizers") or ())
    removes = [
        {"op": "remove", "path": f"/metadata/finalizers/{i}"}
        for i in reversed(range(len(held)))
        if held[i] == FINALIZER
    ]
    if not removes:
        raise ValueError(f"metadata.finalizers: {FINALIZER} is not held")
    return [_precondition(meta), *removes]


def released_service(obj: Mapping[str, Any]) -> str:
    """The Service a deleted model may have adopted (spec.service.name; "" when none is named).
    Read from the raw spec: a model whose spec no longer validates is still finalized."""
    service = (obj.get("spec") or {}).get("service") or {}
    return str(service.get("name") or "") if isinstance(service, dict) else ""
