"""The kube shell: the only part of clef that talks to the API server (with `writes`, its writing
side, and `ledger`).  `observe` turns the ClefModel's children into the planner's snapshots, read
from the informer cache (`manager.cache`: list + watch per kind, `snapshots.KINDS` says how each
is stored); `apply` carries out the planner's actions, one API call each (`writes.Writer`);
`write_status` publishes the planner's status.  Reads come from the cache, writes go to the API
server, and a write's response goes back into the cache.
"""

from __future__ import annotations

import base64
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_operator import actions as act
from clef_operator import anchor, labels
from clef_operator.api import GROUP, PLURAL, VERSION, ClefModelStatus, Step
from clef_operator.apiclient import build_validators, close_idle_connections
from clef_operator.goldens import GOLDENS_CONTAINER, MAX_GOLDENS_BYTES
from clef_operator.ledger import Ledgers
from clef_operator.manager import cache
from clef_operator.observed import (
    ConfigMapState,
    JobState,
    ModelRef,
    Observed,
    Packed,
    PodState,
    node_versions,
)
from clef_operator.snapshots import KINDS, ServiceReaders, pod_refusal, version_number
from clef_operator.writes import REFUSALS, Writer, refusal

log = logging.getLogger("clef.kube")

# The Secret that holds the HMAC key verdicts are signed with (verdicts.sign), in the operator's
# own namespace; only the operator reads it (kustomize/base/rbac.yaml, Role clef-verdict-key).
VERDICT_KEY_SECRET = "clef-verdict-key"
VERDICT_KEY_FIELD = "key"
VERDICT_KEY_BYTES = 32
GPU_CLASS_COMPONENTS = (labels.COMPONENT_VERIFICATION, labels.COMPONENT_SERVING)
LOG_SLACK_BYTES = 64 * 1024
# After anchoring a namespace, how long to wait at most for the API server's admission to see the
# anchor (its view of ClefModels is a watch, a moment behind the patch), and the first pause.
ANCHOR_ADMISSION_SECONDS = 10.0
ANCHOR_RETRY_SECONDS = 0.05


