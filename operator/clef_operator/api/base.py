"""What every part of the ClefModel API shares: its names (group, version, kind), the wire form
of its models (`ApiModel`: camelCase, unknown fields refused, object-level rules enforced), and
the field rules that more than one part applies (`no_nul`, `image_reference`, label keys, names
unique in a list)."""

from __future__ import annotations

from typing import Any, ClassVar, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel

from clef_operator import syntax
from clef_operator.checks import Check, add_checks, matching

GROUP = "clef.riotpiao.com"
VERSION = "v1alpha1"
KIND = "ClefModel"
PLURAL = "clefmodels"
SINGULAR = "clefmodel"
# `cm` belongs to ConfigMaps.
SHORT_NAMES = ["clef"]
API_VERSION = f"{GROUP}/{VERSION}"

# Longest ClefModel name: the Job `<name>-verify-<key10>-<r6>` carries its name in the
# `job-name` label, whose value is at most 63 characters.
MAX_MODEL_NAME = 38


def wire_name(field: str) -> str:
    """snake_case -> camelCase, keeping the unit MiB spelt as Kubernetes spells it."""
    return to_camel(field).replace("Mib", "MiB")


class ApiModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are an error, not ignored.

    `checks` are the object-level rules (those that relate fields); each is a CEL rule on the
    object in the CRD and runs on the wire form after the fields have parsed.
    """

    model_config = ConfigDict(
        alias_generator=wire_name, populate_by_name=True, extra="forbid", json_schema_extra=add_checks
    )
    checks: ClassVar[tuple[Check, ...]] = ()

    @model_validator(mode="after")
    def _enforce_checks(self) -> Self:
        if self.checks:
            wire = self.to_wire()
            for check in self.checks:
                check.enforce(wire)
        return self

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def no_nul(path: str) -> Check:
    """A NUL byte is valid JSON and stored as is, but no container can be started with it (argv,
    environment and mount paths are C strings): the pod would fail at every start."""
    return Check(
        f"!self.contains('{syntax.NUL_ESCAPE}')",
        f"{path}: must not contain a NUL character",
        lambda v: "\0" not in v,
    )


def image_reference(path: str, example: str) -> tuple[Check, Check]:
    return (
        matching(
            syntax.IMAGE_REFERENCE,
            f"{path}: must be an image reference [host[:port]/]path[:tag][@sha256:<digest>] such as {example}"
            " (no scheme, no spaces, lower-case path)",
        ),
        Check(
            syntax.IMAGE_NAME_LENGTH_RULE,
            f"{path}: the name before the tag or digest is at most {syntax.MAX_IMAGE_NAME} characters",
            syntax.image_name_fits,
        ),
    )


def label_key_rule(name: str) -> str:
    """CEL: the string `name` is a label key (what `syntax.is_qualified_name` says)."""
    return f"{name}.matches(r'{syntax.QUALIFIED_NAME}') && !{name}.matches(r'{syntax.LONG_PREFIX}')"


def unique_names(path: str) -> AfterValidator:
    """What the API server's list-map keyed by name enforces for the list at `path`."""

    def check(items: list[Any]) -> list[Any]:
        seen: set[str] = set()
        for i, item in enumerate(items):
            if item.name in seen:
                raise ValueError(f"{path}[{i}]: Duplicate value: name {item.name!r}")
            seen.add(item.name)
        return items

    return AfterValidator(check)
