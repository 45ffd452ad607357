"""Where things are: the pins, the binary cache, the state directory, and the contract labels."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = Path(__file__).resolve().parent
MANIFESTS_DIR = PACKAGE_DIR / "manifests"
IMAGE_TABLE_FILE = PACKAGE_DIR / "images.yaml"
VERSIONS_FILE = REPO_ROOT / "hack" / "cluster" / "versions.env"
BUILD_SCRIPT = REPO_ROOT / "hack" / "cluster" / "build.sh"
CRDS_DIR = REPO_ROOT / "crds"
VENV_BIN = REPO_ROOT / ".venv" / "bin"
DEFAULT_STATE_DIR = REPO_ROOT / ".cluster"

# The labels and names agreed in docs/architecture.md.
COMPONENT_LABEL = "clef.riotpiao.com/component"
VERIFICATION = "verification"
VERIFICATION_SELECTOR = f"{COMPONENT_LABEL}={VERIFICATION}"
# Images under this prefix are engine images that the runner really serves (image kind `serve`):
# kwok leaves every pod with such a container alone (manifests/kwok-stages.yaml matches the same
# prefix), whatever its labels, so the operator needs to know nothing about the local cluster.
ENGINE_IMAGE_PREFIX = "registry.clef.test/engines/"
# kwok manages only nodes carrying this annotation, so a real node (kind) is never taken over.
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"
# Where the harness keeps the live image table inside the cluster (see images.py).
HARNESS_NAMESPACE = "clef-harness"
IMAGE_TABLE_CONFIGMAP = "image-table"
IMAGE_TABLE_KEY = "images.yaml"


def cache_root() -> Path:
    return Path(os.environ.get("CLEF_CACHE") or Path.home() / ".cache" / "clef")


@dataclass(frozen=True)
class Versions:
    kubernetes: str
    etcd: str
    kwok: str
    # The real node's (`make test-real`); its kubelet is KUBERNETES_VERSION's.
    containerd: str = ""
    cni_plugins: str = ""

    @classmethod
    def load(cls, path: Path = VERSIONS_FILE) -> Versions:
        values: dict[str, str] = {}
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise ValueError(f"{path}: {raw!r} is not KEY=value")
            values[key.strip()] = value.strip()
        try:
            return cls(
                values["KUBERNETES_VERSION"],
                values["ETCD_VERSION"],
                values["KWOK_VERSION"],
                values.get("CONTAINERD_VERSION", ""),
                values.get("CNI_PLUGINS_VERSION", ""),
            )
        except KeyError as e:
            raise ValueError(f"{path}: {e.args[0]} is not set") from e


@dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    etcd: Path
    kwok: Path

    @classmethod
    def for_versions(cls, versions: Versions, root: Path | None = None) -> Binaries:
        root = root or cache_root()
        k8s = root / f"k8s-{versions.kubernetes}" / "bin"
        return cls(
            kube_apiserver=k8s / "kube-apiserver",
            kube_controller_manager=k8s / "kube-controller-manager",
            kube_scheduler=k8s / "kube-scheduler",
            kubectl=k8s / "kubectl",
            etcd=root / f"etcd-{versions.etcd}" / "bin" / "etcd",
            kwok=root / f"kwok-{versions.kwok}" / "bin" / "kwok",
        )

    def all(self) -> list[Path]:
        return [
            self.kube_apiserver,
            self.kube_controller_manager,
            self.kube_scheduler,
            self.kubectl,
            self.etcd,
            self.kwok,
        ]

    def missing(self) -> list[Path]:
        # build.sh writes .complete last, so a binary without it is from an interrupted build.
        return [b for b in self.all() if not (b.is_file() and (b.parent.parent / ".complete").is_file())]


@dataclass(frozen=True)
class NodeBinaries:
    """The real node's binaries: `build.sh node` puts them in one cache entry."""

    dir: Path

    @classmethod
    def for_versions(cls, versions: Versions, root: Path | None = None) -> NodeBinaries:
        root = root or cache_root()
        name = f"node-{versions.kubernetes}-{versions.containerd}-{versions.cni_plugins}"
        return cls(root / name / "bin")

    @property
    def kubelet(self) -> Path:
        return self.dir / "kubelet"

    @property
    def containerd(self) -> Path:
        return self.dir / "containerd"

    @property
    def ctr(self) -> Path:
        return self.dir / "ctr"

    @property
    def pause(self) -> Path:
        return self.dir / "pause"

    NAMES = (
        "kubelet",
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
        "bridge",
        "host-local",
        "loopback",
        "portmap",
        "pause",
    )

    def missing(self) -> list[Path]:
        if not (self.dir.parent / ".complete").is_file():
            return [self.dir / n for n in self.NAMES]
        return [self.dir / n for n in self.NAMES if not (self.dir / n).is_file()]


def default_node_binaries() -> NodeBinaries:
    return NodeBinaries.for_versions(Versions.load())


def default_binaries() -> Binaries:
    return Binaries.for_versions(Versions.load())


def missing_prerequisites(binaries: Binaries | None = None) -> str | None:
    """One line naming what this machine lacks to run the local cluster, or None."""
    binaries = binaries or default_binaries()
    lacking: list[str] = []
    if shutil.which("openssl") is None:
        lacking.append("openssl (apt-get install openssl) to generate the cluster's certificates")
    if binaries.missing():
        if shutil.which("go") is None:
            lacking.append(
                "go >= 1.26 to build kube-apiserver, etcd and kwok once "
                "(https://go.dev/dl/, or point CLEF_KUBECONFIG at an existing cluster)"
            )
        if shutil.which("flock") is None:
            lacking.append("flock (apt-get install util-linux) for the build lock")
    if not lacking:
        return None
    return "missing " + "; ".join(lacking)
