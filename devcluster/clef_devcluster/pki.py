"""Certificates and kubeconfigs for the local control plane, made with the openssl CLI.

P-256 keys keep generation to milliseconds, so a fresh state directory costs nothing noticeable.
Everything is reused across `up`s while the CA and leaves are still valid, so a kubeconfig a user
exported keeps working after a restart.
"""

from __future__ import annotations

import base64
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

# The first address of the service range (10.96.0.0/16) is the `kubernetes` Service's ClusterIP;
# in-cluster clients (kind, a pod) reach the API server through it.
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
CLUSTER_NAME = "clef-local"

_VALID_DAYS = 365
# Renew a leaf this long before it expires, so a long-lived state dir never serves an expired cert.
_RENEW_BEFORE_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class ClientIdentity:
    """A client certificate: the CN is the user name, each O a group."""

    name: str
    user: str
    groups: tuple[str, ...] = ()


# The control-plane components use their own identities, so the API server's bootstrap RBAC roles
# (system:kube-controller-manager, system:kube-scheduler) are what authorizes them, as in a real
# cluster.  kwok and the runner stand in for kubelets of many nodes, so they get admin rights.
CLIENTS = (
    ClientIdentity("admin", "clef-admin", ("system:masters",)),
    ClientIdentity("controller-manager", "system:kube-controller-manager"),
    ClientIdentity("scheduler", "system:kube-scheduler"),
    ClientIdentity("kwok", "clef-kwok", ("system:masters",)),
    ClientIdentity("runner", "clef-runner", ("system:masters",)),
    # What the API server shows the stand-in kubelet's log endpoint (runner/logs.py).
    ClientIdentity("apiserver-kubelet-client", "kube-apiserver-kubelet-client"),
    # The real node's kubelet (realnode.py, `make test-real`): the Node authorizer's identity for
    # node `localhost` (the kubelet runs with --hostname-override=localhost).
    ClientIdentity("node-localhost", "system:node:localhost", ("system:nodes",)),
)
# The runner's kubelet endpoint (`kubectl logs`) serves on loopback with this leaf, which the API
# server checks against the cluster CA (--kubelet-certificate-authority).
KUBELET_SERVING = "kubelet"


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}")


def _still_valid(cert: Path) -> bool:
    if not cert.is_file():
        return False
    proc = subprocess.run(
        ["openssl", "x509", "-checkend", str(_RENEW_BEFORE_SECONDS), "-noout", "-in", str(cert)],
        capture_output=True,
    )
    return proc.returncode == 0


class PKI:
    def __init__(self, directory: Path) -> None:
        self.dir = directory

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "service-account.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "service-account.pub"

    def cert(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"

    def ensure(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        fresh_ca = not _still_valid(self.ca_cert)
        if fresh_ca:
            self._make_ca()
        if fresh_ca or not _still_valid(self.cert("apiserver")):
            self._make_leaf(
                "apiserver",
                "/CN=kube-apiserver",
                usage="serverAuth",
                san=(
                    "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,"
                    f"DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:{KUBERNETES_SERVICE_IP}"
                ),
            )
        if fresh_ca or not _still_valid(self.cert(KUBELET_SERVING)):
            self._make_leaf(
                KUBELET_SERVING,
                "/CN=clef-runner-kubelet",
                usage="serverAuth",
                san="DNS:localhost,IP:127.0.0.1",
            )
        for client in CLIENTS:
            if fresh_ca or not _still_valid(self.cert(client.name)):
                subject = f"/CN={client.user}" + "".join(f"/O={g}" for g in client.groups)
                self._make_leaf(client.name, subject, usage="clientAuth")
        if fresh_ca or not self.sa_key.is_file():
            _openssl(
                "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(self.sa_key)
            )
            _openssl("pkey", "-in", str(self.sa_key), "-pubout", "-out", str(self.sa_pub))
        for p in self.dir.iterdir():
            if p.suffix == ".key":
                p.chmod(0o600)

    def _make_ca(self) -> None:
        _openssl(
            "req", "-x509", "-new", "-nodes",
            "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-keyout", str(self.ca_key), "-out", str(self.ca_cert),
            "-subj", f"/CN={CLUSTER_NAME}-ca", "-days", str(10 * _VALID_DAYS),
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        )  # fmt: skip

    def _make_leaf(self, name: str, subject: str, *, usage: str, san: str | None = None) -> None:
        args = [
            "req", "-x509", "-new", "-nodes",
            "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-keyout", str(self.key(name)), "-out", str(self.cert(name)),
            "-CA", str(self.ca_cert), "-CAkey", str(self.ca_key),
            "-subj", subject, "-days", str(_VALID_DAYS),
            "-addext", "basicConstraints=critical,CA:FALSE",
            "-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
            "-addext", f"extendedKeyUsage={usage}",
        ]  # fmt: skip
        if san:
            args += ["-addext", f"subjectAltName={san}"]
        _openssl(*args)

    def kubeconfig(self, client: str, server: str) -> dict[str, object]:
        def b64(p: Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": CLUSTER_NAME,
                    "cluster": {"server": server, "certificate-authority-data": b64(self.ca_cert)},
                }
            ],
            "users": [
                {
                    "name": client,
                    "user": {
                        "client-certificate-data": b64(self.cert(client)),
                        "client-key-data": b64(self.key(client)),
                    },
                }
            ],
            "contexts": [{"name": CLUSTER_NAME, "context": {"cluster": CLUSTER_NAME, "user": client}}],
            "current-context": CLUSTER_NAME,
        }

    def write_kubeconfig(self, client: str, server: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written whole and renamed so a reader never sees half a kubeconfig.
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            yaml.safe_dump(self.kubeconfig(client, server), f)
        tmp = Path(f.name)
        tmp.chmod(0o600)
        tmp.replace(path)
