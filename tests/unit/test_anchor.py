"""The namespace anchor (clef_operator/anchor.py): the decision, exhaustively; the cache's index of
anchored models; and the kube shell that sends the label and waits for admission to see it."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_operator import anchor, labels
from clef_operator import kube as kube_module
from clef_operator.kube import Kube
from clef_operator.snapshots import KINDS

ANCHOR = labels.NAMESPACE_ANCHOR

# ---------------------------------------------------------------------------------- the decision

STATES = [(a, d) for a in (False, True) for d in (False, True)]  # (anchored, deleting)


def members(prefix: str, states: tuple[tuple[bool, bool], ...]) -> list[anchor.Member]:
    return [anchor.Member(f"{prefix}{i}", a, d) for i, (a, d) in enumerate(states)]


def every_namespace(most: int = 3) -> Iterator[tuple[list[anchor.Member], list[anchor.Member]]]:
    """Every list of labelled models and every list of candidates, of up to `most` each, in every
    combination of labelled and being deleted."""
    for n in range(most + 1):
        for held in itertools.product(STATES, repeat=n):
            for m in range(most + 1):
                for offered in itertools.product(STATES, repeat=m):
                    yield members("a", held), members("c", offered)


def test_the_decision_in_every_namespace_of_up_to_three_anchors_and_three_candidates() -> None:
    seen = 0
    for held, offered in every_namespace():
        chosen = anchor.to_anchor(held, offered)
        live = [c for c in offered if not c.deleting]
        anchored_already = any(a.anchored and not a.deleting for a in held)
        if anchored_already or not live or live[0].anchored:
            # A live anchor is held (or the first live candidate is one); or nothing can be one.
            assert chosen is None, (held, offered)
        else:
            # The first live candidate, in the caller's order; never one being deleted.
            assert chosen == live[0].name, (held, offered)
        seen += 1
    assert seen == sum(4**n for n in range(4)) ** 2


def test_candidates_are_read_only_up_to_the_one_chosen() -> None:
    read: list[str] = []

    def walk() -> Iterator[anchor.Member]:
        for m in members("c", ((False, True), (False, False), (False, False))):
            read.append(m.name)
            yield m

    assert anchor.to_anchor([], walk()) == "c1"
    assert read == ["c0", "c1"]
    read.clear()
    assert anchor.to_anchor([anchor.Member("a", True, False)], walk()) is None
    assert read == [], "a namespace that is anchored walks nothing"


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        ({"name": "m"}, anchor.Member("m", False, False)),
        ({"name": "m", "labels": None}, anchor.Member("m", False, False)),
        ({"name": "m", "labels": {ANCHOR: "true"}}, anchor.Member("m", True, False)),
        # The binding's selector matches "true" only: any other value anchors nothing.
        ({"name": "m", "labels": {ANCHOR: "True"}}, anchor.Member("m", False, False)),
        ({"name": "m", "labels": {ANCHOR: "false"}}, anchor.Member("m", False, False)),
        ({"name": "m", "labels": {ANCHOR: ""}}, anchor.Member("m", False, False)),
        ({"name": "m", "labels": {"other": "true"}}, anchor.Member("m", False, False)),
        (
            {"name": "m", "labels": {ANCHOR: "true"}, "deletionTimestamp": "2026-12-05T00:00:00Z"},
            anchor.Member("m", True, True),
        ),
    ],
)
def test_a_member_is_read_from_metadata(meta: dict[str, Any], expected: anchor.Member) -> None:
    assert anchor.member(meta) == expected


def test_the_patch_adds_the_one_label_the_binding_selects() -> None:
    assert anchor.label_patch() == {"metadata": {"labels": {"clef.riotpiao.com/namespace-anchor": "true"}}}
    probe = anchor.admission_probe()
    assert probe["metadata"]["labels"] == {labels.MANAGED_BY: labels.MANAGED_BY_VALUE}
    assert "name" not in probe["metadata"] and probe["metadata"]["generateName"]


def test_only_a_refusal_by_the_model_namespaces_policy_means_no_anchor_yet() -> None:
    said = (
        "configmaps \"x\" is forbidden: ValidatingAdmissionPolicy 'clef-operator-model-namespaces' with binding"
        " 'clef-operator-model-namespaces' denied request: failed to configure binding: no params found"
    )
    assert anchor.refused_for_want_of_anchor(403, said)
    assert anchor.refused_for_want_of_anchor(422, said)
    assert not anchor.refused_for_want_of_anchor(
        403, "ValidatingAdmissionPolicy 'clef-operator-fence' denied"
    )
    assert not anchor.refused_for_want_of_anchor(500, said)


# ---------------------------------------------------------------------------------- the cache


def model(name: str, version: int, anchored: bool = False, ns: str = "ns", **meta: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "uid": f"uid-{ns}-{name}",
        "resourceVersion": str(version),
    }
    body.update(meta)
    if anchored:
        body["labels"] = {ANCHOR: "true", "app": "x"}
    else:
        body["labels"] = {"app": "x"}
    return {"metadata": body, "spec": {}, "status": {}}


def names(kube: Kube, ns: str = "ns") -> list[str]:
    return sorted(m.name for m in kube.anchors(ns))


def test_the_cache_indexes_anchored_models_by_namespace_and_forgets_them() -> None:
    kube = Kube(client.ApiClient())
    table = kube.cache["clefmodels"]
    table.put(model("a", 1, anchored=True))
    table.put(model("b", 1))
    table.put(model("c", 1, anchored=True, ns="other"))
    assert names(kube) == ["a"] and names(kube, "other") == ["c"]
    # The snapshot keeps the anchor, and no other label.
    assert kube.read_model("ns", "a")["metadata"]["labels"] == {ANCHOR: "true"}  # type: ignore[index]
    assert "labels" not in kube.read_model("ns", "b")["metadata"]  # type: ignore[index]
    table.put(model("a", 2))  # its label removed
    table.put(model("b", 2, anchored=True))
    assert names(kube) == ["b"]
    table.put(model("b", 1))  # an older event: ignored
    assert names(kube) == ["b"]
    table.delete(model("b", 3, anchored=True))
    assert names(kube) == []
    table.replace("other", [])  # a re-list of that namespace finds none
    assert table.tags == {}, "no state is kept for a namespace with no anchor"


def test_the_walk_of_a_namespace_skips_the_model_being_deleted() -> None:
    kube = Kube(client.ApiClient())
    for m in (model("c", 1), model("a", 1, anchored=True), model("b", 1), model("z", 1, ns="other")):
        kube.cache["clefmodels"].put(m)
    # The last by name first (anchor.successors): a bulk deletion by name hands the label on once.
    assert [m.name for m in kube.members("ns", but="a")] == ["c", "b"]
    assert anchor.successors(["m-1", "m-3", "m-2"]) == ["m-3", "m-2", "m-1"]


# ---------------------------------------------------------------------------------- the kube shell


class FakeApi:
    """The two requests anchoring makes: the label patch (into the cache, as the Writer does) and
    the dry-run ConfigMap, refused `refusals` times for want of an anchor."""

    def __init__(self, kube: Kube, refusals: int = 0, other: ApiException | None = None) -> None:
        self.kube = kube
        self.refusals = refusals
        self.other = other
        self.patched: list[str] = []
        self.deleting: set[str] = set()  # models the API server has marked deleted (the cache not yet)
        self.probes = 0
        self.probing = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def merge_patch_model(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any] | None:
        assert body == anchor.label_patch()
        self.patched.append(name)
        current = self.kube.read_model(namespace, name)
        if current is None:
            return None
        version = int(current["metadata"]["resourceVersion"]) + 1
        extra = {"deletionTimestamp": "2026-12-05T00:00:00Z"} if name in self.deleting else {}
        written = model(name, version, anchored=True, ns=namespace, **extra)
        self.kube.cache["clefmodels"].put(written)
        return written

    def create_namespaced_config_map(self, namespace: str, body: dict[str, Any], dry_run: str) -> None:
        assert dry_run == "All" and body == anchor.admission_probe()
        self.probes += 1
        self.probing.set()
        assert self.release.wait(10)
        if self.other is not None:
            raise self.other
        if self.probes <= self.refusals:
            e = ApiException(status=403, reason="Forbidden")
            e.body = json.dumps(
                {"message": "ValidatingAdmissionPolicy 'clef-operator-model-namespaces' denied"}
            )
            raise e


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch) -> tuple[Kube, FakeApi]:
    kube = Kube(client.ApiClient())
    api = FakeApi(kube)
    monkeypatch.setattr(kube.writer, "merge_patch_model", api.merge_patch_model)
    monkeypatch.setattr(kube, "core", api)
    monkeypatch.setattr(kube_module.time, "sleep", lambda s: None)
    return kube, api


def own(kube: Kube, name: str) -> list[anchor.Member]:
    found = kube.read_model("ns", name)
    assert found is not None
    return [anchor.member(found["metadata"])]


def test_a_namespace_with_an_anchor_costs_no_request(shell: tuple[Kube, FakeApi]) -> None:
    kube, api = shell
    kube.cache["clefmodels"].put(model("a", 1, anchored=True))
    kube.cache["clefmodels"].put(model("b", 1))
    assert kube.anchor_namespace("ns", lambda: own(kube, "b")) is None
    assert (api.patched, api.probes) == ([], 0)


def test_an_unanchored_namespace_is_anchored_once_admission_sees_it(shell: tuple[Kube, FakeApi]) -> None:
    kube, api = shell
    api.refusals = 2
    kube.cache["clefmodels"].put(model("b", 1))
    assert kube.anchor_namespace("ns", lambda: own(kube, "b")) == "b"
    assert api.patched == ["b"] and api.probes == 3
    assert names(kube) == ["b"], "the response is in the cache"
    assert kube.anchor_namespace("ns", lambda: own(kube, "b")) is None
    assert api.patched == ["b"] and api.probes == 3


def test_waiting_for_admission_is_bounded(
    shell: tuple[Kube, FakeApi], monkeypatch: pytest.MonkeyPatch
) -> None:
    kube, api = shell
    api.refusals = 10**6
    clock = iter(range(0, 10**6, 1))
    monkeypatch.setattr(kube_module.time, "monotonic", lambda: float(next(clock)))
    kube.cache["clefmodels"].put(model("b", 1))
    assert kube.anchor_namespace("ns", lambda: own(kube, "b")) == "b"
    assert 1 < api.probes <= kube_module.ANCHOR_ADMISSION_SECONDS + 1


def test_another_refusal_ends_the_wait(shell: tuple[Kube, FakeApi]) -> None:
    kube, api = shell
    api.other = ApiException(status=403, reason="Forbidden")
    api.other.body = json.dumps({"message": "ValidatingAdmissionPolicy 'clef-operator-fence' denied"})
    kube.cache["clefmodels"].put(model("b", 1))
    assert kube.anchor_namespace("ns", lambda: own(kube, "b")) == "b"
    assert api.probes == 1


def test_a_model_gone_before_its_label_is_no_anchor(shell: tuple[Kube, FakeApi]) -> None:
    kube, api = shell
    assert kube.anchor_namespace("ns", lambda: [anchor.Member("gone", False, False)]) is None
    assert api.patched == ["gone"] and api.probes == 0
    assert "ns" not in kube._confirming


def test_a_hand_over_skips_a_model_the_patch_finds_deleted_and_waits_for_no_admission(
    shell: tuple[Kube, FakeApi],
) -> None:
    """The deleted anchor admits until its finalizer goes, and the API server sees the new label
    before that: no dry run.  A candidate the cache still shows live but the API server has marked
    deleted (the patch's answer says so) is passed over for the next."""
    kube, api = shell
    kube.cache["clefmodels"].put(model("a", 1, anchored=True, deletionTimestamp="2026-12-05T00:00:00Z"))
    for name in ("b", "c", "d"):
        kube.cache["clefmodels"].put(model(name, 1))
    api.deleting = {"d"}
    assert kube.anchor_namespace("ns", lambda: kube.members("ns", but="a"), confirm=False) == "c"
    assert api.patched == ["d", "c"] and api.probes == 0
    assert names(kube) == ["a", "c", "d"] and [m.name for m in kube.anchors("ns") if m.live_anchor] == ["c"]


def test_a_pass_over_a_model_the_patch_finds_deleted_anchors_nothing(shell: tuple[Kube, FakeApi]) -> None:
    kube, api = shell
    kube.cache["clefmodels"].put(model("b", 1))
    api.deleting = {"b"}
    assert kube.anchor_namespace("ns", lambda: own(kube, "b")) is None
    assert api.patched == ["b"] and api.probes == 0


def test_a_refused_label_is_no_anchor_and_no_crash(
    shell: tuple[Kube, FakeApi], monkeypatch: pytest.MonkeyPatch
) -> None:
    kube, api = shell

    def refuse(namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any] | None:
        api.patched.append(name)
        e = ApiException(status=422, reason="Unprocessable Entity")
        e.body = json.dumps({"message": "ClefModel.clef.riotpiao.com is invalid"})
        raise e

    monkeypatch.setattr(kube.writer, "merge_patch_model", refuse)
    kube.cache["clefmodels"].put(model("b", 1))
    kube.cache["clefmodels"].put(model("c", 1))
    assert kube.anchor_namespace("ns", lambda: kube.members("ns")) is None
    assert api.patched == ["c", "b"] and api.probes == 0


def test_two_passes_at_once_make_one_anchor_and_both_wait_for_admission(shell: tuple[Kube, FakeApi]) -> None:
    """b's pass anchors b and is waiting for admission to see it; c's pass, meanwhile, finds b's
    anchor in the cache but must not write before admission sees it either, nor anchor c."""
    kube, api = shell
    kube.cache["clefmodels"].put(model("b", 1))
    kube.cache["clefmodels"].put(model("c", 1))
    api.release.clear()
    results: dict[str, str | None] = {}
    first = threading.Thread(
        target=lambda: results.update(b=kube.anchor_namespace("ns", lambda: own(kube, "b")))
    )
    first.start()
    assert api.probing.wait(10)
    second = threading.Thread(
        target=lambda: results.update(c=kube.anchor_namespace("ns", lambda: own(kube, "c")))
    )
    second.start()
    second.join(0.3)
    assert second.is_alive(), "c's pass waits while admission may not see b's anchor yet"
    api.release.set()
    first.join(10)
    second.join(10)
    assert results == {"b": "b", "c": None}
    assert api.patched == ["b"] and names(kube) == ["b"]


def test_the_clefmodel_kind_indexes_by_the_anchor() -> None:
    tag = KINDS["clefmodels"].tag
    assert tag is not None
    assert tag(model("a", 1, anchored=True)) and not tag(model("a", 1))
