"""The cluster tier's cluster: the local control plane by default, or any cluster named by
CLEF_KUBECONFIG (kind, a real cluster), with no code change between them.

The local cluster is started once per session (built first if the cache lacks it) and stopped at
the end even when tests fail.  A cluster already running from `.cluster/` (`make cluster-up`) is
reused and left running.  Where a prerequisite is missing the tier is skipped with one line that
names it; with CLEF_REQUIRE_CLUSTER=1 (CI) that is a failure instead.  The same holds for every
test's own prerequisite (the harness's image table, the local control plane, a GPU node):
each goes through `missing_prerequisite`, the only skip in the tier
(tests/unit/test_cluster_skips.py keeps it so).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from clef_devcluster import images
from clef_devcluster.cluster import ClusterError, LocalCluster, build, install_crds
from clef_devcluster.config import CRDS_DIR, DEFAULT_STATE_DIR, missing_prerequisites
from clef_devcluster.kustomize import find_kubectl
from clef_devcluster.rest import Rest
from clef_devcluster.runner.memo import MEMO_DIR, read_ledger

T = TypeVar("T")


@dataclass
class Cluster:
    kubeconfig: Path
    api: client.ApiClient
    # The harness's own control plane (its processes and ports are ours to inspect).
    local: LocalCluster | None
    kubectl: str | None

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.api)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api)

    def image_table(self) -> images.ImageTable:
        """The harness's live image table; a missing prerequisite where this cluster has no
        harness runner."""
        table = images.read_table(self.core)
        if table is None:
            missing_prerequisite(
                "this cluster has no clef harness runner (no clef-harness/image-table ConfigMap): "
                "verification pods would need real images here (runs on the local cluster: unset CLEF_KUBECONFIG)"
            )
        return table


def _install_crds_anywhere(kubeconfig: Path, kubectl: str | None) -> None:
    try:
        rest = Rest(kubeconfig)
    except ValueError:
        # Auth the harness's client does not speak (exec plugins): kubectl does.
        if not list(CRDS_DIR.glob("*.yaml")):
            return
        if kubectl is None:
            pytest.fail(f"cannot install {CRDS_DIR}/*.yaml into {kubeconfig}: no kubectl", pytrace=False)
        subprocess.run(
            [kubectl, "--kubeconfig", str(kubeconfig), "apply", "--server-side", "-f", str(CRDS_DIR)],
            check=True,
        )
        return
    install_crds(rest)


_SKIPPED: dict[str, object] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Where the local cluster cannot run, its tests are set aside with one line saying why
    (a skip per test would repeat the same reason dozens of times)."""
    if os.environ.get("CLEF_KUBECONFIG") or _required():
        return
    missing = missing_prerequisites()
    if not missing:
        return
    here = Path(__file__).parent
    cluster_items = [i for i in items if i.get_closest_marker("cluster") and here in i.path.parents]
    if not cluster_items:
        return
    items[:] = [i for i in items if i not in cluster_items]
    config.hook.pytest_deselected(items=cluster_items)
    _SKIPPED.update(reason=missing, count=len(cluster_items))


# Hits and misses of the session's verify memo (clef_devcluster/runner/memo.py), for the summary.
_MEMO: dict[str, int] = {}


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On an xdist worker: hand the memo's counts and the skip to the controller's summary."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["clef_cluster"] = {"memo": dict(_MEMO), "skipped": dict(_SKIPPED)}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """On the xdist controller: add up what each worker's session reported."""
    report = getattr(node, "workeroutput", {}).get("clef_cluster", {})
    for key, count in report.get("memo", {}).items():
        _MEMO[key] = _MEMO.get(key, 0) + count
    if report.get("skipped"):
        _SKIPPED.update(report["skipped"])


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if getattr(terminalreporter.config, "workeroutput", None) is not None:
        return
    if _MEMO:
        terminalreporter.write_line(
            f"verify memo: {_MEMO['hit']} replayed, {_MEMO['miss']} run for real"
            " (CLEF_VERIFY_MEMO=0 runs every one)"
        )
    elif _memo_off():
        terminalreporter.write_line("verify memo: off (CLEF_VERIFY_MEMO=0): every verify ran for real")
    if _SKIPPED:
        terminalreporter.write_line(
            f"cluster tier skipped ({_SKIPPED['count']} tests): {_SKIPPED['reason']}", yellow=True
        )


