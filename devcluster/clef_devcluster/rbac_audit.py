"""RBAC rules expanded into single permissions, and compared with what an API server's audit log
says a ServiceAccount asked for (the local cluster logs the operator's: manifests/audit-policy.yaml).
Pure: no cluster needed."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .host_operator import OPERATOR_USER

# (apiGroup, resource[/subresource], verb) -- one API permission.
Permission = tuple[str, str, str]

# Rules that no request exercises: the API server's admission checks them on the operator's
# behalf.  OwnerReferencesPermissionEnforcement asks whether the creator of an object whose
# ownerReference sets blockOwnerDeletion may `update` the owner's finalizers.
ADMISSION_ONLY: frozenset[Permission] = frozenset({("clef.riotpiao.com", "clefmodels/finalizers", "update")})
# Rules used only on the operator's first start in a cluster: creating its verdict key Secret,
# which later starts (and the audited run, when an earlier one made it) only read.
FIRST_START_ONLY: frozenset[Permission] = frozenset({("", "secrets", "create")})


def rule_permissions(rules: Iterable[dict[str, Any]]) -> set[Permission]:
    """Expand RBAC rules into single permissions.  Wildcards are refused: they have no place in a
    least-privilege role, and expanding them would hide what they grant."""
    out: set[Permission] = set()
    for rule in rules:
        if rule.get("nonResourceURLs"):
            raise ValueError(f"rule {rule}: nonResourceURLs are not expected here")
        # resourceNames narrow a rule; the permission (group, resource, verb) is what is compared.
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
    admission_only: frozenset[Permission] = ADMISSION_ONLY | FIRST_START_ONLY,
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
