"""Watching the API server without gaps, so "X never happened" is a proof and not a sample.

A poll, or a watch that re-lists after each event, sees states; whatever lasted less than the
interval between two looks is missed.  Here the objects are listed once and then watched from that
list's resourceVersion: the API server sends every change after it, in order, and a watch that
times out resumes from the last resourceVersion it saw (bookmarks included), which loses nothing.
Where the server cannot resume (410 Gone: the history was compacted) or the stream breaks, the
watch records the error and `check()` fails the test: re-listing would silently hide the gap.

A watch lags the API server a little.  A test that judged a state through a list or a get and then
reads the watch's changes may read them before the events that made that state arrived; it calls
`caught_up()` instead of `snapshot()` (leaving the `with` does so too).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kubernetes import watch

# How long one watch request stays open; resuming afterwards is gap-free, this only bounds how
# long `stop()` waits for the thread.
_REQUEST_SECONDS = 2


@dataclass(frozen=True)
class Change:
    """One watch event: what happened to which object, at which resourceVersion."""

    type: str  # ADDED, MODIFIED, DELETED
    obj: Any  # the typed client model, as the list call returns it
    resource_version: int

    @property
    def name(self) -> str:
        return str(_metadata(self.obj)["name"])


def _metadata(obj: Any) -> dict[str, Any]:
    """metadata of a typed client model or of a custom object (a dict)."""
    if isinstance(obj, dict):
        return dict(obj["metadata"])
    return {"name": obj.metadata.name, "resourceVersion": obj.metadata.resource_version}


def resource_version(obj: Any) -> int:
    """An object's resourceVersion as a number: the API server's storage revision, which orders
    changes across every kind stored in the same etcd (the cluster tier's clusters)."""
    return int(_metadata(obj)["resourceVersion"])


class GaplessWatch:
    """Every change to what `list_fn(*args, **kwargs)` lists, from the moment of `start()`.

    `initial` is the list's items; `changes` every event since, in the API server's order.  Use as
    a context manager; call `check()` (or leave the `with`) to fail on a watch error."""

    def __init__(self, list_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.list_fn, self.args, self.kwargs = list_fn, args, kwargs
        self.initial: list[Any] = []
        self._version = ""
        self.start_version = ""
        self.changes: list[Change] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    def start(self, from_version: str | None = None) -> GaplessWatch:
        """List, then watch from the list's resourceVersion (or `from_version`: the test of this
        class uses one the server refuses, to show that a broken watch fails)."""
        listed = self.list_fn(*self.args, **self.kwargs)
        if isinstance(listed, dict):  # custom objects
            self.initial = list(listed["items"])
            self._version = from_version or listed["metadata"]["resourceVersion"]
        else:
            self.initial = list(listed.items)
            self._version = from_version or listed.metadata.resource_version
        self.start_version = str(self._version)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(
                    self.list_fn,
                    *self.args,
                    resource_version=self._version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=_REQUEST_SECONDS,
                    **self.kwargs,
                ):
                    if event["type"] != "BOOKMARK":
                        obj = event["object"]
                        with self._changed:
                            self.changes.append(Change(event["type"], obj, resource_version(obj)))
                            self._changed.notify_all()
                # The events and bookmarks of this request moved it on; the next resumes there.
                self._version = w.resource_version or self._version
            except Exception as e:  # any failure to watch fails the test (check)
                with self._changed:
                    self.errors.append(f"{type(e).__name__}: {e}")
                    self._changed.notify_all()
                return

    def snapshot(self) -> list[Change]:
        with self._lock:
            return list(self.changes)

    def caught_up(self, timeout: float = 30) -> list[Change]:
        """The changes, once the watch has delivered every change made before this call.

        Lists now, and waits until the watch's own view agrees with the list: every listed object
        seen at its listed resourceVersion or later, and every object the watch still holds that
        the list lacks deleted (or created after the list).  Fails if the watch breaks or has not
        caught up within `timeout` seconds."""
        listed = self.list_fn(*self.args, **self.kwargs)
        if isinstance(listed, dict):
            items, version = listed["items"], int(listed["metadata"]["resourceVersion"])
        else:
            items, version = listed.items, int(listed.metadata.resource_version)
        wanted = {str(_metadata(o)["name"]): resource_version(o) for o in items}
        with self._changed:
            self._changed.wait_for(lambda: self.errors or not self._behind(wanted, version), timeout)
            behind = self._behind(wanted, version)
        self.check()
        assert not behind, f"the watch has not caught up with a list at {version} in {timeout} s: {behind}"
        return self.snapshot()

    def _behind(self, wanted: dict[str, int], version: int) -> list[str]:
        """What the changes so far lack against a list at `version` that held `wanted` (name ->
        resourceVersion).  Called holding the lock."""
        newest = {str(_metadata(o)["name"]): resource_version(o) for o in self.initial}
        held = set(newest)
        for c in self.changes:
            newest[c.name] = max(newest.get(c.name, 0), c.resource_version)
            (held.discard if c.type == "DELETED" else held.add)(c.name)
        late = [f"{n} at {v}" for n, v in wanted.items() if newest.get(n, 0) < v]
        undeleted = [f"{n} deleted" for n in held - set(wanted) if newest[n] <= version]
        return late + undeleted

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(3 * _REQUEST_SECONDS + 10)
        if self._thread.is_alive():
            self.errors.append("the watch thread did not stop")

    def check(self) -> None:
        assert not self.errors, (
            f"the watch of {getattr(self.list_fn, '__name__', self.list_fn)} from resourceVersion"
            f" {self.start_version} broke, so what happened in between is unknown: {self.errors}"
        )

    def __enter__(self) -> GaplessWatch:
        return self.start()

    def __exit__(self, exc_type: object, *_: object) -> None:
        try:
            if exc_type is None:
                self.caught_up()
        finally:
            self.stop()
        if exc_type is None:
            self.check()


def states(initial: Iterable[Any], changes: Iterable[Change]) -> Iterable[dict[str, Any]]:
    """Every state the watched set of objects went through, by name: the initial list, then one
    state after each change (so a state that lasted a millisecond is here too)."""
    current = {_metadata(o)["name"]: o for o in initial}
    yield dict(current)
    for c in changes:
        if c.type == "DELETED":
            current.pop(c.name, None)
        else:
            current[c.name] = c.obj
        yield dict(current)
