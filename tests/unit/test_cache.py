"""The informer cache's store (cache.Table): what a watch event, a write's response, a re-list and
a delete do to it.  The watches themselves run in the cluster tier (test_scale, and every
operator test, which now reads only from this cache)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from kubernetes import client

from clef_operator import labels
from clef_operator.manager import cache
from clef_operator.snapshots import KINDS


def deployment(
    name: str, model: str, rv: str, uid: str = "", replicas: int = 1, ns: str = "ns"
) -> client.V1Deployment:
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(
            name=name,
            namespace=ns,
            uid=uid or f"uid-{name}",
            resource_version=rv,
            labels={labels.MODEL: model},
            owner_references=[
                client.V1OwnerReference(api_version="v1", kind="ClefModel", name=model, uid=f"model-{model}")
            ],
        ),
        spec=client.V1DeploymentSpec(
            replicas=replicas, selector=client.V1LabelSelector(), template=client.V1PodTemplateSpec()
        ),
    )


def table(kind: str = "deployments") -> cache.Table:
    return cache.Table(KINDS[kind], threading.RLock())


def replicas(t: cache.Table, model: str = "m") -> list[int]:
    return [state.replicas for _, state in t.get(("ns", model))]


def test_a_newer_version_replaces_an_older_one_and_never_the_reverse() -> None:
    t = table()
    t.put(deployment("m-a", "m", "10", replicas=1))
    t.put(deployment("m-a", "m", "12", replicas=2))  # e.g. this operator's write, its response
    t.put(deployment("m-a", "m", "11", replicas=3))  # a watch event from before that write
    assert replicas(t) == [2]
    t.put(deployment("m-a", "m", "13", replicas=0))
    assert replicas(t) == [0]


def test_versions_that_are_not_integers_go_by_arrival() -> None:
    assert cache.newer_or_same("b", "a") and cache.newer_or_same("a", "b")
    assert cache.newer_or_same("7", "7") and not cache.newer_or_same("6", "7")


def test_a_deleted_object_and_its_models_key_are_gone_and_stay_gone() -> None:
    t = table()
    d = deployment("m-a", "m", "10")
    t.put(d)
    t.delete(d)
    assert t.get(("ns", "m")) == [] and t.keys() == [] and len(t) == 0
    # A write's response or an event older than the delete does not bring it back ...
    assert t.put(deployment("m-a", "m", "11")) is None
    assert len(t) == 0
    # ... a list (the truth) does.
    t.replace("ns", [deployment("m-a", "m", "20")])
    assert replicas(t) == [1]


def test_a_relist_drops_what_was_deleted_while_the_watch_was_down_in_its_namespace_only() -> None:
    t = table()
    t.put(deployment("m-a", "m", "10"))
    t.put(deployment("m-b", "m", "11"))
    t.put(deployment("x-a", "x", "12", ns="other"))
    t.replace("ns", [deployment("m-b", "m", "15")])
    assert [s.name for _, s in t.get(("ns", "m"))] == ["m-b"]
    assert [s.name for _, s in t.get(("other", "x"))] == ["x-a"]
    t.replace(None, [])
    assert len(t) == 0 and t.keys() == []


def test_an_object_whose_model_label_changed_moves_to_the_new_key() -> None:
    t = table()
    t.put(deployment("d", "m", "10", uid="u"))
    t.put(deployment("d", "n", "11", uid="u"))
    assert t.get(("ns", "m")) == [] and len(t.get(("ns", "n"))) == 1
    # Without clef's model label it is not stored at all.
    unlabelled = deployment("d", "n", "12", uid="u")
    unlabelled.metadata.labels = {}
    t.put(unlabelled)
    assert len(t) == 0 and t.keys() == []


def test_forget_removes_what_this_operator_deleted() -> None:
    t = table()
    t.put(deployment("m-a", "m", "10"))
    t.put(deployment("m-b", "m", "11"))
    t.forget(("ns", "m"), lambda value: value[1].name == "m-a")
    assert [s.name for _, s in t.get(("ns", "m"))] == ["m-b"]
    assert t.put(deployment("m-a", "m", "12")) is None


def test_the_gone_set_is_bounded_in_number_and_in_time() -> None:
    now = [1000.0]
    t = cache.Table(KINDS["deployments"], threading.RLock(), clock=lambda: now[0])
    for i in range(cache.GONE_REMEMBERED + 10):
        t.delete(deployment(f"d{i}", "m", "1"))
    assert t.tombstones() == cache.GONE_REMEMBERED
    # Nothing is kept for a deleted object once its tombstone expired: per-model state too.
    now[0] += cache.GONE_SECONDS + 1
    assert t.tombstones() == 0
    # A tombstone younger than that still keeps a late response out.
    t.delete(deployment("late", "m", "5"))
    assert t.put(deployment("late", "m", "4")) is None and t.tombstones() == 1


def test_custom_objects_are_stored_by_namespace_and_name() -> None:
    t = table("clefmodels")
    body: dict[str, Any] = {"metadata": {"name": "m", "namespace": "ns", "uid": "u", "resourceVersion": "5"}}
    assert t.put(body) == ("ns", "m")
    newer = {**body, "metadata": {**body["metadata"], "resourceVersion": "6"}, "status": {"x": 1}}
    t.put(newer)
    t.put(body)
    assert t.get(("ns", "m")) == [newer]


def test_resync_and_workers_are_command_line_knobs() -> None:
    from clef_operator.cli import build_parser
    from clef_operator.manager.workers import RESYNC_SECONDS, WORKERS, _next_look

    args = build_parser().parse_args(["run"])
    assert (args.resync_seconds, args.workers) == (RESYNC_SECONDS, WORKERS)
    args = build_parser().parse_args(["run", "--resync-seconds", "60", "--workers", "4"])
    assert (args.resync_seconds, args.workers) == (60.0, 4)
    # The planner's requeue wins when sooner (never below 0.2 s); with none, the resync.
    assert _next_look(None, 60.0) == 60.0
    assert _next_look(0.0, 60.0) == 0.2
    assert _next_look(5.0, 60.0) == 5.0 and _next_look(500.0, 60.0) == 60.0


def config_map(name: str, model: str, owner: str, rv: str = "1") -> client.V1ConfigMap:
    return client.V1ConfigMap(
        metadata=client.V1ObjectMeta(
            name=name,
            namespace="ns",
            uid=f"uid-{name}",
            resource_version=rv,
            labels={labels.MODEL: model, labels.COMPONENT: labels.COMPONENT_GOLDENS},
            owner_references=[
                client.V1OwnerReference(api_version="v1", kind="ClefModel", name=model, uid=owner)
            ],
        ),
        binary_data={"goldens.json.gz": "aGk="},
    )


def test_goldens_config_maps_are_watched_by_label_and_observed_by_owner() -> None:
    from clef_operator.kube import Kube
    from clef_operator.observed import ModelRef

    kind = KINDS["configmaps"]
    # Only the goldens are listed and watched, never every ConfigMap of a namespace.
    assert kind.selector == f"{labels.COMPONENT}={labels.COMPONENT_GOLDENS}"
    informer = cache.Informer(table("configmaps"), lambda *a, **kw: None, "ns", lambda ns, m: None)
    assert informer._filter() == {"label_selector": kind.selector}
    assert cache.Informer(table(), lambda *a, **kw: None, "ns", lambda ns, m: None)._filter() == {}
    # Stored by model, observed (no request: nothing else in the cache asks for one) only when the
    # model owns it, with binaryData decoded.
    kube = Kube(client.ApiClient())
    kube.cache["configmaps"].put(config_map("m-goldens-a", "m", "model-uid"))
    kube.cache["configmaps"].put(config_map("m-goldens-b", "m", "someone-else"))
    observed = kube.observe(ModelRef("m", "ns", "model-uid", 1), "svc")
    assert [c.name for c in observed.config_maps] == ["m-goldens-a"]
    assert observed.config_maps[0].binary_data == {"goldens.json.gz": b"hi"}
    # A delete this operator made is not seen by the next pass.
    kube.writer._forget("configmaps", ModelRef("m", "ns", "model-uid", 1), "m-goldens-a")
    assert kube.observe(ModelRef("m", "ns", "model-uid", 1), "svc").config_maps == ()


def test_a_watch_resumes_from_the_last_version_it_saw_bookmarks_and_deletions_included() -> None:
    """The informer keeps the version itself: the client's Watch records none for the custom-object
    listers, and resuming from the list's version ended in 410 and a re-list every few minutes."""
    informer = cache.Informer(table("clefmodels"), lambda *a, **kw: None, None, lambda ns, m: None)
    body: dict[str, Any] = {"metadata": {"name": "m", "namespace": "ns", "uid": "u", "resourceVersion": "10"}}
    informer.version = "5"  # the list's
    informer._handle({"type": "ADDED", "object": body})
    assert informer.version == "10"
    informer._handle({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}})
    assert informer.version == "12"
    informer._handle(
        {"type": "DELETED", "object": {**body, "metadata": {**body["metadata"], "resourceVersion": "13"}}}
    )
    assert informer.version == "13" and informer.table.get(("ns", "m")) == []


