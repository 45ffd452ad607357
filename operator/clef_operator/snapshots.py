"""What clef keeps of each kind it plans from: API objects turned into the planner's snapshots
(`observed`), the informer cache's table of kinds (`KINDS`: each kind's key in the cache, its
snapshot, whom a change to it wakes) and the index that turns an event on a Service into the
models that name it (`ServiceReaders`).  Pure but for that index's lock: no request is made here.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from clef_operator import anchor, labels
from clef_operator.api import Step
from clef_operator.endpoint import CHECK_CONTAINER
from clef_operator.goldens import GOLDENS_CONTAINER
from clef_operator.manager import cache
from clef_operator.observed import (
    ConfigMapState,
    DeploymentState,
    JobState,
    NodeState,
    Packed,
    PodState,
    ServiceState,
    Taint,
    node_versions,
)
from clef_operator.render import ENGINE_CONTAINER, VERIFY_CONTAINER

JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")

# The container whose state speaks for a pod, by its step label, else its component label.
CONTAINER_OF = {
    labels.COMPONENT_VERIFICATION: VERIFY_CONTAINER,
    Step.GOLDENS.value: GOLDENS_CONTAINER,
    Step.ENDPOINT.value: CHECK_CONTAINER,
    labels.STEP_PROBE: CHECK_CONTAINER,
    labels.STEP_DRIVER: VERIFY_CONTAINER,
}
# The goldens ConfigMaps are the only ConfigMaps clef reads: its cache lists and watches just
# these (by label), never every ConfigMap in the namespace.
GOLDENS_SELECTOR = f"{labels.COMPONENT}={labels.COMPONENT_GOLDENS}"

# The client's serializer (model objects -> wire dicts); it holds no connection state.
_WIRE = client.ApiClient()


def _wire(obj: Any) -> Any:
    return _WIRE.sanitize_for_serialization(obj)


def _deployment(d: Any) -> DeploymentState:
    meta, status = d.metadata, d.status
    return DeploymentState(
        name=meta.name,
        revision=(meta.labels or {}).get(labels.REVISION, ""),
        replicas=d.spec.replicas if d.spec.replicas is not None else 1,
        annotations=dict(meta.annotations or {}),
        generation=meta.generation or 0,
        observed_generation=(status.observed_generation or 0) if status else 0,
        status_replicas=(status.replicas or 0) if status else 0,
        ready_replicas=(status.ready_replicas or 0) if status else 0,
        available_replicas=(status.available_replicas or 0) if status else 0,
        updated_replicas=(status.updated_replicas or 0) if status else 0,
        created_at=meta.creation_timestamp,
        deleting=meta.deletion_timestamp is not None,
        template=Packed(_wire(d.spec.template)) if d.spec.template is not None else None,
        replica_failure=_replica_failure(status),
        available_at=_available_at(status),
    )


def _available_at(status: Any) -> datetime | None:
    for c in (status.conditions or []) if status else []:
        if c.type == "Progressing" and c.reason == "NewReplicaSetAvailable":
            return c.last_update_time
    return None


def _replica_failure(status: Any) -> str:
    for c in (status.conditions or []) if status else []:
        if c.type == "ReplicaFailure" and c.status == "True":
            return f"{c.reason}: {c.message}" if c.reason else (c.message or "ReplicaFailure")
    return ""


def _job(j: Any) -> JobState:
    conditions = {c.type: c for c in (j.status.conditions or [])} if j.status else {}

    def true(kind: str) -> bool:
        c = conditions.get(kind)
        return c is not None and c.status == "True"

    failed = conditions.get("Failed")
    template = j.spec.template.spec if j.spec and j.spec.template else None
    containers = (template.containers or []) if template else []
    return JobState(
        name=j.metadata.name,
        key=(j.metadata.labels or {}).get(labels.VERIFICATION_KEY, ""),
        uid=j.metadata.uid or "",
        complete=true("Complete"),
        failed=true("Failed"),
        failed_reason=(failed.reason or "") if failed is not None and failed.status == "True" else "",
        failed_message=(failed.message or "") if failed is not None and failed.status == "True" else "",
        created_at=j.metadata.creation_timestamp,
        finished_at=_finished_at(j.status, failed),
        deleting=j.metadata.deletion_timestamp is not None,
        component=(j.metadata.labels or {}).get(labels.COMPONENT, ""),
        step=(j.metadata.labels or {}).get(labels.STEP, ""),
        annotations=dict(j.metadata.annotations or {}),
        command=tuple(containers[0].command or ()) if containers else (),
    )


def _finished_at(status: Any, failed: Any) -> datetime | None:
    if status is not None and status.completion_time is not None:
        return status.completion_time
    if failed is not None and failed.status == "True":
        return failed.last_transition_time
    return None


def pod_refusal(events: Iterable[Any]) -> str:
    """The newest FailedCreate message among a Job's events: the API server's own words for the
    pod the Job controller could not create ("" when there is none).  The Job controller records
    nothing else about it (no Job condition), so these events are the only place it is said."""
    refused = [e for e in events if e.reason == "FailedCreate" and e.message]
    if not refused:
        return ""

    def when(e: Any) -> datetime:
        at = e.last_timestamp or e.event_time or e.metadata.creation_timestamp
        return at or datetime.min.replace(tzinfo=UTC)

    return str(max(refused, key=when).message)


def _pod(p: Any, node_labels: Mapping[str, Mapping[str, str]]) -> PodState:
    meta, status = p.metadata, p.status
    pod_labels = meta.labels or {}
    component = pod_labels.get(labels.COMPONENT, "")
    wanted = CONTAINER_OF.get(pod_labels.get(labels.STEP) or component, ENGINE_CONTAINER)
    containers = list(status.container_statuses or []) if status else []
    cs = next((c for c in containers if c.name == wanted), containers[0] if containers else None)
    unschedulable = ""
    for cond in (status.conditions or []) if status else []:
        if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
            unschedulable = cond.message or "Unschedulable"
    fields: dict[str, Any] = {}
    if cs is not None:
        state, last = cs.state, cs.last_state
        if state is not None and state.waiting is not None:
            fields.update(
                waiting_reason=state.waiting.reason or "", waiting_message=state.waiting.message or ""
            )
        if state is not None and state.terminated is not None:
            t = state.terminated
            fields.update(
                terminated=True,
                exit_code=t.exit_code,
                terminated_reason=t.reason or "",
                termination_message=t.message or "",
            )
        if last is not None and last.terminated is not None:
            fields.update(
                last_termination_message=last.terminated.message or "",
                last_terminated_reason=last.terminated.reason or "",
            )
        fields.update(restart_count=cs.restart_count or 0, image_id=cs.image_id or "", ready=bool(cs.ready))
    node = (p.spec.node_name if p.spec else None) or ""
    node_meta = node_labels.get(node, {})
    memory = node_meta.get(labels.NODE_GPU_MEMORY, "")
    job_name = next((pod_labels[k] for k in JOB_NAME_LABELS if k in pod_labels), "")
    return PodState(
        name=meta.name,
        component=component,
        revision=pod_labels.get(labels.REVISION, ""),
        serving_label=pod_labels.get(labels.MODEL, ""),
        revision_of=pod_labels.get(labels.REVISION_OF, ""),
        deleting=meta.deletion_timestamp is not None,
        job_name=job_name,
        phase=(status.phase or "Pending") if status else "Pending",
        reason=(status.reason or "") if status else "",
        message=(status.message or "") if status else "",
        node_name=node,
        unschedulable_message=unschedulable,
        node_gpu_product=node_meta.get(labels.NODE_GPU_PRODUCT, ""),
        node_gpu_memory_mib=int(memory) if memory.isdigit() else None,
        node_driver=node_versions(node_meta)[0],
        node_cuda_runtime=node_versions(node_meta)[1],
        created_at=meta.creation_timestamp,
        owner_uids=tuple(ref.uid for ref in (meta.owner_references or []) if ref.uid),
        uid=meta.uid or "",
        ip=((status.pod_ip or "") if status else ""),
        **fields,
    )


def _config_map(c: Any) -> ConfigMapState:
    meta = c.metadata
    return ConfigMapState(
        name=meta.name,
        labels=dict(meta.labels or {}),
        annotations=dict(meta.annotations or {}),
        # The client hands binaryData over as base64 text; one that does not decode is absent.
        binary_data={k: b for k, v in (c.binary_data or {}).items() if (b := _b64(v)) is not None},
        data_keys=tuple(c.data or {}),
        deleting=meta.deletion_timestamp is not None,
    )


def _b64(text: str) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True)
    except (ValueError, TypeError):
        return None


@dataclass(frozen=True)
class ServiceRecord:
    """What clef reads of a Service, for any model that names it."""

    name: str
    selector: Mapping[str, str]
    annotations: Mapping[str, str]
    # (uid, "Kind/name", controller) of each ownerReference.
    owners: tuple[tuple[str, str, bool], ...]
    cluster_ip: str
    ports: tuple[Mapping[str, Any], ...]
    # What a release tests and names (`Kube.release_service`).
    uid: str = ""
    resource_version: str = ""

    def state(self, model_uid: str) -> ServiceState:
        return ServiceState(
            name=self.name,
            selector=self.selector,
            annotations=self.annotations,
            owned=any(uid == model_uid for uid, _, _ in self.owners),
            cluster_ip=self.cluster_ip,
            ports=self.ports,
            controller=next((who for uid, who, c in self.owners if c and uid != model_uid), ""),
        )


def service_record(s: Any) -> ServiceRecord:
    return ServiceRecord(
        name=s.metadata.name,
        selector=dict(s.spec.selector or {}),
        annotations=dict(s.metadata.annotations or {}),
        owners=tuple(
            (ref.uid, f"{ref.kind}/{ref.name}", bool(ref.controller))
            for ref in s.metadata.owner_references or []
        ),
        cluster_ip=s.spec.cluster_ip or "",
        ports=tuple(_wire(p) for p in s.spec.ports or []),
        uid=s.metadata.uid or "",
        resource_version=s.metadata.resource_version or "",
    )


def _owners(obj: Any) -> frozenset[str]:
    return frozenset(ref.uid for ref in (obj.metadata.owner_references or []) if ref.uid)


def _by_model(obj: Any) -> cache.Key | None:
    """The model an object belongs to: on pods, by the label clef created it with (`revision-of`,
    `verifies`) before the serving label, which anyone who may patch the pod can set."""
    found = obj.metadata.labels or {}
    model = found.get(labels.REVISION_OF) or found.get(labels.VERIFIES) or found.get(labels.MODEL)
    return (obj.metadata.namespace or "", model) if model else None


def _by_name(obj: Any) -> cache.Key:
    meta = obj["metadata"] if isinstance(obj, dict) else obj.metadata  # dict: cache._meta says why
    if isinstance(meta, dict):
        return (meta.get("namespace") or "", meta["name"])
    return (meta.namespace or "", meta.name)


def node_state(n: Any) -> NodeState:
    """What placement reads of a node: labels, taints, cordon (`plan_drivers.eligible`)."""
    spec = n.spec
    taints = (
        tuple(Taint(t.key or "", t.value or "", t.effect or "") for t in (spec.taints or [])) if spec else ()
    )
    return NodeState(
        name=n.metadata.name,
        labels=dict(n.metadata.labels or {}),
        taints=taints,
        unschedulable=bool(spec.unschedulable) if spec else False,
    )


def _service_wakes(s: Any) -> cache.Key | None:
    """The Service's own name: `ServiceReaders` turns it into the models whose spec names it (an
    event must wake them whatever the Service's annotations say: stripping them is an attack)."""
    return (s.metadata.namespace or "", s.metadata.name)


