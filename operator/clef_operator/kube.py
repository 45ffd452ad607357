"""The only module that talks to the API server.

`observe` turns the ClefModel's children into the planner's snapshots, read from the informer
cache (`cache`: list + watch per kind, `KINDS` says how each is stored); `apply` carries out the
planner's actions, one API call each; `write_status` publishes the planner's status.  Reads come
from the cache, writes go to the API server, and a write's response goes back into the cache.
A cache read can still lag the world (another writer, a watch event on its way): conflicts that a
level-triggered loop resolves by itself (AlreadyExists on create, NotFound on delete, a Service
changed between read and patch) are not errors: the next reconcile observes the truth and plans
again.  A refusal (400, 403, 422: the object is invalid or not allowed) is returned, with the
API server's message, for the ClefModel's status; anything else raises.
"""

from __future__ import annotations

import base64
import inspect
import json
import logging
import os
import queue
import secrets
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from clef_operator import actions as act
from clef_operator import cache, labels
from clef_operator.api import GROUP, KIND, PLURAL, VERSION, ClefModelStatus, Step
from clef_operator.children import release_ops
from clef_operator.endpoint import CHECK_CONTAINER
from clef_operator.goldens import GOLDENS_CONTAINER, MAX_GOLDENS_BYTES
from clef_operator.observed import (
    ConfigMapState,
    DeploymentState,
    JobState,
    ModelRef,
    Observed,
    Packed,
    PodState,
    ServiceState,
)
from clef_operator.render import ENGINE_CONTAINER, VERIFY_CONTAINER
from clef_operator.verdicts import LEDGER_PREFIX, decode_ledger, encode_ledger, ledger_name

# The ledger ConfigMap's annotation naming the model it is for (its name carries the UID only).
LEDGER_FOR = f"{labels.PREFIX}/ledger-for"

log = logging.getLogger("clef.kube")

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
REPORTING_COMPONENT = "clef.riotpiao.com/operator"
# The Secret that holds the HMAC key verdicts are signed with (verdicts.sign), in the operator's
# own namespace; only the operator reads it (kustomize/base/rbac.yaml, Role clef-verdict-key).
VERDICT_KEY_SECRET = "clef-verdict-key"
VERDICT_KEY_FIELD = "key"
VERDICT_KEY_BYTES = 32
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
REFUSALS = (400, 403, 422)


class LostRace(Exception):
    """A patch tested a resourceVersion the object has moved on from: nothing was written."""


# The container whose state speaks for a pod, by its step label, else its component label.
CONTAINER_OF = {
    labels.COMPONENT_VERIFICATION: VERIFY_CONTAINER,
    Step.GOLDENS.value: GOLDENS_CONTAINER,
    Step.ENDPOINT.value: CHECK_CONTAINER,
    labels.STEP_PROBE: CHECK_CONTAINER,
}
GPU_CLASS_COMPONENTS = (labels.COMPONENT_VERIFICATION, labels.COMPONENT_SERVING)
LOG_SLACK_BYTES = 64 * 1024
# The goldens ConfigMaps are the only ConfigMaps clef reads: its cache lists and watches just
# these (by label), never every ConfigMap in the namespace.
GOLDENS_SELECTOR = f"{labels.COMPONENT}={labels.COMPONENT_GOLDENS}"
# Threads that post events, apart from the reconciles.
EVENT_POSTERS = 4
# Actions on an object that is gone (404): a delete is done; a patch is moot, and the next pass,
# which sees it gone (the cache may have shown it a moment longer), plans from that.
VANISHED_IS_DONE = (
    act.DeleteJob,
    act.DeleteDeployment,
    act.DeleteConfigMap,
    act.ScaleDeployment,
    act.AnnotateDeployment,
    act.ReplaceTemplate,
    act.LabelPod,
    act.PatchServiceSelector,
    act.PatchServicePorts,
)
# The API methods a pass may call (the lists run at start-up already).  Each builds its argument
# validator on its first call (pydantic, in the kubernetes client; ~100 objects each, kept for
# good): `Kube.warm_up` builds them before the first burst of passes.
PASS_METHODS = {
    "apps": ("create_namespaced_deployment", "delete_namespaced_deployment", "patch_namespaced_deployment"),
    "batch": ("create_namespaced_job", "delete_namespaced_job"),
    "core": (
        "create_namespaced_config_map",
        "create_namespaced_event",
        "create_namespaced_secret",
        "create_namespaced_service",
        "delete_namespaced_config_map",
        "patch_namespaced_pod",
        "list_namespaced_event",
        "patch_namespaced_service",
        "read_namespaced_config_map",
        "read_namespaced_pod_log",
        "read_namespaced_secret",
        "patch_namespaced_config_map",
        "read_namespaced_service",
    ),
    "custom": ("patch_namespaced_custom_object", "patch_namespaced_custom_object_status"),
}
# The client's serializer (model objects -> wire dicts); it holds no connection state.
_WIRE = client.ApiClient()


