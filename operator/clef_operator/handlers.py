"""The kopf wiring: one reconcile loop per ClefModel, woken by anything that happens to it or to
its children, and a periodic resync.  A deleted ClefModel hands back a Service it adopted
(`release`).

The loop is a kopf daemon, so each ClefModel has exactly one reconciler at a time (no two plans
for one model ever race).  The informer cache (`cache`, started here) watches the ClefModels and
their children; a change wakes the model's loop, which reads the world from the cache
(`kube.read_model`, `kube.observe`: no request), asks the planner, and applies its answer through
the API server.  With no event a model is re-planned every `resync_seconds`, from the cache.  Status is written before the
actions, so verdicts and re-verify bookkeeping are never lost to a crash between the two; an
action the API server refuses stops the rest and is reported in Degraded (ChildRejected) in the
same pass.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes import client, config
from pydantic import ValidationError

from clef_operator import labels, memory
from clef_operator.actions import Action, Event
from clef_operator.api import GROUP, PLURAL, VERSION, ClefModelSpec, ClefModelStatus
from clef_operator.conditions import Stamp, carried_rejection, child_rejected, invalid_spec
from clef_operator.kube import Kube, operator_namespace
from clef_operator.observed import ModelRef
from clef_operator.rollout import plan_rollout

log = logging.getLogger("clef.operator")

# Every model is re-planned this often with no event (from the cache: no request); `clef-operator
# run --resync-seconds`.
RESYNC_SECONDS = 300.0
WORKERS = 24
MAX_BACKOFF_SECONDS = 60.0
# Memory is handed back this long after the last pass (`memory.trim`).
TRIM_AFTER_SECONDS = 5.0
TRIM_EVERY_SECONDS = 30.0


def api_client(pool: int | None = None) -> client.ApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG); `pool`
    connections kept open (one per reconcile worker and watch)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    if pool is not None:
        configuration.connection_pool_maxsize = pool
    return client.ApiClient(configuration)


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
    before = plan.status.model_copy(
        update={"conditions": carried_rejection(status.conditions, plan.status.conditions)}
    )
    if before != status:
        kube.write_status(model, before)
    refused = _apply_all(kube, model, plan.actions)
    after = plan.status
    if refused:
        after = after.model_copy(
            update={
                "conditions": child_rejected(plan.status.conditions, refused, Stamp(now, model.generation))
            }
        )
    if after != before:
        kube.write_status(model, after)
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
    # Before the first thread (the reconcile pool, the watches) allocates.
    memory.limit_arenas()
    memo.trim, memo.trimmed_at, memo.trimmer, memo.deleted = None, 0.0, None, False
    tuning: Tuning = memo.get("tuning") or Tuning()
    memo.tuning = tuning
    memo.pool = ThreadPoolExecutor(max_workers=tuning.workers, thread_name_prefix="reconcile")
    memo.wakers = {}
    memo.kube = Kube(api_client(pool=tuning.workers + 16))
    # Verdicts are signed with this key; without it nothing may be promoted, so start-up fails.
    memo.kube.load_verdict_key(operator_namespace())
    loop = asyncio.get_running_loop()

    def wake(namespace: str, model: str) -> None:  # called from the watch threads
        if not loop.is_closed():  # the operator is stopping: there is nobody to wake
            loop.call_soon_threadsafe(_wake, memo, namespace, model)

    # Children, Services, nodes and the ClefModels themselves come from these watches; kopf
    # watches ClefModels only to run one daemon per model and its deletion handler.
    memo.kube.start_cache(tuning.namespaces, wake)


@kopf.on.cleanup()
async def stop_cache(memo: Any, **_: Any) -> None:
    memo.kube.cache.stop()
    memo.pool.shutdown(wait=False, cancel_futures=True)


@kopf.on.probe(id="clef-state")
def held_state(memo: Any, **_: Any) -> dict[str, int]:
    """What the operator holds, on its liveness endpoint: objects per kind in the cache, models
    with a running loop, whether the cache has synced.  After the last model is deleted every
    count but nodes and Services (which are not per model) falls back to where it started."""
    kube: Kube | None = getattr(memo, "kube", None)
    if kube is None:
        return {}
    return {**kube.cache.sizes(), "loops": len(memo.wakers), "synced": int(kube.cache.synced())}


def _wake(memo: Any, namespace: str, model: str) -> None:
    event = memo.wakers.get((namespace, model))
    if event is not None:
        event.set()


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def run_model(
    name: str, namespace: str | None, memo: Any, stopped: kopf.DaemonStopped, **_: Any
) -> None:
    assert namespace is not None, "ClefModel is namespaced"
    wake = asyncio.Event()
    memo.wakers[(namespace, name)] = wake
    loop = asyncio.get_running_loop()
    backoff = 1.0
    try:
        # Never plan from a half-filled cache: wait until every kind has been listed once.
        while not stopped and not memo.kube.cache.synced():
            await asyncio.sleep(0.2)
        while not stopped:
            wake.clear()
            try:
                requeue = await loop.run_in_executor(memo.pool, reconcile, memo.kube, namespace, name)
                backoff = 1.0
                _trim_soon(memo, loop)
            except Exception:
                log.exception("%s/%s: reconcile failed; retrying in %.0fs", namespace, name, backoff)
                requeue, backoff = backoff, min(backoff * 2, MAX_BACKOFF_SECONDS)
            await _sleep(wake, stopped, _next_look(requeue, memo.tuning.resync_seconds))
    finally:
        if memo.wakers.get((namespace, name)) is wake:
            del memo.wakers[(namespace, name)]
        memo.deleted = True
        _trim_soon(memo, loop)


def _trim_soon(memo: Any, loop: asyncio.AbstractEventLoop) -> None:
    """After a burst of passes (a rollout of many models, their deletion), hand the memory the
    burst used back (`memory.trim`) once no pass has ended for TRIM_AFTER_SECONDS; at most one
    trim every TRIM_EVERY_SECONDS, and never two at once."""
    if memo.trim is not None:
        memo.trim.cancel()
    earliest = memo.trimmed_at + TRIM_EVERY_SECONDS
    memo.trim = loop.call_at(max(loop.time() + TRIM_AFTER_SECONDS, earliest), _trim, memo, loop)


def _trim(memo: Any, loop: asyncio.AbstractEventLoop) -> None:
    memo.trim, memo.trimmed_at = None, loop.time()
    if memo.trimmer is None or memo.trimmer.done():
        memo.trimmer = loop.run_in_executor(None, memory.trim, memo.deleted)
        memo.deleted = False


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
def release(name: str, namespace: str | None, spec: Mapping[str, Any], memo: Any, **_: Any) -> None:
    """An adopted Service outlives its model: hand it back with the selector it had (its
    Deployments and Jobs go with the model, by their owner references)."""
    service = (spec.get("service") or {}).get("name")
    if namespace and service and memo.kube.release_service(namespace, name, service):
        log.info("%s/%s: released Service %s", namespace, name, service)
