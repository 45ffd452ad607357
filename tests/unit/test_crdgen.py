"""The checked-in CRD is generated from the models, and is a structural schema."""

from __future__ import annotations

import typing
from typing import Any

import yaml

from clef_operator import api, crdgen
from clef_operator.checks import Check


def walk(node: Any, path: str = ""):
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{path}[{i}]")


def schema() -> dict[str, Any]:
    return crdgen.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_checked_in_crd_is_not_stale():
    assert crdgen.CRD_PATH.read_text() == crdgen.render_crd_yaml(), (
        "crds/clefmodel.yaml is stale: run `make crd`"
    )


def test_check_mode_reports_a_stale_file(tmp_path, capsys):
    stale = tmp_path / "clefmodel.yaml"
    stale.write_text("# edited by hand\n")
    assert crdgen.main(["--check", str(stale)]) == 1
    assert "make crd" in capsys.readouterr().err
    assert crdgen.main([str(stale)]) == 0
    assert crdgen.main(["--check", str(stale)]) == 0


def test_schema_is_structural():
    for path, node in walk(schema()):
        for banned in ("$ref", "anyOf", "allOf", "oneOf", "const", "title", "$defs"):
            assert banned not in node or path.endswith("properties"), f"{banned} at {path}"
        if "properties" in node and not path.endswith("properties"):
            assert node.get("type") == "object", f"object without type at {path}"
        assert node.get("additionalProperties") is not False, f"additionalProperties: false at {path}"


def test_every_string_and_list_is_bounded():
    for path, node in walk(schema()["properties"]["spec"]):
        if path.endswith("properties") or not isinstance(node.get("type"), str):
            continue
        if node["type"] == "string" and "enum" not in node:
            assert "maxLength" in node, f"unbounded string at {path}"
        if node["type"] == "array":
            assert "maxItems" in node, f"unbounded list at {path}"
        if node["type"] == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, f"unbounded map at {path}"


def test_every_rule_message_names_its_field():
    rules = [r for _, node in walk(schema()) for r in node.get("x-kubernetes-validations", [])]
    assert len(rules) >= 25
    for rule in rules:
        text = rule.get("message") or rule.get("messageExpression", "")
        assert text.lstrip("'").startswith(("spec.", "metadata.")), f"message does not name a field: {rule}"


def test_every_status_field_the_operator_writes_is_declared():
    declared = set(schema()["properties"]["status"]["properties"])
    written = {f.alias or name for name, f in api.ClefModelStatus.model_fields.items()}
    assert written == declared
    record = schema()["properties"]["status"]["properties"]["verifications"]["items"]["properties"]
    assert {f.alias or n for n, f in api.VerificationRecord.model_fields.items()} == set(record)


def test_status_subresource_printer_columns_and_names():
    crd = yaml.safe_load(crdgen.CRD_PATH.read_text())
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"].upper() for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["READY", "VERIFIED", "ACTIVE", "CANDIDATE", "AGE"]
    assert crd["spec"]["names"]["shortNames"] == ["clef"]
    assert crd["spec"]["scope"] == "Namespaced"


def test_defaults_match_the_models():
    spec = schema()["properties"]["spec"]["properties"]
    assert spec["runtimeClassName"]["default"] == "nvidia"
    assert spec["verification"]["default"] == {}
    assert spec["verification"]["properties"]["required"]["default"] is True
    assert spec["rollout"]["properties"]["strategy"]["default"] == "BlueGreen"
    assert spec["model"]["properties"]["architecture"]["properties"]["numLayers"]["default"] == 32


def checks_of(model: type[api.ApiModel]) -> set[str]:
    """The CEL rules of every `checks.Check` a model (and the models inside it) carries."""
    found = {c.rule for c in model.checks}

    def visit(annotation: Any) -> None:
        if isinstance(annotation, Check):
            found.add(annotation.rule)
        elif isinstance(annotation, type) and issubclass(annotation, api.ApiModel):
            found.update(checks_of(annotation))
        for inner in typing.get_args(annotation):
            visit(inner)

    for f in model.model_fields.values():
        for annotation in (f.annotation, *f.metadata):
            visit(annotation)
    return found


def test_every_spec_rule_is_also_enforced_by_the_operator():
    """A CEL rule without its Python twin would let the operator's parse accept what admission refuses."""
    crd_rules = {
        r["rule"]
        for _, node in walk(schema()["properties"]["spec"])
        for r in node.get("x-kubernetes-validations", [])
    }
    assert crd_rules == checks_of(api.ClefModelSpec)