def _escape(key: str) -> str:
    """A JSON-pointer path segment."""
    return key.replace("~", "~0").replace("/", "~1")


def _body(manifest: Mapping[str, Any]) -> Any:
    """The client accepts plain dicts where its signatures name model classes."""
    return dict(manifest)


def _wire(obj: Any) -> Any:
    return _WIRE.sanitize_for_serialization(obj)


def refusal(e: ApiException) -> str:
    """The API server's own words for a refused request."""
    try:
        said = json.loads(e.body or "{}").get("message", "")
    except (ValueError, AttributeError):
        said = ""
    return f"{e.status} {e.reason}: {said or e.body or ''}".strip()


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
        deleting=j.metadata.deletion_timestamp is not None,
        component=(j.metadata.labels or {}).get(labels.COMPONENT, ""),
        step=(j.metadata.labels or {}).get(labels.STEP, ""),
        annotations=dict(j.metadata.annotations or {}),
        command=tuple(containers[0].command or ()) if containers else (),
    )


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


def _service(s: Any) -> ServiceRecord:
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


# What a pass reads of a ClefModel's metadata (`handlers.reconcile`, the cache's keys and versions).
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
    ~21 KB of a model's 37), labels, finalizers or owner references, which nothing here reads."""
    meta = obj.get("metadata", {})
    kept = {k: obj[k] for k in ("spec", "status") if k in obj}
    return Packed({"metadata": {k: meta[k] for k in MODEL_METADATA if k in meta}, **kept})


def _version_number(version: str) -> int:
    return int(version) if version.isdigit() else 0


