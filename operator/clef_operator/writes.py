"""The writing side of the kube shell: `Writer.apply` carries out the planner's actions, one API
call each; `write_status` publishes the planner's status; `patch_model` sets the finalizer;
`release_service` hands back an adopted Service; events are posted off the reconcile's path.
Each write's response goes back into the cache, so the next pass reads what was written.

A cache read can still lag the world (another writer, a watch event on its way): conflicts that a
level-triggered loop resolves by itself (AlreadyExists on create, NotFound on delete, a Service
changed between read and patch) are not errors: the next reconcile observes the truth and plans
again.  A refusal (400, 403, 422: the object is invalid or not allowed) is returned, with the
API server's message, for the ClefModel's status; anything else raises.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_operator import actions as act
from clef_operator.api import GROUP, KIND, PLURAL, VERSION, ClefModelStatus
from clef_operator.apiclient import JSON_PATCH, MERGE_PATCH
from clef_operator.children import release_ops
from clef_operator.manager import cache
from clef_operator.observed import ModelRef
from clef_operator.snapshots import ServiceRecord, service_record

log = logging.getLogger("clef.kube")

REPORTING_COMPONENT = "clef.riotpiao.com/operator"
REFUSALS = (400, 403, 422)

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


class LostRace(Exception):
    """A patch tested a resourceVersion the object has moved on from: nothing was written."""


def _escape(key: str) -> str:
    """A JSON-pointer path segment."""
    return key.replace("~", "~0").replace("/", "~1")


def _body(manifest: Mapping[str, Any]) -> Any:
    """The client accepts plain dicts where its signatures name model classes."""
    return dict(manifest)


def refusal(e: ApiException) -> str:
    """The API server's own words for a refused request."""
    try:
        said = json.loads(e.body or "{}").get("message", "")
    except (ValueError, AttributeError):
        said = ""
    return f"{e.status} {e.reason}: {said or e.body or ''}".strip()


class Writer:
    """Writes through `core`, `apps`, `batch` and `custom` (the kube shell's clients) and puts each
    response into `store`; posts events from EVENT_POSTERS threads of its own, as `instance`."""

    def __init__(
        self,
        clients: tuple[client.CoreV1Api, client.AppsV1Api, client.BatchV1Api, client.CustomObjectsApi],
        store: cache.Cache,
    ) -> None:
        self.core, self.apps, self.batch, self.custom = clients
        self.cache = store
        self.instance = socket.gethostname()
        self._events = ThreadPoolExecutor(max_workers=EVENT_POSTERS, thread_name_prefix="events")

    def start_posters(self) -> None:
        """Start every event thread now (each poster busy at once), not mid-burst."""
        barrier = threading.Barrier(EVENT_POSTERS)
        for _ in range(EVENT_POSTERS):
            self._events.submit(barrier.wait, 30)

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

    def merge_patch_model(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """A merge patch of the ClefModel's metadata (the namespace anchor: `anchor.label_patch`,
        which adds one label and can overwrite nothing else, so it needs no resourceVersion
        test); the response goes into the cache and is returned.  None when the model is gone."""
        try:
            written: Any = self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, dict(body), _content_type=MERGE_PATCH
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        self._remember("clefmodels", written)
        return dict(written)

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
            current = service_record(self.core.read_namespaced_service(service, namespace))
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
