"""The verdict ledger's API layer (issue 33, finding 3): read once from the operator's namespace
(absent: empty), written create-then-patch with the resourceVersion it last saw as precondition,
and forgotten on any failed write so the next pass reads it afresh."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from clef_builders import VERDICT_KEY, passed_record
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_operator.kube import Kube
from clef_operator.observed import ModelRef
from clef_operator.verdicts import encode_ledger, ledger_name, sign

MODEL = ModelRef("clef-flash", "homelab", "uid-1", 3)


class FakeCore:
    def __init__(self) -> None:
        self.stored: dict[str, Any] | None = None
        self.version = 0
        self.calls: list[tuple[str, str, Any]] = []

    def _obj(self) -> Any:
        assert self.stored is not None
        return SimpleNamespace(
            data=dict(self.stored), metadata=SimpleNamespace(resource_version=str(self.version))
        )

    def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
        self.calls.append(("get", namespace, name))
        if self.stored is None:
            raise ApiException(status=404)
        return self._obj()

    def create_namespaced_config_map(self, namespace: str, body: Any) -> Any:
        self.calls.append(("create", namespace, body["metadata"]["name"]))
        if self.stored is not None:
            raise ApiException(status=409)
        self.stored, self.version = dict(body["data"]), self.version + 1
        return self._obj()

    def patch_namespaced_config_map(self, name: str, namespace: str, body: Any, **_: Any) -> Any:
        self.calls.append(("patch", namespace, name))
        if body["metadata"]["resourceVersion"] != str(self.version):
            raise ApiException(status=409)
        assert self.stored is not None
        for k, v in body["data"].items():
            if v is None:
                self.stored.pop(k, None)
            else:
                self.stored[k] = v
        self.version += 1
        return self._obj()


@pytest.fixture
def kube() -> Kube:
    k = Kube(client.ApiClient())
    k._verdict_key = VERDICT_KEY
    k.core = FakeCore()  # type: ignore[assignment]
    k.ledgers.core = k.core
    k.ledgers.namespace = "clef-system"
    return k


def test_absent_is_empty_then_created_then_patched_on_its_version(kube: Kube) -> None:
    core: FakeCore = kube.core  # type: ignore[assignment]
    assert kube.read_ledger(MODEL) == {}
    first = sign(VERDICT_KEY, MODEL, passed_record(key="k1"))
    kube.write_ledger(MODEL, {"k1": first})
    second = sign(VERDICT_KEY, MODEL, passed_record(key="k2"))
    kube.write_ledger(MODEL, {"k2": second})
    assert [c[0] for c in core.calls] == ["get", "create", "patch"]
    assert all(ns == "clef-system" and name == ledger_name(MODEL) for _, ns, name in core.calls)
    assert core.stored == encode_ledger({"k2": second}), "a dropped key is removed"
    assert kube.read_ledger(MODEL) == {"k2": second} and len(core.calls) == 3, "kept, not read again"


def test_a_conflict_forgets_what_was_kept_and_the_next_read_is_fresh(kube: Kube) -> None:
    core: FakeCore = kube.core  # type: ignore[assignment]
    r = sign(VERDICT_KEY, MODEL, passed_record(key="k1"))
    kube.read_ledger(MODEL)
    kube.write_ledger(MODEL, {"k1": r})
    core.version += 1  # someone else wrote it (a deposed leader, an admin)
    with pytest.raises(ApiException):
        kube.write_ledger(MODEL, {})
    assert kube.read_ledger(MODEL) == {"k1": r} and core.calls[-1][0] == "get"


def test_records_it_did_not_sign_are_left_out(kube: Kube) -> None:
    core: FakeCore = kube.core  # type: ignore[assignment]
    core.stored = encode_ledger({"k1": passed_record(key="k1")})
    assert kube.read_ledger(MODEL) == {}