# Every kind clef plans from: its key in the cache, its snapshot, whom a change to it wakes.
KINDS: dict[str, cache.Kind] = {
    "clefmodels": cache.Kind("clefmodels", _by_name, _model_body, _by_name),
    # The snapshots of every model's children are held pickled (cache.Kind.packed).
    "deployments": cache.Kind(
        "deployments", _by_model, lambda d: (_owners(d), _deployment(d)), _by_model, packed=True
    ),
    "jobs": cache.Kind("jobs", _by_model, lambda j: (_owners(j), _job(j)), _by_model, packed=True),
    # Node fields are filled in when observed (Kube._on_node), from the node cache.
    "pods": cache.Kind("pods", _by_model, lambda p: _pod(p, {}), _by_model, packed=True),
    "services": cache.Kind("services", _by_name, _service, _service_wakes, packed=True),
    "nodes": cache.Kind("nodes", _by_name, lambda n: dict(n.metadata.labels or {}), lambda n: None),
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


def serves(api: client.ApiClient, group: str, version: str, plural: str) -> bool:
    """Whether the API server serves `plural` in `group/version` (discovery: no RBAC needed)."""
    try:
        found: Any = client.CustomObjectsApi(api).get_api_resources(group, version)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return found is not None and any(r.name == plural for r in found.resources or [])


def operator_namespace() -> str:
    """The operator's own namespace: its pod's (POD_NAMESPACE, from the downward API), else
    CLEF_OPERATOR_NAMESPACE, else the kubeconfig context's namespace, else `default`."""
    for name in ("POD_NAMESPACE", "CLEF_OPERATOR_NAMESPACE"):
        if os.environ.get(name):
            return os.environ[name]
    try:
        _, context = config.list_kube_config_contexts()
        return str((context or {}).get("context", {}).get("namespace") or "default")
    except (config.ConfigException, OSError):
        return "default"


class Kube:
    def __init__(self, api: client.ApiClient, store: cache.Cache | None = None) -> None:
        self.api = api
        self.cache = store if store is not None else cache.Cache(KINDS)
        self._events = ThreadPoolExecutor(max_workers=EVENT_POSTERS, thread_name_prefix="events")
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.instance = socket.gethostname()
        self._verdict_key: bytes | None = None
        self.service_readers = ServiceReaders()
        # The verdict ledgers (verdicts.py) by model UID, with their resourceVersion: read from
        # the operator's namespace once, then kept as this operator writes them.
        self._ledger_namespace = ""
        self._ledgers: dict[str, tuple[dict[str, Any], str]] = {}
        self._ledger_lock = threading.Lock()

    def warm_up(self) -> None:
        """Make before the first burst of passes what a pass would otherwise make once, mid-burst,
        and keep for good: each API method's argument validator and the event threads.  Objects
        born during a burst that outlive it pin the memory around them: after 1,000 models were
        deleted, memory stayed above the start by what they pinned (docs/performance.md,
        "Memory after deletion")."""
        for api_name, names in PASS_METHODS.items():
            api = getattr(self, api_name)
            for name in names:
                _build_validator(getattr(api, name))
        # Every poster busy at once: the pool starts all of its threads now.
        barrier = threading.Barrier(EVENT_POSTERS)
        for _ in range(EVENT_POSTERS):
            self._events.submit(barrier.wait, 30)

    def close_idle_connections(self) -> int:
        """Close the connections kept open in the client's pools and not in use (those a burst of
        passes opened; a watch's is in use), so that they, their TLS state and what they pin go;
        the next request opens one again.  How many were closed."""
        return close_idle_connections(self.api)

    def start_cache(self, namespaces: tuple[str, ...], wake: cache.Wake) -> None:
        """List and watch every kind clef plans from, in `namespaces` (empty: all); nodes are
        cluster-scoped.  `wake(namespace, model)` is called from the watch threads."""
        listers: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
            "deployments": (
                self.apps.list_namespaced_deployment,
                self.apps.list_deployment_for_all_namespaces,
            ),
            "jobs": (self.batch.list_namespaced_job, self.batch.list_job_for_all_namespaces),
            "pods": (self.core.list_namespaced_pod, self.core.list_pod_for_all_namespaces),
            "services": (self.core.list_namespaced_service, self.core.list_service_for_all_namespaces),
            "configmaps": (
                self.core.list_namespaced_config_map,
                self.core.list_config_map_for_all_namespaces,
            ),
            "clefmodels": (
                cache.custom_lister(self.custom, GROUP, VERSION, PLURAL, all_namespaces=False),
                cache.custom_lister(self.custom, GROUP, VERSION, PLURAL, all_namespaces=True),
            ),
        }
        for kind, (namespaced, everywhere) in listers.items():
            woken = self.service_readers.waking(wake) if kind == "services" else wake
            if namespaces:
                for ns in namespaces:
                    self.cache.add(kind, namespaced, ns, woken)
            else:
                self.cache.add(kind, everywhere, None, woken)
        self.cache.add("nodes", self.core.list_node, None, wake)
        self.cache.start()

    # -------------------------------------------------------------------------- the verdict key
    @property
    def verdict_key(self) -> bytes:
        if self._verdict_key is None:
            raise RuntimeError("the verdict key was not loaded (Kube.load_verdict_key at start-up)")
        return self._verdict_key

    def load_verdict_key(self, namespace: str) -> None:
        """Read the HMAC key from Secret clef-verdict-key, creating it (32 random bytes) on the
        first start.  Two operators starting at once: the loser of the create reads the winner's.
        The key is never logged."""
        self._ledger_namespace = namespace
        for _ in range(3):
            try:
                found: Any = self.core.read_namespaced_secret(VERDICT_KEY_SECRET, namespace)
                key = base64.b64decode((found.data or {}).get(VERDICT_KEY_FIELD, ""))
                if len(key) < VERDICT_KEY_BYTES:
                    raise RuntimeError(
                        f"Secret {namespace}/{VERDICT_KEY_SECRET} holds no {VERDICT_KEY_BYTES}-byte"
                        f" `{VERDICT_KEY_FIELD}`; delete it to have a new key made (every verdict is then re-run)"
                    )
                self._verdict_key = key
                return
            except ApiException as e:
                if e.status != 404:
                    raise
            body = client.V1Secret(
                metadata=client.V1ObjectMeta(
                    name=VERDICT_KEY_SECRET,
                    namespace=namespace,
                    labels={labels.MANAGED_BY: labels.MANAGED_BY_VALUE},
                ),
                type="Opaque",
                data={VERDICT_KEY_FIELD: base64.b64encode(secrets.token_bytes(VERDICT_KEY_BYTES)).decode()},
            )
            try:
                self.core.create_namespaced_secret(namespace, body)
                log.info("created Secret %s/%s with a new verdict key", namespace, VERDICT_KEY_SECRET)
            except ApiException as e:
                if e.status != 409:
                    raise
        raise RuntimeError(f"could not read or create Secret {namespace}/{VERDICT_KEY_SECRET}")

    # -------------------------------------------------------------------------- reading
    def read_model(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ClefModel as the cache holds it (its watch, or this operator's last status write,
        whichever is newer); None when it is gone."""
        found = self.cache["clefmodels"].get((namespace, name))
        if not found:
            return None
        newest: Packed = max(found, key=lambda o: _version_number(cache.resource_version(o)))
        return newest.decoded()

    def has_model(self, namespace: str, name: str) -> bool:
        """Whether the cache holds the ClefModel (no decoding)."""
        return bool(self.cache["clefmodels"].get((namespace, name)))

    def observe(self, model: ModelRef, service_name: str) -> Observed:
        """The model's children from the cache (a dictionary lookup); requests only for what no
        watch holds: the log of a completed goldens pod whose goldens are not stored yet, and the
        FailedCreate events of an active verification Job that has no pod."""
        key = (model.namespace, model.name)
        self.service_readers.note(model.namespace, model.name, service_name)
        deployments = [d for owners, d in self.cache["deployments"].get(key) if model.uid in owners]
        jobs = [j for owners, j in self.cache["jobs"].get(key) if model.uid in owners]
        pods = sorted((self._on_node(p) for p in self.cache["pods"].get(key)), key=lambda p: p.name)
        jobs = [self._with_pod_refusal(model.namespace, j, pods) for j in sorted(jobs, key=lambda j: j.name)]
        config_maps = sorted(
            (c for owners, c in self.cache["configmaps"].get(key) if model.uid in owners),
            key=lambda c: c.name,
        )
        logs = self._goldens_logs(model, jobs, pods, config_maps)
        records = self.cache["services"].get((model.namespace, service_name))
        service = records[0].state(model.uid) if records else None
        return Observed(
            tuple(sorted(deployments, key=lambda d: d.name)),
            tuple(jobs),
            tuple(pods),
            service,
            tuple(config_maps),
            logs,
            # Without the verdict key (never in a running operator: the plan needs it) there is
            # no ledger to read either.
            ledger=self.read_ledger(model) if self._verdict_key is not None else None,
        )

    # -------------------------------------------------------------------------- the ledger
    def read_ledger(self, model: ModelRef) -> dict[str, Any]:
        """The model's verdict ledger (verdicts.py): ConfigMap `clef-ledger-<uid>` in the operator's
        namespace, which a namespace editor cannot write.  Absent: empty.  Records that are not
        this operator's signed final records are left out (and logged)."""
        with self._ledger_lock:
            kept = self._ledgers.get(model.uid)
        if kept is not None:
            return dict(kept[0])
        name = ledger_name(model)
        try:
            found: Any = self.core.read_namespaced_config_map(name, self._ledger_namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            ledger: dict[str, Any] = {}
            version = ""
        else:
            ledger, problems = decode_ledger(found.data or {}, self.verdict_key, model)
            for problem in problems:
                log.warning("%s/%s: ledger %s: %s", model.namespace, model.name, name, problem)
            version = found.metadata.resource_version or ""
        with self._ledger_lock:
            self._ledgers[model.uid] = (ledger, version)
        return dict(ledger)

    def delete_ledger(self, uid: str) -> None:
        """Delete the ledger of a model that is going away (by UID: a model made again under the
        same name starts a new one).  Already gone: nothing to do."""
        if not self._ledger_namespace or not uid:
            return
        with self._ledger_lock:
            self._ledgers.pop(uid, None)
        try:
            self.core.delete_namespaced_config_map(LEDGER_PREFIX + uid, self._ledger_namespace)
        except ApiException as e:
            if e.status != 404:
                raise

    def write_ledger(self, model: ModelRef, ledger: Mapping[str, Any]) -> None:
        """Write the model's ledger: a merge patch with the resourceVersion this operator read or
        wrote last as its precondition (keys it dropped sent as null), or a create when there is
        none.  A conflict forgets what was kept and raises: the pass is retried on a fresh read."""
        with self._ledger_lock:
            before, version = self._ledgers.get(model.uid, ({}, ""))
        name = ledger_name(model)
        data: dict[str, str | None] = {k: None for k in before if k not in ledger}
        data.update(encode_ledger(ledger))
        meta = {
            "name": name,
            "namespace": self._ledger_namespace,
            "labels": {labels.MANAGED_BY: labels.MANAGED_BY_VALUE, labels.COMPONENT: labels.COMPONENT_LEDGER},
            "annotations": {LEDGER_FOR: f"{model.namespace}/{model.name}"},
        }
        try:
            if version:
                patch = {"metadata": {"resourceVersion": version, "labels": meta["labels"]}, "data": data}
                written: Any = self.core.patch_namespaced_config_map(
                    name, self._ledger_namespace, patch, _content_type=MERGE_PATCH
                )
            else:
                body: Any = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": meta,
                    "data": encode_ledger(ledger),
                }
                written = self.core.create_namespaced_config_map(self._ledger_namespace, body)
        except ApiException:
            with self._ledger_lock:
                self._ledgers.pop(model.uid, None)
            raise
        with self._ledger_lock:
            self._ledgers[model.uid] = (dict(ledger), written.metadata.resource_version or "")

    def _on_node(self, pod: PodState) -> PodState:
        """The GPU class and memory of the node a verification or serving pod runs on (its labels,
        from the node cache): they say which GPU class a verdict is for."""
        if pod.component not in GPU_CLASS_COMPONENTS or not pod.node_name:
            return pod
        found = self.cache["nodes"].get(("", pod.node_name))
        if not found:
            return pod
        node: Mapping[str, str] = found[0]
        memory = node.get(labels.NODE_GPU_MEMORY, "")
        return replace(
            pod,
            node_gpu_product=node.get(labels.NODE_GPU_PRODUCT, ""),
            node_gpu_memory_mib=int(memory) if memory.isdigit() else None,
        )

    def _goldens_logs(
        self, model: ModelRef, jobs: list[JobState], pods: list[PodState], stored: list[ConfigMapState]
    ) -> dict[str, bytes]:
        """The log of each goldens pod whose Job completed and whose goldens are not stored yet:
        only the pod that belongs to the Job's UID, at most MAX_GOLDENS_BYTES and a little more
        (what is cut off then fails the sha256 check).  No watch carries a log, so this is a
        request, made once per goldens Job: the ConfigMap written from it (remembered in the
        cache) ends the reads."""
        names = {c.name for c in stored}
        out: dict[str, bytes] = {}
        for job in jobs:
            if job.step != Step.GOLDENS.value or not job.complete or job.name in names:
                continue
            for pod in (p for p in pods if job.uid and job.uid in p.owner_uids and p.terminated):
                try:
                    text: Any = self.core.read_namespaced_pod_log(
                        pod.name,
                        model.namespace,
                        container=GOLDENS_CONTAINER,
                        limit_bytes=MAX_GOLDENS_BYTES + LOG_SLACK_BYTES,
                        _preload_content=False,
                    )
                    out[pod.uid] = text.data
                except ApiException as e:
                    if e.status not in (400, 404):
                        raise
                    log.info(
                        "%s/%s: no log of goldens pod %s: %s", model.namespace, model.name, pod.name, e.reason
                    )
        return out

    def _with_pod_refusal(self, ns: str, job: JobState, pods: list[PodState]) -> JobState:
        """`job` with `pods_refused` read from its FailedCreate events: only while it is active
        and has no pod (one field-selected list for that Job alone; none in the steady state).
        Events are not cached: they are many, and this read is rare."""
        if job.finished or job.deleting or not job.uid or any(job.uid in p.owner_uids for p in pods):
            return job
        selector = f"involvedObject.uid={job.uid},reason=FailedCreate"
        events: list[Any] = self.core.list_namespaced_event(ns, field_selector=selector).items
        return replace(job, pods_refused=pod_refusal(events))

    # -------------------------------------------------------------------------- writing
    def apply(self, model: ModelRef, action: act.Action) -> str | None:
        """Carry out `action`; the API server's message when it refused it (else None)."""
        ns = model.namespace
        try:
            self._apply(ns, model, action)
        except LostRace as race:
            # Benign: the Service's change is a watch event, whose pass plans from what it is now.
            log.info("%s/%s: %s not applied: %s", ns, model.name, type(action).__name__, race)
            return None
        except ApiException as e:
            benign = (
                e.status == 409
                and isinstance(
                    action, (act.CreateJob, act.CreateDeployment, act.CreateService, act.CreateConfigMap)
                )
            ) or (e.status == 404 and isinstance(action, VANISHED_IS_DONE))
            if benign:
                log.info("%s/%s: %s was already done (%s)", ns, model.name, type(action).__name__, e.reason)
                return None
            if e.status in REFUSALS:
                return refusal(e)
            raise
        return None

    def _apply(self, ns: str, model: ModelRef, action: act.Action) -> None:
        if isinstance(action, act.CreateJob):
            self._remember("jobs", self.batch.create_namespaced_job(ns, _body(action.manifest)))
        elif isinstance(action, act.DeleteJob):
            self.batch.delete_namespaced_job(action.name, ns, propagation_policy="Background")
            self._forget("jobs", model, action.name)
        elif isinstance(action, act.CreateDeployment):
            self._remember("deployments", self.apps.create_namespaced_deployment(ns, _body(action.manifest)))
        elif isinstance(action, act.ScaleDeployment):
            body = {
                "metadata": {"annotations": dict(action.annotations)},
                "spec": {"replicas": action.replicas},
            }
            self._patch_deployment(ns, action.name, body, MERGE_PATCH)
        elif isinstance(action, act.AnnotateDeployment):
            body = {"metadata": {"annotations": dict(action.annotations)}}
            self._patch_deployment(ns, action.name, body, MERGE_PATCH)
        elif isinstance(action, act.ReplaceTemplate):
            template = [{"op": "replace", "path": "/spec/template", "value": dict(action.template)}]
            self._patch_deployment(ns, action.name, template, JSON_PATCH)
        elif isinstance(action, act.DeleteDeployment):
            self.apps.delete_namespaced_deployment(action.name, ns, propagation_policy="Background")
            self._forget("deployments", model, action.name)
        elif isinstance(action, act.LabelPod):
            body = {"metadata": {"labels": dict(action.labels)}}
            self._remember(
                "pods", self.core.patch_namespaced_pod(action.name, ns, body, _content_type=MERGE_PATCH)
            )
        elif isinstance(action, act.CreateService):
            self._remember("services", self.core.create_namespaced_service(ns, _body(action.manifest)))
        elif isinstance(action, act.PatchServiceSelector):
            self._patch_selector(ns, action)
        elif isinstance(action, act.PatchServicePorts):
            current: Any = self.core.read_namespaced_service(action.name, ns)
            ops: list[dict[str, Any]] = [
                {"op": "replace", "path": "/spec/ports", "value": [dict(p) for p in action.ports]}
            ]
            self._patch_service(ns, action.name, current.metadata.resource_version, ops)
        elif isinstance(action, act.CreateConfigMap):
            self._remember("configmaps", self.core.create_namespaced_config_map(ns, _body(action.manifest)))
        elif isinstance(action, act.DeleteConfigMap):
            self.core.delete_namespaced_config_map(action.name, ns)
            self._forget("configmaps", model, action.name)
        elif isinstance(action, act.Event):
            self.post_event(model, action)
        else:  # pragma: no cover - every action type is handled above
            raise TypeError(f"unknown action {action!r}")

    def _patch_selector(self, ns: str, action: act.PatchServiceSelector) -> None:
        """Replace the selector wholesale (a merge would keep an adopted Service's old keys and
        select nothing) and set clef's annotations, in one JSON patch: nothing else changes."""
        current: Any = self.core.read_namespaced_service(action.name, ns)
        ops: list[dict[str, Any]] = []
        if current.metadata.annotations is None:
            ops.append({"op": "add", "path": "/metadata/annotations", "value": dict(action.annotations)})
        else:
            for key, value in action.annotations.items():
                ops.append({"op": "add", "path": f"/metadata/annotations/{_escape(key)}", "value": value})
        ops.append({"op": "add", "path": "/spec/selector", "value": dict(action.selector)})
        self._patch_service(ns, action.name, current.metadata.resource_version, ops)

    def _patch_service(self, ns: str, name: str, version: str, ops: list[dict[str, Any]]) -> None:
        """A JSON patch of a Service as it was at `version` (the patch tests it first).  A refusal
        is a lost race (`LostRace`) when the Service is no longer at `version`: the API server
        answers a failed test with a bare 422 that does not say which operation failed, so a fresh
        read decides; any other refusal is the API server's answer to the patch itself."""
        test = {"op": "test", "path": "/metadata/resourceVersion", "value": version}
        try:
            written = self.core.patch_namespaced_service(name, ns, [test, *ops], _content_type=JSON_PATCH)
        except ApiException as e:
            if e.status in (409, 422) and self._service_version(ns, name) != version:
                raise LostRace(f"Service {name} changed since it was read (resourceVersion {version})") from e
            raise
        self._remember("services", written)

    def _service_version(self, ns: str, name: str) -> str | None:
        """The Service's resourceVersion now; None when it is gone."""
        try:
            current: Any = self.core.read_namespaced_service(name, ns)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        version: str = current.metadata.resource_version
        return version

    def _patch_deployment(self, ns: str, name: str, body: Any, content_type: str) -> None:
        self._remember(
            "deployments", self.apps.patch_namespaced_deployment(name, ns, body, _content_type=content_type)
        )

    def _forget(self, kind: str, model: ModelRef, name: str) -> None:
        """A delete went through: the next pass does not see the object (nor delete it again)."""
        self.cache[kind].forget((model.namespace, model.name), lambda value: value[1].name == name)

    def _remember(self, kind: str, response: Any) -> None:
        """A write's response is the object as it is now: the next pass reads it (not the state
        before the write) even before the watch delivers it."""
        self.cache[kind].put(response)

    def patch_model(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> bool:
        """A JSON patch of the ClefModel's metadata (its finalizer: `finalizer.add_patch`,
        `remove_patch`); the response goes into the cache.  False when the model is gone; a failed
        test (a concurrent change) raises, and the pass is retried from the newer version."""
        try:
            written = self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, ops, _content_type=JSON_PATCH
            )
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        self._remember("clefmodels", written)
        return True

    def release_service(self, namespace: str, model: str, service: str) -> bool:
        """Hand back a Service `model` adopted (`children.release_ops`), when the model is deleted;
        whether there was one to hand back.  Planned from the cache (a deletion costs no read);
        the patch tests the cached resourceVersion (`_patch_service`), so a stale cache cannot
        write over a newer Service: a lost race, or a Service the cache does not hold, is read from
        the API server and planned again (any refusal of that plan raises: the pass is retried)."""
        records = self.cache["services"].get((namespace, service))
        if records:
            try:
                return self._release(namespace, model, records[0])
            except LostRace:
                pass  # the Service moved on from the cached copy: plan from what it is now
        try:
            current = _service(self.core.read_namespaced_service(service, namespace))
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return self._release(namespace, model, current)

    def _release(self, namespace: str, model: str, current: ServiceRecord) -> bool:
        ops = release_ops(current.annotations, model)
        if not ops or any(who.split("/", 1)[0] == KIND for _, who, _ in current.owners):
            return False  # not driven by this model, or clef's own (it goes with the model)
        self._patch_service(namespace, current.name, current.resource_version, ops)
        restored = next((op["value"] for op in ops if op["path"] == "/spec/selector" and "value" in op), None)
        what = (
            f"its selector is {restored} again"
            if restored is not None
            else "its selector was left as clef set it"
        )
        reference = client.V1ObjectReference(
            api_version="v1", kind="Service", name=current.name, namespace=namespace, uid=current.uid
        )
        self._post(
            namespace,
            reference,
            act.Event(
                "Normal",
                "ServiceReleased",
                f"ClefModel {model} was deleted: released Service {current.name}; {what}",
            ),
        )
        return True

    def post_event(self, model: ModelRef, event: act.Event) -> None:
        reference = client.V1ObjectReference(
            api_version=f"{GROUP}/{VERSION}",
            kind=KIND,
            name=model.name,
            namespace=model.namespace,
            uid=model.uid,
        )
        # Off the reconcile's path: an event is a record of a decision already carried out, and
        # waiting for it would hold the next action (and the next model's pass) back.
        self._events.submit(self._post, model.namespace, reference, event, datetime.now(UTC))

    def _post(
        self,
        namespace: str,
        involved: client.V1ObjectReference,
        event: act.Event,
        now: datetime | None = None,
    ) -> None:
        now = now or datetime.now(UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{involved.name}.", namespace=namespace),
            involved_object=involved,
            reason=event.reason,
            message=event.message[:1024],
            type=event.type,
            count=1,
            first_timestamp=now,
            last_timestamp=now,
            source=client.V1EventSource(component="clef-operator"),
            reporting_component=REPORTING_COMPONENT,
            reporting_instance=self.instance[:128],
            action=event.reason,
        )
        try:
            self.core.create_namespaced_event(namespace, body)
        except Exception as e:
            # An event is a courtesy; losing one must not stop a rollout (nor, posted from its
            # own thread, go unnoticed).
            reason = e.reason if isinstance(e, ApiException) else e
            log.warning(
                "could not post event %s for %s/%s: %s", event.reason, namespace, involved.name, reason
            )

    def write_status(self, model: ModelRef, status: ClefModelStatus) -> None:
        body = status.to_wire()
        # Merge patch: a field the planner cleared must be sent as null to be removed.
        for name, field in ClefModelStatus.model_fields.items():
            body.setdefault(field.alias or name, None)
        written = self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, model.namespace, PLURAL, model.name, {"status": body}, _content_type=MERGE_PATCH
        )
        # The status the next pass plans from is this one (re-verify runs and verdicts are counted
        # from it), never an older one that a lagging watch still holds.
        self._remember("clefmodels", written)


