"""The work queue that schedules reconcile passes (client-go's workqueue, in small): keys are
(namespace, name) of ClefModels; a watch event adds its model's key, a pass's "look again in N
seconds" and the resync add it for later, and a fixed number of workers take keys and run passes.

* **Deduplicated.**  A key added while it waits is not queued twice: ten events before a worker
  is free cost one pass.
* **One pass per key at a time.**  A key being processed is never handed out again until its
  worker calls `done`; added meanwhile, it is handed out once more after `done` (the pass may
  have read the world before the change that added it).
* **Later.**  `add_after` keeps one deadline per key, the earliest asked for, in one heap for all
  keys: no timer, task or thread per key, so an idle model costs a dictionary entry.
* **Backoff.**  A failing key is retried after 1 s, doubling to `MAX_BACKOFF_SECONDS`; its count
  is kept only while it fails (`succeeded` drops it).
* **Forget.**  `forget` drops everything about a key (a deleted model): nothing per model is
  kept after its deletion.

`WorkQueue` is the pure bookkeeping (a clock is injected, nothing blocks, no lock); `SharedQueue`
is the same behind a lock, with a blocking `get` for worker threads.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable

Key = tuple[str, str]

BASE_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 60.0


class WorkQueue:
    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        base_backoff: float = BASE_BACKOFF_SECONDS,
        max_backoff: float = MAX_BACKOFF_SECONDS,
    ) -> None:
        self._clock = clock
        self._base = base_backoff
        self._max = max_backoff
        self._ready: deque[Key] = deque()  # handed out in this order
        self._wanted: set[Key] = set()  # in `_ready`, or processing and to be handed out again
        self._processing: set[Key] = set()
        self._due: dict[Key, float] = {}  # add_after's deadline per key (the earliest asked for)
        self._heap: list[tuple[float, Key]] = []  # (deadline, key); stale entries skipped
        self._failures: dict[Key, int] = {}  # consecutive failures, only while a key fails

    def add(self, key: Key) -> None:
        if key in self._wanted:
            return
        self._wanted.add(key)
        if key not in self._processing:
            self._ready.append(key)

    def add_after(self, key: Key, seconds: float) -> None:
        """Add `key` in `seconds`; an earlier deadline already held for it stands."""
        if seconds <= 0:
            self.add(key)
            return
        due = self._clock() + seconds
        held = self._due.get(key)
        if held is not None and held <= due:
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, key))
        self._compact()

    def get(self) -> Key | None:
        """The next key to process (None: none is ready); it is processing until `done`."""
        self._promote()
        if not self._ready:
            return None
        key = self._ready.popleft()
        self._wanted.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: Key) -> None:
        """The pass over `key` ended; added meanwhile, it is ready again."""
        self._processing.discard(key)
        if key in self._wanted:
            self._ready.append(key)

    def retry(self, key: Key) -> float:
        """A pass over `key` failed: add it after its backoff, which doubles; the delay."""
        failures = self._failures.get(key, 0)
        delay = min(self._base * 2 ** min(failures, 32), self._max)
        self._failures[key] = failures + 1
        self.add_after(key, delay)
        return delay

    def succeeded(self, key: Key) -> None:
        """A pass over `key` went through: its backoff starts again from the base."""
        self._failures.pop(key, None)

    def forget(self, key: Key) -> None:
        """Drop everything about `key` but a pass running over it (whose `done` still comes: a key
        added after this is handed out again then)."""
        if key in self._wanted:
            self._wanted.discard(key)
            if key not in self._processing:
                self._ready.remove(key)
        self._due.pop(key, None)
        self._failures.pop(key, None)
        self._compact()

    def wait_seconds(self) -> float | None:
        """How long until a key is ready: 0 when one is, None when none is scheduled either."""
        self._promote()
        if self._ready:
            return 0.0
        if not self._heap:  # every deadline in `_due` has its entry, the head a live one
            return None
        return max(0.0, self._heap[0][0] - self._clock())

    def depth(self) -> int:
        """Keys ready and waiting for a worker."""
        return len(self._ready)

    def known(self) -> int:
        """Keys the queue holds anything about (waiting, processing, scheduled or failing)."""
        return len(self._wanted | self._processing | self._due.keys() | self._failures.keys())

    def _promote(self) -> None:
        now = self._clock()
        while self._heap and self._heap[0][0] <= now:
            due, key = heapq.heappop(self._heap)
            if self._due.get(key) == due:
                del self._due[key]
                self.add(key)
        self._drop_stale_head()

    def _drop_stale_head(self) -> None:
        """Keep the heap's head a live deadline, so that `wait_seconds` can read it."""
        while self._heap and self._due.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)

    def _compact(self) -> None:
        """Entries superseded by an earlier deadline or a `forget` stay in the heap until popped;
        rebuilt when they outnumber the live ones, so the heap stays the size of the keys."""
        if len(self._heap) > 2 * len(self._due) + 64:
            self._heap = [(due, key) for key, due in self._due.items()]
            heapq.heapify(self._heap)
        self._drop_stale_head()


class SharedQueue:
    """A `WorkQueue` for threads: watch threads add, worker threads `get` (blocking until a key is
    ready or the queue is closed)."""

    def __init__(self, queue: WorkQueue | None = None) -> None:
        self._queue = queue if queue is not None else WorkQueue()
        self._changed = threading.Condition()
        self._closed = False
        self._waiting = 0

    def add(self, key: Key) -> None:
        with self._changed:
            self._queue.add(key)
            self._changed.notify()

    def add_after(self, key: Key, seconds: float) -> None:
        with self._changed:
            self._queue.add_after(key, seconds)
            self._changed.notify()  # a waiting worker may have to wake sooner

    def get(self) -> Key | None:
        """The next key, once one is ready; None once the queue is closed."""
        with self._changed:
            while not self._closed:
                key = self._queue.get()
                if key is not None:
                    return key
                self._waiting += 1
                try:
                    self._changed.wait(self._queue.wait_seconds())
                finally:
                    self._waiting -= 1
            return None

    def waiting(self) -> int:
        """How many `get` calls are blocked on the queue now (idle workers)."""
        with self._changed:
            return self._waiting

    def done(self, key: Key) -> None:
        with self._changed:
            self._queue.done(key)
            self._changed.notify()

    def retry(self, key: Key) -> float:
        with self._changed:
            delay = self._queue.retry(key)
            self._changed.notify()
            return delay

    def succeeded(self, key: Key) -> None:
        with self._changed:
            self._queue.succeeded(key)

    def forget(self, key: Key) -> None:
        with self._changed:
            self._queue.forget(key)

    def close(self) -> None:
        """Every `get`, waiting or to come, returns None."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def depth(self) -> int:
        with self._changed:
            return self._queue.depth()

    def wait_seconds(self) -> float | None:
        """How long until a key is ready (`WorkQueue.wait_seconds`)."""
        with self._changed:
            return self._queue.wait_seconds()

    def known(self) -> int:
        with self._changed:
            return self._queue.known()
