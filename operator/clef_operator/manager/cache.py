"""The informer-style cache `kube.observe` reads from: every kind clef plans from is listed once
and then watched, in a thread per kind (and namespace), into a store keyed so that observing a
model is a dictionary lookup.  Nothing is polled; a periodic resync (`workers`) re-plans from here.

* **Initial sync.**  `synced` is set only after every informer has listed its kind once; the
  reconcilers wait for it, so no plan is ever made from a half-filled cache.
* **resourceVersion.**  Each informer lists, then watches from the list's resourceVersion (with
  bookmarks, so a quiet kind's version stays fresh).  A watch the server ends is resumed from the
  last version seen; `410 Gone` (the version was compacted away) or any error means a re-list, and
  a re-list *replaces* that informer's part of the store: an object deleted while the watch was
  down is dropped, not kept as a ghost (kopf's watches, by contrast, re-list without forgetting).
* **Deletions.**  A DELETED event removes the object and, with the last object of a model, the
  model's key: no per-model state outlives the model.
* **Tags.**  A kind may tag some of its objects (`Kind.tag`: the ClefModels that carry the namespace
  anchor); the table keeps their UIDs by namespace (`Table.tagged`), updated with every put and
  drop, so finding a namespace's anchors reads no other model.
* **Read your writes.**  A write's response (`remember`) goes into the store unless the store
  already holds a newer version of that object, so the next pass does not plan from the state
  before its own write; a stale event delivered after the response cannot move it back (versions
  are compared as the integers etcd makes them; a server whose versions are not integers gets the
  watch's order).  An object deleted stays deleted for GONE_SECONDS (`gone`: the UIDs deleted
  since, at most GONE_REMEMBERED), so a late response or event does not bring it back; only a list
  does.  A tombstone is per-model state too: it expires, and the `clef-state` probe counts them.

The store holds the planner's snapshots (`observed`), not API objects: a few KiB per model, the
children's pickled (`Kind.packed`), so that a model costs few small objects while it lives.
"""

from __future__ import annotations

import logging
import pickle
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from clef_operator.manager import memory

log = logging.getLogger("clef.cache")

# A watch request is renewed after about this long (the server ends it; jitter spreads renewals).
WATCH_SECONDS = 300
# After an error, wait this long (doubling up to the cap) before listing again.
RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 30.0
# UIDs of recently deleted objects, so that a late write response cannot bring one back: a write
# racing the delete answers within a request's time, so they are kept this long (and at most
# this many per kind).
GONE_SECONDS = 120.0
GONE_REMEMBERED = 4096

Key = tuple[str, str]  # (namespace, model or object name)
Wake = Callable[[str, str], None]


def _meta(obj: Any, wire: str, attr: str) -> str:
    """A metadata field of a wire mapping (`wire`) or of the client's typed object (`attr`).  No
    `isinstance(obj, Mapping)`: an isinstance check against an ABC leaves a weak reference to the class in
    every ABC under it (again whenever any ABC registers a class), objects born during a burst of
    work that outlive it and pin the memory around them (docs/performance.md, "Memory after
    deletion")."""
    typed = getattr(obj, "metadata", None)  # a typed object's; a wire dict (or Packed) has none
    meta = obj.get("metadata", {}) if typed is None else typed
    value = meta.get(wire) if isinstance(meta, dict) else getattr(meta, attr)
    return str(value or "")


def resource_version(obj: Any) -> str:
    return _meta(obj, "resourceVersion", "resource_version")


def uid_of(obj: Any) -> str:
    return _meta(obj, "uid", "uid")


def newer_or_same(candidate: str, held: str) -> bool:
    """Whether version `candidate` of an object may replace version `held`.  Kubernetes calls
    versions opaque; etcd's are increasing integers, and where both are, they are compared, else
    the later arrival wins."""
    if candidate.isdigit() and held.isdigit():
        return int(candidate) >= int(held)
    return True


