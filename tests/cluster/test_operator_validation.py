"""Bad ClefModels are refused by the API server itself, each with a message naming the field
(issue 6, test 8; issue 13: everything Kubernetes would refuse in a child object is refused here,
before a model can get stuck).  Created with dryRun, so nothing is stored."""

from __future__ import annotations

import copy
import json
import subprocess

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_operator import syntax
from clef_operator.api import GROUP, PLURAL, VERSION

from ..admission_cases import BAD, GOOD, Body, Mutation
from .conftest import Cluster
from .operator_support import clefmodel

pytestmark = pytest.mark.cluster

# The table lives next to the unit tier's copy of this test (tests/unit/test_api_admission.py):
# the operator's own parse must refuse exactly what the API server refuses.
CASES = BAD


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 90
    assert len(GOOD) >= 15


def test_the_base_model_is_valid(cluster: Cluster, namespace: str) -> None:
    api = client.CustomObjectsApi(cluster.api)
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, clefmodel("valid"), dry_run="All")


@pytest.mark.parametrize(("what", "mutate", "field"), CASES, ids=[c[0] for c in CASES])
def test_invalid_model_is_rejected_naming_the_field(
    cluster: Cluster, namespace: str, what: str, mutate: Mutation, field: str
) -> None:
    body = copy.deepcopy(clefmodel("invalid"))
    mutate(body)
    api = client.CustomObjectsApi(cluster.api)
    with pytest.raises(ApiException) as caught:
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body, dry_run="All")
    assert caught.value.status == 422, caught.value.body
    message = json.loads(caught.value.body)["message"]
    assert field in message, f"{what}: the message does not name {field}: {message}"


@pytest.mark.parametrize(("what", "mutate"), GOOD, ids=[c[0] for c in GOOD])
def test_valid_model_near_a_rule_is_accepted(
    cluster: Cluster, namespace: str, what: str, mutate: Mutation
) -> None:
    body: Body = copy.deepcopy(clefmodel("valid"))
    mutate(body)
    api = client.CustomObjectsApi(cluster.api)
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body, dry_run="All")


def unknown_field() -> Body:
    body: Body = copy.deepcopy(clefmodel("unknown-field"))
    body["spec"]["gpuCount"] = 2
    body["spec"]["service"]["nodePort"] = 30000
    return body


def test_unknown_fields_are_refused_with_strict_field_validation(cluster: Cluster, namespace: str) -> None:
    api = client.CustomObjectsApi(cluster.api)
    with pytest.raises(ApiException) as caught:
        api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, unknown_field(), dry_run="All", field_validation="Strict"
        )
    assert caught.value.status == 400, caught.value.body
    message = json.loads(caught.value.body)["message"]
    assert "strict decoding error" in message, message
    assert 'unknown field "spec.gpuCount"' in message, message
    assert 'unknown field "spec.service.nodePort"' in message, message


@pytest.mark.parametrize("mode", ["Ignore", "Warn", None], ids=["Ignore", "Warn", "server default"])
def test_unknown_fields_are_dropped_unless_validation_is_strict(
    cluster: Cluster, namespace: str, mode: str | None
) -> None:
    """`kubectl apply --validate=false` sends Ignore, a client that says nothing gets Warn: the
    object is stored without the unknown fields (the schema is structural, so they are pruned)."""
    api = client.CustomObjectsApi(cluster.api)
    options = {"field_validation": mode} if mode else {}
    stored, status, headers = api.create_namespaced_custom_object_with_http_info(
        GROUP, VERSION, namespace, PLURAL, unknown_field(), dry_run="All", **options
    )
    assert status == 201
    warning = headers.get("Warning", "")
    if mode == "Ignore":
        assert "unknown field" not in warning, warning
    else:
        # A Warning header: 299 - "unknown field \"spec.gpuCount\"", ...
        assert "unknown field" in warning and "spec.gpuCount" in warning, warning
    assert "gpuCount" not in stored["spec"]
    assert "nodePort" not in stored["spec"]["service"]
    assert stored["spec"]["gpus"] == 1


def test_a_map_refusal_names_the_offending_key(cluster: Cluster, namespace: str) -> None:
    body = copy.deepcopy(clefmodel("invalid"))
    body["spec"]["nodeSelector"]["a b"] = "x"
    api = client.CustomObjectsApi(cluster.api)
    with pytest.raises(ApiException) as caught:
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body, dry_run="All")
    message = json.loads(caught.value.body)["message"]
    assert 'spec.nodeSelector: "a b": keys must be label keys' in message, message


# Strings at the edges of Kubernetes' quantity syntax (resource.ParseQuantity).
QUANTITY_EDGES = [
    "1",
    "1.",
    ".5",
    ".",
    "+",
    "-",
    "+1",
    "0",
    "00",
    "1e3",
    "1E3",
    "1e+3",
    "1e-3",
    "1E",
    "1Ei",
    "1Ki",
    "1K",
    "1k",
    "1m",
    "1mi",
    "1e",
    "Mi",
    "m",
    "1 ",
    " 1",
    "1,5",
    "0x10",
    "1.5.5",
    "1ee3",
    "1n",
    "1u",
    "1.5Gi",
    "1e3Gi",
]


@pytest.mark.parametrize("text", QUANTITY_EDGES)
def test_the_operator_reads_a_quantity_as_the_api_server_does(
    cluster: Cluster, namespace: str, text: str
) -> None:
    """The unit tier trusts `syntax.quantity`; here the API server's own parser is the judge."""
    body = copy.deepcopy(clefmodel("quantity"))
    body["spec"]["resources"] = {"requests": {"memory": text}}
    api = client.CustomObjectsApi(cluster.api)
    try:
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body, dry_run="All")
        accepted = True
    except ApiException as refused:
        assert refused.status == 422, refused.body
        accepted = False
    amount = syntax.quantity(text)
    assert accepted == (amount is not None and amount >= 0), (
        f"{text!r}: API server {accepted}, operator {amount}"
    )


@pytest.mark.parametrize(
    ("flags", "refused"),
    [([], True), (["--validate=strict"], True), (["--validate=warn"], False), (["--validate=false"], False)],
    ids=["default", "strict", "warn", "false"],
)
def test_what_kubectl_apply_does_with_an_unknown_field(
    cluster: Cluster, namespace: str, flags: list[str], refused: bool
) -> None:
    """docs/api.md's table of fieldValidation modes, as kubectl users meet them."""
    assert cluster.kubectl, "kubectl is needed to show what kubectl apply does"
    proc = subprocess.run(
        [
            cluster.kubectl,
            "--kubeconfig",
            str(cluster.kubeconfig),
            "-n",
            namespace,
            "apply",
            "--dry-run=server",
            *flags,
            "-f",
            "-",
        ],
        input=json.dumps(unknown_field()),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (proc.returncode != 0) == refused, proc.stderr
    if refused:
        assert 'strict decoding error: unknown field "spec.gpuCount"' in proc.stderr, proc.stderr
    elif "warn" in flags[0]:
        assert 'unknown field "spec.gpuCount"' in proc.stderr, proc.stderr
    else:
        assert "unknown field" not in proc.stderr, proc.stderr
