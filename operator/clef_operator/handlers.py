"""The kopf wiring: one reconcile loop per ClefModel, woken by anything that happens to it or to
its children, and a periodic resync.  A deleted ClefModel hands back a Service it adopted
(`release`).

The loop is a kopf daemon, so each ClefModel has exactly one reconciler at a time (no two plans
for one model ever race).  The informer cache (`cache`, started by `start_watching`) watches the
ClefModels and their children; a change wakes the model's loop, which reads the world from the
cache (`kube.read_model`, `kube.observe`: no request), asks the planner, and applies its answer
through the API server.  With no event a model is re-planned every `resync_seconds`, from the
cache.  With leader election (`clef-operator run --leader-elect`) the cache runs on a standby too
(reads pass the write fence), while kopf and so the loops start only once the replica leads.
Status is written before the actions, so verdicts and re-verify bookkeeping are never lost to a
crash between the two; an action the API server refuses stops the rest and is reported in
Degraded (ChildRejected) in the same pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes import client, config
from pydantic import ValidationError

from clef_operator import labels, leader, memory, metrics
from clef_operator.actions import Action, Event
from clef_operator.api import GROUP, PLURAL, VERSION, ClefModelSpec, ClefModelStatus
from clef_operator.conditions import Stamp, carried_rejection, child_rejected, invalid_spec
from clef_operator.kube import Kube, operator_namespace
from clef_operator.observed import ModelRef, Observed
from clef_operator.rollout import Plan, plan_rollout

log = logging.getLogger("clef.operator")

# Every model is re-planned this often with no event (from the cache: no request); `clef-operator
# run --resync-seconds`.
RESYNC_SECONDS = 300.0
WORKERS = 24
MAX_BACKOFF_SECONDS = 60.0
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
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return None
    meta = obj["metadata"]
    model = ModelRef(
        name=name,
        namespace=namespace,
        uid=meta["uid"],
        generation=meta.get("generation", 0),
        annotations=dict(meta.get("annotations") or {}),
    )
    now = now or datetime.now(UTC)
    try:
        status = ClefModelStatus.model_validate(obj.get("status") or {})
    except ValidationError:
        log.warning("%s/%s: unreadable status, starting from an empty one", namespace, name)
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
    """Write status, apply the actions, write what they changed; count what the pass did."""
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


# ------------------------------------------------------------------------------- kopf


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff base: every event looks like a creation to kopf, which has no handler for it."""

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


@dataclass(frozen=True)
class Tuning:
    """`clef-operator run`'s knobs (cli), handed to kopf's start-up through its memo."""

    namespaces: tuple[str, ...] = ()
    # The safety net: every model is re-planned this often (from the cache) even with no event.
    resync_seconds: float = RESYNC_SECONDS
    # Reconciles running at once: a pass mostly waits on the API server, so more than the CPUs.
    workers: int = WORKERS


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    # Keep kopf's own bookkeeping in our annotation namespace and out of status (which the CRD's
    # schema would prune anyway).
    settings.persistence.finalizer = f"{labels.PREFIX}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=labels.PREFIX)
    # kopf keeps a copy of the spec ("diff base") to tell creations and updates apart; clef has
    # no create or update handler (the daemon is level-triggered), so none is kept: that saves a
    # patch of every new ClefModel before its daemon can start.
    settings.persistence.diffbase_storage = NoDiffBase()
    # clef posts its own events, one per decision; kopf's per-handler chatter would drown them.
    settings.posting.level = logging.WARNING
    # No dynamic scanning of CRDs and namespaces: kopf would list and watch both cluster-wide,
    # which the operator's least-privilege RBAC does not grant (kustomize/base/rbac.yaml).  The
    # resources are discovered once at start-up instead, and `clef-operator run` refuses to start
    # before the ClefModel CRD is served.
    settings.scanning.disabled = True
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    # Before the first thread allocates (`clef-operator run` did it before its own threads
    # started; again is harmless).
    memory.limit_arenas()
    tuning: Tuning = memo.get("tuning") or Tuning()
    memo.tuning = tuning
    memo.pool = ThreadPoolExecutor(max_workers=tuning.workers, thread_name_prefix="reconcile")
    # The cache `clef-operator run` started before the election (warm on a standby), else one
    # started now (kopf run directly, no election).
    watching: Watching = memo.get("watching") or start_watching(tuning)
    memo.kube = watching.kube
    memo.wakers = watching.wakers
    # Verdicts are signed with this key; without it nothing may be promoted, so start-up fails.
    # Read (or created: a write) only now that this replica leads.
    memo.kube.load_verdict_key(operator_namespace())
    # From here on a watch event wakes the model's loop.
    watching.attach(asyncio.get_running_loop())
    # kopf's start-up leaves memory free too (docs/performance.md, "Where the memory is").
    memory.touched(collect=True)


@dataclass
class Watching:
    """The informer cache (in `kube`) and the model loops its watch threads wake.  Until a loop
    is attached (kopf has started, after the election) a wake-up goes nowhere: there are no model
    loops yet, and each makes a first pass when it starts."""

    kube: Kube
    wakers: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    loop: asyncio.AbstractEventLoop | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def wake(self, namespace: str, model: str) -> None:
        """Called from the watch threads."""
        loop = self.loop
        if loop is None or loop.is_closed():  # not started, or stopping: there is nobody to wake
            return
        with contextlib.suppress(RuntimeError):  # the loop closed since the line above
            loop.call_soon_threadsafe(self._set, namespace, model)

    def _set(self, namespace: str, model: str) -> None:
        event = self.wakers.get((namespace, model))
        if event is not None:
            event.set()


