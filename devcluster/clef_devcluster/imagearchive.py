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


# ------------------------------------------------------------------------- config variants

REF_NAME = "org.opencontainers.image.ref.name"


def _blob_path(digest: str) -> str:
    algo, _, hexa = digest.partition(":")
    if algo != "sha256" or len(hexa) != 64:
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return f"blobs/sha256/{hexa}"


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write_env_variant(
    base: Path, out: Path, ref: str, env: dict[str, str], files: tuple[File, ...] = ()
) -> str:
    """An image that is `base` (a one-image OCI archive, as `make images` writes) with `env` set
    over its config's Env, and nothing else changed: the same layers, by digest.  The archive
    written to `out` holds only the new manifest and config, not the layers (gigabytes for the
    runtime): it imports only where `base` was imported before (containerd finds the layers in
    its content store by digest).  Returns the new manifest's digest; the image is named `ref`.

    With `files`, one layer holding them is added on top (written into the archive: it is new).

    This is how the real-node tier makes a variant of the runtime image that carries a fault of
    the catalogue (CLEF_RUNTIME_FAULT), as the demo's image table does for the cluster tier, and
    an engine image built on it (`files`: the engine's executable)."""
    with tarfile.open(base) as tar:

        def blob(digest: str) -> bytes:
            f = tar.extractfile(_blob_path(digest))
            if f is None:
                raise ValueError(f"{base}: no blob {digest}")
            data = f.read()
            if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
                raise ValueError(f"{base}: blob {digest} does not match its digest")
            return data

        index_file = tar.extractfile("index.json")
        if index_file is None:
            raise ValueError(f"{base}: not an OCI archive (no index.json)")
        manifests = json.load(index_file)["manifests"]
        if len(manifests) != 1:
            raise ValueError(f"{base}: holds {len(manifests)} manifests, not one image")
        manifest = json.loads(blob(manifests[0]["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
    inner = config.setdefault("config", {})
    kept = [e for e in inner.get("Env") or [] if e.split("=", 1)[0] not in env]
    inner["Env"] = kept + [f"{k}={v}" for k, v in env.items()]
    layer = _layer(list(files)) if files else b""
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    if files:
        # Uncompressed: its digest is its diff ID.
        config["rootfs"]["diff_ids"] = [*config["rootfs"]["diff_ids"], layer_digest]
        config["history"] = [*config.get("history", []), {"created_by": "clef_devcluster.imagearchive"}]
        manifest["layers"] = [
            *manifest["layers"],
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": len(layer),
            },
        ]
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    manifest["config"] = {**manifest["config"], "digest": config_digest, "size": len(config_bytes)}
    manifest_bytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    manifest_digest = "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": manifest.get("mediaType", "application/vnd.oci.image.manifest.v1+json"),
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "annotations": {REF_NAME: ref},
            }
        ],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        _add(tar, _blob_path(config_digest), config_bytes)
        if files:
            _add(tar, _blob_path(layer_digest), layer)
        _add(tar, _blob_path(manifest_digest), manifest_bytes)
        _add(tar, "index.json", json.dumps(index, sort_keys=True).encode())
    return manifest_digest
