"""The kustomize trees rendered with the pinned kubectl (it embeds kustomize), for the demo and the
shipping layer's tests."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from .config import REPO_ROOT, default_binaries

KUSTOMIZE_DIR = REPO_ROOT / "kustomize"
BASE = KUSTOMIZE_DIR / "base"
HOMELAB = KUSTOMIZE_DIR / "overlays" / "homelab"
DEMO = KUSTOMIZE_DIR / "overlays" / "demo"


def find_kubectl() -> str | None:
    """The pinned kubectl the local cluster is built with (it embeds kustomize), else PATH's."""
    cached = default_binaries().kubectl
    if cached.is_file():
        return str(cached)
    return shutil.which("kubectl")


def kustomize_build(kubectl: str, directory: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIR` as a list of objects; a kustomize error is raised with its text."""
    proc = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {directory} failed: {proc.stderr.strip()}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def find(objects: Iterable[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    if len(matches) != 1:
        raise LookupError(f"expected one {kind} {name}, found {len(matches)}")
    return matches[0]
