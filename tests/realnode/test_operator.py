"""The operator image, deployed from the shipped kustomize tree, on a real node: both replicas
Ready, one elected (Lease clef-system/clef-operator held), /healthz passing, the verdict key made;
then, with that in-cluster operator, Pod Security "restricted" enforced on the pods it creates.

This is what every other tier cannot see: the image's own Python, user (UID 65532 with no passwd
entry), read-only root, seccomp profile, service-account token and in-cluster configuration.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_contract.command import DEVICE_ENV, FAULT_ENV, RUNTIME_UID, SHAPES_ENV
from clef_devcluster.host_operator import OPERATOR_NAMESPACE, clef_flash
from clef_devcluster.imagearchive import write_env_variant
from clef_devcluster.kustomize import BASE, find, kustomize_build
from clef_devcluster.realnode import LABEL, NODE_NAME, TOLERATION
from clef_operator import labels
from clef_operator.api import GROUP, PLURAL, VERSION
from clef_operator.conditions import READY, VERIFIED
from clef_operator.kube import VERDICT_KEY_SECRET
from clef_operator.manager.leader import LEASE_NAME

from .conftest import (
    IMAGES_DIR,
    PINNED,
    STATE_DIR,
    BuiltImage,
    RealCluster,
    built_image,
    watch_until,
    write_overlay,
)

pytestmark = pytest.mark.real_node

SELECTOR = "app.kubernetes.io/name=clef-operator"
GPU = labels.GPU_RESOURCE
PRODUCT = labels.NODE_GPU_PRODUCT
START_SECONDS = 180.0


def _placement() -> list[dict[str, Any]]:
    """The only change to the shipped tree: the operator's pods go to the real node (tainted, so
    that nothing of the cluster tier's kwok nodes' lands there)."""
    ops = [
        {"op": "add", "path": "/spec/template/spec/tolerations", "value": [TOLERATION]},
        *(
            {"op": "add", "path": f"/spec/template/spec/nodeSelector/{k.replace('/', '~1')}", "value": v}
            for k, v in LABEL.items()
        ),
    ]
    return [{"target": {"kind": "Deployment", "name": "clef-operator"}, "patch": _json(ops)}]


def _json(value: Any) -> str:
    return json.dumps(value)


@pytest.fixture(scope="module")
def deployed_operator(real: RealCluster, operator_image: BuiltImage) -> Iterator[list[dict[str, Any]]]:
    """The pinned overlay (`make images`: kustomize/base with the operator at the digest just
    built; the install path of docs/operations.md) applied with the placement above."""
    if (PINNED / "kustomization.yaml").is_file():
        source, patches = PINNED, _placement()
    else:
        source, patches = BASE, _placement()
    overlay = write_overlay(STATE_DIR / "overlays" / "operator", source, patches)
    if source == BASE:
        # The same pin the generated overlay makes, where it has not been generated.
        import yaml

        doc = yaml.safe_load((overlay / "kustomization.yaml").read_text())
        repo = operator_image.ref.rsplit(":", 1)[0]
        doc["images"] = [
            {"name": "ghcr.io/riotpiao/clef-operator", "newName": repo, "digest": operator_image.digest}
        ]
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    objects = kustomize_build(real.kubectl, overlay)
    image = find(objects, "Deployment", "clef-operator")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == operator_image.pinned, f"the overlay deploys {image}, not the image just built"
    real.run_kubectl("apply", "--server-side", "-k", str(overlay))
    try:
        yield objects
    finally:
        real.run_kubectl(
            "-n", OPERATOR_NAMESPACE, "delete", "deployment", "clef-operator", "--wait=false", check=False
        )
        # The pods stop through the kubelet (a clean container stop), not the node's teardown.
        try:
            watch_until(
                real.core.list_namespaced_pod,
                lambda pods: not pods or None,
                60,
                "the operator's pods to go",
                namespace=OPERATOR_NAMESPACE,
                label_selector=SELECTOR,
            )
        except AssertionError as e:
            print(f"real-node: {e}")


def _why_not_running(real: RealCluster, pod: client.V1Pod) -> str | None:
    """A container that restarted or ended: the reason and its log (a crash-loop fails at once,
    not at the timeout)."""
    for cs in (pod.status and pod.status.container_statuses) or []:
        term = (cs.state and cs.state.terminated) or (cs.last_state and cs.last_state.terminated)
        if cs.restart_count or term:
            try:
                log = real.core.read_namespaced_pod_log(
                    pod.metadata.name, OPERATOR_NAMESPACE, container=cs.name, previous=bool(cs.restart_count),
                    tail_lines=30,
                )  # fmt: skip
            except ApiException as e:
                log = f"(no log: {e.reason})"
            reason = f"{term.reason} (exit {term.exit_code})" if term else "restarted"
            return (
                f"pod {pod.metadata.name} container {cs.name}: {reason}, restarts {cs.restart_count}:\n{log}"
            )
    return None


def _logs(real: RealCluster) -> str:
    """Each operator pod's state and last log lines (its previous container's if it restarted)."""
    out = []
    for pod in real.core.list_namespaced_pod(OPERATOR_NAMESPACE, label_selector=SELECTOR).items:
        restarts = sum(cs.restart_count for cs in (pod.status and pod.status.container_statuses) or [])
        try:
            text = real.core.read_namespaced_pod_log(
                pod.metadata.name, OPERATOR_NAMESPACE, tail_lines=25, previous=restarts > 0
            )
        except ApiException as e:
            text = f"(no log: {e.reason})"
        out.append(f"--- {pod.metadata.name} ({pod.status.phase}, {restarts} restarts) ---\n{text}")
    return "\n".join(out)


def _ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status and pod.status.conditions) or [])


def test_operator_image_from_the_shipped_tree_runs_and_elects_a_leader(
    real: RealCluster, deployed_operator: list[dict[str, Any]]
) -> None:
    replicas = find(deployed_operator, "Deployment", "clef-operator")["spec"]["replicas"]

    def running(pods: list[client.V1Pod]) -> list[client.V1Pod] | None:
        for pod in pods:
            problem = _why_not_running(real, pod)
            if problem:
                raise AssertionError(problem)
        live = [p for p in pods if p.metadata.deletion_timestamp is None]
        return live if len(live) == replicas and all(_ready(p) for p in live) else None

    def events() -> str:
        items = real.core.list_namespaced_event(OPERATOR_NAMESPACE).items
        return "\n".join(f"{e.involved_object.name}: {e.reason}: {e.message}" for e in items[-15:])

    pods = watch_until(
        real.core.list_namespaced_pod, running, START_SECONDS, f"{replicas} operator pods Ready", events,
        namespace=OPERATOR_NAMESPACE, label_selector=SELECTOR,
    )  # fmt: skip
    names = {p.metadata.name for p in pods}
    for pod in pods:
        # Run by this node's containerd, not played by kwok.
        assert pod.spec.node_name == NODE_NAME, (pod.metadata.name, pod.spec.node_name)
        assert pod.status.container_statuses[0].container_id.startswith("containerd://")

    coordination = client.CoordinationV1Api(real.api)

    def held(leases: list[Any]) -> str | None:
        for lease in leases:
            holder = (lease.spec and lease.spec.holder_identity) or ""
            # The default identity is the pod's hostname (its name) and a random suffix.
            if holder.rsplit("_", 1)[0] in names:
                return str(holder)
        return None

    holder = watch_until(
        coordination.list_namespaced_lease, held, 60, f"Lease {LEASE_NAME} held by one of {sorted(names)}",
        events, namespace=OPERATOR_NAMESPACE, field_selector=f"metadata.name={LEASE_NAME}",
    )  # fmt: skip

    # /healthz from the host, at each pod's address on the node's bridge (what the kubelet's
    # liveness probe asks too), in the leader and in the standby.
    for pod in pods:
        try:
            with urllib.request.urlopen(f"http://{pod.status.pod_ip}:9090/healthz", timeout=5) as r:
                assert r.status == 200, (pod.metadata.name, r.status)
        except OSError as e:
            raise AssertionError(f"/healthz of {pod.metadata.name}: {e}\n{_logs(real)}") from None

    # The leader did its first work through the in-cluster API path (DNAT to the API server).
    watch_until(
        real.core.list_namespaced_secret, lambda secrets: secrets or None, 60, f"Secret {VERDICT_KEY_SECRET}",
        lambda: _logs(real), namespace=OPERATOR_NAMESPACE, field_selector=f"metadata.name={VERDICT_KEY_SECRET}",
    )  # fmt: skip
    print(f"leader: {holder}")


# Models as the cluster tier's (kwok's V100 node, the harness's image table: the runner runs
# their verification for real on this host); only the namespace is new: it enforces "restricted".
MODEL_IMAGE = "registry.clef.test/clef-runtime:1.0"
V100 = "Tesla-V100-SXM2-16GB"
RESTRICTED = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn", "audit")}
ROLLOUT_SECONDS = 600.0
# An engine image that runs as a non-root user, as the model says with spec.runAsUser.
ENGINE_UID = 1000


def _restricted_namespace(real: RealCluster, ns: str) -> None:
    real.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns, labels=RESTRICTED)))
    watch_until(
        real.core.list_namespaced_service_account, lambda sas: sas or None, 30, f"ServiceAccount {ns}/default",
        namespace=ns, field_selector="metadata.name=default",
    )  # fmt: skip
    # The namespace really enforces the profile: a pod without its settings is refused.
    probe = real.run_kubectl(
        "-n", ns, "run", "pss-probe", "--image=registry.clef.test/x:1.0", "--dry-run=server", check=False
    )  # fmt: skip
    assert probe.returncode != 0 and "PodSecurity" in probe.stderr, probe.stderr


def _model(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClefModel", "metadata": {"name": name}, "spec": spec}


def _condition(model: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (model.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return None


def _events(real: RealCluster, ns: str) -> str:
    events = real.core.list_namespaced_event(ns).items
    return "\n".join(
        f"{e.involved_object.kind}/{e.involved_object.name}: {e.reason}: {e.message}" for e in events[-20:]
    )


def _delete_namespace(real: RealCluster, custom: client.CustomObjectsApi, ns: str) -> None:
    for m in custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]:
        custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, m["metadata"]["name"])
    real.core.delete_namespace(ns)


def test_restricted_pod_security_admits_every_pod_the_operator_creates(
    real: RealCluster, deployed_operator: list[dict[str, Any]]
) -> None:
    """docs/operations.md, "Pods": verification pods always meet "restricted" (clef runs them as
    its runtime user, 65532); serving pods meet it when spec.runAsUser names a non-root user, and
    otherwise run as the engine image's user, which "restricted" refuses for runAsNonRoot alone.

    Two models in one namespace that enforces "restricted": `flash` (runAsUser set) must become
    Ready with every pod admitted; `rooted` (unset) must be verified (its verification pod was
    admitted) while its serving pods are refused for runAsNonRoot, and for nothing else."""
    ns = "t-restricted"
    _restricted_namespace(real, ns)
    custom = client.CustomObjectsApi(real.api)
    try:
        common = {
            **clef_flash(MODEL_IMAGE),
            "nodeSelector": {"nvidia.com/gpu.product": V100},
            "verification": {"mode": "kernels", "timeoutSeconds": int(ROLLOUT_SECONDS)},
        }
        flash = {**common, "service": {"name": "clef-serve"}, "runAsUser": ENGINE_UID}
        rooted = {**common, "service": {"name": "rooted-serve"}}
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _model("flash", flash))
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _model("rooted", rooted))

        def refusals() -> list[client.CoreV1Event]:
            return [
                e
                for e in real.core.list_namespaced_event(ns).items
                if e.reason == "FailedCreate" and "PodSecurity" in (e.message or "")
            ]

        def unexpected(bad: list[client.CoreV1Event]) -> None:
            """Any refusal but the one documented (rooted's serving pods, runAsNonRoot) fails now."""
            for e in bad:
                ours = e.involved_object.kind == "ReplicaSet" and e.involved_object.name.startswith("rooted-")
                only_non_root = (
                    "runAsNonRoot != true" in e.message and "allowPrivilegeEscalation" not in e.message
                )
                only_non_root = (
                    only_non_root and "seccompProfile" not in e.message and "capabilities" not in e.message
                )
                if not (ours and only_non_root):
                    raise AssertionError(
                        f"Pod Security 'restricted' refused a pod the operator created: "
                        f"{e.involved_object.kind}/{e.involved_object.name}: {e.message}"
                    )

        def settled(models: list[Any]) -> dict[str, Any] | None:
            bad = refusals()
            unexpected(bad)
            by_name = {m["metadata"]["name"]: m for m in models}
            ready = _condition(by_name.get("flash", {}), READY)
            verified = _condition(by_name.get("rooted", {}), VERIFIED)
            if not (ready and ready["status"] == "True"):
                return None
            if not (verified and verified["status"] == "True"):
                return None
            if not any(e.involved_object.name.startswith("rooted-") for e in bad):
                return None
            return by_name

        started = time.monotonic()
        _watch_models(custom, ns, settled, ROLLOUT_SECONDS, lambda: _events(real, ns))
        print(
            f"restricted: flash Ready, rooted verified and its serving pods refused in {time.monotonic() - started:.0f}s"
        )
        refused = [e for e in refusals() if e.involved_object.name.startswith("rooted-")]
        print(f"rooted's serving pods, as documented: {refused[0].message}")
        pods = real.core.list_namespaced_pod(ns).items
        for p in pods:
            sc = p.spec.security_context
            component = (p.metadata.labels or {}).get(labels.COMPONENT)
            if component == labels.COMPONENT_VERIFICATION:
                assert (sc.run_as_non_root, sc.run_as_user) == (True, RUNTIME_UID), (p.metadata.name, sc)
            else:
                assert p.metadata.name.startswith("flash-"), f"{p.metadata.name} should have been refused"
                assert (sc.run_as_non_root, sc.run_as_user) == (True, ENGINE_UID), (p.metadata.name, sc)
        components = sorted({(p.metadata.labels or {}).get(labels.COMPONENT, "?") for p in pods})
        # Both kinds of pod the operator makes were admitted: verification (both models') and serving (flash's).
        assert components == sorted({labels.COMPONENT_VERIFICATION, labels.COMPONENT_SERVING}), components
        print(f"admitted under restricted: {sorted(p.metadata.name for p in pods)}")
    finally:
        _delete_namespace(real, custom, ns)


# ------------------------------------------------------------------ the runtime image, for real

# The real node plays one GPU class.  It has no GPU: the verifier runs clef's kernels on its CPU
# under Triton's interpreter, as the cluster tier's runner does on the host.
REAL_CLASS = "cpu-triton-interpreter"
# What the cluster tier's runner forces for every run (runner/env.py HARNESS_ENV), here in the
# image's own environment: the operator passes no CLEF_* variable (admission reserves them).
CPU_ENV = {DEVICE_ENV: "cpu", SHAPES_ENV: "reduced", "TRITON_INTERPRET": "1"}
FAULT = "conv_key_band_zero"
VERIFY_SECONDS = 600.0


@dataclass(frozen=True)
class RuntimeImages:
    clean: str  # repo@sha256:... of the CPU runtime image as built, with CPU_ENV
    faulty: str  # the same layers, with CPU_ENV and CLEF_RUNTIME_FAULT=conv_key_band_zero
    built: BuiltImage


@pytest.fixture(scope="module")
def runtime_images(real: RealCluster) -> Iterator[RuntimeImages]:
    """The CPU runtime image `make image-runtime` built, imported into the node, and two variants
    of it that differ from it in their config's Env only (imagearchive.write_env_variant: the same
    layers, by digest).  The node gets one GPU class (a label, the nvidia.com/gpu capacity a
    device plugin would advertise) and a RuntimeClass for runc: it has no NVIDIA runtime."""
    built = built_image("clef-runtime-cpu")
    started = time.monotonic()
    real.node.import_image(built.archive, built.ref, built.digest)
    commit = json.loads((IMAGES_DIR / "digests.json").read_text())["clef-runtime-cpu"].get("commit", "?")
    print(
        f"runtime image: {built.pinned} (built from {commit}) imported in {time.monotonic() - started:.0f}s"
    )
    repo, tag = built.ref.rsplit(":", 1)
    pinned = {}
    for name, env in (("clean", CPU_ENV), ("faulty", {**CPU_ENV, FAULT_ENV: FAULT})):
        ref = f"{repo}:{tag}-realnode-{name}"
        archive = STATE_DIR / "images" / f"runtime-{name}.oci.tar"
        digest = write_env_variant(built.archive, archive, ref, env)
        real.node.import_image(archive, ref, digest)
        pinned[name] = f"{repo}@{digest}"
    present = real.node.images()
    for ref in (built.pinned, *pinned.values()):
        assert ref in present, f"{ref} not among the node's images after import: {present}"
    node_patch = [
        {"op": "add", "path": f"/status/{field}/{GPU.replace('/', '~1')}", "value": "2"}
        for field in ("capacity", "allocatable")
    ]
    real.core.patch_node_status(NODE_NAME, node_patch)
    real.core.patch_node(NODE_NAME, {"metadata": {"labels": {PRODUCT: REAL_CLASS}}})
    node = client.NodeV1Api(real.api)
    node.create_runtime_class(
        client.V1RuntimeClass(metadata=client.V1ObjectMeta(name="runc"), handler="runc")
    )
    try:
        yield RuntimeImages(pinned["clean"], pinned["faulty"], built)
    finally:
        node.delete_runtime_class("runc")
        real.core.patch_node(NODE_NAME, {"metadata": {"labels": {PRODUCT: None}}})


def test_the_runtime_image_verifies_on_the_node_a_clean_image_promotes_a_faulty_one_is_held(
    real: RealCluster, deployed_operator: list[dict[str, Any]], runtime_images: RuntimeImages
) -> None:
    """The issue's test 2: a ClefModel whose verification Job runs the CPU runtime image in a
    pod on the real node (containerd, runc, UID 65532, read-only root, Pod Security "restricted"
    enforced), judged by the in-cluster operator.  The clean image passes and its candidate is
    scaled up, pinned to the digest containerd ran; the key-band fault is caught by name and the
    candidate is held at 0.  (The runtime image has no candle-vllm: the promoted serving pod
    cannot serve, and this test does not ask it to; endpoint mode is where a real engine is.)"""
    ns = "t-runtime"
    _restricted_namespace(real, ns)
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
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _model("clean", clean))
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _model("faulty", faulty))
        seen: dict[str, float] = {}

        def judged(models: list[Any]) -> dict[str, Any] | None:
            for e in real.core.list_namespaced_event(ns).items:
                if e.reason == "FailedCreate" and e.involved_object.kind == "Job":
                    raise AssertionError(f"Job/{e.involved_object.name}: {e.message}")
            by_name = {m["metadata"]["name"]: m for m in models}
            for name in ("clean", "faulty"):
                v = _condition(by_name.get(name, {}), VERIFIED)
                if v and v["status"] in ("True", "False") and v["reason"] not in ("VerificationPending",):
                    seen.setdefault(name, time.monotonic() - started)
            return by_name if len(seen) == 2 else None

        models = _watch_models(custom, ns, judged, VERIFY_SECONDS, lambda: _events(real, ns))
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

        v = _condition(models["clean"], VERIFIED)
        assert v is not None and (v["status"], v["reason"]) == ("True", "Verified"), v
        image_id, term = ran["clean"]
        assert term.exit_code == 0, term
        assert image_id.endswith(runtime_images.clean.split("@")[1]), (image_id, runtime_images.clean)

        v = _condition(models["faulty"], VERIFIED)
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
            lambda: _events(real, ns), namespace=ns,
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
        _delete_namespace(real, custom, ns)


def _watch_models(
    custom: client.CustomObjectsApi, ns: str, done: Any, timeout: float, describe: Any
) -> dict[str, Any]:
    """watch_until for custom objects (plain dicts, not models)."""
    import time

    from kubernetes import watch

    deadline = time.monotonic() + timeout
    listed = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
    found = done(listed["items"])
    if found:
        return dict(found)
    rv = listed["metadata"]["resourceVersion"]
    objects = {m["metadata"]["name"]: m for m in listed["items"]}
    w = watch.Watch()
    while (left := deadline - time.monotonic()) > 0:
        for event in w.stream(
            custom.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL,
            resource_version=rv, timeout_seconds=max(1, int(min(left, 20))),
        ):  # fmt: skip
            obj = event["object"]
            rv = obj["metadata"]["resourceVersion"]
            objects[obj["metadata"]["name"]] = obj
            found = done(list(objects.values()))
            if found:
                w.stop()
                return dict(found)
        # A watch that ended without news: look at the events once more (a refusal is an event).
        found = done(list(objects.values()))
        if found:
            return dict(found)
    raise AssertionError(
        f"timed out after {timeout:.0f}s waiting for the ClefModel to be Ready\n{describe()}"
    )
