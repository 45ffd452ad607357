"""The CPU runtime image on a real node, judged by the in-cluster operator (the issue's tests 2
and 3): kernels verification, where the verification Job runs `clef-runtime verify` from the image
in a pod on the node; and endpoint verification, where the preview is a real pod serving
`clef-runtime serve` from an engine image built on the runtime image, asked by a comparison Job
that is a real pod on the node too.  In both a clean image is promoted and the key-band fault is
held.  The operator is deployed from the shipped tree for this module (conftest.py).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from clef_contract.command import RUNTIME_UID
from clef_devcluster.checkpoints import write_chat_checkpoint
from clef_devcluster.host_operator import clef_flash
from clef_devcluster.realnode import LABEL, NODE_NAME, TOLERATION
from clef_operator import labels
from clef_operator.api import GROUP, PLURAL, VERSION
from clef_operator.conditions import READY, VERIFIED

from .conftest import (
    PRODUCT,
    REAL_CLASS,
    VERIFY_SECONDS,
    RealCluster,
    RuntimeImages,
    watch_until,
)
from .support import condition, delete_namespace, events_of, model_object, restricted_namespace, watch_models

pytestmark = pytest.mark.real_node


def test_the_runtime_image_verifies_on_the_node_a_clean_image_promotes_a_faulty_one_is_held(
    real: RealCluster, deployed_operator: list[dict[str, Any]], runtime_images: RuntimeImages
) -> None:
    """The issue's test 2: a ClefModel whose verification Job runs the CPU runtime image in a
    pod on the real node (containerd, runc, UID 65532, read-only root, Pod Security "restricted"
    enforced), judged by the in-cluster operator.  The clean image passes and its candidate is
    scaled up, pinned to the digest containerd ran; the key-band fault is caught by name and the
    candidate is held at 0.  (The runtime image has no candle-vllm: the promoted serving pod
    cannot serve, and this test does not ask it to; the endpoint test below serves for real.)"""
    ns = "t-runtime"
    restricted_namespace(real, ns)
    custom = client.CustomObjectsApi(real.api)
    try:
        base = {
            **clef_flash(runtime_images.clean),
            "runtimeClassName": "runc",
            "nodeSelector": {**LABEL, PRODUCT: REAL_CLASS},
            "tolerations": [TOLERATION],
            "runAsUser": RUNTIME_UID,
            "verification": {"mode": "kernels", "timeoutSeconds": int(VERIFY_SECONDS)},
        }
        clean = {**base, "service": {"name": "clean-serve"}}
        faulty = {**base, "image": runtime_images.faulty, "service": {"name": "faulty-serve"}}
        started = time.monotonic()
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, model_object("clean", clean))
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, model_object("faulty", faulty))
        seen: dict[str, float] = {}

        def judged(models: list[Any]) -> dict[str, Any] | None:
            for e in real.core.list_namespaced_event(ns).items:
                if e.reason == "FailedCreate" and e.involved_object.kind == "Job":
                    raise AssertionError(f"Job/{e.involved_object.name}: {e.message}")
            by_name = {m["metadata"]["name"]: m for m in models}
            for name in ("clean", "faulty"):
                v = condition(by_name.get(name, {}), VERIFIED)
                if v and v["status"] in ("True", "False") and v["reason"] not in ("VerificationPending",):
                    seen.setdefault(name, time.monotonic() - started)
            return by_name if len(seen) == 2 else None

        models = watch_models(custom, ns, judged, VERIFY_SECONDS, lambda: events_of(real, ns))
        print(f"verdicts: clean after {seen['clean']:.0f}s, faulty after {seen['faulty']:.0f}s")

        # Both verification pods ran here, for real, as the runtime user.
        jobs_pods = [
            p
            for p in real.core.list_namespaced_pod(ns).items
            if (p.metadata.labels or {}).get(labels.COMPONENT) == labels.COMPONENT_VERIFICATION
        ]
        ran = {}
        for p in jobs_pods:
            assert p.spec.node_name == NODE_NAME, (p.metadata.name, p.spec.node_name)
            (cs,) = p.status.container_statuses
            assert cs.container_id.startswith("containerd://"), cs.container_id
            ran[(p.metadata.labels or {})[labels.VERIFIES]] = (cs.image_id, cs.state.terminated)
        assert set(ran) == {"clean", "faulty"}, sorted(ran)

        v = condition(models["clean"], VERIFIED)
        assert v is not None and (v["status"], v["reason"]) == ("True", "Verified"), v
        image_id, term = ran["clean"]
        assert term.exit_code == 0, term
        assert image_id.endswith(runtime_images.clean.split("@")[1]), (image_id, runtime_images.clean)

        v = condition(models["faulty"], VERIFIED)
        assert v is not None and (v["status"], v["reason"]) == ("False", "KernelMismatch"), v
        image_id, term = ran["faulty"]
        assert term.exit_code == 1, term
        assert image_id.endswith(runtime_images.faulty.split("@")[1]), (image_id, runtime_images.faulty)
        assert "key channel band" in json.dumps(models["faulty"]["status"]), models["faulty"]["status"]

        # The clean candidate is scaled up, pinned to the digest its verification pod ran; the
        # faulty one is held at 0 (or never made).
        def deployments(ds: list[client.V1Deployment]) -> dict[str, list[client.V1Deployment]] | None:
            by_model: dict[str, list[client.V1Deployment]] = {"clean": [], "faulty": []}
            for d in ds:
                by_model.setdefault((d.metadata.labels or {}).get(labels.MODEL, "?"), []).append(d)
            return by_model if any((d.spec.replicas or 0) > 0 for d in by_model["clean"]) else None

        by_model = watch_until(
            real.apps.list_namespaced_deployment, deployments, 60, "the clean candidate scaled up",
            lambda: events_of(real, ns), namespace=ns,
        )  # fmt: skip
        (up,) = [d for d in by_model["clean"] if (d.spec.replicas or 0) > 0]
        assert up.spec.template.spec.containers[0].image == runtime_images.clean, (
            up.spec.template.spec.containers[0].image
        )
        assert up.spec.template.spec.node_selector[PRODUCT] == REAL_CLASS
        assert all((d.spec.replicas or 0) == 0 for d in by_model["faulty"]), [
            (d.metadata.name, d.spec.replicas) for d in by_model["faulty"]
        ]
        print(f"promoted: {up.metadata.name} -> {runtime_images.clean}; held: faulty ({v['message'][:200]})")
    finally:
        delete_namespace(real, custom, ns)


# ------------------------------------------------------------------ endpoint mode, for real

# Two short chat prompts and a few new tokens, as the cluster tier's endpoint test asks.
PROMPTS = [
    {"name": "capital", "text": "What is the capital of France?"},
    {"name": "count", "text": "Count from one to five."},
]
# The preview's readyTimeoutSeconds: a fresh container imports torch and loads the checkpoint
# on a loaded 2-core machine before /v1/models answers (about a minute measured; 5x that).
READY_SECONDS = 300


def _checkpoint() -> Path:
    """The cluster tier's small chat checkpoint, where the pods' UID 65532 can read it (pytest's
    own temporary directories are root's alone)."""
    root = Path(tempfile.mkdtemp(prefix="clef-realnode-"))
    root.chmod(0o755)
    checkpoint = write_chat_checkpoint(root / "clef-flash")
    for path in (checkpoint, *checkpoint.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return checkpoint


def _weights_claim(real: RealCluster, ns: str, checkpoint: Path) -> str:
    """The checkpoint as a PersistentVolumeClaim bound to a hostPath PersistentVolume the admin
    (this test) made: the shipped tree allows no hostPath in clef's pods (its admission policy
    clef-operator-host-paths), and Pod Security "restricted" allows claims."""
    name = f"{ns}-clef-flash"
    real.core.create_persistent_volume(
        client.V1PersistentVolume(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1PersistentVolumeSpec(
                capacity={"storage": "1Gi"},
                access_modes=["ReadOnlyMany"],
                host_path=client.V1HostPathVolumeSource(path=str(checkpoint), type="Directory"),
                storage_class_name="",
                persistent_volume_reclaim_policy="Retain",
                claim_ref=client.V1ObjectReference(namespace=ns, name="clef-flash"),
            ),
        )
    )
    real.core.create_namespaced_persistent_volume_claim(
        ns,
        client.V1PersistentVolumeClaim(
            metadata=client.V1ObjectMeta(name="clef-flash"),
            spec=client.V1PersistentVolumeClaimSpec(
                access_modes=["ReadOnlyMany"],
                storage_class_name="",
                volume_name=name,
                resources=client.V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
            ),
        ),
    )
    watch_until(
        real.core.list_namespaced_persistent_volume_claim,
        lambda claims: any(c.status and c.status.phase == "Bound" for c in claims) or None,
        60, "PersistentVolumeClaim clef-flash Bound", namespace=ns, field_selector="metadata.name=clef-flash",
    )  # fmt: skip
    return name


def _endpoint_flash(image: str, runtime: str) -> dict[str, Any]:
    return {
        **clef_flash(image),
        "model": {
            "name": "clef-flash",
            "path": "/models/clef-flash",
            "volume": {"pvc": {"claimName": "clef-flash"}},
        },
        "runtimeClassName": "runc",
        "nodeSelector": {**LABEL, PRODUCT: REAL_CLASS},
        "tolerations": [TOLERATION],
        "runAsUser": RUNTIME_UID,
        "service": {"name": "flash-serve"},
        "verification": {
            "mode": "endpoint",
            "timeoutSeconds": int(VERIFY_SECONDS),
            "endpoint": {
                "runtimeImage": runtime,
                "builtinPrompts": "none",
                "prompts": PROMPTS,
                "maxNewTokens": 6,
                "requestTimeoutSeconds": 300,
                "readyTimeoutSeconds": READY_SECONDS,
            },
        },
        "rollout": {"scaleDownDelaySeconds": 2, "revisionHistoryLimit": 1},
    }


def _ran_here(pod: client.V1Pod) -> client.V1ContainerStatus:
    """The pod's one container status, after checking that this node's containerd ran it."""
    assert pod.spec.node_name == NODE_NAME, (pod.metadata.name, pod.spec.node_name)
    (cs,) = pod.status.container_statuses
    assert cs.container_id and cs.container_id.startswith("containerd://"), (
        pod.metadata.name,
        cs.container_id,
    )
    return cs


def _pods(real: RealCluster, ns: str, step: str) -> list[client.V1Pod]:
    return [
        p
        for p in real.core.list_namespaced_pod(ns).items
        if (p.metadata.labels or {}).get(labels.STEP) == step
    ]


def test_endpoint_mode_a_real_preview_serves_and_a_real_comparison_pod_asks_it(
    real: RealCluster, deployed_operator: list[dict[str, Any]], runtime_images: RuntimeImages
) -> None:
    """The issue's test 3.  The candidate is an engine image built on the CPU runtime image (its
    `candle-vllm` is `clef-runtime serve`, candle_vllm.py); the goldens Job, the preview and the
    comparison Job are pods on the real node, the comparison asking the preview at its pod IP on
    the node's bridge.  The clean engine is promoted in place: the Service selects the real pod,
    which carries the serving label; then the key-band fault in the engine is an EndpointMismatch,
    its preview never gets the serving label, and the clean revision keeps serving.

    The namespace enforces Pod Security "restricted"; the weights are a claim bound to a hostPath
    volume (`_weights_claim`)."""
    ns = "t-endpoint"
    restricted_namespace(real, ns)
    custom = client.CustomObjectsApi(real.api)
    checkpoint = _checkpoint()
    volume = ""
    try:
        volume = _weights_claim(real, ns, checkpoint)
        spec = _endpoint_flash(runtime_images.engine, runtime_images.clean)
        started = time.monotonic()
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, model_object("flash", spec))

        def promoted(models: list[Any]) -> dict[str, Any] | None:
            (m,) = models or [{}]
            v = condition(m, VERIFIED)
            if v and v["status"] == "False":
                raise AssertionError(f"the clean engine was not verified: {v}")
            d = condition(m, "Degraded")
            if d and d["reason"] == "ChildRejected":
                raise AssertionError(f"the API server refused a child: {d['message']}")
            r = condition(m, READY)
            return (
                m if r and r["status"] == "True" and (m.get("status") or {}).get("activeRevision") else None
            )

        model = watch_models(custom, ns, promoted, VERIFY_SECONDS, lambda: events_of(real, ns))
        print(
            f"endpoint: goldens, preview and comparison on the node, promoted in {time.monotonic() - started:.0f}s"
        )
        status = model["status"]
        records = status["verifications"]
        assert [r["step"] for r in records[:3]] == ["endpoint", "preview", "goldens"], records
        assert (records[0]["verdict"], records[0]["reason"]) == ("Passed", "Verified"), records[0]
        assert records[0]["digest"] == runtime_images.engine, (records[0]["digest"], runtime_images.engine)

        # Goldens and comparison: real pods of the runtime image, here, as the runtime user.
        (goldens,) = _pods(real, ns, "goldens")
        (comparison,) = _pods(real, ns, "endpoint")
        for pod in (goldens, comparison):
            cs = _ran_here(pod)
            assert cs.state.terminated and cs.state.terminated.exit_code == 0, (pod.metadata.name, cs.state)
            assert cs.image_id.endswith(runtime_images.clean.split("@")[1]), (
                cs.image_id,
                runtime_images.clean,
            )
            assert pod.spec.security_context.run_as_user == RUNTIME_UID
        # The comparison carries the model's placement (it would not fit the tainted node otherwise).
        tolerations = [
            {"key": t.key, "operator": t.operator, "value": t.value, "effect": t.effect}
            for t in comparison.spec.tolerations or []
        ]
        assert TOLERATION in tolerations, tolerations
        url = comparison.spec.containers[0].command[comparison.spec.containers[0].command.index("--url") + 1]

        # The preview became the serving pod: the engine image ran by digest, on this node.
        serving = real.core.list_namespaced_pod(
            ns, label_selector=f"{labels.REVISION}={status['activeRevision']}"
        ).items
        (pod,) = [p for p in serving if p.metadata.deletion_timestamp is None]
        cs = _ran_here(pod)
        assert cs.ready and cs.image_id.endswith(runtime_images.engine.split("@")[1]), (cs.image_id, cs.ready)
        assert url.startswith(f"http://{pod.status.pod_ip}:"), (url, pod.status.pod_ip)
        assert (pod.metadata.labels or {}).get(labels.MODEL) == "flash", (
            "the verified pod has the serving label"
        )
        with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as r:
            served = json.load(r)
        print(f"serving pod {pod.metadata.name} at {pod.status.pod_ip}: /v1/models {served}")

        # The Service selects it: its EndpointSlice holds the real pod's address.
        svc = real.core.read_namespaced_service("flash-serve", ns)
        assert svc.spec.selector == {labels.MODEL: "flash", labels.REVISION: status["activeRevision"]}, (
            svc.spec.selector
        )
        discovery = client.DiscoveryV1Api(real.api)

        def addresses(slices: list[client.V1EndpointSlice]) -> set[str] | None:
            found = {a for s in slices for e in (s.endpoints or []) for a in e.addresses}
            return found if pod.status.pod_ip in found else None

        behind = watch_until(
            discovery.list_namespaced_endpoint_slice, addresses, 60, f"Service flash-serve's EndpointSlice to hold {pod.status.pod_ip}",
            namespace=ns, label_selector="kubernetes.io/service-name=flash-serve",
        )  # fmt: skip
        assert behind == {pod.status.pod_ip}, behind

        # The key-band fault in the engine: asked, caught, held; the clean pod keeps serving.
        active = status["activeRevision"]
        started = time.monotonic()
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, "flash", {"spec": {"image": runtime_images.engine_faulty}}
        )

        def judged(models: list[Any]) -> dict[str, Any] | None:
            (m,) = models
            v = condition(m, VERIFIED)
            return m if v and v["status"] == "False" else None

        model = watch_models(custom, ns, judged, VERIFY_SECONDS, lambda: events_of(real, ns))
        v = condition(model, VERIFIED)
        assert v is not None and v["reason"] == "EndpointMismatch", v
        print(f"endpoint: the faulty engine held in {time.monotonic() - started:.0f}s: {v['message'][:200]}")
        assert model["status"]["activeRevision"] == active, "the clean revision keeps serving"
        assert model["status"]["verifications"][1]["digest"] == runtime_images.engine_faulty
        checks = [p for p in _pods(real, ns, "endpoint") if p.metadata.uid != comparison.metadata.uid]
        assert checks, "the faulty preview was asked by a comparison pod"
        for check in checks:
            term = _ran_here(check).state.terminated
            assert term and term.exit_code == 1, (check.metadata.name, term)
        labelled = real.core.list_namespaced_pod(ns, label_selector=f"{labels.MODEL}=flash").items
        assert [p.metadata.name for p in labelled] == [pod.metadata.name], "only the verified pod is served"
    finally:
        delete_namespace(real, custom, ns)
        if volume:
            real.core.delete_persistent_volume(volume)
        shutil.rmtree(checkpoint.parent, ignore_errors=True)