def test_the_childrens_snapshots_are_held_as_one_bytes_object_and_read_back_equal() -> None:
    """Packed kinds hold one object per snapshot (not dozens in Python's arenas, which a deleted
    model would leave pinned); every read is a fresh, equal copy."""
    assert {name for name, kind in KINDS.items() if kind.packed} == {
        "deployments",
        "jobs",
        "pods",
        "services",
        "configmaps",
    }
    t = table("deployments")
    d = deployment("m-1", "m", "1", replicas=3)
    t.put(d)
    [held] = t.by_key[("ns", "m")].values()
    assert isinstance(held, bytes)
    first, second = t.get(("ns", "m")), t.get(("ns", "m"))
    assert first == second == [KINDS["deployments"].snapshot(d)]
    assert first[0] is not second[0]
    t.forget(("ns", "m"), lambda value: value[1].name == "m-1")
    assert t.get(("ns", "m")) == []


def test_a_compacted_table_gives_back_the_room_of_deleted_objects_and_keeps_the_rest() -> None:
    import sys

    t = table()
    many = [deployment(f"m{i}-a", f"m{i}", "10") for i in range(1000)]
    for d in many:
        t.put(d)
    one = sys.getsizeof({"a": 1})  # the smallest table
    for d in many[1:]:
        t.delete(d)
    assert sys.getsizeof(t.by_uid) > 100 * one, "a dict keeps its room as entries go"
    t.compact()
    assert sys.getsizeof(t.by_uid) <= 2 * one and sys.getsizeof(t.by_key) <= 2 * one
    assert replicas(t, "m0") == [1] and len(t) == 1
    assert t.put(deployment("m1-a", "m1", "11")) is None, "the deleted stay deleted"


