"""A real node joined to the local control plane: containerd (with Debian's runc) and a kubelet
built from the same Kubernetes pin, as processes of this host (`make test-real`; docs/local-cluster.md,
"A real node").

The node is called `localhost` (--hostname-override), so the API server reaches its kubelet on
loopback through the node's Hostname address; it is tainted TAINT so that nothing meant for
kwok's nodes lands there, and labelled LABEL for what is.  Pods get addresses on the bridge
BRIDGE (POD_CIDR) and reach the loopback-only API server at the `kubernetes` Service's address
through one DNAT rule (10.96.0.1:443 -> 127.0.0.1:<API server port>) with route_localnet on the
bridge; no kube-proxy, no traffic off the machine.

Everything lives under <state>/node/ where the daemons allow it.  What they change on the host
regardless (sysctls, cgroups, mounts, /run/containerd, /var/log/containers, the bridge, iptables)
is recorded before `up` (hoststate.py) and put back by `down`, which also runs from the cluster's
own `down` so a crashed run is cleaned up by the next one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import yaml

from . import hoststate
from .config import NodeBinaries, default_node_binaries
from .imagearchive import File, write_docker_archive
from .pki import KUBELET_SERVING, KUBERNETES_SERVICE_IP, PKI
from .procs import ProcessLedger, ProcessRecord, free_port, is_alive, proc_starttime, stop
from .rest import ApiError, Rest

NODE_NAME = "localhost"
TAINT_KEY = "clef.test/real-node"
TAINT = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}
LABEL = {TAINT_KEY: "true"}
# What a pod needs to run on the real node (and only there).
TOLERATION = {"key": TAINT_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
BRIDGE = "clef0"
# Away from kwok's --cidr=10.244.0.0/16, podman's 10.88.0.0/16 and the 10.10.0.x node addresses.
POD_CIDR = "10.89.0.0/24"
GATEWAY = "10.89.0.1"
# containerd 2.4's default sandbox image, built here from hack/cluster/pause.c and pinned in
# containerd's config, so it is never pulled nor garbage-collected.
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.2"
K8S_NAMESPACE = "k8s.io"
RUNC = "/usr/sbin/runc"
# Debian packages the node and its images need (installed by `make test-real`).
HOST_PACKAGES = ("runc", "iptables", "iproute2")
# The API server's client certificate for kubelets (pki.py) is no superuser: with the kubelet's
# Webhook authorization it needs the role kubeadm binds for the same purpose.
KUBELET_API_BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": "clef:apiserver-kubelet-client"},
    "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "system:kubelet-api-admin",
    },
    "subjects": [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kube-apiserver-kubelet-client"}
    ],
}

Log = Callable[[str], None]


class NodeError(RuntimeError):
    pass


def missing_prerequisites(binaries: NodeBinaries | None = None) -> str | None:
    """One line naming what this machine lacks to run the real node, or None."""
    binaries = binaries or default_node_binaries()
    lacking = []
    if os.geteuid() != 0:
        lacking.append("root (the kubelet and containerd mount, make cgroups and set sysctls)")
    if not Path(RUNC).is_file():
        lacking.append(f"{RUNC} (apt-get install runc)")
    for tool in ("iptables", "ip", "umount"):
        if not any(Path(d, tool).is_file() for d in ("/usr/sbin", "/sbin", "/usr/bin", "/bin")):
            lacking.append(f"{tool} (apt-get install iptables iproute2)")
    if binaries.missing():
        lacking.append(f"the node's binaries in {binaries.dir} (hack/cluster/build.sh node)")
    return ("missing " + "; ".join(lacking)) if lacking else None


class ControlPlane(Protocol):
    """What the node needs of the control plane it joins (`cluster.LocalCluster`)."""

    dir: Path
    log: Log
    pki: PKI
    ledger: ProcessLedger

    @property
    def logs(self) -> Path: ...
    @property
    def kubeconfig(self) -> Path: ...
    def state(self) -> dict[str, Any]: ...
    def update_state(self, **fields: Any) -> None: ...
    def spawn(
        self, name: str, argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> None: ...
    def wait_ready(self, name: str, ready: Callable[[], bool], deadline: float) -> None: ...
    def forget_children(self, names: Iterable[str]) -> None: ...


class RealNode:
    def __init__(self, cluster: ControlPlane, binaries: NodeBinaries | None = None, log: Log | None = None):
        self.cluster = cluster
        self.bin = binaries or default_node_binaries()
        self.dir = cluster.dir / "node"
        self.log = log or cluster.log
        self.timings: dict[str, float] = {}

    # -- paths -------------------------------------------------------------------------------
    @property
    def snapshot_file(self) -> Path:
        return self.dir / "host-before.json"

    @property
    def socket(self) -> Path:
        return self.dir / "run" / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.dir / "containerd" / "config.toml"

    @property
    def kubelet_config(self) -> Path:
        return self.dir / "kubelet-config.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubelet.kubeconfig"

    @property
    def images_dir(self) -> Path:
        return self.dir / "images"

    def roots(self) -> list[Path]:
        """Where the daemons mount things (everything under them is unmounted at `down`)."""
        return [self.dir, Path("/run/containerd")]

    # -- up ----------------------------------------------------------------------------------
    def up(self, timeout: float = 60.0) -> float:
        """Starts containerd and the kubelet against the running local cluster and waits until
        the node is Ready.  Returns the seconds it took."""
        missing = missing_prerequisites(self.bin)
        if missing:
            raise NodeError(missing)
        state = self.cluster.state()
        if "ports" not in state:
            raise NodeError("the local control plane is not running (LocalCluster.up first)")
        if self.snapshot_file.exists():
            # A previous run did not finish its `down`: finish it first (its record is the truth).
            self.down()
        started = time.monotonic()
        hoststate.HostSnapshot.take(links=(BRIDGE,)).save(self.snapshot_file)
        try:
            self._up(state, started + timeout)
        except BaseException:
            self.log(f"node: start failed; restoring the host (logs in {self.cluster.logs})")
            self.down()
            raise
        seconds = time.monotonic() - started
        self.cluster.update_state(node={**self.timings, "upSeconds": seconds})
        return seconds

    def _up(self, state: dict[str, Any], deadline: float) -> None:
        t0 = time.monotonic()
        api_port = int(state["ports"]["apiserver"])
        for sub in ("run", "containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs", "manifests", "runc"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.cluster.pki.ensure()
        self.cluster.pki.write_kubeconfig("node-localhost", state["server"], self.kubeconfig)
        rest = Rest(self.cluster.kubeconfig)
        rest.apply(KUBELET_API_BINDING)
        self._network(api_port)
        self._write_containerd_config()
        self._spawn("containerd", [str(self.bin.containerd), f"--config={self.containerd_config}"])
        self._wait("containerd", self._containerd_ready, deadline)
        self.timings["containerd"] = round(time.monotonic() - t0, 2)
        self.import_image(self._pause_archive())
        ports = {"kubelet": free_port(), "kubeletHealthz": free_port()}
        self.cluster.update_state(nodePorts=ports)
        self._write_kubelet_config(ports["kubelet"], ports["kubeletHealthz"])
        kubelet_started = time.monotonic()
        self._spawn(
            "kubelet",
            [
                str(self.bin.kubelet),
                f"--config={self.kubelet_config}",
                f"--kubeconfig={self.kubeconfig}",
                f"--root-dir={self.dir / 'kubelet'}",
                f"--hostname-override={NODE_NAME}",
                "--node-labels=" + ",".join(f"{k}={v}" for k, v in LABEL.items()),
                "--v=2",
            ],
        )
        self._wait("kubelet", lambda: _node_ready(rest), deadline)
        self.timings["kubeletReady"] = round(time.monotonic() - kubelet_started, 2)

    def _network(self, api_port: int) -> None:
        prefix = POD_CIDR.split("/")[1]
        if not hoststate.link_exists(BRIDGE):
            _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
            _run(["ip", "addr", "add", f"{GATEWAY}/{prefix}", "dev", BRIDGE])
        _run(["ip", "link", "set", BRIDGE, "up"])
        hoststate.write_sysctl(f"net.ipv4.conf.{BRIDGE}.route_localnet", "1")
        _run(
            [
                "iptables", "-t", "nat", "-A", "PREROUTING",
                "-s", POD_CIDR, "-d", f"{KUBERNETES_SERVICE_IP}/32", "-p", "tcp", "--dport", "443",
                "-m", "comment", "--comment", hoststate.IPTABLES_COMMENT,
                "-j", "DNAT", "--to-destination", f"127.0.0.1:{api_port}",
            ]
        )  # fmt: skip
        # The bridge plugin turns on ip_forward for its gateway; nothing from a pod may leave the
        # machine through it (host DNS included: pods have no cluster DNS here).
        _run(
            [
                "iptables", "-A", "FORWARD", "-s", POD_CIDR, "!", "-d", POD_CIDR,
                "-m", "comment", "--comment", hoststate.IPTABLES_COMMENT, "-j", "DROP",
            ]
        )  # fmt: skip
        conflist = {
            "cniVersion": "1.0.0",
            "name": "clef-realnode",
            # No portmap: restricted Pod Security forbids hostPorts anyway, and its iptables
            # chains would be the only ones this node shares with other CNI users (podman).
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.dir / "cni" / "ipam"),
                        "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "loopback"},
            ],
        }
        (self.dir / "cni" / "net.d" / "10-clef.conflist").write_text(json.dumps(conflist, indent=1))

    def _write_containerd_config(self) -> None:
        d = self.dir
        cri_runtime = "plugins.'io.containerd.cri.v1.runtime'"
        self.containerd_config.write_text(
            f"""# Written by clef_devcluster/realnode.py at every `up`.
