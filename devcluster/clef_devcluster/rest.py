"""A small JSON client for the Kubernetes API, for the harness's own processes.

The official client costs several CPU-seconds just to import (thousands of generated models),
paid by every `up` and by the runner at each start; the harness needs a handful of verbs on a
handful of resources, so it speaks HTTP itself.  Objects are plain dicts spelled as the API
spells them.  Tests use the official client.

Supports kubeconfigs with client certificates or a bearer token (what the local cluster and kind
write); exec plugins and auth providers are out of scope.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

# kind -> (API path prefix, plural, namespaced) for what the harness applies.
_RESOURCES: dict[tuple[str, str], tuple[str, bool]] = {
    ("v1", "Namespace"): ("namespaces", False),
    ("v1", "Node"): ("nodes", False),
    ("v1", "ConfigMap"): ("configmaps", True),
    ("node.k8s.io/v1", "RuntimeClass"): ("runtimeclasses", False),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): ("customresourcedefinitions", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): ("clusterrolebindings", False),
}


class ApiError(Exception):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        self.status = status
        try:
            self.message = str(json.loads(body).get("message", body))
        except ValueError:
            self.message = body
        super().__init__(f"{method} {path}: HTTP {status}: {self.message}")


def object_path(doc: Obj) -> str:
    api_version, kind = doc["apiVersion"], doc["kind"]
    try:
        plural, namespaced = _RESOURCES[(api_version, kind)]
    except KeyError:
        raise ValueError(f"the harness does not know how to apply {api_version} {kind}") from None
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    name = doc["metadata"]["name"]
    if namespaced:
        return f"{base}/namespaces/{doc['metadata'].get('namespace', 'default')}/{plural}/{name}"
    return f"{base}/{plural}/{name}"


class Rest:
    def __init__(self, kubeconfig: Path, timeout: float = 15.0) -> None:
        self.timeout = timeout
        cfg = yaml.safe_load(kubeconfig.read_text())
        ctx_name = cfg.get("current-context")
        ctx = _named(cfg.get("contexts"), ctx_name, "context")
        cluster = _named(cfg.get("clusters"), ctx["cluster"], "cluster")
        user = _named(cfg.get("users"), ctx["user"], "user")
        base = kubeconfig.resolve().parent
        url = urllib.parse.urlsplit(cluster["server"])
        if url.scheme != "https":
            raise ValueError(f"{kubeconfig}: only https servers are supported, not {cluster['server']}")
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port or 443
        self.prefix = url.path.rstrip("/")
        self.ssl = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            self.ssl.check_hostname = False
            self.ssl.verify_mode = ssl.CERT_NONE
        elif "certificate-authority-data" in cluster:
            self.ssl.load_verify_locations(
                cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
            )
        elif "certificate-authority" in cluster:
            self.ssl.load_verify_locations(cafile=str(base / cluster["certificate-authority"]))
        self.headers = {"Accept": "application/json", "User-Agent": "clef-harness"}
        if "token" in user:
            self.headers["Authorization"] = f"Bearer {user['token']}"
        cert, key = _material(user, "client-certificate", base), _material(user, "client-key", base)
        if cert and key:
            # ssl wants files; private copies live only as long as loading takes.
            with tempfile.TemporaryDirectory(prefix="clef-rest-") as d:
                paths = []
                for name, data in (("cert.pem", cert), ("key.pem", key)):
                    p = Path(d) / name
                    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                    paths.append(str(p))
                self.ssl.load_cert_chain(paths[0], paths[1])
        self._local = threading.local()

    # -- plumbing ----------------------------------------------------------------------------
    def _connect(self, timeout: float | None) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.ssl, timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        body: Obj | None = None,
        *,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        url = self.prefix + path + ("?" + urllib.parse.urlencode(query) if query else "")
        payload = json.dumps(body).encode() if body is not None else None
        headers = dict(self.headers)
        if payload is not None:
            headers["Content-Type"] = content_type
        # One kept-alive connection per thread; a dropped one is reopened once.
        for attempt in (0, 1):
            conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = self._connect(self.timeout)
            try:
                conn.request(method, url, body=payload, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except (http.client.HTTPException, ConnectionError, OSError):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
                continue
            if resp.status >= 400:
                raise ApiError(resp.status, method, path, data.decode(errors="replace"))
            return json.loads(data) if data else {}
        raise AssertionError("unreachable")

    def get(self, path: str, **query: str) -> Obj:
        return self.request("GET", path, query=query or None)

    def watch(self, path: str, **query: str) -> Iterator[Obj]:
        """Events of a watch (its own connection), until the server ends it."""
        query = {**query, "watch": "true"}
        conn = self._connect(timeout=float(query.get("timeoutSeconds", "300")) + 30)
        try:
            conn.request(
                "GET", self.prefix + path + "?" + urllib.parse.urlencode(query), headers=self.headers
            )
            resp = conn.getresponse()
            if resp.status >= 400:
                raise ApiError(resp.status, "WATCH", path, resp.read().decode(errors="replace"))
            while line := resp.readline():
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()

    # -- verbs the harness uses --------------------------------------------------------------
    def apply(self, doc: Obj, manager: str = "clef-harness") -> Obj:
        """Server-side apply of a whole object (create or update), taking over conflicts."""
        return self.request(
            "PATCH",
            object_path(doc),
            doc,
            query={"fieldManager": manager, "force": "true"},
            content_type="application/apply-patch+yaml",
        )

    def patch_status(self, path: str, status: Obj) -> Obj:
        return self.request(
            "PATCH",
            path + "/status",
            {"status": status},
            content_type="application/strategic-merge-patch+json",
        )

    def delete(self, path: str, body: Obj | None = None) -> Obj:
        return self.request("DELETE", path, body)


def _named(items: list[Obj] | None, name: str | None, what: str) -> Obj:
    for item in items or []:
        if item.get("name") == name:
            value = item.get(what)
            if isinstance(value, dict):
                return value
    raise ValueError(f"kubeconfig: no {what} named {name!r}")


def _material(user: Obj, key: str, base: Path) -> bytes | None:
    if f"{key}-data" in user:
        return base64.b64decode(user[f"{key}-data"])
    if key in user:
        return (base / user[key]).read_bytes()
    return None
