"""What the planner asks `kube` to do.  Each action is one API call (or one event)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CreateJob:
    manifest: Mapping[str, Any]


@dataclass(frozen=True)
class DeleteJob:
    name: str


@dataclass(frozen=True)
class CreateDeployment:
    manifest: Mapping[str, Any]


@dataclass(frozen=True)
class ScaleDeployment:
    """Set replicas and (in the same patch) annotations; a None value removes an annotation."""

    name: str
    replicas: int
    annotations: Mapping[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class AnnotateDeployment:
    name: str
    annotations: Mapping[str, str | None]


@dataclass(frozen=True)
class ReplaceTemplate:
    """Put back the pod template clef rendered (one JSON patch: drift is reverted as a whole)."""

    name: str
    template: Mapping[str, Any]


@dataclass(frozen=True)
class DeleteDeployment:
    name: str


@dataclass(frozen=True)
class LabelPod:
    """Set labels on one pod, None removing one (a merge patch of its metadata; a pod already
    gone is no error)."""

    name: str
    labels: Mapping[str, str | None]


@dataclass(frozen=True)
class CreateService:
    manifest: Mapping[str, Any]


@dataclass(frozen=True)
class PatchServiceSelector:
    """Selector plus clef's own annotations, in one patch (with PatchServicePorts, all clef ever
    changes on an existing Service)."""

    name: str
    selector: Mapping[str, str]
    annotations: Mapping[str, str]


@dataclass(frozen=True)
class PatchServicePorts:
    """Replace the Service's ports with `ports` (clef's `http` port and the others as they were)."""

    name: str
    ports: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class CreateConfigMap:
    manifest: Mapping[str, Any]


@dataclass(frozen=True)
class DeleteConfigMap:
    name: str


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


Action = (
    CreateJob
    | DeleteJob
    | CreateDeployment
    | ScaleDeployment
    | AnnotateDeployment
    | ReplaceTemplate
    | DeleteDeployment
    | LabelPod
    | CreateService
    | PatchServiceSelector
    | PatchServicePorts
    | CreateConfigMap
    | DeleteConfigMap
    | Event
)


def event(reason: str, message: str, warning: bool = False) -> Event:
    """An Event action: Normal, or Warning with `warning`."""
    return Event("Warning" if warning else "Normal", reason, message)