@dataclass(frozen=True)
class Kind:
    """How one kind is stored: its key (None: not stored, e.g. a pod without clef's labels),
    its snapshot, and which model an event on it wakes."""

    name: str
    key: Callable[[Any], Key | None]
    snapshot: Callable[[Any], Any]
    wakes: Callable[[Any], Key | None]
    # A label selector for the list and the watch ("": every object of the kind in scope).
    selector: str = ""
    # Held pickled: one bytes object per snapshot instead of a dataclass with its strings, dicts
    # and tuples (dozens of small objects, each in Python's object arenas, which a model's
    # deletion leaves pinned by whatever long-lived object shares an arena with them:
    # docs/performance.md, "Memory after deletion").  Unpickled on every read; only this
    # process's own snapshots are ever unpickled.
    packed: bool = False
    # Wake only when an update changes the snapshot (nodes: a heartbeat changes nothing clef reads).
    wake_on_change: bool = False
    # The objects it picks are also indexed by namespace (`Table.tagged`): the ClefModels that
    # carry the namespace anchor, so that a pass finds its namespace's without reading every model.
    tag: Callable[[Any], bool] | None = None


@dataclass
class _Entry:
    key: Key  # (namespace, ...): a re-list of one namespace drops by key[0]
    version: str
    value: Any


@dataclass
class Table:
    """One kind's store: by UID, and by key for the lookups."""

    kind: Kind
    lock: threading.RLock
    by_uid: dict[str, _Entry] = field(default_factory=dict)
    by_key: dict[Key, dict[str, Any]] = field(default_factory=dict)
    # UID -> when it was deleted (monotonic), oldest first.
    gone: OrderedDict[str, float] = field(default_factory=OrderedDict)
    # namespace -> UIDs of the objects `kind.tag` picked (none kept for a namespace with none).
    tags: dict[str, set[str]] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic

    def get(self, key: Key) -> list[Any]:
        with self.lock:
            held = list(self.by_key.get(key, {}).values())
        return [self._unpack(v) for v in held]

    def _pack(self, value: Any) -> Any:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL) if self.kind.packed else value

    def _unpack(self, stored: Any) -> Any:
        return pickle.loads(stored) if self.kind.packed else stored

    def keys(self) -> list[Key]:
        with self.lock:
            return list(self.by_key)

    def tagged(self, namespace: str) -> list[Any]:
        """The objects of `namespace` that `kind.tag` picked (a snapshot each)."""
        with self.lock:
            held = [self.by_uid[uid].value for uid in self.tags.get(namespace, ())]
        return [self._unpack(v) for v in held]

    def values(self) -> list[Any]:
        """Every object held (a snapshot each)."""
        with self.lock:
            held = [v for by_uid in self.by_key.values() for v in by_uid.values()]
        return [self._unpack(v) for v in held]

    def put(self, obj: Any, listed: bool = False) -> Key | None:
        """Store `obj` unless a newer version is held or it was deleted since (a late write
        response, an event older than the delete); a list is the truth and always goes in.
        Returns the key it was stored under."""
        uid = uid_of(obj)
        with self.lock:
            if uid in self.gone and not listed:
                return None
            held = self.by_uid.get(uid)
            if held is not None and not newer_or_same(resource_version(obj), held.version):
                return None
            self._drop(uid)
            key = self.kind.key(obj)
            if key is None:
                return None
            entry = _Entry(key, resource_version(obj), self._pack(self.kind.snapshot(obj)))
            self.by_uid[uid] = entry
            self.by_key.setdefault(key, {})[uid] = entry.value
            if self.kind.tag is not None and self.kind.tag(obj):
                self.tags.setdefault(key[0], set()).add(uid)
            self.gone.pop(uid, None)
            return key

    def delete(self, obj: Any) -> None:
        uid = uid_of(obj)
        with self.lock:
            self._drop(uid)
            self._bury(uid)

    def forget(self, key: Key, which: Callable[[Any], bool]) -> None:
        """Delete the objects under `key` that `which` picks (a delete this process made)."""
        with self.lock:
            for uid, value in list(self.by_key.get(key, {}).items()):
                if which(self._unpack(value)):
                    self._drop(uid)
                    self._bury(uid)

    def _bury(self, uid: str) -> None:
        self.gone[uid] = self.clock()
        self.gone.move_to_end(uid)
        self._expire()

    def _expire(self) -> None:
        oldest = self.clock() - GONE_SECONDS
        while self.gone and (len(self.gone) > GONE_REMEMBERED or next(iter(self.gone.values())) < oldest):
            self.gone.popitem(last=False)

    def tombstones(self) -> int:
        """Deleted UIDs still remembered (none GONE_SECONDS after the last delete)."""
        with self.lock:
            self._expire()
            return len(self.gone)

    def _drop(self, uid: str) -> None:
        entry = self.by_uid.pop(uid, None)
        if entry is None:
            return
        values = self.by_key.get(entry.key)
        if values is not None:
            values.pop(uid, None)
            if not values:
                del self.by_key[entry.key]
        tagged = self.tags.get(entry.key[0])
        if tagged is not None:
            tagged.discard(uid)
            if not tagged:
                del self.tags[entry.key[0]]

    def replace(self, namespace: str | None, objs: list[Any]) -> None:
        """A (re-)list: what `namespace` (None: all) holds is exactly `objs`."""
        listed = {uid_of(o) for o in objs}
        with self.lock:
            stale = [
                uid
                for uid, entry in self.by_uid.items()
                if (namespace is None or entry.key[0] == namespace) and uid not in listed
            ]
            for uid in stale:
                self._drop(uid)
            for obj in objs:
                self.put(obj, listed=True)

    def __len__(self) -> int:
        with self.lock:
            return len(self.by_uid)

    def compact(self) -> None:
        """Copy the table's dicts, each sized to what it holds now: a dict never shrinks as
        entries go, so after 1,000 models were deleted each would keep room for them (tables of
        tens of KiB each, per-model state in all but name)."""
        with self.lock:
            self._expire()
            self.by_uid = dict(self.by_uid)
            self.by_key = dict(self.by_key)
            self.gone = OrderedDict(self.gone)
            self.tags = dict(self.tags)


