"""reconcile.reconcile: status first, then the actions in order, stopping at the first failure."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from clef_builders import T0, base_spec_dict

from clef_operator import anchor, labels
from clef_operator.actions import Action, CreateJob
from clef_operator.api import ClefModelStatus
from clef_operator.finalizer import FINALIZER
from clef_operator.observed import ModelRef, Observed
from clef_operator.reconcile import REFUSED_RETRY_SECONDS, reconcile
from clef_operator.snapshots import ServiceReaders


class RecordingKube:
    """Stands in for the kube layer (not the API server): it records what reconcile asked for."""

    def __init__(
        self, obj: dict[str, Any] | None, fail_on: type | None = None, refuse_on: type | None = None
    ) -> None:
        self.obj = obj
        self.calls: list[str] = []
        self.fail_on = fail_on
        self.refuse_on = refuse_on
        self.status: ClefModelStatus | None = None
        self.verdict_key = b"clef-unit-test-verdict-key-32byte"
        self.statuses: list[ClefModelStatus] = []
        self.service_readers = ServiceReaders()
        # The namespace's anchored models (by default another one, live: nothing to do) and its
        # other models, as the cache would give them.
        self.held_anchors = [anchor.Member("a", anchored=True, deleting=False)]
        self.others: list[anchor.Member] = []

    def anchor_namespace(
        self, namespace: str, candidates: Callable[[], Iterable[anchor.Member]], confirm: bool = True
    ) -> str | None:
        chosen = anchor.to_anchor(self.held_anchors, candidates())
        if chosen is not None:
            self.calls.append(f"anchor {chosen}" + ("" if confirm else " (unconfirmed)"))
        return chosen

    def members(self, namespace: str, but: str = "") -> Iterator[anchor.Member]:
        return (m for m in self.others if m.name != but)

    def read_model(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.obj

    def observe(self, model: ModelRef, service_name: str) -> Observed:
        return Observed()

    def write_status(self, model: ModelRef, status: ClefModelStatus) -> None:
        self.calls.append("status")
        self.status = status
        self.statuses.append(status)
        if self.obj is not None:
            self.obj["status"] = status.to_wire()

    def patch_model(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> bool:
        self.calls.append(f"patch {[(op['op'], op.get('value')) for op in ops[1:]]}")
        if self.fail_on is PatchFails:
            raise RuntimeError("409 Conflict")
        return self.obj is not None

    def release_service(self, namespace: str, model: str, service: str) -> bool:
        self.calls.append(f"release {service}")
        if self.fail_on is ReleaseFails:
            raise RuntimeError("the API server said no")
        return True

    def delete_ledger(self, uid: str) -> None:
        self.calls.append(f"delete ledger {uid}")
        if self.fail_on is LedgerDeleteFails:
            raise RuntimeError("the API server said no")

    def apply(self, model: ModelRef, action: Action) -> str | None:
        if self.fail_on is not None and isinstance(action, self.fail_on):
            raise RuntimeError("API server said no")
        self.calls.append(type(action).__name__)
        if self.refuse_on is not None and isinstance(action, self.refuse_on):
            return '403 Forbidden: jobs.batch "m-verify" is forbidden: exceeded quota: no-jobs'
        return None


class ReleaseFails(Exception):
    pass


class PatchFails(Exception):
    pass


class LedgerDeleteFails(Exception):
    pass


def body(finalizers: tuple[str, ...] = (FINALIZER,), deleted: bool = False, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "m", "uid": "u", "generation": 2, "resourceVersion": "7"}
    meta["finalizers"] = list(finalizers)
    if deleted:
        meta["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    return {"metadata": meta, "spec": base_spec_dict(**spec)}


def test_status_is_written_before_the_actions():
    kube = RecordingKube(body())
    reconcile(kube, "ns", "m", now=T0)  # type: ignore[arg-type]
    assert kube.calls == ["status", "CreateJob", "Event"]
    assert kube.status is not None and kube.status.observed_generation == 2


def test_a_failing_action_stops_the_rest():
    kube = RecordingKube(body(), fail_on=CreateJob)
    with pytest.raises(RuntimeError):
        reconcile(kube, "ns", "m", now=T0)  # type: ignore[arg-type]
    assert "Event" not in kube.calls, "no event for a decision that did not happen"


def test_a_model_gone_from_the_cache_is_left_alone():
    kube = RecordingKube(None)
    kube.service_readers.note("ns", "m", "clef-serve")
    assert reconcile(kube, "ns", "m", now=T0) is None  # type: ignore[arg-type]
    assert kube.calls == []
    assert kube.service_readers.models("ns", "clef-serve") == [], "an event on its Service wakes it no more"


def test_the_first_pass_adds_the_finalizer_then_reconciles():
    kube = RecordingKube(body(finalizers=("someone/else",)))
    reconcile(kube, "ns", "m", now=T0)  # type: ignore[arg-type]
    assert kube.calls == [f"patch {[('add', FINALIZER)]}", "status", "CreateJob", "Event"]


def test_a_failed_finalizer_patch_plans_nothing():
    kube = RecordingKube(body(finalizers=()), fail_on=PatchFails)
    with pytest.raises(RuntimeError):
        reconcile(kube, "ns", "m", now=T0)  # type: ignore[arg-type]
    assert kube.calls == [f"patch {[('add', [FINALIZER])]}"]


def test_a_deleted_model_hands_its_service_back_then_lets_go():
    kube = RecordingKube(body(deleted=True))
    assert reconcile(kube, "ns", "m", now=T0) is None  # type: ignore[arg-type]
    uid = kube.obj["metadata"]["uid"]
    assert kube.calls == ["release clef-serve", f"delete ledger {uid}", f"patch {[('remove', None)]}"]


def test_a_ledger_that_cannot_be_deleted_keeps_the_finalizer():
    """The ledger lives in the operator's namespace, where no owner reference reaches: the
    finalizer is what makes sure it goes with the model."""
    kube = RecordingKube(body(deleted=True), fail_on=LedgerDeleteFails)
    with pytest.raises(RuntimeError):
        reconcile(kube, "ns", "m", now=T0)  # type: ignore[arg-type]
    assert kube.calls[-1].startswith("delete ledger")


def test_the_first_model_of_a_namespace_anchors_it_before_any_child_is_written():
    kube = RecordingKube(body(finalizers=()))
    kube.held_anchors = []
    reconcile(kube, "ns", "m", now=T0)  # type: ignore[arg-type]
    assert kube.calls == [f"patch {[('add', [FINALIZER])]}", "anchor m", "status", "CreateJob", "Event"]


def test_an_anchor_being_deleted_is_no_anchor_for_a_pass_that_writes():
    kube = RecordingKube(body())
    kube.held_anchors = [anchor.Member("a", anchored=True, deleting=True)]
    reconcile(kube, "ns", "m", now=T0)  # type: ignore[arg-type]
    assert kube.calls[:2] == ["anchor m", "status"]


def test_a_deleted_anchor_hands_the_label_on_before_its_finalizer_goes():
    obj = body(deleted=True)
    obj["metadata"]["labels"] = {labels.NAMESPACE_ANCHOR: "true"}
    kube = RecordingKube(obj)
    kube.held_anchors = [anchor.Member("m", anchored=True, deleting=True)]
    kube.others = [
        anchor.Member("b", anchored=False, deleting=True),
        anchor.Member("c", anchored=False, deleting=False),
    ]
    assert reconcile(kube, "ns", "m", now=T0) is None  # type: ignore[arg-type]
    assert kube.calls == [
        "anchor c (unconfirmed)",
        "release clef-serve",
        "delete ledger u",
        f"patch {[('remove', None)]}",
    ]


def test_a_deleted_model_that_is_no_anchor_walks_no_namespace():
    kube = RecordingKube(body(deleted=True))
    kube.held_anchors = []
    kube.others = [anchor.Member("c", anchored=False, deleting=False)]
    reconcile(kube, "ns", "m", now=T0)  # type: ignore[arg-type]
    assert not [c for c in kube.calls if c.startswith("anchor")]


def test_a_failed_release_keeps_the_finalizer():
    kube = RecordingKube(body(deleted=True), fail_on=ReleaseFails)
    with pytest.raises(RuntimeError):
        reconcile(kube, "ns", "m", now=T0)  # type: ignore[arg-type]
    assert kube.calls == ["release clef-serve"]


def test_a_deleted_model_without_clefs_finalizer_is_left_to_go():
    kube = RecordingKube(body(finalizers=("someone/else",), deleted=True))
    assert reconcile(kube, "ns", "m", now=T0) is None  # type: ignore[arg-type]
    assert kube.calls == []


def test_a_spec_the_models_reject_becomes_a_condition_not_a_crash():
    kube = RecordingKube(body(kvFraction="lots"))
    reconcile(kube, "ns", "m", now=T0)  # type: ignore[arg-type]
    assert kube.calls == ["status"]
    (degraded,) = [c for c in kube.status.conditions if c.type == "Degraded"]
    assert degraded.reason == "InvalidSpec" and "spec.kvFraction" in degraded.message


def degraded(status: ClefModelStatus | None) -> tuple[str, str, str]:
    assert status is not None
    (c,) = [c for c in status.conditions if c.type == "Degraded"]
    return c.status.value, c.reason, c.message


def test_a_refused_child_is_in_degraded_in_the_same_pass_and_stops_the_rest():
    kube = RecordingKube(body(), refuse_on=CreateJob)
    reconcile(kube, "ns", "m", now=T0)  # type: ignore[arg-type]
    assert kube.calls == ["status", "CreateJob", "Event", "status"], "the planned event is not posted"
    state, reason, message = degraded(kube.status)
    assert (state, reason) == ("True", "ChildRejected")
    assert "exceeded quota" in message and "Job" in message


def test_a_refused_pass_looks_again_before_the_resync():
    """Nothing clef watches lifts a refusal (a quota deleted): the loop must not wait for the resync."""
    kube = RecordingKube(body(), refuse_on=CreateJob)
    assert reconcile(kube, "ns", "m", now=T0) == REFUSED_RETRY_SECONDS  # type: ignore[arg-type]
    kube.refuse_on = None
    kube.calls.clear()
    assert reconcile(kube, "ns", "m", now=T0) is None, "then only events and the resync"  # type: ignore[arg-type]


def test_the_same_refusal_again_writes_nothing():
    """Each write wakes the model (its watch event): a refusal restamped on every pass was a loop
    of refused creates, events and status writes as fast as the API server answered."""
    kube = RecordingKube(body(), refuse_on=CreateJob)
    reconcile(kube, "ns", "m", now=T0)  # type: ignore[arg-type]
    kube.statuses.clear()
    reconcile(kube, "ns", "m", now=T0 + timedelta(seconds=1))  # type: ignore[arg-type]
    assert kube.statuses == [], "the status of the first refusal still says it all"


def test_a_refusal_stays_in_degraded_until_a_pass_goes_through():
    kube = RecordingKube(body(), refuse_on=CreateJob)
    reconcile(kube, "ns", "m", now=T0)  # type: ignore[arg-type]
    kube.statuses.clear()
    reconcile(kube, "ns", "m", now=T0)  # type: ignore[arg-type]
    assert all(degraded(s)[1] == "ChildRejected" for s in kube.statuses), "no flapping while it persists"
    kube.refuse_on = None
    reconcile(kube, "ns", "m", now=T0)  # type: ignore[arg-type]
    assert degraded(kube.status)[1] != "ChildRejected"
