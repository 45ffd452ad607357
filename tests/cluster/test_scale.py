"""The load test's small version (`make load-test` is the large one; docs/performance.md,
"Operator at scale"): 30 models through the operator running as its ServiceAccount.

* all Ready;
* at idle the operator makes (almost) no API request: its reads come from watches, not polls
  (the audit log counts every request but the watches themselves);
* once they are deleted, the operator holds nothing for them (its `clef-state` probe: cache
  entries per kind and the keys its work queue knows, `loops`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_devcluster.load import scale

from .conftest import Cluster, missing_prerequisite, wait_for
from .operator_support import delete_models

pytestmark = pytest.mark.cluster

MODELS = 30
NODE = "scale-test-1"
# Idle: no request is needed at all until the resync (minutes away); a few are allowed for the
# odd late status write.  Polling 30 models (the operator before its cache) made about 5 per second,
# in bursts 30 s apart (models made Ready together poll together): the window is longer than that.
IDLE_WINDOW_SECONDS = 32.0
IDLE_MAX_PER_SECOND = 0.25
PER_MODEL = ("clefmodels", "deployments", "jobs", "pods", "loops")


@pytest.fixture
def identity(cluster: Cluster) -> Iterator[None]:
    """kustomize/base's ServiceAccount and RBAC (not its Deployment), and a node for the models;
    removed afterwards (all but the CRD, which the session uses)."""
    assert cluster.kubectl
    objects = scale.operator_identity(cluster.kubectl)
    scale.kubectl_objects(cluster.kubeconfig, cluster.kubectl, "apply", objects)
    scale.add_gpu_node(cluster.kubeconfig, NODE, MODELS + 10)
    try:
        yield
    finally:
        with contextlib.suppress(ApiException):
            cluster.core.delete_node(NODE)
        kept = ("CustomResourceDefinition", "Namespace")
        scale.kubectl_objects(
            cluster.kubeconfig, cluster.kubectl, "delete", [o for o in objects if o["kind"] not in kept]
        )


def test_thirty_models_ready_idle_without_requests_and_forgotten_when_deleted(
    cluster: Cluster, identity: None, namespace: str, tmp_path: Path
) -> None:
    if cluster.local is None or not cluster.local.audit_log.exists():
        missing_prerequisite(
            "needs the local cluster's API server audit log (manifests/audit-policy.yaml) (runs on the local cluster: unset CLEF_KUBECONFIG)"
        )
    audit = cluster.local.audit_log
    offset = audit.stat().st_size
    operator = scale.Operator(cluster.kubeconfig, tmp_path, scope=("--namespace", namespace))
    custom = client.CustomObjectsApi(cluster.api)
    try:
        wait_for(lambda: operator.state() is not None, 60, "the operator's liveness endpoint", operator.tail)
        scale.create_all(
            lambda b: custom.create_namespaced_custom_object(
                scale.GROUP, scale.VERSION, namespace, scale.PLURAL, b
            ),
            [scale.clefmodel(f"m-{i:02d}") for i in range(MODELS)],
        )
        wait_for(
            lambda: scale.ready_models(cluster.api, namespace) == MODELS,
            180,
            f"{MODELS} models Ready",
            lambda: f"{scale.ready_models(cluster.api, namespace)} Ready\n{operator.tail()}",
        )
        time.sleep(5)  # the last passes' status writes land
        start = time.time()
        time.sleep(IDLE_WINDOW_SECONDS)
        end = time.time()
        time.sleep(2)  # requests are logged as they complete
        rate = scale.request_rate(audit, offset, start, end)
        assert rate.per_second <= IDLE_MAX_PER_SECOND, (
            f"{rate.requests} requests in {rate.seconds:.0f}s at idle: {rate.by_kind}"
        )

        held = operator.held()
        assert held.get("clefmodels") == MODELS and held.get("loops") == MODELS, held
        scale.delete_namespace_objects(cluster.api, namespace)

        def forgotten() -> bool:
            now = operator.held()
            return bool(now) and all(now.get(k, 0) == 0 for k in PER_MODEL)

        wait_for(forgotten, 90, "the operator to hold nothing per model", lambda: f"{operator.held()}")
        assert operator.alive(), operator.tail()
    finally:
        delete_models(cluster, namespace)
        operator.stop()
