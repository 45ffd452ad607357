"""The real-node tier (`make test-real`): the local control plane plus a real node (containerd,
Debian's runc and a kubelet of the same Kubernetes pin), and clef's images run on it as a user
runs them.  Opt-in: it runs daemons as root and changes host state (all of it put back at the
end, checked by test_teardown.py and again by this session's teardown).

Without CLEF_REAL_NODE=1 every test here is skipped with the reason printed.  With it, a missing
prerequisite is a failure, not a skip: the tier was asked for.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client, config, watch

from clef_contract.command import DEVICE_ENV, FAULT_ENV, SHAPES_ENV
from clef_devcluster import realnode
from clef_devcluster.cluster import ClusterError, LocalCluster, build
from clef_devcluster.config import REPO_ROOT, missing_prerequisites
from clef_devcluster.host_operator import OPERATOR_NAMESPACE
from clef_devcluster.hoststate import HostSnapshot
from clef_devcluster.imagearchive import File, write_env_variant
from clef_devcluster.kustomize import BASE, find, kustomize_build
from clef_devcluster.realnode import BRIDGE, LABEL, NODE_NAME, TOLERATION, NodeError, RealNode
from clef_operator import labels
from tests import opt_in

HERE = Path(__file__).parent
# A state directory of its own: the cluster tier's .cluster/ and the demo's are never touched.
STATE_DIR = REPO_ROOT / ".cluster-real"
IMAGES_DIR = Path(os.environ.get("CLEF_IMAGES_DIR") or REPO_ROOT / ".images")
PINNED = REPO_ROOT / "kustomize" / "overlays" / "pinned"
SKIP_REASON = (
    "real-node tier is opt-in: set CLEF_REAL_NODE=1 (`make test-real` does); it runs containerd "
    "and a kubelet as root and changes host state, restored at teardown"
)

T = TypeVar("T")


def enabled() -> bool:
    return opt_in.enabled("CLEF_REAL_NODE")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    opt_in.gate(items, HERE, "CLEF_REAL_NODE", SKIP_REASON)


@dataclass
class RealCluster:
    local: LocalCluster
    node: RealNode
    api: client.ApiClient
    kubectl: str

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api)

    def run_kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [self.kubectl, "--kubeconfig", str(self.local.kubeconfig), *args], capture_output=True, text=True
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc


@pytest.fixture(scope="session")
def real(pytestconfig: pytest.Config) -> Iterator[RealCluster]:
    missing = missing_prerequisites() or realnode.missing_prerequisites()
    if missing:
        pytest.fail(f"real-node tier asked for (CLEF_REAL_NODE=1) but {missing}", pytrace=False)
    local = LocalCluster(STATE_DIR)
    node = RealNode(local)
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        try:
            build(log=print)
            if local.running():
                # A run that was killed: its `down` restores the host before anything starts.
                print(f"\nreal-node: stopping a previous run in {STATE_DIR}")
                report = local.down()
                if not report.clean:
                    pytest.fail(f"a previous run could not be stopped: {report}", pytrace=False)
            seconds = local.up()
            print(f"\nreal-node: control plane up in {seconds:.1f}s")
            seconds = node.up()
            print(
                f"real-node: node `localhost` Ready {node.timings['kubeletReady']:.2f}s after the kubelet started ({seconds:.1f}s with containerd)"
            )
        except (ClusterError, NodeError) as e:
            report = local.down()
            pytest.fail(f"real node did not start: {e}\n(teardown: {report})", pytrace=False)
    try:
        api = config.new_client_from_config(config_file=str(local.kubeconfig))
        yield RealCluster(local, node, api, str(local.bin.kubectl))
    finally:
        before = HostSnapshot.load(node.snapshot_file)
        report = local.down()
        if not report.clean:
            pytest.fail(f"real-node teardown left {report}", pytrace=False)
        if before is not None:
            left = HostSnapshot.take(links=(BRIDGE,)).differences(before, node.roots())
            if left:
                pytest.fail(f"real-node teardown did not restore the host: {left}", pytrace=False)


@dataclass(frozen=True)
class BuiltImage:
    ref: str  # name:tag
    digest: str
    archive: Path

    @property
    def pinned(self) -> str:
        return f"{self.ref.rsplit(':', 1)[0]}@{self.digest}"


def built_image(name: str) -> BuiltImage:
    """An image `make images` built (.images/digests.json), or a failure saying how to build it."""
    digests = IMAGES_DIR / "digests.json"
    try:
        entry = json.loads(digests.read_text())[name]
    except (OSError, ValueError, KeyError):
        pytest.fail(f"no {name} image in {digests}: run `make images` first", pytrace=False)
    archive = IMAGES_DIR / entry["oci_archive"]
    if not archive.is_file():
        pytest.fail(f"{archive} is missing: run `make images` again", pytrace=False)
    return BuiltImage(entry["ref"], entry["digest"], archive)


@pytest.fixture(scope="session")
def operator_image(real: RealCluster) -> BuiltImage:
    image = built_image("clef-operator")
    real.node.import_image(image.archive, image.ref, image.digest)
    present = real.node.images()
    assert image.pinned in present, f"{image.pinned} not among the node's images after import: {present}"
    return image


def watch_until(
    list_fn: Callable[..., Any],
    done: Callable[[list[Any]], T | None],
    timeout: float,
    what: str,
    describe: Callable[[], str] | None = None,
    **kwargs: Any,
) -> T:
    """Lists, then watches, the objects of `list_fn(**kwargs)` until `done(objects)` returns
    something truthy (it may raise to fail early); fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    listed = list_fn(**kwargs)
    objects = {o.metadata.uid: o for o in listed.items}
    result = done(list(objects.values()))
    if result:
        return result
    rv = listed.metadata.resource_version
    w = watch.Watch()
    while (left := deadline - time.monotonic()) > 0:
        for event in w.stream(
            list_fn, resource_version=rv, timeout_seconds=max(1, int(min(left, 30))), **kwargs
        ):
            obj = event["object"]
            rv = obj.metadata.resource_version
            if event["type"] == "DELETED":
                objects.pop(obj.metadata.uid, None)
            else:
                objects[obj.metadata.uid] = obj
            result = done(list(objects.values()))
            if result:
                w.stop()
                return result
            if time.monotonic() > deadline:
                w.stop()
                break
    raise AssertionError(
        f"timed out after {timeout:.0f}s waiting for {what}" + (f"\n{describe()}" if describe else "")
    )


