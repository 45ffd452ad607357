"""The operator's own parse of a spec refuses what the API server refuses, naming the field.

The same table runs against a real kube-apiserver in tests/cluster/test_operator_validation.py;
here it runs through `ClefModelSpec.model_validate`, which is what the operator applies to every
spec it reads.  `metadata.name` is the API server's alone (the operator never parses metadata).
"""

from __future__ import annotations

import copy
import re
from decimal import Decimal
from typing import Any

import pytest
from clef_builders import base_spec_dict
from pydantic import ValidationError
from tests.admission_cases import BAD, GOOD, Body, Mutation

from clef_operator import syntax
from clef_operator.api import ClefModelSpec

V100 = "Tesla-V100-SXM2-16GB"


def body() -> Body:
    """A valid ClefModel as the cases expect it (they mutate `spec` and `metadata`)."""
    return {
        "metadata": {"name": "valid"},
        "spec": base_spec_dict(nodeSelector={"nvidia.com/gpu.product": V100}),
    }


def wire_path(loc: tuple[Any, ...]) -> str:
    """pydantic's error location as the API server spells a field: spec.env[0].name."""
    out = "spec"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


SPEC_CASES = [c for c in BAD if not c[2].startswith("metadata.")]


def test_the_base_spec_is_valid() -> None:
    ClefModelSpec.model_validate(body()["spec"])


@pytest.mark.parametrize(("what", "mutate", "field"), SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_invalid_spec_is_refused_naming_the_field(what: str, mutate: Mutation, field: str) -> None:
    case = copy.deepcopy(body())
    mutate(case)
    with pytest.raises(ValidationError) as caught:
        ClefModelSpec.model_validate(case["spec"])
    named = [f"{wire_path(e['loc'])}: {e['msg']}" for e in caught.value.errors()]
    # A rule on an object names the member it is about without its index: spec.tolerations[].key.
    generic = re.sub(r"\[\d+\]", "[]", field)
    assert any(field in text or generic in text for text in named), f"{what}: no error names {field}: {named}"


@pytest.mark.parametrize(("what", "mutate"), GOOD, ids=[c[0] for c in GOOD])
def test_valid_spec_near_a_rule_is_accepted(what: str, mutate: Mutation) -> None:
    case = copy.deepcopy(body())
    mutate(case)
    ClefModelSpec.model_validate(case["spec"])


@pytest.mark.parametrize(
    ("text", "amount"),
    [
        ("500m", Decimal("0.5")),
        ("16Gi", Decimal(16 * 2**30)),
        ("1e3", Decimal(1000)),
        ("1E", Decimal(10**18)),
        ("1.5k", Decimal(1500)),
        (".5", Decimal("0.5")),
        ("+2", Decimal(2)),
        ("-1", Decimal(-1)),
        ("2E3", Decimal(2000)),
        # resource.ParseQuantity reads a missing number as 0 (checked against the API server in
        # tests/cluster/test_operator_validation.py).
        (".", Decimal(0)),
        ("-", Decimal(0)),
        ("Mi", Decimal(0)),
    ],
)
def test_quantities_read_as_kubernetes_reads_them(text: str, amount: Decimal) -> None:
    assert syntax.quantity(text) == amount


@pytest.mark.parametrize("text", ["", "1 Gi", "1gi", "1e", "1K", "1.2.3", "1Gii", "0x10", "1ee3", " 1"])
def test_non_quantities_are_refused(text: str) -> None:
    assert syntax.quantity(text) is None


def test_a_map_refusal_names_the_offending_key() -> None:
    case = body()["spec"] | {"nodeSelector": {"nvidia.com/gpu.product": V100, "a b": "x"}}
    with pytest.raises(ValidationError, match=re.escape('spec.nodeSelector: "a b": keys must be label keys')):
        ClefModelSpec.model_validate(case)
