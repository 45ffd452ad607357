"""A Service that clients already use is adopted (with spec.service.adopt), never recreated, and
outlives the ClefModel with its selector back (issue 6, test 6; issue 13)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from .conftest import Cluster, wait_for
from .operator_support import VERIFY_SECONDS, Models, clefmodel, operator_running, ready_endpoints

pytestmark = pytest.mark.cluster


def test_existing_service_is_adopted_selector_only_and_survives_the_model(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    cluster.image_table()
    legacy = client.V1Service(
        metadata=client.V1ObjectMeta(name="clef-serve", annotations={"gateway.example/route": "clef"}),
        spec=client.V1ServiceSpec(
            selector={"app": "legacy-predictor"},
            ports=[client.V1ServicePort(name="http", port=8000, target_port=8000)],
        ),
    )
    before = cluster.core.create_namespaced_service(namespace, legacy)
    with operator_running(cluster, namespace, tmp_path) as op:
        models = Models(cluster, namespace, op)
        models.create(clefmodel("clef-flash", service={"name": "clef-serve", "adopt": True}))
        models.wait_condition("clef-flash", "Ready", "True", "Available", timeout=VERIFY_SECONDS + 120)
        status = models.get("clef-flash")["status"]
        assert status["serviceAdopted"] is True
        svc = cluster.core.read_namespaced_service("clef-serve", namespace)
        assert svc.metadata.uid == before.metadata.uid, "the Service was recreated"
        assert svc.spec.cluster_ip == before.spec.cluster_ip, "the ClusterIP moved"
        assert svc.spec.ports == before.spec.ports, "only the selector may change"
        assert svc.spec.selector == {
            "clef.riotpiao.com/model": "clef-flash",
            "clef.riotpiao.com/revision": status["activeRevision"],
        }, "the old selector keys must be gone, or the Service would select nothing"
        assert svc.metadata.annotations["gateway.example/route"] == "clef"
        assert not svc.metadata.owner_references, "an adopted Service is not owned"
        wait_for(lambda: ready_endpoints(cluster, namespace, "clef-serve") == 1, 30, "an endpoint behind it")
        models.wait_events("clef-flash", "ServiceAdopted")

        models.delete("clef-flash")
        wait_for(
            lambda: not models.deployments("clef-flash"),
            90,
            "the model's Deployments to go",
            lambda: models.describe("clef-flash"),
        )
    after = cluster.core.read_namespaced_service("clef-serve", namespace)
    assert after.metadata.uid == before.metadata.uid
    assert after.spec.cluster_ip == before.spec.cluster_ip
    assert after.spec.selector == {"app": "legacy-predictor"}, "released with its own selector"