def test_an_event_on_a_service_wakes_the_models_that_name_it_whatever_its_annotations():
    from clef_operator.snapshots import ServiceReaders, _service_wakes

    readers = ServiceReaders()
    readers.note("ns", "a", "clef-serve")
    readers.note("ns", "b", "clef-serve")
    readers.note("other", "c", "clef-serve")
    readers.note("ns", "d", "d-svc")
    woken: list[tuple[str, str]] = []
    wake = readers.waking(lambda ns, model: woken.append((ns, model)))
    stripped = SimpleNamespace(metadata=SimpleNamespace(namespace="ns", name="clef-serve", annotations=None))
    wake(*_service_wakes(stripped))
    assert woken == [("ns", "a"), ("ns", "b")]
    # A model that names another Service from its next pass on, or is gone, is no longer woken.
    readers.note("ns", "a", "renamed")
    readers.forget("ns", "b")
    woken.clear()
    wake("ns", "clef-serve")
    assert woken == []
    wake("ns", "renamed")
    assert woken == [("ns", "a")]


def node(name: str, rv: str, labels_: dict[str, str], unschedulable: bool = False) -> client.V1Node:
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name, uid=f"uid-{name}", resource_version=rv, labels=labels_),
        spec=client.V1NodeSpec(unschedulable=unschedulable),
    )


def test_a_node_wakes_only_when_what_placement_reads_of_it_changes() -> None:
    """A heartbeat (status only) wakes nothing; a new node, a label, a taint or a cordon does."""
    woken: list[tuple[str, str]] = []
    informer = cache.Informer(
        table("nodes"), lambda *a, **kw: None, None, lambda ns, n: woken.append((ns, n))
    )
    driver = {labels.NODE_DRIVER_VERSION: "550.127.05"}
    informer._handle({"type": "ADDED", "object": node("n1", "1", driver)})
    assert woken == [("", "n1")], "a new node"
    informer._handle({"type": "MODIFIED", "object": node("n1", "2", driver)})
    assert woken == [("", "n1")], "a heartbeat changes nothing clef reads"
    informer._handle(
        {"type": "MODIFIED", "object": node("n1", "3", {labels.NODE_DRIVER_VERSION: "570.86.15"})}
    )
    informer._handle(
        {"type": "MODIFIED", "object": node("n1", "4", {labels.NODE_DRIVER_VERSION: "570.86.15"}, True)}
    )
    assert woken == [("", "n1")] * 3
    [held] = informer.table.get(("", "n1"))
    assert held.driver == "570.86.15" and held.unschedulable
