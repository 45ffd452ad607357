"""The process's lifecycle, the only part kopf runs: start-up, login, clean-up and the liveness
probe; nothing per model (docs/architecture.md, "kopf's role").  kopf registers no resource
handler, so it watches nothing and keeps no copy of any ClefModel: clef's own manager
(`manager`: the informer cache, the work queue, the workers, leadership, metrics, memory) runs
the reconcile passes (`reconcile`).

* **Start.**  `clef-operator run` starts the cache (`start_watching`) before campaigning for the
  Lease; kopf, and so the queue and its workers (`configure`), start only once the replica leads.
* **Stop.**  kopf's clean-up stops the workers and the cache.
"""

from __future__ import annotations

from typing import Any

import kopf

from clef_operator.apiclient import api_client, operator_namespace
from clef_operator.kube import Kube
from clef_operator.manager import leader, memory
from clef_operator.manager.workers import Tuning, Watching, Workers
from clef_operator.reconcile import reconcile


def start_watching(tuning: Tuning) -> Watching:
    """Start the informer cache: every kind clef plans from, listed and then watched through the
    fenced client (reads and watches pass the fence, so a standby may run it; its writes would
    not).  `clef-operator run` calls it before campaigning for the Lease, so that a standby's
    cache is synced when it takes over: failover then costs kopf's start-up, not a list of every
    child of every model."""
    kube = Kube(api_client(pool=tuning.workers + 16))
    kube.writer.instance = leader.identity() or kube.writer.instance
    kube.warm_up()
    memory.on_quiet(kube.close_idle_connections)
    memory.on_quiet(kube.cache.compact)
    watching = Watching(kube)
    kube.start_cache(tuning.namespaces, watching.wake)
    return watching


# ------------------------------------------------------------------------------- kopf


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
    memo.workers = Workers(watching, tuning, reconcile)
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
