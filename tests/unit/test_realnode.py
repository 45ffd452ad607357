"""The real node's pieces that need no root: its pins and cache entry, the daemons' configs, the
sandbox image archive, and the host-state comparison that `make test-real` relies on."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tomllib
from pathlib import Path

import pytest
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


def _oci_archive(path: Path, env: list[str]) -> tuple[str, str]:
    """A one-image OCI archive like `make images` writes: (manifest digest, layer digest)."""
    layer = b"layer bytes, never read"
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({"config": {"User": "65532:65532", "Env": env}, "rootfs": {"diff_ids": []}}).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"digest": config_digest, "size": len(config)},
            "layers": [{"digest": layer_digest, "size": len(layer)}],
        }
    ).encode()
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    index = {"schemaVersion": 2, "manifests": [{"digest": digest, "size": len(manifest)}]}
    with tarfile.open(path, "w") as tar:
        for name, data in [
            (f"blobs/sha256/{layer_digest[7:]}", layer),
            (f"blobs/sha256/{config_digest[7:]}", config),
            (f"blobs/sha256/{digest[7:]}", manifest),
            ("index.json", json.dumps(index).encode()),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return digest, layer_digest


def test_an_env_variant_is_the_same_layers_with_the_env_set(tmp_path: Path) -> None:
    from clef_devcluster.imagearchive import write_env_variant

    base = tmp_path / "base.oci.tar"
    base_digest, layer = _oci_archive(base, ["PATH=/opt/clef/bin", "CLEF_VERIFY_DEVICE=cuda"])
    out = tmp_path / "fault.oci.tar"
    ref = "ghcr.io/riotpiao/clef-runtime:0.1.0-cpu-fault"
    env = {"CLEF_VERIFY_DEVICE": "cpu", "CLEF_RUNTIME_FAULT": "conv_key_band_zero"}
    digest = write_env_variant(base, out, ref, env)
    assert digest != base_digest
    with tarfile.open(out) as tar:
        (entry,) = json.load(tar.extractfile("index.json"))["manifests"]  # type: ignore[arg-type]
        assert entry["digest"] == digest and entry["annotations"] == {
            "org.opencontainers.image.ref.name": ref
        }
        manifest_bytes = tar.extractfile(f"blobs/sha256/{digest[7:]}").read()  # type: ignore[union-attr]
        assert "sha256:" + hashlib.sha256(manifest_bytes).hexdigest() == digest
        manifest = json.loads(manifest_bytes)
        assert [x["digest"] for x in manifest["layers"]] == [layer], "the base's layers, by digest"
        config = json.loads(tar.extractfile(f"blobs/sha256/{manifest['config']['digest'][7:]}").read())  # type: ignore[union-attr]
        # Only the manifest and config travel: the layers are the base's, already on the node.
        assert f"blobs/sha256/{layer[7:]}" not in tar.getnames()
    assert config["config"]["Env"] == [
        "PATH=/opt/clef/bin",
        "CLEF_VERIFY_DEVICE=cpu",
        "CLEF_RUNTIME_FAULT=conv_key_band_zero",
    ]
    assert config["config"]["User"] == "65532:65532"
    # The same inputs, the same digest (a variant is as reproducible as its base).
    assert write_env_variant(base, tmp_path / "again.tar", ref, env) == digest


def test_a_variant_with_files_adds_one_layer_holding_them(tmp_path: Path) -> None:
    """An engine image on the runtime image: the base's layers, then one uncompressed layer with
    the files (its digest is its diff ID), carried in the archive; the base's are not."""
    from clef_devcluster.imagearchive import write_env_variant

    base = tmp_path / "base.oci.tar"
    base_digest, layer = _oci_archive(base, ["PATH=/opt/clef/bin"])
    shim = File("opt/clef/bin/candle-vllm", b"#!/bin/sh\nexec true\n", 0o755)
    out = tmp_path / "engine.oci.tar"
    digest = write_env_variant(base, out, "x/engine:1", {"A": "b"}, (shim,))
    assert digest not in (
        base_digest,
        write_env_variant(base, tmp_path / "env.tar", "x/engine:1", {"A": "b"}),
    )
    with tarfile.open(out) as tar:
        manifest = json.loads(tar.extractfile(f"blobs/sha256/{digest[7:]}").read())  # type: ignore[union-attr]
        first, added = manifest["layers"]
        assert first["digest"] == layer and added["mediaType"] == "application/vnd.oci.image.layer.v1.tar"
        blob = tar.extractfile(f"blobs/sha256/{added['digest'][7:]}").read()  # type: ignore[union-attr]
        assert "sha256:" + hashlib.sha256(blob).hexdigest() == added["digest"] and len(blob) == added["size"]
        config = json.loads(tar.extractfile(f"blobs/sha256/{manifest['config']['digest'][7:]}").read())  # type: ignore[union-attr]
        assert f"blobs/sha256/{layer[7:]}" not in tar.getnames()
    assert config["rootfs"]["diff_ids"] == [added["digest"]], (
        "the base's diff IDs (none here) and the new one"
    )
    with tarfile.open(fileobj=io.BytesIO(blob)) as layer_tar:
        member = layer_tar.getmember("opt/clef/bin/candle-vllm")
        assert member.mode == 0o755 and layer_tar.extractfile(member).read() == shim.data  # type: ignore[union-attr]
    assert write_env_variant(base, tmp_path / "again.tar", "x/engine:1", {"A": "b"}, (shim,)) == digest


def test_an_env_variant_of_a_tampered_archive_is_refused(tmp_path: Path) -> None:
    from clef_devcluster.imagearchive import write_env_variant

    base = tmp_path / "base.oci.tar"
    _oci_archive(base, [])
    with tarfile.open(base) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(base, "w") as tar:
        for m, data in members:
            if m.name != "index.json" and b"never read" not in data and b'"layers"' not in data:
                data = data.replace(b"65532", b"00000")  # the config, edited after it was hashed
                m.size = len(data)
            tar.addfile(m, io.BytesIO(data))
    with pytest.raises(ValueError, match="does not match its digest"):
        write_env_variant(base, tmp_path / "out.tar", "x:1", {"A": "b"})
