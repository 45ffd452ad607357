"""`make images` twice, the same digests (opt-in: `make test-images`; not part of `make test`).

Each test builds an image with hack/images.py into two output directories and compares the
manifest digests read from the two OCI archives.  The second build rebuilds the Debian base
(mmdebstrap) too, as a fresh machine would, so the base's reproducibility is under test as well.
Builds take minutes (the runtime image: 11-22 min each here), so the tier needs CLEF_IMAGES=1, which
`make test-images` sets; CLEF_IMAGES_RUNTIME=cpu adds the CPU runtime image.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "images.py"


def _skip(reason: str) -> None:
    print(f"\nSKIPPED: {reason}", file=sys.stderr)
    pytest.skip(reason)


def _engine() -> None:
    if os.environ.get("CLEF_IMAGES", "") in ("", "0"):
        _skip("image builds take minutes: set CLEF_IMAGES=1 (make test-images does)")
    docker = (
        subprocess.run(["docker", "info"], capture_output=True).returncode == 0
        if shutil.which("docker")
        else False
    )
    if not docker and not shutil.which("buildah"):
        _skip(
            "neither a Docker engine nor buildah here (apt-get install buildah, or make images installs it as root)"
        )
    if not os.environ.get("CLEF_IMAGES_PIP"):
        _skip("CLEF_IMAGES_PIP (the host pip that builds the wheels) is not set: run `make test-images`")


def _source_date_epoch() -> str:
    """The last commit's time, read once: both builds use it even if a commit lands between them."""
    out = subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=REPO, capture_output=True, text=True)
    return os.environ.get("SOURCE_DATE_EPOCH") or out.stdout.strip()


def _build(out: Path, what: list[str], *, rebuild_base: bool, sde: str) -> dict[str, dict[str, object]]:
    env = {**os.environ, "REBUILD_BASE": "1" if rebuild_base else "0", "SOURCE_DATE_EPOCH": sde}
    cmd = [
        sys.executable, str(SCRIPT), "build", "--out", str(out),
        "--pip", os.environ["CLEF_IMAGES_PIP"], "--python", f"{sys.version_info[0]}.{sys.version_info[1]}",
        "--registry", "localhost/clef-test", "--version", "0.0.0", *what,
    ]  # fmt: skip
    t = time.monotonic()
    subprocess.run(cmd, cwd=REPO, env=env, check=True)
    print(f"\nbuild {' '.join(what)} into {out}: {time.monotonic() - t:.0f} s", file=sys.stderr)
    return dict(json.loads((out / "digests.json").read_text()))


def _twice(tmp_path: Path, what: list[str], key: str) -> None:
    sde = _source_date_epoch()
    first = _build(tmp_path / "one", what, rebuild_base=False, sde=sde)[key]
    second = _build(tmp_path / "two", [*what, "--no-smoke"], rebuild_base=True, sde=sde)[key]
    print(f"\n{key}: {first['digest']} / {second['digest']} ({first['size_bytes']} bytes)", file=sys.stderr)
    assert first["digest"].startswith("sha256:")  # type: ignore[union-attr]
    assert (first["digest"], first["image_id"]) == (second["digest"], second["image_id"])


@pytest.mark.images
@pytest.mark.timeout(3600)  # two builds and a base: 10 to 30 min on a loaded 2-core machine
def test_operator_image_builds_to_the_same_digest_twice(tmp_path: Path) -> None:
    _engine()
    _twice(tmp_path, ["--operator"], "clef-operator")


@pytest.mark.images
@pytest.mark.timeout(7200)
def test_cpu_runtime_image_builds_to_the_same_digest_twice(tmp_path: Path) -> None:
    _engine()
    if os.environ.get("CLEF_IMAGES_RUNTIME") != "cpu":
        _skip("the runtime image is several GB (11-22 min a build): set CLEF_IMAGES_RUNTIME=cpu")
    _twice(tmp_path, ["--runtime", "cpu"], "clef-runtime-cpu")
