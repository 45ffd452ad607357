"""What the shipping layer's tests and `make demo` share: rendering the kustomize trees with the
pinned kubectl, a kubeconfig that authenticates as a ServiceAccount, the comparison of an
API server audit log with RBAC rules, and starting `clef-operator` on this host (the operator
tests use that too).

Nothing here needs a running cluster except `service_account_kubeconfig`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from .harness.config import REPO_ROOT, default_binaries

KUSTOMIZE_DIR = REPO_ROOT / "kustomize"
BASE = KUSTOMIZE_DIR / "base"
HOMELAB = KUSTOMIZE_DIR / "overlays" / "homelab"
DEMO = KUSTOMIZE_DIR / "overlays" / "demo"

OPERATOR_NAMESPACE = "clef-system"
OPERATOR_SA = "clef-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SA}"

# (apiGroup, resource[/subresource], verb) -- one API permission.
Permission = tuple[str, str, str]

# Rules that no request exercises: the API server's admission checks them on the operator's
# behalf.  OwnerReferencesPermissionEnforcement asks whether the creator of an object whose
# ownerReference sets blockOwnerDeletion may `update` the owner's finalizers.
ADMISSION_ONLY: frozenset[Permission] = frozenset({("clef.riotpiao.com", "clefmodels/finalizers", "update")})


def spawn_operator(args: Sequence[str], kubeconfig: Path, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """`clef-operator ARGS` from this checkout, talking to the API server of `kubeconfig`, its
    output appended to `log`, in a process group of its own (so a stop ends its children too)."""
    return subprocess.Popen(
        [sys.executable, "-m", "clef_operator.cli", *args],
        cwd=REPO_ROOT,
        env={**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


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


def rule_permissions(rules: Iterable[dict[str, Any]]) -> set[Permission]:
    """Expand RBAC rules into single permissions.  Wildcards are refused: they have no place in a
    least-privilege role, and expanding them would hide what they grant."""
    out: set[Permission] = set()
    for rule in rules:
        if rule.get("nonResourceURLs") or rule.get("resourceNames"):
            raise ValueError(f"rule {rule}: nonResourceURLs/resourceNames are not expected here")
        for field in ("apiGroups", "resources", "verbs"):
            if "*" in rule.get(field, []):
                raise ValueError(f"rule {rule}: wildcard in {field}")
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return out


def granted_to(objects: list[dict[str, Any]], namespace: str, name: str) -> set[Permission]:
    """Every permission the rendered ClusterRoles/Roles give ServiceAccount namespace/name through
    the rendered bindings (where they apply is not distinguished: RBAC in both variants is the
    same rules, bound cluster-wide or per namespace)."""
    roles = {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
        for o in objects
        if o["kind"] in ("ClusterRole", "Role")
    }
    out: set[Permission] = set()
    for b in objects:
        if b["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(
            s.get("kind") == "ServiceAccount" and s.get("name") == name and s.get("namespace") == namespace
            for s in b.get("subjects") or []
        ):
            continue
        ref = b["roleRef"]
        role_ns = "" if ref["kind"] == "ClusterRole" else b["metadata"].get("namespace", "")
        role = roles.get((ref["kind"], role_ns, ref["name"]))
        if role is None:
            raise LookupError(
                f"{b['kind']} {b['metadata']['name']} refers to missing {ref['kind']} {ref['name']}"
            )
        out |= rule_permissions(role.get("rules") or [])
    return out


@dataclass(frozen=True)
class AuditedRequest:
    permission: Permission
    allowed: bool
    code: int
    uri: str


def audited_requests(lines: Iterable[str], user: str = OPERATOR_USER) -> Iterator[AuditedRequest]:
    """Resource requests by `user` from an audit log in JSON lines (one event per line).  Discovery
    and other non-resource requests carry no objectRef and are skipped: every user may make them."""
    seen: set[str] = set()
    for line in lines:
        line = line.strip()
        if not line:
            continue
        event = json.loads(line)
        # A watch logs ResponseStarted when it begins and ResponseComplete only when it ends, which
        # a stopped operator's watches never do; other requests log ResponseComplete alone.
        if event.get("user", {}).get("username") != user or event.get("stage") not in (
            "ResponseStarted",
            "ResponseComplete",
        ):
            continue
        if event.get("auditID") in seen:
            continue
        seen.add(event.get("auditID", ""))
        ref = event.get("objectRef")
        if not ref or not ref.get("resource"):
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        decision = (event.get("annotations") or {}).get("authorization.k8s.io/decision", "")
        code = int((event.get("responseStatus") or {}).get("code") or 0)
        yield AuditedRequest(
            permission=(ref.get("apiGroup", ""), resource, event["verb"]),
            allowed=decision == "allow",
            code=code,
            uri=event.get("requestURI", ""),
        )


@dataclass(frozen=True)
class RbacComparison:
    used: set[Permission]
    denied: list[AuditedRequest]
    unused: set[Permission]
    ungranted: set[Permission]

    @property
    def exact(self) -> bool:
        return not self.denied and not self.unused and not self.ungranted

    def explain(self) -> str:
        lines = []
        for r in self.denied[:10]:
            lines.append(
                f"denied (missing rule): {r.permission[2]} {r.permission[1]}.{r.permission[0] or 'core'} ({r.uri})"
            )
        for p in sorted(self.unused):
            lines.append(
                f"granted but never used (remove the rule, or exercise it): {p[2]} {p[1]}.{p[0] or 'core'}"
            )
        for p in sorted(self.ungranted):
            lines.append(f"used without a rule: {p[2]} {p[1]}.{p[0] or 'core'}")
        return "\n".join(lines) or "RBAC matches the requests exactly"


def compare_rbac(
    granted: set[Permission],
    requests: Iterable[AuditedRequest],
    admission_only: frozenset[Permission] = ADMISSION_ONLY,
) -> RbacComparison:
    reqs = list(requests)
    used = {r.permission for r in reqs if r.allowed}
    denied = [r for r in reqs if not r.allowed]
    return RbacComparison(
        used=used,
        denied=denied,
        unused=granted - used - admission_only,
        ungranted=used - granted,
    )


def service_account_kubeconfig(
    admin_kubeconfig: Path, namespace: str, name: str, out: Path, seconds: int = 86400
) -> Path:
    """A kubeconfig that authenticates as ServiceAccount namespace/name with a token from the
    TokenRequest API, for the same server and CA as `admin_kubeconfig`: how to run the operator on
    a host with exactly the rights its in-cluster pod would have."""
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(admin_kubeconfig))
    try:
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds)
        )
        response: Any = client.CoreV1Api(api).create_namespaced_service_account_token(
            name, namespace, request
        )
    finally:
        api.close()
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    user = f"{namespace}-{name}"
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": user, "user": {"token": response.status.token}}],
        "contexts": [{"name": user, "context": {"cluster": cluster["name"], "user": user}}],
        "current-context": user,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.touch(mode=0o600)
    out.write_text(yaml.safe_dump(kubeconfig))
    return out
