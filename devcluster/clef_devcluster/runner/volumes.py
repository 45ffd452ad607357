"""A pod's volumes without a mount namespace: each mounted volume is a directory on this host, and
a container path under a volume's mountPath is rewritten to that directory wherever the runner
can see it, in the command's arguments and in its environment's values.

    hostPath    the host path itself (the mount's subPath appended)
    configMap   the ConfigMap's keys (data and binaryData) written as files into the pod's scratch
                directory, or only `items` (key -> path), as a kubelet projects them
    secret      the same, for a Secret
    emptyDir    a fresh directory in the pod's scratch directory

Other sources (persistentVolumeClaim, projected service-account tokens, ...) are not mounted: a
path under their mountPath stays as written, so a process that needs them fails on a missing
file, saying which.  What a program computes from a path at run time (not in its argv or env) is
not rewritten: the runner has no mount namespace.
"""

from __future__ import annotations

import base64
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
# (namespace, kind "configmaps"|"secrets", name) -> the object, None if it does not exist
Reader = Callable[[str, str, str], Obj | None]


class MountError(RuntimeError):
    """A volume cannot be set up (the kubelet's FailedMount): the container is not started."""


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str


def _under(path: str, prefix: str) -> str | None:
    """The rest of `path` below `prefix` ("" for the prefix itself), or None."""
    prefix = prefix.rstrip("/") or "/"
    if path == prefix:
        return ""
    if prefix == "/":
        return path[1:] if path.startswith("/") else None
    return path[len(prefix) + 1 :] if path.startswith(prefix + "/") else None


def host_path(mounts: list[Mount], path: str) -> str:
    """`path` inside the container -> on this host, by the deepest mount that holds it."""
    best: tuple[int, str] | None = None
    for m in mounts:
        rest = _under(path, m.container_path)
        if rest is not None and (best is None or len(m.container_path) > best[0]):
            best = (len(m.container_path), str(Path(m.host_path) / rest) if rest else m.host_path)
    return best[1] if best else path


def rewrite(value: str, mounts: list[Mount]) -> str:
    """An argument or env value: a path under a mount, or `--flag=<path>`, moves to the host."""
    if value.startswith("/"):
        return host_path(mounts, value)
    head, eq, tail = value.partition("=")
    if eq and tail.startswith("/") and head.startswith("-"):
        return f"{head}={host_path(mounts, tail)}"
    return value


def _project(
    target: Path, data: dict[str, bytes], items: list[Obj] | None, what: str, optional: bool
) -> None:
    target.mkdir(parents=True, exist_ok=True)
    chosen = [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in data]
    for key, rel in chosen:
        if key not in data:
            if optional:
                continue
            raise MountError(f"configmap/secret references non-existent config key: {key} ({what})")
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise MountError(f"{what}: item path {rel!r} must be relative and must not contain '..'")
        out = target / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data[key])


def _object_data(obj: Obj, kind: str) -> dict[str, bytes]:
    if kind == "secrets":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    data = {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


def _source(volume: Obj, namespace: str, scratch: Path, read: Reader) -> str | None:
    """Set one volume up; its directory on this host, or None for a source that is not mounted."""
    name = volume["name"]
    if "hostPath" in volume:
        path = str(volume["hostPath"]["path"])
        kind = volume["hostPath"].get("type") or ""
        if kind == "Directory" and not Path(path).is_dir():
            raise MountError(
                f'MountVolume.SetUp failed for volume "{name}": hostPath type check failed: {path} is not a directory'
            )
        if kind == "DirectoryOrCreate":
            Path(path).mkdir(parents=True, exist_ok=True)
        return path
    if "emptyDir" in volume:
        target = scratch / name
        target.mkdir(parents=True, exist_ok=True)
        return str(target)
    for key, kind, ref in (("configMap", "configmaps", "name"), ("secret", "secrets", "secretName")):
        if key in volume:
            src = volume[key]
            optional = bool(src.get("optional"))
            obj = read(namespace, kind, src[ref])
            if obj is None and not optional:
                raise MountError(
                    f'MountVolume.SetUp failed for volume "{name}": {key} "{src[ref]}" not found'
                )
            target = scratch / name
            shutil.rmtree(target, ignore_errors=True)
            _project(target, _object_data(obj or {}, kind), src.get("items"), f'volume "{name}"', optional)
            return str(target)
    return None


def set_up(pod: Obj, container: Obj, scratch: Path, read: Reader) -> list[Mount]:
    """The container's mounts, its volumes set up under `scratch` (the pod's volume directory)."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    namespace = pod["metadata"]["namespace"]
    mounts: list[Mount] = []
    made: dict[str, str | None] = {}
    for m in container.get("volumeMounts") or []:
        volume = volumes.get(m["name"])
        if volume is None:
            raise MountError(f'volumeMount "{m["name"]}" names no volume of the pod')
        if m["name"] not in made:
            made[m["name"]] = _source(volume, namespace, scratch, read)
        base = made[m["name"]]
        if base is None:
            continue
        sub = m.get("subPath") or ""
        mounts.append(Mount(str(m["mountPath"]), str(Path(base) / sub) if sub else base))
    return mounts
