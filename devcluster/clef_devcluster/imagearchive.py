"""A one-layer container image written as a docker-archive tarball (`docker save`'s format),
which `ctr images import` reads.  For the real node's sandbox image: its one file is the static
`pause` built by `hack/cluster/build.sh node`, so no registry, Docker or umoci is needed.

Byte-reproducible: fixed mtimes, owners and order, so the same files give the same image ID.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class File:
    path: str  # inside the image, without the leading /
    data: bytes
    mode: int = 0o644


def _layer(files: list[File]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(f.path).parent) for f in files} - {"."})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        for f in sorted(files, key=lambda f: f.path):
            info = tarfile.TarInfo(f.path)
            info.size = len(f.data)
            info.mode = f.mode
            tar.addfile(info, io.BytesIO(f.data))
    return buf.getvalue()


def write_docker_archive(
    out: Path, ref: str, files: list[File], *, entrypoint: list[str], user: str = ""
) -> str:
    """Writes the image `ref` (a tag, e.g. registry.k8s.io/pause:3.10.2) to `out`; returns its
    image ID (the digest of its config)."""
    layer = _layer(files)
    layer_digest = hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Entrypoint": entrypoint, **({"User": user} if user else {})},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "clef_devcluster.imagearchive"}],
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_digest = hashlib.sha256(config_bytes).hexdigest()
    manifest = [
        {
            "Config": f"{config_digest}.json",
            "RepoTags": [ref],
            "Layers": [f"{layer_digest}/layer.tar"],
        }
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (
            (f"{config_digest}.json", config_bytes),
            (f"{layer_digest}/layer.tar", layer),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return f"sha256:{config_digest}"
