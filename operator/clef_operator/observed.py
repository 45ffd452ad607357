"""What the planner sees: plain, frozen snapshots of the ClefModel's children.

`kube` fills these from the API server; tests build them by hand.  They hold only what a rollout
decision needs, so the planner never touches a raw API object.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from clef_operator import labels
from clef_operator.conditions import Why

# Waiting reasons of a container (the kubelet's words) that mean it will not start by itself.
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
CONFIG_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})


class Packed(Mapping[str, Any]):
    """A wire dict held as its compact JSON text, decoded when read: the cache holds a ClefModel
    and a serving Deployment's pod template per model, each about a third of its size as nested
    dicts (docs/performance.md, "Where the memory is"), and reads them once per pass."""

    __slots__ = ("_text",)

    def __init__(self, value: Mapping[str, Any]) -> None:
        self._text = json.dumps(value, separators=(",", ":"))

    def decoded(self) -> dict[str, Any]:
        """A fresh copy of the dict (the caller may change it)."""
        value: dict[str, Any] = json.loads(self._text)
        return value

    def __getitem__(self, key: str) -> Any:
        return self.decoded()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.decoded())

    def __len__(self) -> int:
        return len(self.decoded())

    def get(self, key: str, default: Any = None) -> Any:
        return self.decoded().get(key, default)

    def items(self) -> Any:
        return self.decoded().items()

    def __eq__(self, other: object) -> bool:
        return self.decoded() == (dict(other) if isinstance(other, Mapping) else other)

    __hash__ = None  # type: ignore[assignment]  # like the dict it stands for

    def __repr__(self) -> str:
        return f"Packed({self._text})"


@dataclass(frozen=True)
class ModelRef:
    name: str
    namespace: str
    uid: str
    generation: int
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def reverify_token(self) -> str:
        return self.annotations.get(labels.REVERIFY, "")


def node_versions(node_labels: Mapping[str, str]) -> tuple[str, str]:
    """A node's NVIDIA driver and CUDA runtime versions from its GPU feature discovery labels (the
    driver from the deprecated major/minor/rev labels when the full one is missing), "" for what
    it does not report: PodState's `node_driver` and `node_cuda_runtime`."""
    driver = node_labels.get(labels.NODE_DRIVER_VERSION, "")
    parts = [node_labels.get(k, "") for k in labels.NODE_DRIVER_PARTS]
    if not driver and all(parts):
        driver = ".".join(parts)
    return driver[:64], node_labels.get(labels.NODE_CUDA_RUNTIME, "")[:64]


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = ""


@dataclass(frozen=True)
class NodeState:
    """A node as placement sees it: its labels, taints and whether it is cordoned."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False

    @property
    def driver(self) -> str:
        """Its NVIDIA driver version (`node_versions`), "" when it reports none."""
        return node_versions(self.labels)[0]


@dataclass(frozen=True)
class DeploymentState:
    name: str
    revision: str
    replicas: int
    annotations: Mapping[str, str] = field(default_factory=dict)
    generation: int = 1
    observed_generation: int = 1
    status_replicas: int = 0
    ready_replicas: int = 0
    available_replicas: int = 0
    updated_replicas: int = 0
    created_at: datetime | None = None
    deleting: bool = False
    # spec.template as the API server holds it (wire form); None when not observed.
    template: Mapping[str, Any] | None = None
    # The ReplicaFailure condition's message: its ReplicaSet cannot create pods (a quota, an
    # admission plugin: e.g. a RuntimeClass that does not exist).
    replica_failure: str = ""
    # When the Deployment controller last found every replica updated and available (its Progressing
    # condition's lastUpdateTime with reason NewReplicaSetAvailable); for metrics only.
    available_at: datetime | None = None

    def is_available(self) -> bool:
        """Every replica it should have is up to date and available (0 wanted: trivially)."""
        if self.observed_generation < self.generation:
            return False
        return self.available_replicas >= self.replicas and self.updated_replicas >= self.replicas

    @property
    def drained(self) -> bool:
        return self.replicas == 0 and self.status_replicas == 0


@dataclass(frozen=True)
class JobState:
    name: str
    key: str
    uid: str = ""
    complete: bool = False
    failed: bool = False
    failed_reason: str = ""
    failed_message: str = ""
    created_at: datetime | None = None
    # When it finished, by the Job controller: completionTime, or its Failed condition's time.
    finished_at: datetime | None = None
    deleting: bool = False
    # The Job controller's newest FailedCreate message while the Job has no pod: the API server
    # refuses its pods (an admission plugin: a RuntimeClass that does not exist, a quota, a
    # LimitRange, Pod Security).  Read only for an active Job without pods (kube.pod_refusal).
    pods_refused: str = ""
    component: str = ""
    # The verification step it runs (label): "" (kernels: verify), goldens, endpoint.
    step: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)
    # The first container's argv (immutable in a Job): what the comparison Job really asks.
    command: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        return self.complete or self.failed


@dataclass(frozen=True)
class PodState:
    """One pod of the model (serving or verification), with its first container's state."""

    name: str
    component: str
    revision: str = ""
    # The value of its serving label (labels.MODEL): "" until the operator adds it to a pod of a
    # verified revision; verification pods never get it.
    serving_label: str = ""
    # The model a serving pod was created for (labels.REVISION_OF; "" on pods made before it).
    revision_of: str = ""
    deleting: bool = False
    job_name: str = ""
    phase: str = "Pending"
    reason: str = ""
    message: str = ""
    node_name: str = ""
    unschedulable_message: str = ""
    waiting_reason: str = ""
    waiting_message: str = ""
    terminated: bool = False
    exit_code: int | None = None
    terminated_reason: str = ""
    termination_message: str = ""
    last_termination_message: str = ""
    last_terminated_reason: str = ""
    restart_count: int = 0
    image_id: str = ""
    ready: bool = False
    node_gpu_product: str = ""
    node_gpu_memory_mib: int | None = None
    # The node's driver and CUDA runtime versions (`node_versions`), "" when not labelled.
    node_driver: str = ""
    node_cuda_runtime: str = ""
    created_at: datetime | None = None
    # The UIDs in its ownerReferences: what binds a verification pod to its Job (labels do not).
    owner_uids: tuple[str, ...] = ()
    uid: str = ""
    ip: str = ""

    def problem(self) -> PodProblem | None:
        """What keeps this pod from running, in its own words (the scheduler's message, the
        container's last output); None when nothing is known to be wrong."""
        if self.unschedulable_message:
            return PodProblem(
                Why.UNSCHEDULABLE, f"pod {self.name} cannot be scheduled: {self.unschedulable_message}"
            )
        if self.waiting_reason == "CrashLoopBackOff":
            said = (
                self.last_termination_message.strip() or self.last_terminated_reason or self.waiting_message
            )
            return PodProblem(
                Why.CRASH_LOOP,
                f"pod {self.name} is crash-looping ({self.restart_count} restarts); last words: {said}",
            )
        if self.waiting_reason in IMAGE_PULL_REASONS:
            return PodProblem(
                Why.IMAGE_PULL, f"pod {self.name}: {self.waiting_reason}: {self.waiting_message}"
            )
        if self.waiting_reason in CONFIG_REASONS:
            return PodProblem(
                Why.CONTAINER_ERROR, f"pod {self.name}: {self.waiting_reason}: {self.waiting_message}"
            )
        return None


