"""The admission load test's pure parts (`clef_devcluster.load.admission`): the Job it sends is the
operator's own rendering, and the table says which binding each number is for.  The run itself is
`python -m clef_devcluster.load --admission N`, on a control plane of its own."""

from __future__ import annotations

from clef_devcluster.load import admission
from clef_devcluster.load.__main__ import table
from clef_operator import labels


def test_the_job_is_a_verification_job_as_the_operator_renders_it() -> None:
    job = admission.operator_job("ns")
    meta = job["metadata"]
    assert "name" not in meta and meta["generateName"], "a dry run each: no name to collide"
    assert meta["labels"][labels.MANAGED_BY] == labels.MANAGED_BY_VALUE
    assert meta["labels"][labels.COMPONENT] == labels.COMPONENT_VERIFICATION
    assert meta["ownerReferences"][0]["kind"] == "ClefModel"
    pod = job["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False  # passes clef-operator-no-secrets
    assert admission.BINDING == "clef-operator-model-namespaces"


def test_the_table_names_both_bindings() -> None:
    stats = {"n": 30, "p50_ms": 3.2, "p90_ms": 4.1, "max_ms": 4.7, "mean_ms": 3.4}
    result = {
        "models": 300,
        "cpus": 2,
        "loadavg_start": (0.4, 0.5, 0.5),
        "admission": {"anchor": stats, "every_model": {**stats, "p50_ms": 42.3}},
    }
    out = table(result)
    assert "parameters the namespace's anchor: p50/p90/max/mean, ms  3.2 / 4.1 / 4.7 / 3.4 (n=30)" in out
    assert "parameters every ClefModel" in out and "42.3 /" in out