class Kube:
    """What a pass and the process's start-up ask of the API server: the cache's lists and
    watches, the verdict key, the model and its children (from the cache), the ledger (`ledger`)
    and the writes (`writes`), through one client."""

    def __init__(self, api: client.ApiClient, store: cache.Cache | None = None) -> None:
        self.api = api
        self.cache = store if store is not None else cache.Cache(KINDS)
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self._verdict_key: bytes | None = None
        self.service_readers = ServiceReaders()
        self.writer = Writer((self.core, self.apps, self.batch, self.custom), self.cache)
        self.ledgers = Ledgers(self.core, lambda: self.verdict_key)
        # The namespace anchor (anchor.py): one decision at a time in this process, and the
        # namespaces whose new anchor the API server's admission may not see yet.
        self._anchoring = threading.Lock()
        self._confirming: set[str] = set()

    def warm_up(self) -> None:
        """Make before the first burst of passes what a pass would otherwise make once, mid-burst,
        and keep for good: each API method's argument validator and the event threads.  Objects
        born during a burst that outlive it pin the memory around them: after 1,000 models were
        deleted, memory stayed above the start by what they pinned (docs/performance.md,
        "Memory after deletion")."""
        build_validators(self)
        self.writer.start_posters()

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
        self.cache.add("nodes", self.core.list_node, None, self._every_model(wake))
        self.cache.start()

    def _every_model(self, wake: cache.Wake) -> cache.Wake:
        """`wake` for every model, whatever the node an event is about: a node's labels, taints or
        cordon changed (the cache wakes only then), and any model may have to verify its driver."""

        def wake_all(_namespace: str, _node: str) -> None:
            models: list[cache.Key] = self.cache["clefmodels"].keys()
            for namespace, name in models:
                wake(namespace, name)

        return wake_all

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
        self.ledgers.namespace = namespace
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
        newest: Packed = max(found, key=lambda o: version_number(cache.resource_version(o)))
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
            nodes=tuple(self.cache["nodes"].values()),
        )

    def _on_node(self, pod: PodState) -> PodState:
        """The GPU class and memory of the node a verification or serving pod runs on (its labels,
        from the node cache): they say which GPU class a verdict is for."""
        if pod.component not in GPU_CLASS_COMPONENTS or not pod.node_name:
            return pod
        found = self.cache["nodes"].get(("", pod.node_name))
        if not found:
            return pod
        node: Mapping[str, str] = found[0].labels
        memory = node.get(labels.NODE_GPU_MEMORY, "")
        return replace(
            pod,
            node_gpu_product=node.get(labels.NODE_GPU_PRODUCT, ""),
            node_gpu_memory_mib=int(memory) if memory.isdigit() else None,
            node_driver=node_versions(node)[0],
            node_cuda_runtime=node_versions(node)[1],
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

    # -------------------------------------------------------------------------- the namespace anchor
    def anchors(self, namespace: str) -> list[anchor.Member]:
        """The ClefModels of `namespace` that carry the anchor, from the cache's index of them."""
        return [anchor.member(m["metadata"]) for m in self.cache["clefmodels"].tagged(namespace)]

    def members(self, namespace: str, but: str = "") -> Iterator[anchor.Member]:
        """The ClefModels of `namespace` in the cache, but `but`, in `anchor.successors` order,
        each read only when the walk reaches it (a hand-over stops at the first live one)."""
        models: list[cache.Key] = self.cache["clefmodels"].keys()
        for name in anchor.successors(name for ns, name in models if ns == namespace and name != but):
            found = self.read_model(namespace, name)
            if found is not None:
                yield anchor.member(found["metadata"])

    def anchor_namespace(
        self, namespace: str, candidates: Callable[[], Iterable[anchor.Member]], confirm: bool = True
    ) -> str | None:
        """Make sure a live ClefModel of `namespace` carries the anchor before clef writes there
        (anchor.py).  With one in the cache that admission already sees: nothing, no request.
        Else label the model `anchor.to_anchor` picks from `candidates()` (the next one when the
        patch finds it gone or being deleted) and, with `confirm`, wait until the API server
        admits a managed write there (at most ANCHOR_ADMISSION_SECONDS: a write refused after
        that is retried as any refused write is).  One decision at a time, so two passes never
        anchor two models for want of seeing each other's.  The model labelled, if any."""
        if anchor.anchored(self.anchors(namespace)) and namespace not in self._confirming:
            return None
        with self._anchoring:
            walk = iter(candidates())
            # Before the patch: a pass that sees the new anchor in the cache waits for this.
            self._confirming.add(namespace)
            try:
                while (chosen := anchor.to_anchor(self.anchors(namespace), walk)) is not None:
                    written = self._label(namespace, chosen)
                    if written is not None and anchor.member(written["metadata"]).live_anchor:
                        break
                if chosen is None:
                    return None
                log.info(
                    "%s/%s: labelled %s (the namespace's anchor)", namespace, chosen, labels.NAMESPACE_ANCHOR
                )
                if confirm:
                    self._await_admission(namespace)
            finally:
                self._confirming.discard(namespace)
            return chosen

    def _label(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Put the anchor on a model: the model as written, None when it is gone or the API server
        refused the patch (then a write the namespace's policy refuses says why, in Degraded)."""
        try:
            return self.writer.merge_patch_model(namespace, name, anchor.label_patch())
        except ApiException as e:
            if e.status not in REFUSALS:
                raise
            log.warning(
                "%s/%s: could not label it as the namespace's anchor: %s", namespace, name, refusal(e)
            )
            return None

    def _await_admission(self, namespace: str) -> None:
        """Until the API server admits a ConfigMap as clef labels its children in `namespace` (a
        server-side dry run: nothing is stored), while it refuses one for want of an anchor."""
        deadline = time.monotonic() + ANCHOR_ADMISSION_SECONDS
        pause = ANCHOR_RETRY_SECONDS
        while True:
            try:
                probe: Any = anchor.admission_probe()  # the client accepts plain dicts
                self.core.create_namespaced_config_map(namespace, probe, dry_run="All")
                return
            except ApiException as e:
                if not anchor.refused_for_want_of_anchor(e.status, str(e.body or "")):
                    log.info("%s: no check that admission sees the anchor: %s", namespace, refusal(e))
                    return
            if time.monotonic() + pause > deadline:
                log.warning(
                    "%s: the API server's admission did not see the namespace anchor within %.0fs",
                    namespace,
                    ANCHOR_ADMISSION_SECONDS,
                )
                return
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    # -------------------------------------------------------------------------- the ledger
    def read_ledger(self, model: ModelRef) -> dict[str, Any]:
        return self.ledgers.read(model)

    def write_ledger(self, model: ModelRef, ledger: Mapping[str, Any]) -> None:
        self.ledgers.write(model, ledger)

    def delete_ledger(self, uid: str) -> None:
        self.ledgers.delete(uid)

    # -------------------------------------------------------------------------- writing (writes.py)
    def apply(self, model: ModelRef, action: act.Action) -> str | None:
        return self.writer.apply(model, action)

    def write_status(self, model: ModelRef, status: ClefModelStatus) -> None:
        self.writer.write_status(model, status)

    def patch_model(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> bool:
        return self.writer.patch_model(namespace, name, ops)

    def release_service(self, namespace: str, model: str, service: str) -> bool:
        return self.writer.release_service(namespace, model, service)
