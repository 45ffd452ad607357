"""The namespace anchor: which ClefModel of a namespace carries the label that lets clef's children
in (pure; `Kube.anchor_namespace` sends the patch).

The admission policy clef-operator-model-namespaces (kustomize/base/admission.yaml) admits a Job,
Deployment or ConfigMap labelled app.kubernetes.io/managed-by=clef only in a namespace where a
ClefModel carries `clef.riotpiao.com/namespace-anchor: "true"`.  Its binding selects only those
ClefModels as parameters, so the API server evaluates it once per anchor, not once per model of
the namespace (which made every child's create take 7.6 s at 1,000 models in one namespace:
docs/performance.md, "Operator at scale").  A label can only be put on a ClefModel that exists, and
the operator's token can patch ClefModels but not create them, so an anchor still proves that the
namespace holds a ClefModel.

* **Before a pass writes.**  A pass over a live model first makes sure its namespace holds a live
  anchor (labelled, not being deleted); if none does, it anchors its own model.  The first model of
  a namespace, an anchor whose label a user removed, an operator restart: each is that case.
* **An anchor deleted.**  The pass that finalizes an anchored model hands the label on to another
  live model of the namespace first (`successors`), so the namespace stays anchored: the API
  server's view of ClefModels is a watch, in etcd's order, so it sees the new label before the old
  anchor goes.  Where the anchor went without that pass (its finalizer taken off by hand), the
  next pass that writes anchors its own model, as above.
* **Concurrent passes.**  The decision is made from the cache, under one lock per process, and the
  patch's response goes into the cache before the lock is released: a second pass sees the first
  one's anchor.  Anchors are never taken off (one more costs the API server one more evaluation);
  a model's label goes with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from clef_operator import labels

# The admission policy that reads the anchor; its refusals name it.
POLICY = "clef-operator-model-namespaces"
LABELS = {labels.NAMESPACE_ANCHOR: labels.NAMESPACE_ANCHOR_VALUE}


@dataclass(frozen=True)
class Member:
    """A ClefModel of a namespace, as the anchor decision sees it."""

    name: str
    anchored: bool  # carries NAMESPACE_ANCHOR=true (the binding's selector: any other value is none)
    deleting: bool  # has a deletionTimestamp: it anchors until it is gone, which is soon

    @property
    def live_anchor(self) -> bool:
        return self.anchored and not self.deleting


def member(meta: Mapping[str, Any]) -> Member:
    """A ClefModel's metadata (as the API server or the cache holds it) as a Member."""
    found = (meta.get("labels") or {}).get(labels.NAMESPACE_ANCHOR)
    return Member(
        name=str(meta.get("name") or ""),
        anchored=found == labels.NAMESPACE_ANCHOR_VALUE,
        deleting=bool(meta.get("deletionTimestamp")),
    )


def anchored(members: Iterable[Member]) -> bool:
    """Whether a live anchor is among `members`."""
    return any(m.live_anchor for m in members)


def to_anchor(anchors: Iterable[Member], candidates: Iterable[Member]) -> str | None:
    """Which model of a namespace to label now: None when `anchors` (the namespace's labelled
    models) hold a live one; else the first live one of `candidates`, in the caller's order of
    preference (None when it already is an anchor, or when none is live).  `candidates` is read
    only up to that one, so it may be a lazy walk of a large namespace."""
    if anchored(anchors):
        return None
    for candidate in candidates:
        if candidate.deleting:
            continue
        return None if candidate.anchored else candidate.name
    return None


def successors(names: Iterable[str]) -> list[str]:
    """The order in which a deleted anchor's namespace is walked for the next one: by name, the
    last first.  `kubectl delete` of several models (and a GitOps prune) goes through them by
    name, so the one picked is the one deleted last, and a bulk deletion hands the label on about
    once instead of once per model."""
    return sorted(names, reverse=True)


def label_patch() -> dict[str, Any]:
    """The merge patch that anchors a model: the one label added, nothing else changed."""
    return {"metadata": {"labels": dict(LABELS)}}


def admission_probe() -> dict[str, Any]:
    """A ConfigMap as clef labels what it writes, for a server-side dry run (nothing is stored) in
    the namespace just anchored: admitted once the API server's admission sees the anchor (its
    parameters come from a watch of ClefModels, a moment behind the patch)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "generateName": "clef-anchor-check-",
            "labels": {labels.MANAGED_BY: labels.MANAGED_BY_VALUE},
        },
    }


def refused_for_want_of_anchor(status: int, body: str) -> bool:
    """Whether the API server refused a write because no anchor is in its view yet."""
    return status in (400, 403, 422) and POLICY in body
