"""The real node's pieces that need no root: its pins and cache entry, the daemons' configs, the
sandbox image archive, and the host-state comparison that `make test-real` relies on."""

from __future__ import annotations

import hashlib
import json
import tarfile
import tomllib
from pathlib import Path

import yaml

from clef_devcluster import realnode
from clef_devcluster.cluster import LocalCluster
from clef_devcluster.config import NodeBinaries, Versions
from clef_devcluster.hoststate import HostSnapshot
from clef_devcluster.imagearchive import File, write_docker_archive

REPO = Path(__file__).resolve().parents[2]


def test_the_node_pins_live_with_the_control_planes() -> None:
    v = Versions.load()
    assert v.containerd.startswith("v2.") and v.cni_plugins.startswith("v1.")
    b = NodeBinaries.for_versions(v, Path("/cache"))
    # A cache entry of its own: the control plane's k8s-<v> stamp is not touched by it.
    assert b.dir == Path(f"/cache/node-{v.kubernetes}-{v.containerd}-{v.cni_plugins}/bin")
    assert b.kubelet.name == "kubelet" and "pause" in NodeBinaries.NAMES


def test_node_binaries_without_the_stamp_are_missing(tmp_path: Path) -> None:
    b = NodeBinaries(tmp_path / "node" / "bin")
    b.dir.mkdir(parents=True)
    for name in NodeBinaries.NAMES:
        (b.dir / name).write_text("")
    assert len(b.missing()) == len(NodeBinaries.NAMES), "an interrupted build is never trusted"
    (b.dir.parent / ".complete").write_text("built")
    assert b.missing() == []


def test_build_script_has_a_node_step() -> None:
    script = (REPO / "hack" / "cluster" / "build.sh").read_text()
    assert "node) build_node ;;" in script
    assert (REPO / "hack" / "cluster" / "pause.c").is_file()


def _node(tmp_path: Path) -> realnode.RealNode:
    cluster = LocalCluster(tmp_path / "state")
    return realnode.RealNode(cluster, NodeBinaries(tmp_path / "bin"))


def test_containerd_config_is_valid_toml_with_everything_under_the_state_dir(tmp_path: Path) -> None:
    node = _node(tmp_path)
    node.containerd_config.parent.mkdir(parents=True)
    node._write_containerd_config()
    config = tomllib.loads(node.containerd_config.read_text())
    assert config["version"] == 3
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["netns_mounts_under_state_dir"] is True
    options = runtime["containerd"]["runtimes"]["runc"]["options"]
    assert options["BinaryName"] == realnode.RUNC and options["SystemdCgroup"] is False
    assert (
        config["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == realnode.PAUSE_IMAGE
    )
    state = str(node.dir)
    for path in (config["root"], config["state"], config["grpc"]["address"], options["Root"]):
        assert path.startswith(state), path


def test_kubelet_config_taints_the_node_and_authorizes_by_webhook(tmp_path: Path) -> None:
    node = _node(tmp_path)
    node.dir.mkdir(parents=True)
    node._write_kubelet_config(11250, 11248)
    config = yaml.safe_load(node.kubelet_config.read_text())
    assert config["registerWithTaints"] == [realnode.TAINT]
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["authentication"]["webhook"] == {"enabled": True}
    assert config["failCgroupV1"] is False and config["oomScoreAdj"] == 0
    assert config["address"] == "127.0.0.1" and config["readOnlyPort"] == 0
    assert config["containerRuntimeEndpoint"] == f"unix://{node.socket}"
    # The toleration the tier's pods carry matches the taint.
    t = realnode.TOLERATION
    assert (t["key"], t["value"], t["effect"]) == (
        realnode.TAINT["key"],
        realnode.TAINT["value"],
        realnode.TAINT["effect"],
    )


def test_pod_subnet_stays_away_from_kwoks() -> None:
    import ipaddress

    pods = ipaddress.ip_network(realnode.POD_CIDR)
    assert not pods.overlaps(ipaddress.ip_network("10.244.0.0/16"))
    assert not pods.overlaps(ipaddress.ip_network("10.96.0.0/16"))
    assert ipaddress.ip_address(realnode.GATEWAY) in pods


def test_sandbox_image_archive_is_reproducible_and_well_formed(tmp_path: Path) -> None:
    files = [File("pause", b"\x7fELF not really", 0o755)]
    a = write_docker_archive(tmp_path / "a.tar", realnode.PAUSE_IMAGE, files, entrypoint=["/pause"])
    b = write_docker_archive(tmp_path / "b.tar", realnode.PAUSE_IMAGE, files, entrypoint=["/pause"])
    assert a == b
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    with tarfile.open(tmp_path / "a.tar") as tar:
        [entry] = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        assert entry["RepoTags"] == [realnode.PAUSE_IMAGE]
        config_bytes = tar.extractfile(entry["Config"]).read()  # type: ignore[union-attr]
        layer = tar.extractfile(entry["Layers"][0]).read()  # type: ignore[union-attr]
    assert a == "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    config = json.loads(config_bytes)
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    assert config["config"]["Entrypoint"] == ["/pause"]
    with tarfile.open(fileobj=__import__("io").BytesIO(layer)) as inner:
        member = inner.getmember("pause")
        assert member.mode == 0o755 and member.mtime == 0 and member.uid == 0


def _snapshot(**kw: object) -> HostSnapshot:
    base: dict[str, object] = {
        "sysctls": {"vm.overcommit_memory": "0", "kernel.panic": "1"},
        "paths": {"/run/containerd": False},
        "kubepods": {"/sys/fs/cgroup/memory": False},
        "links": {"clef0": False},
        "chains": {"nat": ["PREROUTING"]},
    }
    base.update(kw)
    return HostSnapshot(**base)  # type: ignore[arg-type]


def test_host_comparison_names_each_thing_left_changed(tmp_path: Path) -> None:
    before = _snapshot()
    assert _snapshot().differences(before, [tmp_path]) == []
    after = _snapshot(
        sysctls={"vm.overcommit_memory": "1", "kernel.panic": "1"},
        paths={"/run/containerd": True},
        kubepods={"/sys/fs/cgroup/memory": True},
        links={"clef0": True},
        chains={"nat": ["PREROUTING", "KUBE-KUBELET-CANARY"]},
    )
    found = after.differences(before, [tmp_path])
    assert len(found) == 5, found
    assert any("vm.overcommit_memory = 1 (was 0)" in f for f in found)
    assert any("KUBE-KUBELET-CANARY" in f for f in found)


def test_host_snapshot_survives_the_process_that_took_it(tmp_path: Path) -> None:
    snap = _snapshot()
    snap.save(tmp_path / "host-before.json")
    assert HostSnapshot.load(tmp_path / "host-before.json") == snap
    assert HostSnapshot.load(tmp_path / "nothing.json") is None
