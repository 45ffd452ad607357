"""The node's `down` puts the host back as it found it: the kubelet's sysctls, its cgroups, every
mount, the bridge, the DNAT rule, containerd's shims and host directories.  Runs last in the tier
(file order): it stops the node that the tests before it used, and checks that they changed the
host in the first place, so the comparison cannot pass by looking at nothing.  The session's
teardown repeats the comparison after the control plane is gone too, even when tests failed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clef_devcluster.hoststate import KUBEPODS, HostSnapshot, cgroup_hierarchies
from clef_devcluster.realnode import BRIDGE

from .conftest import RealCluster

pytestmark = pytest.mark.real_node


def _node_processes(real: RealCluster) -> list[str]:
    """Every live process running one of the node's binaries (kubelet, containerd, its shims)."""
    ours = str(real.node.bin.dir)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = str((entry / "exe").readlink())
        except OSError:
            continue
        if exe.startswith(ours + "/"):
            found.append(f"{entry.name} {exe}")
    return found


def _rss(real: RealCluster) -> str:
    """Resident memory of the kubelet and containerd (the tier's numbers in docs/local-cluster.md)."""
    out = []
    for rec in real.node.records():
        try:
            status = Path(f"/proc/{rec.pid}/status").read_text()
        except OSError:
            continue
        kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        out.append(f"{rec.name} {kib // 1024} MiB")
    return ", ".join(out)


def test_node_down_restores_the_host(real: RealCluster) -> None:
    node = real.node
    before = HostSnapshot.load(node.snapshot_file)
    assert before is not None, (
        f"no host snapshot at {node.snapshot_file}: the node did not record one at `up`"
    )
    running = HostSnapshot.take(links=(BRIDGE,))
    changed = running.differences(before, node.roots())
    # What the running node changed (the kubelet's tunables and cgroups, the bridge).
    assert any(c.startswith("sysctl vm.overcommit_memory") for c in changed), changed
    assert any(f"/{KUBEPODS}" in c for c in changed), changed
    assert any(c.startswith(f"network link {BRIDGE}") for c in changed), changed
    assert _node_processes(real)
    print(f"node memory (RSS): {_rss(real)}")

    problems = node.down()

    assert problems == [], problems
    after = HostSnapshot.take(links=(BRIDGE,))
    assert after.differences(before, node.roots()) == []
    assert after.sysctls == before.sysctls
    assert _node_processes(real) == []
    for hierarchy in cgroup_hierarchies():
        assert (hierarchy / KUBEPODS).is_dir() == before.kubepods.get(str(hierarchy), False), hierarchy
    assert not node.snapshot_file.exists(), "a restored host leaves no snapshot to restore again"
