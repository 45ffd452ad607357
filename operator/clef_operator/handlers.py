"""The process's wiring: kopf runs its lifecycle (start-up, login, clean-up, the liveness probe)
and nothing per model; clef's own work queue schedules the reconcile passes.

* **Events.**  The informer cache (`cache`, started by `start_watching`) lists and watches the
  ClefModels and their children; a change adds its model's key to the work queue (`workqueue`),
  deduplicated.  kopf registers no resource handler, so it watches nothing and keeps no copy of
  any ClefModel.
* **Workers.**  `tuning.workers` threads take keys from the queue and run `reconcile` (one pass
  per key at a time: no two plans for one model ever race).  A pass reads the world from the cache
  (`kube.read_model`, `kube.observe`: no request), asks the planner, and applies its answer
  through the API server; its "look again in N seconds" (or, with none, the resync,
  `resync_seconds`) goes back to the queue's heap, and a failure is retried with a per-key backoff.
  An idle model costs one entry in that heap.
* **Start.**  The workers start only once the cache has synced (never a plan from a half-filled
  cache), and every cached model is queued once then.  With leader election (`clef-operator run
  --leader-elect`) the cache runs on a standby too (reads pass the write fence), while kopf, and so
  the queue and its workers, start only once the replica leads.
* **Deletion.**  Every ClefModel carries clef's finalizer (`finalizer`, the name kopf used for clef
  before): a pass adds it; once the model is deleted a pass hands back a Service it adopted
  (`Kube.release_service`) and then removes it, so a failed release keeps the model (and is
  retried).  A pass that finds its model gone from the cache forgets the key: nothing per model is
  kept after the deletion.

Status is written before the actions, so verdicts and re-verify bookkeeping are never lost to a
crash between the two; an action the API server refuses stops the rest and is reported in
Degraded (ChildRejected) in the same pass.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes import client, config
from pydantic import ValidationError

from clef_operator import finalizer, leader, memory, metrics
from clef_operator.actions import Action, Event
from clef_operator.api import ClefModelSpec, ClefModelStatus
from clef_operator.conditions import Stamp, carried_rejection, child_rejected, invalid_spec
from clef_operator.kube import Kube, operator_namespace
from clef_operator.observed import ModelRef, Observed
from clef_operator.rollout import Plan, plan_rollout
from clef_operator.workqueue import Key, SharedQueue

log = logging.getLogger("clef.operator")

# Every model is re-planned this often with no event (from the cache: no request); `clef-operator
# run --resync-seconds`.
RESYNC_SECONDS = 300.0
WORKERS = 24
# A pass whose action the API server refused looks again this soon: what lifts a refusal (a quota
# raised or deleted, an admission policy or RuntimeClass changed) is nothing clef watches, so no
# event would wake the model before the resync.
REFUSED_RETRY_SECONDS = 30.0


def api_client(fenced: bool = True, pool: int | None = None) -> client.ApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG).  Fenced:
    every write refused while this replica cannot prove it holds the Lease (`leader`); reads and
    watches pass.  `pool`: connections kept open (one per reconcile worker and watch)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    if pool is not None:
        configuration.connection_pool_maxsize = pool
    api = leader.FencedApiClient(configuration=configuration) if fenced else client.ApiClient(configuration)
    api.user_agent = leader.user_agent()
    return api


def reconcile(kube: Kube, namespace: str, name: str, now: datetime | None = None) -> float | None:
    """One level-triggered pass over one ClefModel.  Returns when to look again (None: only on
    the next event or resync)."""
    obj = kube.read_model(namespace, name)
    if obj is None:
        kube.service_readers.forget(namespace, name)
        return None
    todo = finalizer.step(obj["metadata"])
    if todo is finalizer.Step.RELEASE:
        _finalize(kube, namespace, name, obj)
        return None
    if todo is finalizer.Step.WAIT:
        return None
    if todo is finalizer.Step.ADD and not kube.patch_model(
        namespace, name, finalizer.add_patch(obj["metadata"])
    ):
        return None  # deleted since the cache saw it
    return _reconcile(kube, namespace, name, obj, now or datetime.now(UTC))


def _finalize(kube: Kube, namespace: str, name: str, obj: Mapping[str, Any]) -> None:
    """The model is being deleted: hand back a Service it adopted and delete its verdict ledger
    (in the operator's namespace, where no owner reference reaches; its Deployments and Jobs go
    with it, by their owner references), then remove clef's finalizer.  A failed release or delete
    raises before the finalizer is removed: the model stays, and the pass is retried."""
    service = finalizer.released_service(obj)
    if service and kube.release_service(namespace, name, service):
        log.info("%s/%s: released Service %s", namespace, name, service)
    kube.delete_ledger(str(obj["metadata"].get("uid") or ""))
    kube.patch_model(namespace, name, finalizer.remove_patch(obj["metadata"]))


def _reconcile(kube: Kube, namespace: str, name: str, obj: Mapping[str, Any], now: datetime) -> float | None:
    meta = obj["metadata"]
    model = ModelRef(
        name=name,
        namespace=namespace,
        uid=meta["uid"],
        generation=meta.get("generation", 0),
        annotations=dict(meta.get("annotations") or {}),
    )
    try:
        status = ClefModelStatus.model_validate(obj.get("status") or {})
    except ValidationError:
        log.warning("%s/%s: unreadable status, starting from an empty one", model.namespace, model.name)
        status = ClefModelStatus()
    try:
        spec = ClefModelSpec.model_validate(obj.get("spec") or {})
    except ValidationError as e:
        conditions = invalid_spec(status.conditions, e, Stamp(now, model.generation))
        kube.write_status(model, status.model_copy(update={"conditions": conditions}))
        return None
    observed = kube.observe(model, spec.service.name)
    plan = plan_rollout(model, spec, observed, status, now, kube.verdict_key)
    try:
        return _carry_out(kube, model, status, observed, plan, now)
    finally:
        metrics.RECONCILES.inc()


def _carry_out(
    kube: Kube, model: ModelRef, status: ClefModelStatus, observed: Observed, plan: Plan, now: datetime
) -> float | None:
    """Write the ledger (when a run concluded), then status, apply the actions, write what they
    changed; count what the pass did.  The ledger goes first: a record in status that the ledger
    does not hold never counts (verdicts.py)."""
    if plan.ledger is not None:
        kube.write_ledger(model, plan.ledger)
    before = plan.status.model_copy(
        update={"conditions": carried_rejection(status.conditions, plan.status.conditions)}
    )
    if before != status:
        kube.write_status(model, before)
    refused = _apply_all(kube, model, plan.actions)
    after = plan.status
    if refused:
        # Against `before`, which carries a refusal already reported: the same refusal again keeps
        # its lastTransitionTime, so nothing is written, and the write's own watch event does not
        # wake the model into the same refusal at once, over and over.
        rejected = child_rejected(before.conditions, refused, Stamp(now, model.generation))
        after = after.model_copy(update={"conditions": rejected})
    if after != before:
        kube.write_status(model, after)
    if refused:
        metrics.RECONCILE_ERRORS.labels(kind="rejected").inc()
    metrics.record_pass(
        metrics.derive_pass(status, after, plan.actions, observed, datetime.now(UTC), bool(refused))
    )
    metrics.record_model(model.namespace, model.name, after)
    if refused:
        return min(plan.requeue_after or REFUSED_RETRY_SECONDS, REFUSED_RETRY_SECONDS)
    return plan.requeue_after


def _apply_all(kube: Kube, model: ModelRef, actions: tuple[Action, ...]) -> str:
    """Apply in order; at the first refusal stop (the rest follows from it) and say why."""
    for action in actions:
        log.info("%s/%s: %s", model.namespace, model.name, _describe(action))
        refused = kube.apply(model, action)
        if refused:
            message = f"the API server refused {_name(action)}: {refused}"
            log.warning("%s/%s: %s", model.namespace, model.name, message)
            kube.apply(model, Event("Warning", "ChildRejected", message))
            return message
    return ""


def _name(action: Action) -> str:
    manifest = getattr(action, "manifest", None)
    if manifest is not None:
        return f"{manifest['kind']} {manifest['metadata']['name']} ({type(action).__name__})"
    return f"{type(action).__name__} {getattr(action, 'name', '')}".rstrip()


def _describe(action: Any) -> str:
    fields = {k: v for k, v in vars(action).items() if k != "manifest"}
    if "manifest" in vars(action):
        fields["name"] = action.manifest["metadata"]["name"]
    return f"{type(action).__name__} {fields}"


# ------------------------------------------------------------------------------- the workers


@dataclass
class Watching:
    """The informer cache (in `kube`) and the work queue its watch threads add to.  Until the queue
    is attached (this replica leads and kopf has started) an event adds nothing: no worker runs
    yet, and every cached model is queued once when the workers start."""

    kube: Kube
    queue: SharedQueue = field(default_factory=SharedQueue)
    attached: bool = False

    def attach(self) -> None:
        self.attached = True

    def wake(self, namespace: str, model: str) -> None:
        """Called from the watch threads."""
        if self.attached:
            self.queue.add((namespace, model))


class Workers:
    """`tuning.workers` threads that take keys from the queue and run a pass over each."""

    def __init__(self, watching: Watching, tuning: Tuning) -> None:
        self.kube = watching.kube
        self.queue = watching.queue
        self.resync = tuning.resync_seconds
        self.count = tuning.workers
        self.stopping = threading.Event()

    def start(self) -> None:
        metrics.MODELS.set_function(self.queue.known)
        metrics.QUEUE_DEPTH.set_function(self.queue.depth)
        threading.Thread(target=self._start, name="reconcile-start", daemon=True).start()

    def stop(self) -> None:
        self.stopping.set()
        self.queue.close()

    def _start(self) -> None:
        """Never plan from a half-filled cache: wait until every kind has been listed once, then
        queue every model once (the first pass) and start the workers."""
        while not self.kube.cache.synced():
            if self.stopping.wait(0.2):
                return
        models = self.kube.cache["clefmodels"].keys()
        for key in models:
            self.queue.add(key)
        for i in range(self.count):
            threading.Thread(target=self._work, name=f"reconcile-{i}", daemon=True).start()

    def _work(self) -> None:
        while (key := self.queue.get()) is not None:
            try:
                self._pass(key)
            except Exception:  # a worker never dies; the key comes back after its backoff
                log.exception("%s/%s: scheduling the next pass failed", *key)
                self.queue.retry(key)
            finally:
                self.queue.done(key)

    def _pass(self, key: Key) -> None:
        """One pass, then when to look again; a model gone from the cache is forgotten."""
        went_through, requeue = self._reconcile(key)
        if not self.kube.has_model(*key):
            self.queue.forget(key)
            metrics.record_model(*key, None)
            memory.touched(collect=True)
        elif went_through:  # else the queue's backoff says when to look again
            self.queue.add_after(key, _next_look(requeue, self.resync))

    def _reconcile(self, key: Key) -> tuple[bool, float | None]:
        namespace, name = key
        metrics.IN_PROGRESS.inc()
        try:
            requeue = reconcile(self.kube, namespace, name)
        except leader.Fenced as e:
            metrics.RECONCILE_ERRORS.labels(kind="fenced").inc()
            log.warning("%s/%s: %s; retrying in %.0fs", namespace, name, e, self.queue.retry(key))
            return False, None
        except Exception:
            metrics.RECONCILE_ERRORS.labels(kind="exception").inc()
            log.exception(
                "%s/%s: reconcile failed; retrying in %.0fs", namespace, name, self.queue.retry(key)
            )
            return False, None
        finally:
            metrics.IN_PROGRESS.dec()
        self.queue.succeeded(key)
        memory.touched()
        return True, requeue


def _next_look(requeue: float | None, resync: float) -> float:
    """Seconds until the next pass with no event: what the planner asked for, else the resync."""
    return resync if requeue is None else min(max(requeue, 0.2), resync)


def start_watching(tuning: Tuning) -> Watching:
    """Start the informer cache: every kind clef plans from, listed and then watched through the
    fenced client (reads and watches pass the fence, so a standby may run it; its writes would
    not).  `clef-operator run` calls it before campaigning for the Lease, so that a standby's
    cache is synced when it takes over: failover then costs kopf's start-up, not a list of every
    child of every model."""
    kube = Kube(api_client(pool=tuning.workers + 16))
    kube.instance = leader.identity() or kube.instance
    kube.warm_up()
    memory.on_quiet(kube.close_idle_connections)
    memory.on_quiet(kube.cache.compact)
    watching = Watching(kube)
    kube.start_cache(tuning.namespaces, watching.wake)
    return watching


# ------------------------------------------------------------------------------- kopf


@dataclass(frozen=True)
class Tuning:
    """`clef-operator run`'s knobs (cli), handed to kopf's start-up through its memo."""

    namespaces: tuple[str, ...] = ()
    # The safety net: every model is re-planned this often (from the cache) even with no event.
    resync_seconds: float = RESYNC_SECONDS
    # Passes running at once: a pass mostly waits on the API server, so more than the CPUs.
    workers: int = WORKERS


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    # No dynamic scanning of CRDs and namespaces: kopf would list and watch both cluster-wide,
    # which the operator's least-privilege RBAC does not grant (kustomize/base/rbac.yaml).  With
    # no resource handler kopf watches nothing else either.
    settings.scanning.disabled = True
    # Before the first thread allocates (`clef-operator run` did it before its own threads
    # started; again is harmless).
    memory.limit_arenas()
    tuning: Tuning = memo.get("tuning") or Tuning()
    # The cache `clef-operator run` started before the election (warm on a standby), else one
    # started now (kopf run directly, no election).
    watching: Watching = memo.get("watching") or start_watching(tuning)
    memo.kube = watching.kube
    memo.queue = watching.queue
    # Verdicts are signed with this key; without it nothing may be promoted, so start-up fails.
    # Read (or created: a write) only now that this replica leads.
    memo.kube.load_verdict_key(operator_namespace())
    # From here on a watch event queues its model; the workers start once the cache has synced.
    watching.attach()
    memo.workers = Workers(watching, tuning)
    memo.workers.start()
    # kopf's start-up leaves memory free too (docs/performance.md, "Where the memory is").
    memory.touched(collect=True)


@kopf.on.login()
async def login(logger: Any, settings: kopf.OperatorSettings, **_: Any) -> kopf.AiohttpSession | None:
    """kopf's own session (it makes no request of its own with no resource handler) with writes
    behind the same fence as clef's (`leader.fence_trace`), should it ever make one."""
    import aiohttp

    info = kopf.login_via_client(logger=logger, settings=settings)
    if info is None:
        return None
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=info.as_ssl_context()),
        headers={**info.as_http_headers(), "User-Agent": leader.user_agent()},
        proxy=info.proxy_url,
        trust_env=info.trust_env,
        trace_configs=[leader.fence_trace()],
    )
    return kopf.AiohttpSession(
        server=info.server,
        default_namespace=info.default_namespace,
        expiration=info.expiration,
        aiohttp_session=session,
    )


@kopf.on.cleanup()
async def stop(memo: Any, **_: Any) -> None:
    memo.workers.stop()
    memo.kube.cache.stop()


# Every kopf handler here is async: a sync one runs in kopf's own thread pool, whose threads
# would be started by the first call and live on.
@kopf.on.probe(id="clef-state")
async def held_state(memo: Any, **_: Any) -> dict[str, int]:
    """What the operator holds, on its liveness endpoint: objects per kind in the cache, keys the
    work queue knows (`loops`: waiting, running, scheduled for later or failing), the cache's
    tombstones of deleted objects, whether the cache has synced.  After the last model is deleted
    every count but nodes and Services (which are not per model) falls back to where it started,
    tombstones within `cache.GONE_SECONDS`."""
    kube: Kube | None = getattr(memo, "kube", None)
    if kube is None:
        return {}
    cache = kube.cache
    return {
        **cache.sizes(),
        "loops": memo.queue.known(),
        "tombstones": cache.tombstones(),
        "synced": int(cache.synced()),
    }
