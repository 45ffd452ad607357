"""hack/images.py's parts that need no image build: the runtime's torch architecture check, the
refusal of an unknown CUDA_ARCHS value, and the pinned overlay `make images` generates (rendered
by kustomize).  The builds themselves are tests/images (`make test-images`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kubectl_gate import require_kubectl

from clef_devcluster.kustomize import find, kustomize_build

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "images.py"
CHECK = REPO / "images" / "runtime" / "check_torch_arch.py"
DIGEST = "sha256:" + "ab" * 32


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True)


@pytest.mark.parametrize(
    ("arch", "flags", "rc"),
    [
        ("sm70", "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120", 1),  # PyPI's torch 2.11 (CUDA 13)
        ("sm70", "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90", 0),  # the cu126 index's
        ("sm90", "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120", 0),
        ("sm90", "sm_70 sm_75 sm_80", 1),
        ("sm90", "", 1),  # a CPU-only torch
        ("cpu", "", 0),
    ],
)
def test_torch_arch_check(arch: str, flags: str, rc: int) -> None:
    result = _check(arch, "--arch-flags", flags)
    assert result.returncode == rc, result.stdout + result.stderr
    if rc:
        want = "sm_" + arch[2:]
        assert f"no {want} kernels" in result.stderr, result.stderr


def test_torch_arch_check_names_the_index_that_has_volta() -> None:
    result = _check("sm70", "--arch-flags", "sm_80 sm_90")
    assert "https://download.pytorch.org/whl/cu126" in result.stderr


def test_torch_arch_check_reads_the_installed_wheel_without_a_gpu() -> None:
    """The project's venv holds PyPI's torch: compiled for sm_90, not for V100's sm_70."""
    pytest.importorskip(
        "torch", reason="no torch in this venv (an operator-only install): `make venv` installs it"
    )
    assert _check("sm90").returncode == 0
    result = _check("sm70")
    assert result.returncode == 1 and "no sm_70 kernels" in result.stderr, result.stderr


def test_unknown_arch_is_refused_by_name() -> None:
    result = _check("sm80")
    assert result.returncode == 2 and "'sm80'" in result.stderr
    build = subprocess.run(
        [sys.executable, str(SCRIPT), "build", "--pip", "pip", "--python", "3.11", "--registry", "r",
         "--version", "0", "--runtime", "cpu", "sm80"],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert build.returncode == 2
    assert "CUDA_ARCHS: sm80 is not one of cpu sm70 sm90" in build.stderr, build.stderr


def _pin(tmp_path: Path, digests: dict[str, object]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "digests.json").write_text(json.dumps(digests))
    return subprocess.run(
        [sys.executable, str(SCRIPT), "pin", "--digests", str(tmp_path / "digests.json"),
         "--out", str(tmp_path / "pinned")],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip


def test_pinned_overlay_points_the_base_at_the_built_digest(tmp_path: Path) -> None:
    kubectl = require_kubectl()
    ref = "registry.homelab.lan/clef/clef-operator:0.1.0"
    result = _pin(tmp_path, {"clef-operator": {"ref": ref, "digest": DIGEST, "commit": "c0ffee"}})
    assert result.returncode == 0, result.stderr
    objects = kustomize_build(kubectl, tmp_path / "pinned")
    [container] = find(objects, "Deployment", "clef-operator")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"registry.homelab.lan/clef/clef-operator@{DIGEST}"
    # Nothing else changes: the pinned overlay is the base.
    base = kustomize_build(kubectl, REPO / "kustomize" / "base")
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objects) == sorted(
        (o["kind"], o["metadata"]["name"]) for o in base
    )


@pytest.mark.parametrize(
    ("digests", "problem"),
    [
        ({}, "has no clef-operator image"),
        ({"clef-operator": {"ref": "r/clef-operator:1", "digest": "sha256:abc"}}, "is not a sha256 digest"),
    ],
)
def test_pin_refuses_what_was_not_built(tmp_path: Path, digests: dict[str, object], problem: str) -> None:
    result = _pin(tmp_path, digests)
    assert result.returncode == 2 and problem in result.stderr, result.stderr
