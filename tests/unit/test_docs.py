"""docs/api.md describes every field, condition and reason the operator has."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from clef_operator import api
from clef_operator.conditions import CONDITION_TYPES, Reason, Why

API_MD = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def wire_fields(model: type[api.ApiModel]) -> set[str]:
    out = set()
    for name, f in model.model_fields.items():
        out.add(f.alias or name)
        for a in (f.annotation, *typing.get_args(f.annotation)):
            for b in (a, *typing.get_args(a)):
                if isinstance(b, type) and issubclass(b, api.ApiModel):
                    out |= wire_fields(b)
    return out


def test_every_field_is_documented():
    text = API_MD.read_text()
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    spans = [span for line in prose.splitlines() for span in re.findall(r"`([^`]+)`", line)]
    # A field is named whole: `spec.x.field`, `field[]`, `{field, other}`; a hyphenated or slashed
    # word (an annotation's `…/verified-generation`) and Kubernetes' own `metadata.*` name none.
    words = {
        w for span in spans if not span.startswith("metadata.") for w in re.split(r"[^A-Za-z0-9/…-]+", span)
    }
    missing = sorted((wire_fields(api.ClefModelSpec) | wire_fields(api.ClefModelStatus)) - words)
    assert not missing, f"docs/api.md lacks {missing}"


def test_every_condition_and_reason_is_documented():
    text = API_MD.read_text()
    reasons = {v for k, v in vars(Reason).items() if k.isupper()} | {
        v for k, v in vars(Why).items() if k.isupper()
    }
    missing = sorted(r for r in reasons | set(CONDITION_TYPES) if f"`{r}`" not in text)
    assert not missing, f"docs/api.md lacks {missing}"