class Informer(threading.Thread):
    """List, then watch, one kind in one namespace (None: all) into its table, for ever."""

    def __init__(self, table: Table, list_fn: Callable[..., Any], namespace: str | None, wake: Wake) -> None:
        super().__init__(name=f"informer-{table.kind.name}-{namespace or 'all'}", daemon=True)
        self.table = table
        self.list_fn = list_fn
        self.namespace = namespace
        self.wake = wake
        self.listed = threading.Event()
        self.stopping = threading.Event()
        self.version = ""  # the last resourceVersion seen (list or event)

    def _scope(self) -> tuple[Any, ...]:
        return (self.namespace,) if self.namespace is not None else ()

    def _filter(self) -> dict[str, str]:
        selector = self.table.kind.selector
        return {"label_selector": selector} if selector else {}

    def run(self) -> None:
        delay = RETRY_SECONDS
        while not self.stopping.is_set():
            try:
                version = self._list()
                delay = RETRY_SECONDS
                self._watch(version)
            except ApiException as e:
                if e.status != 410:
                    log.warning("%s: %s %s; listing again in %.0fs", self.name, e.status, e.reason, delay)
                    self.stopping.wait(delay)
                    delay = min(delay * 2, MAX_RETRY_SECONDS)
            except Exception as e:  # a dropped connection, a decoding error: list again
                log.warning("%s: %s; listing again in %.0fs", self.name, e, delay)
                self.stopping.wait(delay)
                delay = min(delay * 2, MAX_RETRY_SECONDS)

    def _list(self) -> str:
        result: Any = self.list_fn(*self._scope(), **self._filter())
        items = result["items"] if isinstance(result, dict) else result.items
        before = set(self.table.keys())
        self.table.replace(self.namespace, list(items or []))
        if self.listed.is_set():
            # A re-list: whatever changed while the watch was down is unknown, so every model
            # the kind touched before or after it looks again.
            for key in before | set(self.table.keys()):
                self._wake_key(key)
        self.listed.set()
        memory.touched()  # a list's response (and a re-list's dropped objects) are freed now
        return resource_version(result)

    def _watch(self, version: str) -> None:
        self.version = version
        while not self.stopping.is_set():
            w = watch.Watch()
            seconds = int(WATCH_SECONDS * random.uniform(0.8, 1.0))
            for event in w.stream(
                self.list_fn,
                *self._scope(),
                **self._filter(),
                resource_version=self.version,
                allow_watch_bookmarks=True,
                timeout_seconds=seconds,
            ):
                self._handle(event)
                if self.stopping.is_set():
                    w.stop()
                    return

    def _handle(self, event: Mapping[str, Any]) -> None:
        kind, obj = event["type"], event["object"]
        # The next watch resumes from here.  Kept here, not read from the client's Watch: for a
        # list function it cannot type (the custom-object listers) it never records a version,
        # so every renewal resumed from the list's, and once etcd compacted that away the answer
        # was 410 and a re-list of every ClefModel (~15 MB at 1,000 models, every few minutes).
        self.version = resource_version(obj) or self.version
        if kind == "BOOKMARK":
            return
        woken = self.table.kind.wakes(obj)
        if woken is not None and kind == "MODIFIED" and self.table.kind.wake_on_change:
            key = self.table.kind.key(obj)
            if key is not None and self.table.get(key) == [self.table.kind.snapshot(obj)]:
                woken = None
        if kind == "DELETED":
            self.table.delete(obj)
            memory.touched()  # the children of deleted models go after the models' loops ended
        else:
            self.table.put(obj)
        if woken is not None:
            self._wake_key(woken)

    def _wake_key(self, key: Key) -> None:
        try:
            self.wake(*key)
        except Exception:  # a wake-up is a hint; the resync still comes
            log.exception("%s: waking %s/%s failed", self.name, *key)


