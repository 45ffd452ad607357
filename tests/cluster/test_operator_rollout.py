"""The story of DESIGN's first section, on the real control plane, in order (issue 6, tests 1, 2,
3 and 5): first deploy, a new good image, the key-band fault caught, and a rollback.

The steps share one namespace and one operator, as one ClefModel's life does; each step states
what it needs from the step before and fails with the ClefModel's status and the operator's log.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .conftest import Cluster, wait_for
from .operator_support import (
    IMAGE_10,
    IMAGE_11,
    KEY_BAND_IMAGE,
    V100,
    VERIFY_SECONDS,
    EndpointWatch,
    Models,
    OperatorProcess,
    clefmodel,
    delete_models,
    image_of,
    ready_endpoints,
)

pytestmark = pytest.mark.cluster

NAME = "clef-flash"
SERVICE = "clef-serve"


@pytest.fixture(scope="module")
def story(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Models]:
    cluster.image_table()
    ns = f"story-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    wait_for(lambda: _has_default_sa(cluster, ns), 30, f"ServiceAccount {ns}/default")
    op = OperatorProcess(cluster.kubeconfig, ns, tmp_path_factory.mktemp("operator") / "operator.log")
    op.start()
    try:
        yield Models(cluster, ns, op)
    finally:
        delete_models(cluster, ns)
        op.stop()
        cluster.core.delete_namespace(ns, propagation_policy="Background")


def _has_default_sa(cluster: Cluster, ns: str) -> bool:
    return bool(
        cluster.core.list_namespaced_service_account(ns, field_selector="metadata.name=default").items
    )


def _active(models: Models) -> str:
    return str(models.get(NAME)["status"]["activeRevision"])


MEMO: dict[str, Any] = {}


def test_1_first_deploy_verifies_for_real_and_serves(story: Models, cluster: Cluster) -> None:
    story.create(clefmodel(NAME, IMAGE_10))
    story.wait_condition(NAME, "Ready", "True", "Available", timeout=VERIFY_SECONDS + 120)

    status = story.get(NAME)["status"]
    verified = story.condition(NAME, "Verified")
    assert verified["status"] == "True", verified
    (record,) = status["verifications"]
    assert record["verdict"] == "Passed" and record["gpuClass"] == V100
    assert record["digest"].startswith("registry.clef.test/clef-runtime@sha256:")

    (job,) = story.jobs(NAME)
    assert any(c.type == "Complete" and c.status == "True" for c in job.status.conditions or [])
    pod_spec = job.spec.template.spec
    assert pod_spec.containers[0].image == IMAGE_10
    assert pod_spec.containers[0].image_pull_policy == "Always"
    assert pod_spec.containers[0].command[:2] == ["clef-runtime", "verify"]

    deployment = story.deployment_of(NAME, status["activeRevision"])
    assert image_of(deployment) == record["digest"], "serving runs exactly the digest that was verified"
    assert deployment.spec.template.spec.runtime_class_name == "nvidia"
    assert deployment.status.available_replicas == 1

    svc = cluster.core.read_namespaced_service(SERVICE, story.ns)
    assert svc.spec.selector == {
        "clef.riotpiao.com/model": NAME,
        "clef.riotpiao.com/revision": status["activeRevision"],
    }
    wait_for(
        lambda: ready_endpoints(cluster, story.ns, SERVICE) == 1, 30, "one ready endpoint behind clef-serve"
    )
    # V100-16GB from the node label, weights 9426 MiB, f16, kvFraction 0.30: about 66.8K tokens.
    assert 66_000 < status["kvCacheTokens"] < 67_500, status["kvCacheTokens"]
    story.wait_events(NAME, "VerificationStarted", "VerificationPassed", "RevisionCreated", "ServiceSwitched")

    assert cluster.kubectl, "kubectl is needed to show the printer columns"
    out = subprocess.run(
        [cluster.kubectl, "--kubeconfig", str(cluster.kubeconfig), "get", "clefmodels", "-n", story.ns],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    header, row = out.splitlines()[:2]
    assert header.split() == ["NAME", "READY", "VERIFIED", "ACTIVE", "CANDIDATE", "AGE"]
    assert row.split()[:4] == [NAME, "True", "True", status["activeRevision"]]
    MEMO["first"] = status["activeRevision"]
    MEMO["svc"] = (svc.metadata.uid, svc.spec.cluster_ip)


def test_2_new_good_image_swaps_with_endpoints_never_empty(story: Models, cluster: Cluster) -> None:
    first = MEMO.get("first")
    assert first, "needs test_1's serving revision"
    with EndpointWatch(cluster, story.ns, SERVICE) as endpoints:
        story.set_image(NAME, IMAGE_11)
        story.wait_status(
            NAME,
            lambda s: s.get("activeRevision") not in (None, first),
            "the switch to 1.1",
            VERIFY_SECONDS + 120,
        )
        story.wait_condition(NAME, "Ready", "True", "Available")
        # scaleDownDelaySeconds is 5: the old revision goes to 0 after it, not before.
        wait_for(
            lambda: story.deployment_of(NAME, first).spec.replicas == 0,
            60,
            "the old revision at 0 replicas",
            lambda: story.describe(NAME),
        )
        wait_for(
            lambda: ready_endpoints(cluster, story.ns, SERVICE) == 1, 30, "one endpoint after scale-down"
        )
    assert endpoints.counts, "the EndpointSlice watch saw nothing"
    assert min(endpoints.counts) >= 1, (
        f"the Service had no ready endpoint during the rollout: {endpoints.counts}"
    )
    svc = cluster.core.read_namespaced_service(SERVICE, story.ns)
    assert (svc.metadata.uid, svc.spec.cluster_ip) == MEMO["svc"], "the Service was recreated or moved"
    story.wait_events(NAME, "RevisionScaledDown")
    MEMO["second"] = _active(story)


def test_3_key_band_fault_is_caught_and_held(story: Models, cluster: Cluster) -> None:
    second = MEMO.get("second")
    assert second, "needs test_2's serving revision"
    before = {d.metadata.name for d in story.deployments(NAME)}
    story.set_image(NAME, KEY_BAND_IMAGE)
    verified = story.wait_condition(NAME, "Verified", "False", timeout=VERIFY_SECONDS + 60)
    assert verified["reason"] == "KernelMismatch", verified
    assert "causal_conv1d" in verified["message"] and "key" in verified["message"], verified["message"]
    degraded = story.condition(NAME, "Degraded")
    assert degraded["status"] == "True" and "causal_conv1d" in degraded["message"]
    ready = story.condition(NAME, "Ready")
    assert ready["status"] == "True", ready
    status = story.get(NAME)["status"]
    assert status["activeRevision"] == second, "the old revision still serves"
    assert not status.get("candidateRevision")
    assert status["verifications"][0]["failing"][0]["op"] == "causal_conv1d"
    # Held at 0: no Deployment was made for the faulty image, nothing runs it.
    fault = cluster.image_table().lookup(KEY_BAND_IMAGE)
    assert fault is not None, "the harness has no key-band fault image"
    after = story.deployments(NAME)
    assert {d.metadata.name for d in after} == before
    assert all(image_of(d) != fault.image_id for d in after)
    svc = cluster.core.read_namespaced_service(SERVICE, story.ns)
    assert svc.spec.selector["clef.riotpiao.com/revision"] == second
    assert ready_endpoints(cluster, story.ns, SERVICE) == 1
    story.wait_events(NAME, "VerificationFailed")


def test_4_hand_edits_and_deleted_children_are_put_back(story: Models, cluster: Cluster) -> None:
    second = MEMO.get("second")
    assert second, "needs test_2's serving revision"
    wanted = {"clef.riotpiao.com/model": NAME, "clef.riotpiao.com/revision": second}
    cluster.core.patch_namespaced_service(
        SERVICE,
        story.ns,
        [{"op": "replace", "path": "/spec/selector", "value": {"app": "by-hand"}}],
        _content_type="application/json-patch+json",
    )
    wait_for(
        lambda: cluster.core.read_namespaced_service(SERVICE, story.ns).spec.selector == wanted,
        30,
        "the selector to be put back",
        lambda: story.describe(NAME),
    )
    story.wait_events(NAME, "SelectorRestored")

    cluster.apps.delete_namespaced_deployment(f"{NAME}-{second}", story.ns)
    wait_for(
        lambda: _available(story, second),
        60,
        "the deleted active Deployment to come back",
        lambda: story.describe(NAME),
    )
    story.wait_events(NAME, "RevisionRecreated")
    story.wait_condition(NAME, "Ready", "True", "Available", timeout=30)


def _available(models: Models, revision: str) -> bool:
    try:
        d = models.deployment_of(NAME, revision)
    except ApiException:
        return False
    return d.metadata.deletion_timestamp is None and (d.status.available_replicas or 0) == 1


def test_5_rollback_to_the_earlier_image_needs_no_job(story: Models, cluster: Cluster) -> None:
    first = MEMO.get("first")
    assert first, "needs test_1's serving revision"
    jobs_before = {j.metadata.name for j in story.jobs(NAME)}
    story.set_image(NAME, IMAGE_10)
    story.wait_status(NAME, lambda s: s.get("activeRevision") == first, "the switch back to 1.0", timeout=20)
    story.wait_condition(NAME, "Ready", "True", "Available", timeout=20)
    assert {j.metadata.name for j in story.jobs(NAME)} == jobs_before, "a rollback ran a new verification"
    assert story.condition(NAME, "Verified")["status"] == "True"
    assert story.condition(NAME, "Degraded")["status"] == "False"


def test_6_deleting_the_model_removes_what_it_owns(story: Models, cluster: Cluster) -> None:
    assert MEMO.get("first"), "needs the model of test_1"
    story.delete(NAME)
    wait_for(
        lambda: (
            not story.custom.list_namespaced_custom_object(
                "clef.riotpiao.com", "v1alpha1", story.ns, "clefmodels"
            )["items"]
        ),
        60,
        "the ClefModel to go",
        lambda: story.describe(NAME),
    )
    wait_for(lambda: not story.deployments(NAME), 60, "owned Deployments to be garbage-collected")
    wait_for(
        lambda: (
            not cluster.core.list_namespaced_service(
                story.ns, field_selector=f"metadata.name={SERVICE}"
            ).items
        ),
        60,
        "the Service clef created to go with it",
    )
