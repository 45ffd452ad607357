"""finalizer: what a pass does about clef's finalizer, and the patches it sends."""

from __future__ import annotations

from typing import Any

import pytest

from clef_operator.finalizer import FINALIZER, Step, add_patch, released_service, remove_patch, step

OTHER = "example.com/keep"
GONE = "2026-12-02T00:00:00Z"


def meta(*finalizers: str, deleted: bool = False, rv: str = "42") -> dict[str, Any]:
    out: dict[str, Any] = {"name": "m", "resourceVersion": rv}
    if finalizers:
        out["finalizers"] = list(finalizers)
    if deleted:
        out["deletionTimestamp"] = GONE
    return out


def test_the_name_is_the_one_kopf_used_for_clef() -> None:
    # ClefModels created under the kopf-based operator carry it; they must still be finalized.
    assert FINALIZER == "clef.riotpiao.com/finalizer"


@pytest.mark.parametrize(
    ("m", "expected"),
    [
        (meta(), Step.ADD),
        (meta(OTHER), Step.ADD),
        ({"name": "m", "finalizers": None}, Step.ADD),
        (meta(FINALIZER), Step.RECONCILE),
        (meta(OTHER, FINALIZER), Step.RECONCILE),
        (meta(FINALIZER, deleted=True), Step.RELEASE),
        (meta(OTHER, FINALIZER, deleted=True), Step.RELEASE),
        (meta(deleted=True), Step.WAIT),
        (meta(OTHER, deleted=True), Step.WAIT),
        ({"name": "m", "deletionTimestamp": None, "finalizers": [FINALIZER]}, Step.RECONCILE),
    ],
)
def test_step(m: dict[str, Any], expected: Step) -> None:
    assert step(m) is expected


def test_adding_to_no_finalizers_creates_the_list_if_still_that_version() -> None:
    assert add_patch(meta()) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
    ]


def test_adding_to_others_appends_and_keeps_them() -> None:
    assert add_patch(meta(OTHER))[1:] == [{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}]


def test_removing_takes_out_only_clefs_own_from_the_end() -> None:
    assert remove_patch(meta(OTHER, FINALIZER, "x/y", FINALIZER)) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "remove", "path": "/metadata/finalizers/3"},
        {"op": "remove", "path": "/metadata/finalizers/1"},
    ]


def test_removing_what_is_not_held_is_an_error() -> None:
    with pytest.raises(ValueError, match="not held"):
        remove_patch(meta(OTHER))


def test_no_patch_without_a_resource_version() -> None:
    with pytest.raises(ValueError, match="resourceVersion"):
        add_patch({"name": "m"})
    with pytest.raises(ValueError, match="resourceVersion"):
        remove_patch({"name": "m", "finalizers": [FINALIZER]})


@pytest.mark.parametrize(
    ("spec", "service"),
    [
        ({"service": {"name": "web"}}, "web"),
        ({"service": {}}, ""),
        ({"service": "not-an-object"}, ""),
        ({}, ""),
        (None, ""),
    ],
)
def test_the_service_a_deleted_model_hands_back_comes_from_its_raw_spec(spec: Any, service: str) -> None:
    assert released_service({"spec": spec}) == service
