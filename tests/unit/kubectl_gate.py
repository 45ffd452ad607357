"""kubectl for the unit tests that render kustomize trees: a skip that says how to get one, or a
failure where the tier is required (CLEF_REQUIRE_CLUSTER, set by CI), which must render them."""

from __future__ import annotations

import os

import pytest

from clef_devcluster.kustomize import find_kubectl

MISSING = (
    "no kubectl to render kustomize with: the local cluster's build provides one "
    "(make cluster-build), or put kubectl >= 1.27 on PATH"
)


def require_kubectl() -> str:
    kubectl = find_kubectl()
    if kubectl is None:
        if os.environ.get("CLEF_REQUIRE_CLUSTER", "") not in ("", "0"):
            pytest.fail(MISSING, pytrace=False)
        pytest.skip(MISSING)
    return kubectl
