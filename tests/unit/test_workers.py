"""manager.workers.Workers and Watching: the shell between the cache's watch threads, the work queue and
`reconcile` (replaced here by a recorder: `reconcile` itself is tested in test_reconcile).  The
cache is filled by hand, as its watches would; no request is made."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from clef_operator.kube import Kube
from clef_operator.manager import metrics
from clef_operator.manager.workers import Tuning, Watching, Workers
from clef_operator.manager.workqueue import SharedQueue, WorkQueue


def model(name: str, rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": rv}}


def sample(metric: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(metric, labels or None) or 0.0


def until(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Passes:
    """Stands in for `reconcile.reconcile`: records each pass; `fail` raises for those names."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.fail: set[str] = set()
        self.requeue: float | None = None
        self.lock = threading.Lock()

    def __call__(self, kube: Kube, namespace: str, name: str) -> float | None:
        with self.lock:
            self.seen.append(name)
        if name in self.fail:
            raise RuntimeError("the API server said no")
        return self.requeue

    def count(self, name: str) -> int:
        with self.lock:
            return self.seen.count(name)


@pytest.fixture
def running() -> Iterator[tuple[Watching, Passes]]:
    passes = Passes()
    # No informer added: the cache counts as synced.  A short backoff, so that retries come soon.
    queue = SharedQueue(WorkQueue(base_backoff=0.05, max_backoff=0.2))
    watching = Watching(Kube(client.ApiClient()), queue)
    workers = Workers(watching, Tuning(workers=2, resync_seconds=300.0), passes)
    watching.kube.cache["clefmodels"].put(model("a"))
    watching.kube.cache["clefmodels"].put(model("b"))
    # A standby's cache: its events queue nothing (no worker runs yet).
    watching.wake("ns", "a")
    assert watching.queue.known() == 0
    watching.attach()
    workers.start()
    yield watching, passes
    workers.stop()


def test_every_cached_model_gets_a_first_pass_then_waits_for_its_resync(
    running: tuple[Watching, Passes],
) -> None:
    watching, passes = running
    assert until(lambda: passes.count("a") == 1 and passes.count("b") == 1)
    # Both scheduled for the resync: known, not queued.
    assert until(lambda: sample("clef_models") == 2 and sample("clef_reconcile_queue_depth") == 0)
    # No pass without an event before the resync: the next key is due 300 s from now.
    soonest = watching.queue.wait_seconds()
    assert soonest is not None and soonest > 290, soonest
    assert passes.count("a") == 1


def test_an_event_queues_its_model(running: tuple[Watching, Passes]) -> None:
    watching, passes = running
    assert until(lambda: passes.count("a") == 1)
    watching.wake("ns", "a")
    assert until(lambda: passes.count("a") == 2)


def test_a_model_gone_from_the_cache_is_forgotten_after_its_pass(running: tuple[Watching, Passes]) -> None:
    watching, passes = running
    assert until(lambda: watching.queue.known() == 2 and len(passes.seen) == 2)
    watching.kube.cache["clefmodels"].delete(model("a"))
    watching.wake("ns", "a")  # the DELETED event
    assert until(lambda: watching.queue.known() == 1)
    assert passes.count("a") == 2
    # An event for a model that does not exist (a leftover child's) leaves nothing either.
    watching.wake("ns", "never-was")
    assert until(lambda: passes.count("never-was") == 1)
    assert until(lambda: watching.queue.known() == 1)


def test_a_failing_pass_is_retried_with_backoff_and_counted(running: tuple[Watching, Passes]) -> None:
    watching, passes = running
    before = sample("clef_reconcile_errors_total", kind="exception")
    passes.fail.add("c")
    watching.kube.cache["clefmodels"].put(model("c"))
    watching.wake("ns", "c")
    assert until(lambda: passes.count("c") == 2, seconds=10), "retried after its backoff"
    assert sample("clef_reconcile_errors_total", kind="exception") >= before + 2
    passes.fail.clear()
    assert until(lambda: passes.count("c") == 3, seconds=10), "and again, after a longer one"
    # A pass that went through waits for the resync: nothing is due before it.
    assert until(lambda: (watching.queue.wait_seconds() or 0) > 290), watching.queue.wait_seconds()
    assert passes.count("c") == 3


def test_a_requeue_from_the_planner_comes_back(running: tuple[Watching, Passes]) -> None:
    watching, passes = running
    assert until(lambda: len(passes.seen) == 2)
    passes.requeue = 0.2
    watching.wake("ns", "a")
    assert until(lambda: passes.count("a") >= 4, seconds=10)


def test_workers_wait_for_the_cache_to_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    passes = Passes()
    watching = Watching(Kube(client.ApiClient()))
    synced = threading.Event()
    asked: list[bool] = []

    def is_synced() -> bool:
        asked.append(synced.is_set())
        return asked[-1]

    monkeypatch.setattr(watching.kube.cache, "synced", is_synced)
    watching.kube.cache["clefmodels"].put(model("a"))
    watching.attach()
    workers = Workers(watching, Tuning(workers=1, resync_seconds=300.0), passes)
    workers.start()
    try:
        watching.wake("ns", "a")
        # The start-up has found the cache unsynced twice (0.2 s apart) and started no worker.
        assert until(lambda: asked.count(False) >= 2)
        assert passes.seen == [] and watching.queue.waiting() == 0, "no plan from a half-filled cache"
        synced.set()
        assert until(lambda: passes.count("a") == 1)
        # The worker is back in get() and the only key is due at the resync: the event and the
        # first pass were one pass, and no second one is queued.
        assert until(lambda: watching.queue.waiting() == 1 and (watching.queue.wait_seconds() or 0) > 290)
        assert passes.count("a") == 1, "the event and the first pass are one pass"
    finally:
        workers.stop()
