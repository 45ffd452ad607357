"""A Service that clients already use is adopted (with spec.service.adopt), never recreated, and
outlives the ClefModel with its selector back (issue 6, test 6; issue 13)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_operator import actions as act
from clef_operator import labels
from clef_operator.finalizer import FINALIZER
from clef_operator.kube import Kube
from clef_operator.observed import ModelRef

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


def test_a_model_from_the_kopf_based_operator_is_finalized_and_hands_its_service_back(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """A ClefModel that already carries the finalizer the kopf-based operator added (created here
    while no operator runs, as after an upgrade) is adopted, then deleted cleanly by this one: the
    Service is handed back before the finalizer goes, and the model is gone."""
    cluster.image_table()
    legacy = client.V1Service(
        metadata=client.V1ObjectMeta(name="clef-serve"),
        spec=client.V1ServiceSpec(
            selector={"app": "legacy-predictor"},
            ports=[client.V1ServicePort(name="http", port=8000, target_port=8000)],
        ),
    )
    cluster.core.create_namespaced_service(namespace, legacy)
    models = Models(cluster, namespace)
    body = clefmodel(
        "clef-old", service={"name": "clef-serve", "adopt": True}, verification={"required": False}
    )
    body["metadata"]["finalizers"] = [FINALIZER]
    models.create(body)
    with operator_running(cluster, namespace, tmp_path) as op:
        models.operator = op
        models.wait_condition("clef-old", "Ready", "True", "Available", timeout=120)
        assert models.get("clef-old")["metadata"]["finalizers"] == [FINALIZER], "not added twice"
        selector = cluster.core.read_namespaced_service("clef-serve", namespace).spec.selector
        assert selector.get("clef.riotpiao.com/model") == "clef-old", "adopted"
        models.delete("clef-old")
        wait_for(lambda: gone(models, "clef-old"), 60, "the model to go", lambda: models.describe("clef-old"))
        after = cluster.core.read_namespaced_service("clef-serve", namespace)
        assert after.spec.selector == {"app": "legacy-predictor"}, "released with its own selector"


def test_a_release_planned_from_a_stale_cache_reads_the_service_again(
    cluster: Cluster, namespace: str
) -> None:
    """A deleted model's release is planned from the cache and tests the cached resourceVersion:
    when the Service changed since (here: another model adopted it), the patch is refused and the
    release is planned again from the API server's copy, which it must not touch; a Service the
    cache does not hold is read from the API server too."""

    def adopted_by(model: str) -> dict[str, str]:
        return {labels.SERVICE_MODEL: model, labels.ORIGINAL_SELECTOR: '{"app": "legacy-predictor"}'}

    service = client.V1Service(
        metadata=client.V1ObjectMeta(name="clef-serve", annotations=adopted_by("clef-a")),
        spec=client.V1ServiceSpec(
            selector={"clef.riotpiao.com/model": "clef-a"},
            ports=[client.V1ServicePort(name="http", port=8000, target_port=8000)],
        ),
    )
    stale = Kube(cluster.api)
    stale.cache["services"].put(cluster.core.create_namespaced_service(namespace, service))
    patch = {"metadata": {"annotations": adopted_by("clef-b")}, "spec": {"selector": {"x": "b"}}}
    cluster.core.patch_namespaced_service("clef-serve", namespace, patch)

    assert stale.release_service(namespace, "clef-a", "clef-serve") is False, "clef-b drives it now"
    now = cluster.core.read_namespaced_service("clef-serve", namespace)
    assert now.metadata.annotations[labels.SERVICE_MODEL] == "clef-b"
    assert now.spec.selector == {"clef.riotpiao.com/model": "clef-a", "x": "b"}, "left as clef-b has it"

    assert Kube(cluster.api).release_service(namespace, "clef-b", "clef-serve") is True, "read, not cached"
    after = cluster.core.read_namespaced_service("clef-serve", namespace)
    assert after.spec.selector == {"app": "legacy-predictor"}, "released with its own selector"
    assert labels.SERVICE_MODEL not in (after.metadata.annotations or {})


def test_a_service_patch_that_lost_a_race_is_not_reported_as_a_refusal(
    cluster: Cluster, namespace: str
) -> None:
    """The selector and ports patches test the resourceVersion the pass read.  When the Service
    changed in between, the API server's bare 422 is a lost race (nothing written, no refusal
    reported: the change's own event plans again), told apart from a refused patch by a fresh read."""
    service = client.V1Service(
        metadata=client.V1ObjectMeta(name="clef-race"),
        spec=client.V1ServiceSpec(
            selector={"app": "legacy"}, ports=[client.V1ServicePort(name="http", port=8000, target_port=8000)]
        ),
    )
    cluster.core.create_namespaced_service(namespace, service)
    kube = Kube(cluster.api)
    read = kube.core.read_namespaced_service
    model = ModelRef("clef-race", namespace, "uid-race", 1)
    select = act.PatchServiceSelector(
        "clef-race", {"clef.riotpiao.com/model": "m"}, {labels.SERVICE_MODEL: "m"}
    )
    ports = act.PatchServicePorts("clef-race", ({"name": "http", "port": 9000, "targetPort": 8000},))
    stale: list[Any] = []  # what the pass reads: the Service before someone else's change
    kube.core.read_namespaced_service = lambda name, ns, **kw: stale.pop() if stale else read(name, ns, **kw)
    for action in (select, ports):
        stale.append(read("clef-race", namespace))
        cluster.core.patch_namespaced_service(
            "clef-race", namespace, {"metadata": {"labels": {"by": "else"}}}
        )
        assert kube.apply(model, action) is None, f"{type(action).__name__}: a lost race is no refusal"
        assert not stale, "the pass read the stale copy"
        now = cluster.core.read_namespaced_service("clef-race", namespace)
        assert now.spec.selector == {"app": "legacy"} and now.spec.ports[0].port == 8000, "nothing written"
        cluster.core.patch_namespaced_service("clef-race", namespace, {"metadata": {"labels": {"by": None}}})

    kube.core.read_namespaced_service = read
    refused = kube.apply(
        model, act.PatchServiceSelector("clef-race", {"clef.riotpiao.com/model": "not valid!"}, {})
    )
    assert refused is not None and "not valid!" in refused, refused
    assert cluster.core.read_namespaced_service("clef-race", namespace).spec.selector == {"app": "legacy"}


