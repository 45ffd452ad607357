"""`python -m clef_devcluster.load --admission N`: what admission costs one of the operator's
writes in a namespace of N ClefModels, with clef-operator-model-namespaces bound as the base binds
it (its parameters: the ClefModels labelled as the namespace's anchor, one here) and bound as it
was before the anchor (its parameters: every ClefModel of the namespace).

No operator runs: the N models are created and one is labelled as the operator would label it
(clef_operator/anchor.py), so nothing but admission is measured.  Each sample is a server-side dry
run (admission runs in full, nothing is stored) of a verification Job as the operator renders it,
sent with the operator's ServiceAccount token, one at a time; the time is the request's, as the
client sees it.
"""

from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from clef_operator import anchor, labels
from clef_operator.api import ClefModelSpec
from clef_operator.render import Owner, render_job, render_verification_pod_spec

from ..host_operator import OPERATOR_NAMESPACE, OPERATOR_SA, service_account_kubeconfig
from . import scale

BINDING = "clef-operator-model-namespaces"
ADMISSION = "admissionregistration.k8s.io"


def operator_job(namespace: str) -> dict[str, Any]:
    """A verification Job as the operator renders one for a scale model (no name: a dry run each)."""
    spec = ClefModelSpec.model_validate(scale.clefmodel("a-0000")["spec"])
    owner = Owner("a-0000", namespace, str(uuid.uuid4()))
    job = render_job(owner, spec, "k" * 16, render_verification_pod_spec(spec), "")
    del job["metadata"]["name"]
    job["metadata"]["generateName"] = "admission-"
    return job


def _answer(batch: client.BatchV1Api, namespace: str, job: Any) -> tuple[float, str]:
    """(seconds, "" when admitted else the API server's message) of one dry-run create."""
    start = time.perf_counter()
    try:
        batch.create_namespaced_job(namespace, job, dry_run="All")
    except ApiException as e:
        return time.perf_counter() - start, str(e.body)
    return time.perf_counter() - start, ""


def _until(batch: client.BatchV1Api, namespace: str, job: dict[str, Any], admitted: bool, what: str) -> None:
    """Until the API server answers as `admitted` says (a binding or a label change takes it a
    moment: its policies and their parameters come from watches)."""
    scale.wait_until(lambda: (_answer(batch, namespace, job)[1] == "") is admitted, 60, what, every=0.2)


def _samples(batch: client.BatchV1Api, namespace: str, job: dict[str, Any], n: int) -> dict[str, float]:
    """n dry runs, one after another: p50, p90, max and mean, milliseconds."""
    times = []
    for _ in range(n):
        seconds, refused = _answer(batch, namespace, job)
        if refused:
            raise RuntimeError(f"the Job was refused: {refused}")
        times.append(seconds * 1000)
    ordered = sorted(times)
    return {
        "n": n,
        "p50_ms": round(statistics.median(ordered), 1),
        "p90_ms": round(ordered[-(-9 * n // 10) - 1], 1),
        "max_ms": round(ordered[-1], 1),
        "mean_ms": round(statistics.fmean(ordered), 1),
    }


def _selector(api: client.ApiClient, selector: dict[str, Any]) -> None:
    client.AdmissionregistrationV1Api(api).patch_validating_admission_policy_binding(
        BINDING, [{"op": "replace", "path": "/spec/paramRef/selector", "value": selector}]
    )


def run_admission(
    api: client.ApiClient, kubeconfig: Path, workdir: Path, n: int, samples: int, namespace: str
) -> dict[str, Any]:
    scale.ensure_namespace(api, namespace)
    custom = client.CustomObjectsApi(api)
    names = [f"a-{i:04d}" for i in range(n)]
    started = time.time()
    scale.create_all(
        lambda b: custom.create_namespaced_custom_object(
            scale.GROUP, scale.VERSION, namespace, scale.PLURAL, b
        ),
        [scale.clefmodel(name) for name in names],
    )
    created = time.time() - started

    def label(value: str | None) -> None:
        custom.patch_namespaced_custom_object(
            scale.GROUP, scale.VERSION, namespace, scale.PLURAL, names[0],
            {"metadata": {"labels": {labels.NAMESPACE_ANCHOR: value}}},
            _content_type="application/merge-patch+json",
        )  # fmt: skip

    workdir.mkdir(parents=True, exist_ok=True)
    token = service_account_kubeconfig(
        kubeconfig, OPERATOR_NAMESPACE, OPERATOR_SA, workdir / "sa.kubeconfig", 3600
    )
    sa = config.new_client_from_config(config_file=str(token))
    batch = client.BatchV1Api(sa)
    job = operator_job(namespace)
    anchored = {"matchLabels": dict(anchor.LABELS)}
    result: dict[str, Any] = {"models": n, "models_created_seconds": round(created, 1)}
    try:
        # As the base binds it: the namespace's one anchor is the parameter.
        label(labels.NAMESPACE_ANCHOR_VALUE)
        _until(batch, namespace, job, True, "the Job admitted where a model is anchored")
        result["anchor"] = _samples(batch, namespace, job, samples)
        # As it was bound before: every ClefModel of the namespace is a parameter.  The label goes
        # first, so that the Job admitted again proves the binding's change is in force.
        label(None)
        _until(batch, namespace, job, False, "the Job refused where no model is anchored")
        _selector(api, {})
        _until(batch, namespace, job, True, "the Job admitted with every ClefModel a parameter")
        result["every_model"] = _samples(batch, namespace, job, samples)
    finally:
        _selector(api, anchored)
        sa.close()
    return result
