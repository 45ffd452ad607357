"""An admission rule written once and enforced twice: as CEL by the API server (in the CRD that
`crdgen` generates) and in Python by the operator's parse of every spec it reads.

The operator has to refuse what the API server refuses: a spec stored under an older CRD, or one
the operator builds itself, must not reach a child object that Kubernetes rejects.  `holds`
mirrors `rule` over the wire form (camelCase dicts, absent fields absent, as CEL's `has` sees them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from clef_operator import syntax


def cel(rule: str, message: str, *, field_path: str = "", message_expression: str = "") -> dict[str, str]:
    """One `x-kubernetes-validations` entry.  Messages name the field and say how to fix it."""
    # Mostly static messages: messageExpression with string() of a number is costed as unbounded by
    # the API server's CEL estimator and would make the whole CRD exceed its budget.  `message`
    # stays as the fallback when a messageExpression fails.
    entry = {"rule": rule, "message": message}
    if message_expression:
        entry["messageExpression"] = message_expression
    if field_path:
        entry["fieldPath"] = field_path
    return entry


@dataclass(frozen=True)
class Check:
    """One admission rule, enforced twice: as CEL by the API server, in Python by the operator.

    Put a Check in a field's `Annotated[...]` (it sees the field's value) or in a model's `checks`
    (it sees the model's wire dict; `api.ApiModel` runs them after the fields have parsed).
    """

    rule: str
    message: str
    holds: Callable[[Any], bool]
    field_path: str = ""
    # A CEL messageExpression and its Python twin: the message naming the offending part.
    message_expression: str = ""
    explain: Callable[[Any], str] | None = None

    def entry(self) -> dict[str, str]:
        return cel(
            self.rule, self.message, field_path=self.field_path, message_expression=self.message_expression
        )

    def enforce(self, value: Any) -> Any:
        if not self.holds(value):
            raise ValueError(self.explain(value) if self.explain else self.message)
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self.enforce, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        out.setdefault("x-kubernetes-validations", []).append(self.entry())
        return out


def in_range(path: str, low: float, high: float) -> Check:
    return Check(
        f"self >= {low} && self <= {high}",
        f"{path}: must be between {low} and {high}",
        lambda v: low <= v <= high,
    )


def matching(pattern: str, message: str) -> Check:
    """The string matches `pattern` (a regex both RE2 and Python read alike)."""
    return Check(f"self.matches(r'{pattern}')", message, lambda v: syntax.matches(pattern, v))


def for_each_entry(rule: str, message: str, holds: Callable[[str, str], bool]) -> Check:
    """`rule` (CEL over a key `k` and its value `self[k]`) holds for every entry of a map.

    `message` is `<field>: <what to do>`; the refusal names the first offending key after the field:
    `spec.nodeSelector: "a b": keys must be label keys ...`.
    """
    path, _, advice = message.partition(": ")

    def explain(entries: dict[str, str]) -> str:
        bad = next(k for k, v in entries.items() if not holds(k, v))
        return f'{path}: "{bad}": {advice}'

    return Check(
        f"self.all(k, {rule})",
        message,
        lambda m: all(holds(k, v) for k, v in m.items()),
        message_expression=f"""'''{path}: "''' + self.filter(k, !({rule}))[0] + '''": {advice}'''""",
        explain=explain,
    )


def add_checks(schema: dict[str, Any], cls: type) -> None:
    """pydantic's json_schema_extra hook: a model's `checks` become CEL rules on its object."""
    checks = getattr(cls, "checks", ())
    if checks:
        schema.setdefault("x-kubernetes-validations", []).extend(c.entry() for c in checks)