version = 3
root = "{d / "containerd" / "root"}"
state = "{d / "containerd" / "state"}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[{cri_runtime}]
  # No CAP_SYS_RESOURCE on the build machines: a sandbox's oom_score_adj of -998 is refused.
  restrict_oom_score_adj = true
  # Network namespaces under the state directory, not /var/run/netns.
  netns_mounts_under_state_dir = true
  [{cri_runtime}.containerd]
    default_runtime_name = "runc"
    [{cri_runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri_runtime}.containerd.runtimes.runc.options]
        # Debian's runc (crun refuses the machines' hybrid cgroup hierarchy).
        BinaryName = "{RUNC}"
        Root = "{d / "runc"}"
        SystemdCgroup = false
  [{cri_runtime}.cni]
    bin_dirs = ["{self.bin.dir}"]
    conf_dir = "{d / "cni" / "net.d"}"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
        )

    def _write_kubelet_config(self, port: int, healthz_port: int) -> None:
        pki = self.cluster.pki
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs",
            # The build machines' cgroups are v1 (hybrid); Kubernetes 1.35+ refuses v1 by default.
            "failCgroupV1": False,
            "failSwapOn": False,
            # No CAP_SYS_RESOURCE: the kubelet may not lower its own oom_score_adj.
            "oomScoreAdj": 0,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": "127.0.0.1",
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz_port,
            "tlsCertFile": str(pki.cert(KUBELET_SERVING)),
            "tlsPrivateKeyFile": str(pki.key(KUBELET_SERVING)),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(pki.ca_cert)},
            },
            "authorization": {"mode": "Webhook"},
            "registerWithTaints": [TAINT],
            "staticPodPath": str(self.dir / "manifests"),
            "podLogsDir": str(self.dir / "pod-logs"),
            "resolvConf": "/etc/resolv.conf",
            # true would make the kubelet refuse to start on this host's kernel defaults; the
            # tunables it writes instead are put back at `down` (hoststate.SYSCTLS).
            "protectKernelDefaults": False,
            "imageGCHighThresholdPercent": 95,
            "imageGCLowThresholdPercent": 90,
            "evictionHard": {
                "memory.available": "200Mi",
                "nodefs.available": "2%",
                "imagefs.available": "2%",
            },
            "serializeImagePulls": False,
        }
        self.kubelet_config.write_text(yaml.safe_dump(config))

    def _pause_archive(self) -> Path:
        out = self.images_dir / "pause.tar"
        write_docker_archive(
            out,
            PAUSE_IMAGE,
            [File("pause", self.bin.pause.read_bytes(), 0o755)],
            entrypoint=["/pause"],
            user="65535:65535",
        )
        return out

    def _ctr(self) -> list[str]:
        return [str(self.bin.ctr), f"--address={self.socket}", "-n", K8S_NAMESPACE]

    def import_image(self, archive: Path, ref: str = "", digest: str = "") -> None:
        """`ctr -n k8s.io images import` of a docker- or OCI-archive, for the kubelet to use.
        With `ref` (the name:tag the archive carries) and `digest` (its manifest's), the image is
        also named NAME@DIGEST, the name a digest-pinned pod asks for (what a pull would record;
        ctr's own --digests names the archive's index instead)."""
        started = time.monotonic()
        proc = subprocess.run(
            [*self._ctr(), "images", "import", str(archive)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise NodeError(f"ctr images import {archive} failed: {proc.stderr.strip()}")
        if ref and digest:
            pinned = f"{ref.rsplit(':', 1)[0]}@{digest}"
            proc = subprocess.run(
                [*self._ctr(), "images", "tag", "--force", ref, pinned], capture_output=True, text=True
            )
            if proc.returncode != 0:
                raise NodeError(f"ctr images tag {ref} {pinned} failed: {proc.stderr.strip()}")
        self.log(f"node: imported {archive.name} in {time.monotonic() - started:.1f}s")

    def images(self) -> list[str]:
        proc = subprocess.run([*self._ctr(), "images", "ls", "-q"], capture_output=True, text=True)
        return proc.stdout.split()

    def _containerd_ready(self) -> bool:
        proc = subprocess.run(
            [str(self.bin.ctr), f"--address={self.socket}", "version"], capture_output=True, timeout=5
        )
        return proc.returncode == 0

    def _spawn(self, name: str, argv: list[str]) -> None:
        env = {**os.environ, "PATH": f"{self.bin.dir}:{os.environ.get('PATH', '')}"}
        self.cluster.spawn(name, argv, cwd=self.dir, env=env)

    def _wait(self, name: str, ready: Callable[[], bool], deadline: float) -> None:
        self.cluster.wait_ready(name, ready, deadline)

    # -- down --------------------------------------------------------------------------------
    def records(self) -> list[ProcessRecord]:
        return [r for r in self.cluster.ledger.load() if r.name in ("kubelet", "containerd")]

    def down(self) -> list[str]:
        """Stops the node and restores the host.  Returns what could not be restored (empty:
        everything is as the snapshot found it).  Safe to call when nothing runs."""
        before = hoststate.HostSnapshot.load(self.snapshot_file)
        records = self.records()
        problems: list[str] = []
        kubelet = [r for r in records if r.name == "kubelet"]
        if any(is_alive(r) for r in kubelet):
            # The clean path first: the kubelet stops the pods (CNI DEL, unmounts) while it can.
            self._drain()
        survivors = stop(kubelet, grace=10.0)
        containerd = [r for r in records if r.name == "containerd"]
        if any(is_alive(r) for r in containerd):
            # Stop every container while containerd can still do it cleanly.
            self._kill_tasks()
        survivors += stop(containerd, grace=10.0)
        survivors += stop(self._shims(), grace=5.0)
        if before is not None:
            # Containers whose shim died first: they are in the node's kubepods cgroups.
            survivors += stop(_records("container", hoststate.pids_in_kubepods(before)), grace=2.0)
        problems += [f"still running: {r.name} (pid {r.pid})" for r in survivors]
        ledger = self.cluster.ledger
        ledger.save([r for r in ledger.load() if r not in records or r in survivors])
        self.cluster.forget_children(r.name for r in records)
        roots = [self.dir] + (
            [Path("/run/containerd")] if before and not before.paths["/run/containerd"] else []
        )
        problems += [f"still mounted: {m}" for m in hoststate.unmount_under(roots)]
        if before is not None:
            problems += hoststate.restore(before)
            left = hoststate.HostSnapshot.take(links=tuple(before.links)).differences(before, roots)
            problems += left
            if not problems:
                self.snapshot_file.unlink()
        # The daemons' data (images, containers' layers, volumes): gone with the node.
        for sub in ("containerd/root", "containerd/state", "kubelet", "runc", "cni/ipam", "run"):
            if not hoststate.mountpoints_under(self.dir / sub):
                _rmtree(self.dir / sub)
        return problems

    def _drain(self, timeout: float = 30.0) -> None:
        try:
            rest = Rest(self.cluster.kubeconfig, timeout=5)
            path = "/api/v1/pods"
            selector = {"fieldSelector": f"spec.nodeName={NODE_NAME}"}
            for pod in rest.get(path, **selector)["items"]:
                meta = pod["metadata"]
                rest.delete(
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                    {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 5},
                )
            deadline = time.monotonic() + timeout
            while rest.get(path, **selector)["items"] and time.monotonic() < deadline:
                time.sleep(0.2)
        except (ApiError, OSError, ValueError) as e:
            self.log(f"node: could not drain through the API server ({e}); stopping containers directly")

    def _kill_tasks(self) -> None:
        ctr = self._ctr()
        proc = subprocess.run([*ctr, "tasks", "ls", "-q"], capture_output=True, text=True, timeout=30)
        for task in proc.stdout.split():
            subprocess.run([*ctr, "tasks", "kill", "-s", "SIGKILL", task], capture_output=True, timeout=30)
        for task in proc.stdout.split():
            subprocess.run([*ctr, "tasks", "delete", "-f", task], capture_output=True, timeout=30)

    def _shims(self) -> list[ProcessRecord]:
        """containerd-shim-runc-v2 processes of this node's containerd (they re-parent to PID 1
        and outlive it); recognised by their binary and the node's socket on their command line."""
        shim = str(self.bin.dir / "containerd-shim-runc-v2")
        out = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                exe = os.readlink(entry / "exe")
            except OSError:
                continue
            if exe == shim and str(self.socket).encode() in argv:
                start = proc_starttime(int(entry.name))
                if start is not None:
                    out.append(ProcessRecord("containerd-shim", int(entry.name), start, False))
        return out


def _records(name: str, pids: set[int]) -> list[ProcessRecord]:
    out = []
    for pid in pids:
        start = proc_starttime(pid)
        if start is not None:
            out.append(ProcessRecord(name, pid, start, False))
    return out


def _node_ready(rest: Rest) -> bool:
    try:
        node = rest.get(f"/api/v1/nodes/{NODE_NAME}")
    except ApiError:
        return False
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise NodeError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
