"""The kopf wiring: one reconcile loop per ClefModel, woken by anything that happens to it or to
its children, and a periodic resync.  A deleted ClefModel hands back a Service it adopted
(`release`).

The loop is a kopf daemon, so each ClefModel has exactly one reconciler at a time (no two plans
for one model ever race).  Watches on the children only *wake* the loop; the loop re-reads the
world (`kube.observe`), asks the planner, and applies its answer.  Status is written before the
actions, so verdicts and re-verify bookkeeping are never lost to a crash between the two; an
action the API server refuses stops the rest and is reported in Degraded (ChildRejected) in the
same pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes import client, config
from pydantic import ValidationError

from clef_operator import labels, leader, metrics
from clef_operator.actions import Action, Event
from clef_operator.api import GROUP, PLURAL, VERSION, ClefModelSpec, ClefModelStatus
from clef_operator.conditions import Stamp, carried_rejection, child_rejected, invalid_spec
from clef_operator.kube import Kube, operator_namespace
from clef_operator.observed import ModelRef, Observed
from clef_operator.rollout import Plan, plan_rollout

log = logging.getLogger("clef.operator")

RESYNC_SECONDS = 30.0
MAX_BACKOFF_SECONDS = 60.0


def api_client(fenced: bool = True) -> client.ApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG).  Fenced:
    every write refused while this replica cannot prove it holds the Lease (`leader`)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    api = leader.FencedApiClient() if fenced else client.ApiClient()
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
        after = after.model_copy(
            update={
                "conditions": child_rejected(plan.status.conditions, refused, Stamp(now, model.generation))
            }
        )
    if after != before:
        kube.write_status(model, after)
    if refused:
        metrics.RECONCILE_ERRORS.labels(kind="rejected").inc()
    metrics.record_pass(
        metrics.derive_pass(status, after, plan.actions, observed, datetime.now(UTC), bool(refused))
    )
    metrics.record_model(model.namespace, model.name, after)
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


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    # Keep kopf's own bookkeeping in our annotation namespace and out of status (which the CRD's
    # schema would prune anyway).
    settings.persistence.finalizer = f"{labels.PREFIX}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=labels.PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=labels.PREFIX, key="last-handled-configuration"
    )
    # clef posts its own events, one per decision; kopf's per-handler chatter would drown them.
    settings.posting.level = logging.WARNING
    # No dynamic scanning of CRDs and namespaces: kopf would list and watch both cluster-wide,
    # which the operator's least-privilege RBAC does not grant (kustomize/base/rbac.yaml).  The
    # resources are discovered once at start-up instead, and `clef-operator run` refuses to start
    # before the ClefModel CRD is served.
    settings.scanning.disabled = True
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    memo.kube = Kube(api_client())
    memo.kube.instance = leader.identity() or memo.kube.instance
    # Verdicts are signed with this key; without it nothing may be promoted, so start-up fails.
    memo.kube.load_verdict_key(operator_namespace())
    memo.wakers = {}


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


def _wake(memo: Any, namespace: str | None, model: str | None) -> None:
    if namespace and model:
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
    metrics.MODELS.inc()
    backoff = 1.0
    try:
        while not stopped:
            wake.clear()
            queued = metrics.Queued(lambda: reconcile(memo.kube, namespace, name))
            try:
                requeue = await asyncio.to_thread(queued)
                backoff = 1.0
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
            timeout = RESYNC_SECONDS if requeue is None else min(max(requeue, 0.2), RESYNC_SECONDS)
            deadline = time.monotonic() + timeout
            while not stopped and not wake.is_set() and time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        wake.wait(), timeout=min(1.0, max(deadline - time.monotonic(), 0.01))
                    )
    finally:
        metrics.MODELS.dec()
        metrics.record_model(namespace, name, None)
        if memo.wakers.get((namespace, name)) is wake:
            del memo.wakers[(namespace, name)]


@kopf.on.delete(GROUP, VERSION, PLURAL)
def release(name: str, namespace: str | None, spec: Mapping[str, Any], memo: Any, **_: Any) -> None:
    """An adopted Service outlives its model: hand it back with the selector it had (its
    Deployments and Jobs go with the model, by their owner references)."""
    service = (spec.get("service") or {}).get("name")
    if namespace and service and memo.kube.release_service(namespace, name, service):
        log.info("%s/%s: released Service %s", namespace, name, service)


@kopf.on.event(GROUP, VERSION, PLURAL)
def model_changed(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    _wake(memo, namespace, name)


@kopf.on.event("apps", "v1", "deployments", labels={labels.MANAGED_BY: labels.MANAGED_BY_VALUE})
def deployment_changed(namespace: str | None, labels: Mapping[str, str], memo: Any, **_: Any) -> None:
    _wake(memo, namespace, labels.get(_MODEL))


@kopf.on.event("batch", "v1", "jobs", labels={labels.MANAGED_BY: labels.MANAGED_BY_VALUE})
def job_changed(namespace: str | None, labels: Mapping[str, str], memo: Any, **_: Any) -> None:
    _wake(memo, namespace, labels.get(_MODEL))


@kopf.on.event("v1", "pods", labels={labels.MODEL: kopf.PRESENT})
def pod_changed(namespace: str | None, labels: Mapping[str, str], memo: Any, **_: Any) -> None:
    _wake(memo, namespace, labels.get(_MODEL))


@kopf.on.event("v1", "services", annotations={labels.SERVICE_MODEL: kopf.PRESENT})
def service_changed(namespace: str | None, annotations: Mapping[str, str], memo: Any, **_: Any) -> None:
    _wake(memo, namespace, annotations.get(_SERVICE_MODEL))


# The handlers' `labels` parameter (kopf passes it by that name) shadows the module.
_MODEL = labels.MODEL
_SERVICE_MODEL = labels.SERVICE_MODEL