class Cache:
    """The tables and their informers; `synced` once every informer has listed."""

    def __init__(self, kinds: Mapping[str, Kind]) -> None:
        self.lock = threading.RLock()
        self.tables = {name: Table(kind, self.lock) for name, kind in kinds.items()}
        self.informers: list[Informer] = []

    def add(self, kind: str, list_fn: Callable[..., Any], namespace: str | None, wake: Wake) -> None:
        self.informers.append(Informer(self.tables[kind], list_fn, namespace, wake))

    def start(self) -> None:
        for informer in self.informers:
            informer.start()

    def stop(self) -> None:
        for informer in self.informers:
            informer.stopping.set()

    def synced(self) -> bool:
        return all(i.listed.is_set() for i in self.informers)

    def __getitem__(self, kind: str) -> Table:
        return self.tables[kind]

    def sizes(self) -> dict[str, int]:
        return {name: len(t) for name, t in self.tables.items()}

    def tombstones(self) -> int:
        return sum(t.tombstones() for t in self.tables.values())

    def compact(self) -> None:
        """Every table's dicts sized to what they hold (`Table.compact`); when work goes quiet."""
        for table in self.tables.values():
            table.compact()


def custom_lister(
    api: client.CustomObjectsApi, group: str, version: str, plural: str, all_namespaces: bool
) -> Callable[..., Any]:
    """A list function for a custom resource that `watch.Watch` can stream (it returns dicts)."""
    if all_namespaces:

        def list_all(**kw: Any) -> Any:
            return api.list_cluster_custom_object(group, version, plural, **kw)

        return list_all

    def list_in(namespace: str, **kw: Any) -> Any:
        return api.list_namespaced_custom_object(group, version, namespace, plural, **kw)

    return list_in