@dataclass(frozen=True)
class PodProblem:
    """Why a pod is stuck: a reason of `conditions.Why` and a message that names the pod."""

    reason: str
    message: str


@dataclass(frozen=True)
class ServiceState:
    name: str
    selector: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)
    owned: bool = False
    cluster_ip: str = ""
    # spec.ports in wire form (name, port, targetPort, protocol, ...).
    ports: tuple[Mapping[str, Any], ...] = ()
    # "Kind/name" of another object's controller ownerReference (controller: true), if any.
    controller: str = ""

    @property
    def model(self) -> str:
        return self.annotations.get(labels.SERVICE_MODEL, "")

    @property
    def intended_revision(self) -> str:
        return self.annotations.get(labels.SERVICE_ACTIVE_REVISION, "")


@dataclass(frozen=True)
class ConfigMapState:
    """A goldens ConfigMap owned by the model: its annotations and binaryData as bytes."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    binary_data: Mapping[str, bytes] = field(default_factory=dict)
    data_keys: tuple[str, ...] = ()
    deleting: bool = False


@dataclass(frozen=True)
class Observed:
    deployments: tuple[DeploymentState, ...] = ()
    jobs: tuple[JobState, ...] = ()
    pods: tuple[PodState, ...] = ()
    service: ServiceState | None = None
    config_maps: tuple[ConfigMapState, ...] = ()
    # The logs of goldens pods whose goldens are not stored yet, by pod UID (what the goldens Job
    # printed: the file is one line of it); a pod whose log could not be found is absent.
    logs: Mapping[str, bytes] = field(default_factory=dict)
    # The operator's ledger of the model (verdicts.py): the latest final record per verification
    # key, from the operator's namespace; None where none is kept (tests of single phases).
    ledger: Mapping[str, Any] | None = None
    # Every node of the cluster (plan_drivers: which driver versions a model's pods could land on).
    nodes: tuple[NodeState, ...] = ()

    def config_map(self, name: str) -> ConfigMapState | None:
        return next((c for c in self.config_maps if c.name == name), None)

    def pod(self, uid: str) -> PodState | None:
        return next((p for p in self.pods if uid and p.uid == uid), None)

    def deployment(self, revision: str) -> DeploymentState | None:
        for d in self.deployments:
            if d.revision == revision:
                return d
        return None

    def job(self, name: str) -> JobState | None:
        for j in self.jobs:
            if j.name == name:
                return j
        return None

    def pods_of_job(self, job: JobState) -> list[PodState]:
        """The pods the Job created: owned by its UID.  A pod that only carries its name in a
        label (anyone can create one) never speaks for it."""
        return [p for p in self.pods if job.uid and job.uid in p.owner_uids]

    def pods_of_revision(self, revision: str) -> list[PodState]:
        return [p for p in self.pods if p.component == labels.COMPONENT_SERVING and p.revision == revision]