def start_watching(tuning: Tuning) -> Watching:
    """Start the informer cache: every kind clef plans from, listed and then watched through the
    fenced client (reads and watches pass the fence, so a standby may run it; its writes would
    not).  `clef-operator run` calls it before campaigning for the Lease, so that a standby's
    cache is synced when it takes over: failover then costs kopf's start-up, not a list of every
    child of every model."""
    kube = Kube(api_client(pool=tuning.workers + 16))
    kube.instance = leader.identity() or kube.instance
    watching = Watching(kube)
    # Children, Services, goldens ConfigMaps, nodes and the ClefModels themselves come from these
    # watches; kopf watches ClefModels only to run one daemon per model and its deletion handler.
    kube.start_cache(tuning.namespaces, watching.wake)
    return watching


@kopf.on.login()
async def login(logger: Any, settings: kopf.OperatorSettings, **_: Any) -> kopf.AiohttpSession | None:
    """kopf's own requests (watches, its finalizer and annotations) through a session whose writes
    pass the same fence as clef's (`leader.fence_trace`)."""
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
async def stop_cache(memo: Any, **_: Any) -> None:
    memo.kube.cache.stop()
    memo.pool.shutdown(wait=False, cancel_futures=True)


# Every kopf handler here is async: a sync one runs in kopf's own thread pool, whose threads are
# started by the first deletion and live on (5 threads after 300 models were deleted).
@kopf.on.probe(id="clef-state")
async def held_state(memo: Any, **_: Any) -> dict[str, int]:
    """What the operator holds, on its liveness endpoint: objects per kind in the cache, models
    with a running loop, the cache's tombstones of deleted objects, whether the cache has synced.
    After the last model is deleted every count but nodes and Services (which are not per model)
    falls back to where it started, tombstones within `cache.GONE_SECONDS`."""
    kube: Kube | None = getattr(memo, "kube", None)
    if kube is None:
        return {}
    cache = kube.cache
    return {
        **cache.sizes(),
        "loops": len(memo.wakers),
        "tombstones": cache.tombstones(),
        "synced": int(cache.synced()),
    }


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def run_model(
    name: str, namespace: str | None, memo: Any, stopped: kopf.DaemonStopped, **_: Any
) -> None:
    assert namespace is not None, "ClefModel is namespaced"
    wake = asyncio.Event()
    memo.wakers[(namespace, name)] = wake
    metrics.MODELS.inc()
    loop = asyncio.get_running_loop()
    backoff = 1.0
    try:
        # Never plan from a half-filled cache: wait until every kind has been listed once.
        while not stopped and not memo.kube.cache.synced():
            await asyncio.sleep(0.2)
        while not stopped:
            wake.clear()
            queued = metrics.Queued(lambda: reconcile(memo.kube, namespace, name))
            try:
                requeue = await loop.run_in_executor(memo.pool, queued)
                backoff = 1.0
                memory.touched()
            except leader.Fenced as e:
                metrics.RECONCILE_ERRORS.labels(kind="fenced").inc()
                log.warning("%s/%s: %s", namespace, name, e)
                requeue, backoff = backoff, min(backoff * 2, MAX_BACKOFF_SECONDS)
            except Exception:
                metrics.RECONCILE_ERRORS.labels(kind="exception").inc()
                log.exception("%s/%s: reconcile failed; retrying in %.0fs", namespace, name, backoff)
                requeue, backoff = backoff, min(backoff * 2, MAX_BACKOFF_SECONDS)
            finally:
                queued.cancelled()
            await _sleep(wake, stopped, _next_look(requeue, memo.tuning.resync_seconds))
    finally:
        metrics.MODELS.dec()
        metrics.record_model(namespace, name, None)
        if memo.wakers.get((namespace, name)) is wake:
            del memo.wakers[(namespace, name)]
        # The cycles a deleted model leaves (kopf's per-object tasks and loggers) are collected.
        memory.touched(collect=True)


def _next_look(requeue: float | None, resync: float) -> float:
    """Seconds until the next pass with no event: what the planner asked for, else the resync."""
    return resync if requeue is None else min(max(requeue, 0.2), resync)


async def _sleep(wake: asyncio.Event, stopped: kopf.DaemonStopped, seconds: float) -> None:
    """Until woken, stopped or `seconds` passed, with no timer in between (a thousand idle
    models cost nothing until their resync)."""
    waits = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def release(name: str, namespace: str | None, spec: Mapping[str, Any], memo: Any, **_: Any) -> None:
    """An adopted Service outlives its model: hand it back with the selector it had (its
    Deployments and Jobs go with the model, by their owner references).  On the reconcile pool,
    not kopf's (see above)."""
    service = (spec.get("service") or {}).get("name")
    if not namespace or not service:
        return
    loop = asyncio.get_running_loop()
    if await loop.run_in_executor(memo.pool, memo.kube.release_service, namespace, name, service):
        log.info("%s/%s: released Service %s", namespace, name, service)
