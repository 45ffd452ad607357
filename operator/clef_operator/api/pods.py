"""What the spec hands to every pod besides the model: `spec.tolerations`, `spec.resources` and
`spec.env`, refused where Kubernetes would refuse them in a child."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from clef_operator import syntax
from clef_operator.api.base import ApiModel, label_key_rule, no_nul
from clef_operator.checks import Check, for_each_entry, matching


class Toleration(ApiModel):
    checks = (
        Check(
            "self.operator == 'Exists' || (has(self.key) && self.key != '')",
            "spec.tolerations[].key: required unless operator is Exists",
            lambda t: t["operator"] == "Exists" or bool(t.get("key")),
            field_path=".key",
        ),
        Check(
            "self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "spec.tolerations[].value: must be empty when operator is Exists",
            lambda t: t["operator"] != "Exists" or not t.get("value"),
            field_path=".value",
        ),
        Check(
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "spec.tolerations[].tolerationSeconds: only with effect NoExecute",
            lambda t: "tolerationSeconds" not in t or t.get("effect") == "NoExecute",
            field_path=".tolerationSeconds",
        ),
    )

    key: (
        Annotated[
            str,
            Check(
                f"self == '' || ({label_key_rule('self')})",
                "spec.tolerations[].key: must be a label key ([prefix/]name, e.g. nvidia.com/gpu)",
                lambda v: v == "" or syntax.is_qualified_name(v),
            ),
        ]
        | None
    ) = Field(default=None, max_length=317)
    operator: Literal["Exists", "Equal"] = "Equal"
    value: (
        Annotated[
            str,
            matching(
                syntax.LABEL_VALUE,
                "spec.tolerations[].value: must be a label value (at most 63 letters, digits, '-', '_' or '.',"
                " starting and ending with a letter or digit)",
            ),
        ]
        | None
    ) = Field(default=None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


def _quantities(path: str) -> tuple[Check, ...]:
    """The rules on one map of `spec.resources` (requests or limits), whose name is `path`."""
    return (
        for_each_entry(
            f"k.matches(r'{syntax.STANDARD_RESOURCE}') || (k.matches(r'{syntax.EXTENDED_RESOURCE}')"
            f" && !k.matches(r'{syntax.LONG_PREFIX}') && !k.matches(r'{syntax.NATIVE_PREFIX}'))",
            f"{path}: keys must be cpu, memory, ephemeral-storage or an extended resource <domain>/<name>"
            " (e.g. example.com/fpga) outside kubernetes.io",
            lambda k, _: syntax.is_resource_name(k),
        ),
        for_each_entry(
            "isQuantity(self[k]) && !quantity(self[k]).isLessThan(quantity('0'))",
            f"{path}: values must be non-negative quantities such as 500m, 16Gi or 1e3",
            lambda _, v: (q := syntax.quantity(v)) is not None and q >= 0,
        ),
        for_each_entry(
            "!k.contains('/') || !isQuantity(self[k]) || quantity(self[k]).isInteger()",
            f"{path}: an extended resource (<domain>/<name>) takes a whole number",
            lambda k, v: "/" not in k or (q := syntax.quantity(v)) is None or q == q.to_integral_value(),
        ),
        Check(
            "!('nvidia.com/gpu' in self)",
            "spec.resources: do not set nvidia.com/gpu here; set spec.gpus (GPUs per replica) instead",
            lambda m: "nvidia.com/gpu" not in m,
        ),
    )


def _request_fits(resources: dict[str, dict[str, str]], name: str) -> bool:
    request = syntax.quantity(resources["requests"][name])
    limit = syntax.quantity(resources.get("limits", {}).get(name, ""))
    if syntax.is_extended_resource(name):
        return request is None or (limit is not None and request == limit)
    return request is None or limit is None or request <= limit


_REQUEST = "isQuantity(self.requests[k]) && isQuantity(self.limits[k])"


class Resources(ApiModel):
    """CPU, memory and other non-GPU resources of the engine and verification containers."""

    checks = (
        Check(
            f"!has(self.requests) || !has(self.limits) || self.requests.all(k, k.contains('/') || !(k in self.limits)"
            f" || !({_REQUEST}) || quantity(self.requests[k]).compareTo(quantity(self.limits[k])) <= 0)",
            "spec.resources.requests: a request must not exceed the limit of the same resource",
            lambda r: all(_request_fits(r, k) for k in r.get("requests", {}) if "/" not in k),
            field_path=".requests",
        ),
        Check(
            "!has(self.requests) || self.requests.all(k, !k.contains('/') || (has(self.limits) && k in self.limits"
            f" && ({_REQUEST}) && quantity(self.requests[k]).compareTo(quantity(self.limits[k])) == 0))",
            "spec.resources.requests: an extended resource (<domain>/<name>) cannot be overcommitted: give it a"
            " limit equal to the request",
            lambda r: all(_request_fits(r, k) for k in r.get("requests", {}) if "/" in k),
            field_path=".requests",
        ),
    )

    requests: Annotated[
        dict[str, Annotated[str, Field(max_length=64)]], *_quantities("spec.resources.requests")
    ] = Field(default_factory=dict, max_length=16)
    limits: Annotated[
        dict[str, Annotated[str, Field(max_length=64)]], *_quantities("spec.resources.limits")
    ] = Field(default_factory=dict, max_length=16)


class EnvVar(ApiModel):
    name: Annotated[
        str,
        matching(syntax.ENV_NAME, "spec.env[].name: must be a C identifier such as RUST_LOG"),
        Check(
            f"!self.matches(r'{syntax.RESERVED_ENV}')",
            "spec.env[].name: CLEF_* and TRITON_INTERPRET* are reserved: they steer the verification run (its"
            " shapes, device, fault injection and report), which must check what serving runs",
            lambda v: not syntax.matches(syntax.RESERVED_ENV, v),
        ),
        Check(
            f"!self.matches(r'{syntax.CODE_STEERING_ENV}')",
            "spec.env[].name: names that choose the code a process loads are refused ("
            + ", ".join(syntax.CODE_STEERING_ENV_NAMES)
            + "): the verification pod gets spec.env, and its verifier must run only its own code",
            lambda v: not syntax.matches(syntax.CODE_STEERING_ENV, v),
        ),
    ] = Field(max_length=256)
    value: Annotated[str, no_nul("spec.env[].value")] = Field(default="", max_length=8192)