class ServiceReaders:
    """Which models' specs name each Service, as their last pass read them (`Kube.observe`), so
    that an event on a Service wakes those models by its name.  Every model has a pass once the
    cache has synced, and after every change of its spec, so the index is current from then on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._service_of: dict[cache.Key, str] = {}
        self._readers: dict[cache.Key, set[str]] = {}

    def note(self, namespace: str, model: str, service: str) -> None:
        with self._lock:
            old = self._service_of.get((namespace, model))
            if old == service:
                return
            self._drop(namespace, model, old)
            self._service_of[(namespace, model)] = service
            self._readers.setdefault((namespace, service), set()).add(model)

    def forget(self, namespace: str, model: str) -> None:
        with self._lock:
            self._drop(namespace, model, self._service_of.pop((namespace, model), None))

    def _drop(self, namespace: str, model: str, service: str | None) -> None:
        readers = self._readers.get((namespace, service or ""))
        if readers is not None:
            readers.discard(model)
            if not readers:
                del self._readers[(namespace, service or "")]

    def models(self, namespace: str, service: str) -> list[str]:
        with self._lock:
            return sorted(self._readers.get((namespace, service), ()))

    def waking(self, wake: cache.Wake) -> cache.Wake:
        """`wake` for the models that name the Service an event is about."""

        def wake_readers(namespace: str, service: str) -> None:
            for model in self.models(namespace, service):
                wake(namespace, model)

        return wake_readers


# What a pass reads of a ClefModel's metadata (`reconcile.reconcile`, the cache's keys and versions).
MODEL_METADATA = (
    "name",
    "namespace",
    "uid",
    "generation",
    "resourceVersion",
    "annotations",
    "deletionTimestamp",
    "finalizers",
)


def _model_body(obj: Mapping[str, Any]) -> Packed:
    """A ClefModel as the cache keeps it: spec, status and the metadata a pass reads, as compact
    JSON (~5 KB; ~15 KB as dicts); not managedFields (which grow with every writer and field,
    ~21 KB of a model's 37), owner references or labels, which nothing here reads, but the
    namespace anchor (`anchor`)."""
    meta = obj.get("metadata", {})
    kept = {k: obj[k] for k in ("spec", "status") if k in obj}
    body = {k: meta[k] for k in MODEL_METADATA if k in meta}
    if _anchored(obj):
        body["labels"] = dict(anchor.LABELS)
    return Packed({"metadata": body, **kept})


def _anchored(obj: Mapping[str, Any]) -> bool:
    """Whether a ClefModel (a wire dict: the custom-objects client's) carries the namespace anchor."""
    return anchor.member(obj.get("metadata", {})).anchored


def version_number(version: str) -> int:
    return int(version) if version.isdigit() else 0


# Every kind clef plans from: its key in the cache, its snapshot, whom a change to it wakes.
KINDS: dict[str, cache.Kind] = {
    # The anchored ones also by namespace (`Table.tagged`: `Kube.anchor_namespace`).
    "clefmodels": cache.Kind("clefmodels", _by_name, _model_body, _by_name, tag=_anchored),
    # The snapshots of every model's children are held pickled (cache.Kind.packed).
    "deployments": cache.Kind(
        "deployments", _by_model, lambda d: (_owners(d), _deployment(d)), _by_model, packed=True
    ),
    "jobs": cache.Kind("jobs", _by_model, lambda j: (_owners(j), _job(j)), _by_model, packed=True),
    # Node fields are filled in when observed (Kube._on_node), from the node cache.
    "pods": cache.Kind("pods", _by_model, lambda p: _pod(p, {}), _by_model, packed=True),
    "services": cache.Kind("services", _by_name, service_record, _service_wakes, packed=True),
    # A change of a node's labels, taints or cordon wakes every model (Kube.start_cache): its
    # driver may be one a model's verdict does not cover yet (plan_drivers).
    "nodes": cache.Kind("nodes", _by_name, node_state, _by_name, wake_on_change=True),
    # Goldens ConfigMaps only (GOLDENS_SELECTOR), with their signed goldens.
    "configmaps": cache.Kind(
        "configmaps",
        _by_model,
        lambda c: (_owners(c), _config_map(c)),
        _by_model,
        GOLDENS_SELECTOR,
        packed=True,
    ),
}