def write_overlay(directory: Path, resource: Path, patches: list[dict[str, Any]]) -> Path:
    """A kustomization of `resource` (a directory) with `patches`, for the tier's own placement
    (the node's toleration); the shipped trees themselves are applied unchanged."""
    directory.mkdir(parents=True, exist_ok=True)
    doc = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(resource, directory)],
        "patches": patches,
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return directory


# ------------------------------------------------------------------ the operator, deployed

SELECTOR = "app.kubernetes.io/name=clef-operator"
GPU = labels.GPU_RESOURCE
PRODUCT = labels.NODE_GPU_PRODUCT


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


# ------------------------------------------------------------------ the runtime image, imported

# The real node plays one GPU class.  It has no GPU: the verifier runs clef's kernels on its CPU
# under Triton's interpreter, as the cluster tier's runner does on the host.
REAL_CLASS = "cpu-triton-interpreter"
# What the cluster tier's runner forces for every run (runner/env.py HARNESS_ENV), here in the
# image's own environment: the operator passes no CLEF_* variable (admission reserves them).
CPU_ENV = {DEVICE_ENV: "cpu", SHAPES_ENV: "reduced", "TRITON_INTERPRET": "1"}
FAULT = "conv_key_band_zero"
VERIFY_SECONDS = 600.0


# The engine of the tier's engine images: candle-vllm's command line served by clef-runtime serve.
ENGINE_SHIM = File("opt/clef/bin/candle-vllm", (HERE / "candle_vllm.py").read_bytes(), 0o755)


@dataclass(frozen=True)
class RuntimeImages:
    clean: str  # repo@sha256:... of the CPU runtime image as built, with CPU_ENV
    faulty: str  # the same layers, with CPU_ENV and CLEF_RUNTIME_FAULT=conv_key_band_zero
    engine: str  # clean plus one layer: ENGINE_SHIM (an engine image built on the runtime image)
    engine_faulty: str  # faulty plus the same layer
    built: BuiltImage


@pytest.fixture(scope="module")
def runtime_images(real: RealCluster) -> Iterator[RuntimeImages]:
    """The CPU runtime image `make image-runtime` built, imported into the node, and two variants
    of it that differ from it in their config's Env only (imagearchive.write_env_variant: the same
    layers, by digest); and an engine image on each, the variant plus one layer holding
    `candle-vllm` (candle_vllm.py), as a serving image is built FROM the runtime image.  The node
    gets one GPU class (a label, the nvidia.com/gpu capacity a device plugin would advertise) and
    a RuntimeClass for runc: it has no NVIDIA runtime."""
    built = built_image("clef-runtime-cpu")
    started = time.monotonic()
    real.node.import_image(built.archive, built.ref, built.digest)
    commit = json.loads((IMAGES_DIR / "digests.json").read_text())["clef-runtime-cpu"].get("commit", "?")
    print(
        f"runtime image: {built.pinned} (built from {commit}) imported in {time.monotonic() - started:.0f}s"
    )
    repo, tag = built.ref.rsplit(":", 1)
    pinned = {}
    variants = [("clean", CPU_ENV, ()), ("faulty", {**CPU_ENV, FAULT_ENV: FAULT}, ())]
    variants += [
        ("engine", CPU_ENV, (ENGINE_SHIM,)),
        ("engine-faulty", {**CPU_ENV, FAULT_ENV: FAULT}, (ENGINE_SHIM,)),
    ]
    for name, env, files in variants:
        ref = f"{repo}:{tag}-realnode-{name}"
        archive = STATE_DIR / "images" / f"runtime-{name}.oci.tar"
        digest = write_env_variant(built.archive, archive, ref, env, files)
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
        yield RuntimeImages(
            pinned["clean"], pinned["faulty"], pinned["engine"], pinned["engine-faulty"], built
        )
    finally:
        node.delete_runtime_class("runc")
        real.core.patch_node(NODE_NAME, {"metadata": {"labels": {PRODUCT: None}}})