def gone(models: Models, name: str) -> bool:
    try:
        models.get(name)
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


# The check is an absence, so it needs a window: the Service's watch must stay empty for it.  The
# old operator's patch came within the first second and then 18 times a second, so 10 s holds
# many of its attempts; a refused pass retried only after REFUSED_RETRY_SECONDS (30) would not be
# seen, which the ServiceConflict condition (no write planned at all) covers instead.
UNTOUCHED_SECONDS = 10


def test_an_unnamed_port_is_refused_once_as_a_conflict_not_retried(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """Issue 33, finding 8: adopting a Service whose one port has no name and another number
    would need a second port, which the API server refuses without names (422): the old operator
    retried the patch 18 times in the first second, forever.  Now it is a ServiceConflict that
    says what to do, and the Service is left exactly as it was (watched, not sampled)."""
    from .watches import GaplessWatch

    cluster.image_table()
    legacy = client.V1Service(
        metadata=client.V1ObjectMeta(name="clef-serve"),
        spec=client.V1ServiceSpec(
            selector={"app": "legacy-predictor"}, ports=[client.V1ServicePort(port=80, target_port=8080)]
        ),
    )
    before = cluster.core.create_namespaced_service(namespace, legacy)
    named = "metadata.name=clef-serve"
    with (
        operator_running(cluster, namespace, tmp_path) as op,
        GaplessWatch(cluster.core.list_namespaced_service, namespace, field_selector=named) as service,
    ):
        models = Models(cluster, namespace, op)
        models.create(clefmodel("clef-flash", service={"name": "clef-serve", "adopt": True}))
        degraded = models.wait_condition("clef-flash", "Degraded", "True", "ServiceConflict", timeout=60)
        assert "without a name" in degraded["message"] and "80->8080" in degraded["message"], degraded
        deadline = time.monotonic() + UNTOUCHED_SECONDS
        while time.monotonic() < deadline:
            assert not service.snapshot(), f"the Service was changed: {service.snapshot()}"
            time.sleep(0.5)
        ready = models.get("clef-flash")["status"]["conditions"]
        assert ("Ready", "False") in [(c["type"], c["status"]) for c in ready]
    after = cluster.core.read_namespaced_service("clef-serve", namespace)
    assert after.metadata.resource_version == before.metadata.resource_version
