"""Pod-template drift: how a serving Deployment's pod template, as the API server holds it,
differs from what clef rendered for it.

    template_drift(rendered, observed) -> ["spec.containers[0].image", ...]

clef owns the pod templates of its Deployments: a verdict speaks for the pod clef rendered, so
anything else there (`kubectl set image`, an added init container, hostNetwork) is drift, which
the planner reverts.  The rule: every field clef renders must be present and equal in the
observed template (lists: same length, element by element), and the observed template carries no
field clef does not render, except those the API server fills in with defaults (`DEFAULTED`).
The cluster tier guards that list: every Deployment clef renders, read back from a real API
server, has no drift (tests/cluster/test_integrity_children.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

# Paths (list indices as "*") of fields the API server defaults in a pod template when clef does
# not render them.  A defaulted value is not compared: a default is what an absent field means.
DEFAULTED: frozenset[str] = frozenset(
    {
        "metadata.creationTimestamp",
        # `kubectl rollout restart` stamps this: it restarts pods, it does not change them.
        "metadata.annotations.kubectl.kubernetes.io/restartedAt",
        "spec.dnsPolicy",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.securityContext",
        "spec.terminationGracePeriodSeconds",
        "spec.containers.*.terminationMessagePath",
        "spec.containers.*.terminationMessagePolicy",
        "spec.containers.*.imagePullPolicy",
        "spec.containers.*.resources",
        "spec.containers.*.ports.*.protocol",
        *(
            f"spec.containers.*.{probe}.{field}"
            for probe in ("startupProbe", "readinessProbe", "livenessProbe")
            for field in ("timeoutSeconds", "successThreshold", "periodSeconds", "failureThreshold")
        ),
        *(
            f"spec.containers.*.{probe}.httpGet.scheme"
            for probe in ("startupProbe", "readinessProbe", "livenessProbe")
        ),
        "spec.volumes.*.hostPath.type",
        "spec.volumes.*.persistentVolumeClaim.readOnly",
    }
)

# Resource quantities are compared by value: the API server writes them in canonical form
# ("0.5" reads back as "500m").
_QUANTITY_PARENTS = ("resources.limits", "resources.requests")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1)}
_DECIMAL |= {"k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12")}
_DECIMAL |= {"P": Decimal("1e15"), "E": Decimal("1e18")}


def quantity(text: object) -> Decimal | None:
    """The value of a Kubernetes quantity ("500m", "8Gi", "1e3"); None if it is not one."""
    s = str(text).strip()
    for suffix, factor in _BINARY.items():
        if s.endswith(suffix):
            return _number(s[: -len(suffix)], Decimal(factor))
    for suffix in ("n", "u", "m", "k", "M", "G", "T", "P", "E"):
        if s.endswith(suffix):
            return _number(s[: -len(suffix)], _DECIMAL[suffix])
    return _number(s, Decimal(1))


def _number(text: str, factor: Decimal) -> Decimal | None:
    try:
        return Decimal(text) * factor
    except InvalidOperation:
        return None


def _pattern(path: list[str]) -> str:
    return ".".join("*" if p.startswith("[") else p for p in path)


def _show(path: list[str]) -> str:
    out = ""
    for p in path:
        out += p if p.startswith("[") else (f".{p}" if out else p)
    return out


def _equal_scalars(path: list[str], rendered: object, observed: object) -> bool:
    if rendered == observed:
        return True
    if any(_pattern(path[:-1]).endswith(parent) for parent in _QUANTITY_PARENTS):
        a, b = quantity(rendered), quantity(observed)
        return a is not None and a == b
    return False


def _walk(path: list[str], rendered: Any, observed: Any, out: list[str]) -> None:
    # `dict`, not `Mapping`: wire dicts, and no ABC check (cache._meta says why).
    if isinstance(rendered, dict) and isinstance(observed, dict):
        for key, value in rendered.items():
            if key not in observed:
                # The API server omits empty lists and maps: `env: []` reads back as no env.
                if value not in ([], {}):
                    out.append(_show([*path, key]))
            else:
                _walk([*path, key], value, observed[key], out)
        for key in observed.keys() - rendered.keys():
            if _pattern([*path, key]) in DEFAULTED:
                continue
            if isinstance(observed[key], dict):
                # A map clef does not render: only what is in it, defaults aside, is drift.
                _walk([*path, key], {}, observed[key], out)
            else:
                out.append(_show([*path, key]))
    elif isinstance(rendered, list) and isinstance(observed, list):
        if len(rendered) != len(observed):
            out.append(_show(path))
            return
        for i, (r, o) in enumerate(zip(rendered, observed, strict=True)):
            _walk([*path, f"[{i}]"], r, o, out)
    elif not _equal_scalars(path, rendered, observed):
        out.append(_show(path))


def as_dict(m: Mapping[str, Any]) -> dict[str, Any]:
    return m if isinstance(m, dict) else dict(m.items())


def template_drift(rendered: Mapping[str, Any], observed: Mapping[str, Any]) -> list[str]:
    """The paths where the observed pod template differs from the rendered one (empty: none).
    Both are wire dicts (camelCase keys, as the API server serves them)."""
    out: list[str] = []
    # The walk compares dicts; a packed template (`observed.Packed`) is decoded once, here.
    _walk([], as_dict(rendered), as_dict(observed), out)
    return sorted(out)
