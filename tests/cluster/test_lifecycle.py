"""`up` and `down` of a second, throwaway cluster: nothing may outlive `down`, and `up` works again."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kubernetes import client, config

from clef_devcluster.cluster import LocalCluster
from clef_devcluster.procs import is_alive, listening_ports

from .conftest import Cluster, missing_prerequisite, wait_for
from .objects import RUNTIME_IMAGE, python_command, verification_job

pytestmark = pytest.mark.cluster


def _check_gone(local: LocalCluster, pids: list[int], ports: list[int]) -> None:
    assert not [r for r in local.ledger.load() if is_alive(r)]
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid), f"pid {pid} survived `down`"
    assert not set(ports) & listening_ports(), (
        f"ports still listening after `down`: {set(ports) & listening_ports()}"
    )


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def test_down_leaves_no_process_or_port_and_up_works_again(cluster: Cluster, tmp_path: Path) -> None:
    if cluster.local is None:
        missing_prerequisite(
            "the cluster comes from CLEF_KUBECONFIG; there is no local control plane to restart (runs on the local cluster: unset CLEF_KUBECONFIG)"
        )
    local = LocalCluster(tmp_path / "state")
    try:
        for round_ in (1, 2):
            started = time.monotonic()
            local.up()
            print(f"throwaway cluster up #{round_} in {time.monotonic() - started:.1f}s")
            records = local.ledger.load()
            assert {r.name for r in records} >= {
                "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "runner",
            }  # fmt: skip
            ports = [int(p) for p in local.state()["ports"].values()]
            assert set(ports) <= listening_ports()
            api = config.new_client_from_config(config_file=str(local.kubeconfig))
            core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
            assert {n.metadata.name for n in core.list_node().items} >= {"worker-1", "worker-2"}
            # A verification command in flight when `down` comes must not outlive it either.
            batch.create_namespaced_job(
                "default",
                verification_job(
                    f"inflight-{round_}", RUNTIME_IMAGE, python_command("import time; time.sleep(600)")
                ),
            )

            def running_pids() -> list[int]:
                return [int(f.stem) for f in (local.dir / "run" / "verify-procs").glob("*.json")]

            command_pids = wait_for(running_pids, 60, "the in-flight command to start")
            pids = [r.pid for r in records] + command_pids
            report = local.down()
            assert report.clean, report
            _check_gone(local, pids, ports)
    finally:
        local.down()
