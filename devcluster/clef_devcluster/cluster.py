"""Start and stop the local control plane: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok and the verification runner, as processes on 127.0.0.1.

State lives in one directory (default `.cluster/` in the repo root):

    kubeconfig            admin kubeconfig (what users and tests use)
    kubeconfigs/          one per component identity
    pki/                  CA, serving and client certificates, service-account key
    etcd/                 etcd's data, wiped at every `up` and `down`
    logs/                 one log per component; logs/verify/ one per verification container
    run/                  processes.json (pid + start time of everything started), state.json
    runs/                 scratch working directories of verification containers
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import components, images
from .config import (
    BUILD_SCRIPT,
    CRDS_DIR,
    DEFAULT_STATE_DIR,
    HARNESS_NAMESPACE,
    MANIFESTS_DIR,
    REPO_ROOT,
    Binaries,
    cache_root,
    default_binaries,
    missing_prerequisites,
)
from .pki import PKI
from .procs import ProcessLedger, ProcessRecord, free_port, listening_ports, record, stop
from .rest import ApiError, Rest, object_path

Log = Callable[[str], None]

# Stop order: the runner first (it ends verification commands), the API server's clients next,
# then the API server, etcd last.
_STOP_ORDER = [
    ["runner"],
    ["kwok", "kube-scheduler", "kube-controller-manager"],
    ["kube-apiserver"],
    ["etcd"],
]


class ClusterError(RuntimeError):
    pass


class ClusterRunning(ClusterError):
    pass


@dataclass
class DownReport:
    stopped: list[str]
    survivors: list[str]
    ports_still_listening: list[int]

    @property
    def clean(self) -> bool:
        return not self.survivors and not self.ports_still_listening


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build(log: Log = _stderr, binaries: Binaries | None = None) -> None:
    """Build whatever the cache lacks (hack/cluster/build.sh), streaming its progress."""
    binaries = binaries or default_binaries()
    if not binaries.missing():
        return
    missing = missing_prerequisites(binaries)
    if missing:
        raise ClusterError(missing)
    log(f"cluster: building the control plane into {cache_root()} (once; later runs reuse it)")
    started = time.monotonic()
    env = {**os.environ, "CLEF_CACHE": str(cache_root())}
    proc = subprocess.run(["bash", str(BUILD_SCRIPT), "all"], env=env)
    if proc.returncode != 0:
        raise ClusterError(f"{BUILD_SCRIPT} failed (exit {proc.returncode}); its output is above")
    if binaries.missing():
        raise ClusterError(f"build finished but {', '.join(map(str, binaries.missing()))} are missing")
    log(f"cluster: build done in {time.monotonic() - started:.0f}s")


class LocalCluster:
    def __init__(
        self,
        state_dir: Path = DEFAULT_STATE_DIR,
        binaries: Binaries | None = None,
        log: Log = _stderr,
    ) -> None:
        self.dir = state_dir.resolve()
        self.bin = binaries or default_binaries()
        self.log = log
        self.pki = PKI(self.dir / "pki")
        self.ledger = ProcessLedger(self.dir / "run" / "processes.json")
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._started = time.monotonic()
        self._timings: dict[str, float] = {}

    # -- paths -------------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    @property
    def audit_log(self) -> Path:
        """JSON lines, one per request by a clef-system ServiceAccount (manifests/audit-policy.yaml)."""
        return self.logs / "audit.log"

    @property
    def state_file(self) -> Path:
        return self.dir / "run" / "state.json"

    def component_kubeconfig(self, name: str) -> Path:
        return self.dir / "kubeconfigs" / f"{name}.kubeconfig"

    def state(self) -> dict[str, Any]:
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    # -- queries -----------------------------------------------------------------------------
    def running(self) -> list[ProcessRecord]:
        from .procs import is_alive

        return [r for r in self.ledger.load() if is_alive(r)]

    def active_kubeconfig(self) -> Path:
        external = self.state().get("externalKubeconfig")
        return Path(external) if external else self.kubeconfig

    def env_lines(self) -> list[str]:
        return [
            f"export KUBECONFIG={self.active_kubeconfig()}",
            f'export PATH="{self.bin.kubectl.parent}:$PATH"',
        ]

    # -- up ----------------------------------------------------------------------------------
    def up(self, *, external_kubeconfig: Path | None = None, timeout: float = 180.0) -> float:
        """Start everything and wait until it is usable.  Returns the seconds it took.

        With `external_kubeconfig` (kind, a real cluster) only kwok and the runner start here,
        against that cluster, and the same nodes, RuntimeClass, image table and CRDs are applied.
        """
        if self.running():
            raise ClusterRunning(f"a cluster is already running from {self.dir} (`down` stops it)")
        missing = [
            b for b in self.bin.missing() if external_kubeconfig is None or b.name in ("kwok", "kubectl")
        ]
        if missing:
            raise ClusterError(
                "not built: " + ", ".join(map(str, missing)) + " (run `python -m clef_devcluster build`)"
            )
        started = self._started = time.monotonic()
        self._timings = {}
        deadline = started + timeout
        self._clean_leftovers()
        for sub in ("run", "logs", "kubeconfigs"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        try:
            if external_kubeconfig is None:
                kubeconfig = self.kubeconfig
                self._start_control_plane(deadline)
                kwok_kc = self.component_kubeconfig("kwok")
                runner_kc = self.component_kubeconfig("runner")
            else:
                kubeconfig = external_kubeconfig.resolve()
                kwok_kc = runner_kc = kubeconfig
                self._write_state({"externalKubeconfig": str(kubeconfig)})
            rest = Rest(kubeconfig)
            self.spawn("kwok", components.kwok(self.bin, kwok_kc))
            (self.dir / "run" / "runner.ready").unlink(missing_ok=True)
            self.spawn("runner", components.runner(self.dir, runner_kc), cwd=REPO_ROOT)
            # kwok and the runner start while the objects are written: neither depends on the
            # order (kwok's node stage keeps the capacity whenever it arrives).
            self._seed(rest)
            self._mark("seeded")
            self._wait_usable(rest, deadline, local=external_kubeconfig is None)
        except BaseException:
            self.log(f"cluster: start failed; stopping what was started (logs in {self.logs})")
            self.down()
            raise
        elapsed = time.monotonic() - started
        self._write_state({**self.state(), "upSeconds": round(elapsed, 2), "phases": self._timings})
        return elapsed

    def _start_control_plane(self, deadline: float) -> None:
        self.pki.ensure()
        ports = {
            name: free_port() for name in ("etcd", "etcdPeer", "apiserver", "controllerManager", "scheduler")
        }
        server = f"https://127.0.0.1:{ports['apiserver']}"
        self._write_state({"ports": ports, "server": server})
        self.pki.write_kubeconfig("admin", server, self.kubeconfig)
        for name in ("controller-manager", "scheduler", "kwok", "runner"):
            self.pki.write_kubeconfig(name, server, self.component_kubeconfig(name))
        p = self.pki
        etcd_url = f"http://127.0.0.1:{ports['etcd']}"
        peer_url = f"http://127.0.0.1:{ports['etcdPeer']}"
        shutil.rmtree(self.dir / "etcd", ignore_errors=True)
        self.spawn("etcd", components.etcd(self.bin, self.dir / "etcd", etcd_url, peer_url))
        self.wait_ready("etcd", lambda: _http_ok(f"{etcd_url}/health"), deadline)
        self._mark("etcd")
        cert_dir = self.dir / "run" / "certs"
        self.spawn(
            "kube-apiserver",
            components.kube_apiserver(
                self.bin,
                p,
                etcd_url=etcd_url,
                port=ports["apiserver"],
                cert_dir=cert_dir / "apiserver",
                audit_log=self.audit_log,
            ),
        )
        ctx = ssl.create_default_context(cafile=str(p.ca_cert))
        ctx.load_cert_chain(str(p.cert("admin")), str(p.key("admin")))
        self.wait_ready("kube-apiserver", lambda: _http_ok(f"{server}/readyz", ctx), deadline)
        self._mark("apiserver")
        self.spawn(
            "kube-controller-manager",
            components.kube_controller_manager(
                self.bin,
                p,
                kubeconfig=self.component_kubeconfig("controller-manager"),
                port=ports["controllerManager"],
                cert_dir=cert_dir / "controller-manager",
            ),
        )
        self.spawn(
            "kube-scheduler",
            components.kube_scheduler(
                self.bin,
                kubeconfig=self.component_kubeconfig("scheduler"),
                port=ports["scheduler"],
                cert_dir=cert_dir / "scheduler",
            ),
        )

    def _seed(self, rest: Rest) -> None:
        """Namespace + image table, nodes with their capacity, RuntimeClass, CRDs."""
        rest.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": HARNESS_NAMESPACE}})
        images.write_table(rest, images.seed_table())
        for doc in _load_yaml(MANIFESTS_DIR / "nodes.yaml"):
            # Status is ignored on apply; it goes through the status subresource, as a kubelet's
            # would.  kwok's node stage keeps what it finds, whichever comes first.
            status = doc.pop("status", None)
            rest.apply(doc)
            if status:
                rest.patch_status(object_path(doc), status)
        for doc in _load_yaml(MANIFESTS_DIR / "runtimeclass.yaml"):
            rest.apply(doc)
        install_crds(rest)

    def _wait_usable(self, rest: Rest, deadline: float, *, local: bool) -> None:
        if local:
            ports = self.state()["ports"]
            for name, key in (
                ("kube-controller-manager", "controllerManager"),
                ("kube-scheduler", "scheduler"),
            ):
                self.wait_ready(name, _healthz(int(ports[key])), deadline)

            def default_sa() -> bool:
                # Pods cannot be created in a namespace before its ServiceAccount exists; this is
                # the controller-manager doing real work, not just answering /healthz.
                try:
                    rest.get("/api/v1/namespaces/default/serviceaccounts/default")
                except ApiError:
                    return False
                return True

            self.wait_ready("kube-controller-manager", default_sa, deadline)
            self._mark("controllers")

        ready_file = self.dir / "run" / "runner.ready"
        self.wait_ready("runner", ready_file.exists, deadline)
        self._mark("runner")
        names = {d["metadata"]["name"] for d in _load_yaml(MANIFESTS_DIR / "nodes.yaml")}

        def nodes_ready() -> bool:
            ready = set()
            for n in rest.get("/api/v1/nodes")["items"]:
                for c in (n.get("status") or {}).get("conditions") or []:
                    if c["type"] == "Ready" and c["status"] == "True":
                        ready.add(n["metadata"]["name"])
            return names <= ready

        self.wait_ready("kwok", nodes_ready, deadline)
        self._mark("nodes")

    def _mark(self, phase: str) -> None:
        """Seconds since `up` began, per phase, kept in state.json (how the doc's numbers are made)."""
        self._timings[phase] = round(time.monotonic() - self._started, 2)

    # -- processes ---------------------------------------------------------------------------
    def spawn(
        self, name: str, argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> None:
        """Start component `name` in its own session, its output in `<logs>/<name>.log`, recorded
        in the process ledger (so `down` stops it, also from another process)."""
        log_path = self.logs / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as out:
            out.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
            out.flush()
            # Own session: a Ctrl-C in the terminal that ran `up` does not reach the cluster,
            # and the processes outlive `make cluster-up`.
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cwd or self.dir,
                env=env,
                start_new_session=True,
            )
        self._children[name] = proc
        self.ledger.add(record(name, proc.pid))

    def wait_ready(self, name: str, ready: Callable[[], bool], deadline: float) -> None:
        """Until `ready()`; fails with the log's tail when a component exits or `deadline` passes."""
        while True:
            for child_name, proc in self._children.items():
                if proc.poll() is not None:
                    raise ClusterError(
                        f"{child_name} exited with {proc.returncode} while waiting for {name}:\n"
                        + self._log_tail(child_name)
                    )
            try:
                if ready():
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise ClusterError(f"{name} was not ready in time:\n" + self._log_tail(name))
            time.sleep(0.1)

    def _log_tail(self, name: str, lines: int = 25) -> str:
        try:
            text = (self.logs / f"{name}.log").read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"  (no log at {self.logs / name}.log)"
        return "\n".join("  | " + line for line in text)

    def update_state(self, **fields: Any) -> None:
        """Add `fields` to state.json."""
        self._write_state({**self.state(), **fields})

    def forget_children(self, names: Iterable[str]) -> None:
        """Components stopped by someone else (the real node's `down`): no longer watched."""
        for name in names:
            self._children.pop(name, None)

    def _write_state(self, data: dict[str, Any]) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.state_file)

    def _clean_leftovers(self) -> None:
        """A previous run that crashed may have left records, processes or etcd data behind."""
        if self.ledger.load() or self._verify_records():
            report = self.down()
            if not report.clean:
                raise ClusterError(f"could not clear a previous run: {report}")

    def _verify_records(self) -> list[ProcessRecord]:
        out = []
        for f in (self.dir / "run" / "verify-procs").glob("*.json"):
            try:
                out.append(ProcessRecord(**json.loads(f.read_text())))
            except (OSError, ValueError, TypeError):
                continue
        return out

    # -- down --------------------------------------------------------------------------------
    def down(self) -> DownReport:
        # A real node (realnode.py) goes first and puts the host back as it found it; its
        # problems are reported as survivors, so `down` is not clean until the host is.
        node_problems: list[str] = []
        if (self.dir / "node" / "host-before.json").exists() or any(
            r.name in ("kubelet", "containerd") for r in self.ledger.load()
        ):
            from .realnode import RealNode

            node_problems = RealNode(self).down()
        records = self.ledger.load()
        ports = [int(p) for p in (self.state().get("ports") or {}).values()]
        stopped: list[str] = []
        survivors: list[ProcessRecord] = []
        for group in _STOP_ORDER:
            batch = [r for r in records if r.name in group]
            survivors += stop(batch, grace=10.0)
            stopped += [r.name for r in batch]
        rest = [r for r in records if not any(r.name in g for g in _STOP_ORDER)]
        survivors += stop(rest, grace=5.0)
        # Verification commands whose runner died before it could end them.
        verify = self._verify_records()
        survivors += stop(verify, grace=2.0)
        for proc in self._children.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
        self._children.clear()
        still = sorted(set(ports) & listening_ports())
        if not survivors:
            self.ledger.save([])
            shutil.rmtree(self.dir / "run" / "verify-procs", ignore_errors=True)
            shutil.rmtree(self.dir / "etcd", ignore_errors=True)
            shutil.rmtree(self.dir / "runs", ignore_errors=True)
            self.kubeconfig.unlink(missing_ok=True)
            (self.dir / "run" / "runner.ready").unlink(missing_ok=True)
        return DownReport(stopped, [f"{r.name} (pid {r.pid})" for r in survivors] + node_problems, still)


def _load_yaml(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def install_crds(rest: Rest, directory: Path = CRDS_DIR, timeout: float = 30.0) -> list[str]:
    """Apply every CRD in crds/*.yaml and wait until the API server serves them."""
    names = []
    for path in sorted(directory.glob("*.yaml")):
        for doc in _load_yaml(path):
            if doc.get("kind") != "CustomResourceDefinition":
                continue
            rest.apply(doc)
            names.append(doc["metadata"]["name"])
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            crd = rest.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
            if conds.get("Established") == "True":
                break
            if time.monotonic() > deadline:
                raise ClusterError(f"CRD {name} was not Established within {timeout:.0f}s: {conds}")
            time.sleep(0.1)
    return names


def _healthz(port: int) -> Callable[[], bool]:
    return lambda: _http_ok(f"https://127.0.0.1:{port}/healthz", _insecure())


def _insecure() -> ssl.SSLContext:
    # The controller-manager and scheduler serve /healthz with a self-signed certificate made at
    # start; only liveness is asked of them here.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False
