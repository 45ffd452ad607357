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

from clef_devcluster import realnode
from clef_devcluster.cluster import ClusterError, LocalCluster, build
from clef_devcluster.config import REPO_ROOT, missing_prerequisites
from clef_devcluster.hoststate import HostSnapshot
from clef_devcluster.realnode import BRIDGE, NodeError, RealNode
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