def _required() -> bool:
    return os.environ.get("CLEF_REQUIRE_CLUSTER", "") not in ("", "0")


def _memo_off() -> bool:
    return os.environ.get("CLEF_VERIFY_MEMO", "") == "0"


@contextmanager
def verify_memo(local: LocalCluster) -> Iterator[None]:
    """The session's verify memo: a fresh directory for the local runner to keep finished verify
    runs in and replay them from (clef_devcluster/runner/memo.py), removed at the end, its hits and
    misses kept for the summary.  CLEF_VERIFY_MEMO=0: no memo, every run is real."""
    if _memo_off():
        yield
        return
    root = local.dir / MEMO_DIR
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    try:
        yield
    finally:
        _MEMO.update(read_ledger(root))
        shutil.rmtree(root, ignore_errors=True)


def missing_prerequisite(reason: str) -> NoReturn:
    """A test cannot run here: skip saying why, or fail where the tier is required (CI), so that
    the required tier can never pass by skipping."""
    if _required():
        pytest.fail(f"cluster tier required (CLEF_REQUIRE_CLUSTER) but {reason}", pytrace=False)
    pytest.skip(f"cluster tier skipped: {reason}")


def state_dir() -> Path:
    """The local control plane's directory: `.cluster/`, or on each xdist worker its own
    `.cluster-gw<N>/` (each worker runs its own control plane: its own ports, from free_port, and
    its own 127.<b>/16 block of pod addresses, from the runner's lock)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return (
        DEFAULT_STATE_DIR
        if worker is None
        else DEFAULT_STATE_DIR.with_name(f"{DEFAULT_STATE_DIR.name}-{worker}")
    )


@pytest.fixture(scope="session")
def cluster(pytestconfig: pytest.Config) -> Iterator[Cluster]:
    external = os.environ.get("CLEF_KUBECONFIG")
    if external:
        path = Path(external).expanduser().resolve()
        api = config.new_client_from_config(config_file=str(path))
        kubectl = find_kubectl()
        _install_crds_anywhere(path, kubectl)
        yield Cluster(path, api, None, kubectl)
        return

    missing = missing_prerequisites()
    if missing:
        missing_prerequisite(missing)
    local = LocalCluster(state_dir())
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    started_here = False
    # Build and start-up progress goes straight to the terminal: a first build takes a while.
    with capture.global_and_fixture_disabled():
        try:
            build(log=print)
            if local.running():
                print(f"\ncluster: reusing the cluster already running from {local.dir}")
            else:
                seconds = local.up()
                started_here = True
                print(f"\ncluster: local control plane up in {seconds:.1f}s ({local.kubeconfig})")
        except ClusterError as e:
            pytest.fail(f"local cluster did not start: {e}", pytrace=False)
    runner_log = local.logs / "runner.log"
    log_start = runner_log.stat().st_size if runner_log.exists() else 0
    try:
        api = config.new_client_from_config(config_file=str(local.kubeconfig))
        # Again for a reused cluster: the CRDs in the checkout may be newer than it.
        install_crds(Rest(local.kubeconfig))
        with verify_memo(local):
            yield Cluster(local.kubeconfig, api, local, str(local.bin.kubectl))
    finally:
        report = local.down() if started_here else None
        # The runner's mistakes (a rejected status update, a crash in a worker) would otherwise
        # only show up as some later test's timeout, or not at all.
        with runner_log.open("rb") as f:
            f.seek(log_start)
            errors = [line for line in f.read().decode(errors="replace").splitlines() if " ERROR " in line]
        if report is not None and not report.clean:
            pytest.fail(f"local cluster teardown left {report}", pytrace=False)
        if errors:
            pytest.fail("the verification runner logged errors:\n" + "\n".join(errors[:20]), pytrace=False)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (which exercises pod deletion too)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # Pods are refused until the namespace's default ServiceAccount exists.
    wait_for(lambda: _default_sa(cluster, name), 30, f"ServiceAccount {name}/default")
    yield name
    cluster.core.delete_namespace(name, propagation_policy="Background")


def _default_sa(cluster: Cluster, ns: str) -> bool:
    try:
        cluster.core.read_namespaced_service_account("default", ns)
    except ApiException:
        return False
    return True


def wait_for(
    probe: Callable[[], T | None], timeout: float, what: str, describe: Callable[[], Any] | None = None
) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` and the last state."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            state = f"; last state: {describe()}" if describe else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{state}")
        time.sleep(0.2)