def _build_validator(method: Callable[..., Any]) -> None:
    """Call an API method with none of its required arguments: its validator is built (pydantic
    builds it on first call) and refuses the call, so nothing is sent.  A method without required
    arguments would send a request: it is not called."""
    parameters = inspect.signature(method).parameters.values()
    required = [
        p for p in parameters if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if not required:
        return
    try:
        method()
    except (TypeError, ValueError):  # pydantic's ValidationError is a ValueError
        return
    raise RuntimeError(f"{method.__name__} was called without its arguments")  # pragma: no cover


def close_idle_connections(api: client.ApiClient) -> int:
    """Close the idle connections of every pool of `api` (urllib3's pools keep them in a queue,
    with None for a free slot); a connection in use is left alone.  Without urllib3's pools (a
    client of another shape) nothing is closed."""
    manager = getattr(getattr(api, "rest_client", None), "pool_manager", None)
    pools = getattr(manager, "pools", None)
    if pools is None:
        return 0
    closed = 0
    for key in pools.keys():  # noqa: SIM118 (the container refuses iteration)
        kept = getattr(pools.get(key), "pool", None)
        if kept is None:
            continue
        taken = []
        while True:
            try:
                taken.append(kept.get(block=False))
            except queue.Empty:
                break
        for conn in taken:
            if conn is not None:
                conn.close()
                closed += 1
        for _ in taken:
            try:
                kept.put(None, block=False)
            except queue.Full:  # a request made a connection meanwhile: its slot is taken
                break
    return closed
