"""The workers: threads that take models' keys from the work queue (`workqueue`) and run one
reconcile pass over each (`clef_operator.reconcile`, handed in: this package knows nothing of the
planner).

* **Events.**  The informer cache (`cache`) lists and watches the ClefModels and their children; a
  change adds its model's key to the work queue through `Watching.wake`, deduplicated.
* **Passes.**  `tuning.workers` threads take keys from the queue and run the pass (one pass per key
  at a time: no two plans for one model ever race).  A pass reads the world from the cache (no
  request), asks the planner and applies its answer through the API server; its "look again in N
  seconds" (or, with none, the resync, `resync_seconds`) goes back to the queue's heap, and a
  failure is retried with a per-key backoff.  An idle model costs one entry in that heap.
* **Start.**  The workers start only once the cache has synced (never a plan from a half-filled
  cache), and every cached model is queued once then.  With leader election the cache runs on a
  standby too (reads pass the write fence), while the queue and its workers start only once the
  replica leads.  A model gone from the cache after its pass is forgotten: nothing per model is
  kept after the deletion.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from clef_operator.manager import leader, memory, metrics
from clef_operator.manager.workqueue import Key, SharedQueue

if TYPE_CHECKING:
    from clef_operator.kube import Kube

log = logging.getLogger("clef.operator")

# Every model is re-planned this often with no event (from the cache: no request); `clef-operator
# run --resync-seconds`.
RESYNC_SECONDS = 300.0
WORKERS = 24

# One pass over one model (`clef_operator.reconcile.reconcile`): when to look again, None for
# only on the next event or resync.
Pass = Callable[["Kube", str, str], "float | None"]


@dataclass(frozen=True)
class Tuning:
    """`clef-operator run`'s knobs (cli), handed to kopf's start-up through its memo."""

    namespaces: tuple[str, ...] = ()
    # The safety net: every model is re-planned this often (from the cache) even with no event.
    resync_seconds: float = RESYNC_SECONDS
    # Passes running at once: a pass mostly waits on the API server, so more than the CPUs.
    workers: int = WORKERS


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
    """`tuning.workers` threads that take keys from the queue and run `reconcile` over each."""

    def __init__(self, watching: Watching, tuning: Tuning, reconcile: Pass) -> None:
        self.kube = watching.kube
        self.reconcile = reconcile
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
            requeue = self.reconcile(self.kube, namespace, name)
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
