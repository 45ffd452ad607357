"""The environment a verification container runs with: what its image would provide, what its
spec asks for, and what the runner forces."""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clef_contract.command import DEVICE_ENV, FAULT_ENV, SHAPES_ENV, TERMINATION_LOG_ENV

from ..config import VENV_BIN
from ..rest import ApiError, Rest

log = logging.getLogger("clef.runner")

Obj = dict[str, Any]

# Forced for every run: the host has no GPU for these pods, and the verify suite must fit a CPU.
HARNESS_ENV = {
    DEVICE_ENV: "cpu",
    SHAPES_ENV: "reduced",
    "TRITON_INTERPRET": "1",
}


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined names are replaced, $$ escapes, the rest is kept."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and (end := text.find(")", i + 2)) != -1:
            name = text[i + 2 : end]
            out.append(env[name] if name in env else text[i : end + 1])
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def host_env(pod_name: str) -> dict[str, str]:
    """What an image's ENV would provide: the project's venv first, the host's tools after."""
    env = {
        "PATH": f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "HOSTNAME": pod_name,
        "VIRTUAL_ENV": str(VENV_BIN.parent),
    }
    for passthrough in ("TMPDIR", "TRITON_CACHE_DIR", "HF_HOME", "TORCHINDUCTOR_CACHE_DIR"):
        if passthrough in os.environ:
            env[passthrough] = os.environ[passthrough]
    return env


def process_env(
    pod_name: str, container: dict[str, str], termination_log: Path, fault: str | None
) -> dict[str, str]:
    """What the command runs with: the image's ENV, the container's env over it, the runner's own
    over both (where the termination message goes, and the fault an image carries)."""
    env = host_env(pod_name)
    env.update(container)
    env.update(HARNESS_ENV)
    env[TERMINATION_LOG_ENV] = str(termination_log)
    if fault is not None:
        env[FAULT_ENV] = fault
    return env


class ContainerEnv:
    """A container's environment as a kubelet resolves it (literal values, refs, envFrom), reading
    ConfigMaps and Secrets through the API server.  A missing required reference raises
    LookupError, which the kubelet reports as CreateContainerConfigError."""

    def __init__(self, rest: Rest, node_ip: Callable[[str | None], str]) -> None:
        self.rest = rest
        self.node_ip = node_ip

    def resolve(self, pod: Obj, spec: Obj) -> dict[str, str]:
        ns = pod["metadata"]["namespace"]
        env: dict[str, str] = {}
        for src in spec.get("envFrom") or []:
            prefix = src.get("prefix") or ""
            if "configMapRef" in src:
                ref = src["configMapRef"]
                data = self._config_map(ns, ref["name"], bool(ref.get("optional")))
            elif "secretRef" in src:
                ref = src["secretRef"]
                data = self._secret(ns, ref["name"], bool(ref.get("optional")))
            else:
                continue
            env.update({prefix + k: v for k, v in data.items()})
        for var in spec.get("env") or []:
            if "valueFrom" not in var:
                env[var["name"]] = expand(var.get("value") or "", env)
                continue
            value = self._value_from(pod, var["name"], var["valueFrom"])
            if value is not None:
                env[var["name"]] = value
        return env

    def _value_from(self, pod: Obj, name: str, src: Obj) -> str | None:
        meta, ns = pod["metadata"], pod["metadata"]["namespace"]
        if "fieldRef" in src:
            path = src["fieldRef"]["fieldPath"]
            fields = {
                "metadata.name": meta.get("name"),
                "metadata.namespace": ns,
                "metadata.uid": meta.get("uid"),
                "spec.nodeName": pod["spec"].get("nodeName"),
                "spec.serviceAccountName": pod["spec"].get("serviceAccountName"),
                "status.hostIP": self.node_ip(pod["spec"].get("nodeName")),
            }
            if path in fields:
                return str(fields[path] or "")
            for prefix, key in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
                if path.startswith(prefix + "['") and path.endswith("']"):
                    return str((meta.get(key) or {}).get(path[len(prefix) + 2 : -2], ""))
            log.warning("env %s: fieldRef %s is not supported by the local runner; left unset", name, path)
            return None
        for key, kind, read in (
            ("configMapKeyRef", "ConfigMap", self._config_map),
            ("secretKeyRef", "Secret", self._secret),
        ):
            if key in src:
                ref = src[key]
                optional = bool(ref.get("optional"))
                data = read(ns, ref["name"], optional)
                if ref["key"] not in data and not optional:
                    raise LookupError(f"couldn't find key {ref['key']} in {kind} {ns}/{ref['name']}")
                return data.get(ref["key"])
        log.warning("env %s: this valueFrom is not supported by the local runner; left unset", name)
        return None

    def _config_map(self, ns: str, name: str, optional: bool) -> dict[str, str]:
        return self._data(f"/api/v1/namespaces/{ns}/configmaps/{name}", f'configmap "{name}"', optional)

    def _secret(self, ns: str, name: str, optional: bool) -> dict[str, str]:
        raw = self._data(f"/api/v1/namespaces/{ns}/secrets/{name}", f'secret "{name}"', optional)
        return {k: base64.b64decode(v).decode("utf-8", errors="replace") for k, v in raw.items()}

    def _data(self, path: str, what: str, optional: bool) -> dict[str, str]:
        try:
            return dict(self.rest.get(path).get("data") or {})
        except ApiError as e:
            if e.status == 404 and optional:
                return {}
            if e.status == 404:
                raise LookupError(f"{what} not found") from e
            raise
