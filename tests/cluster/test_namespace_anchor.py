"""The namespace anchor (clef_operator/anchor.py) against a real API server with kustomize/base's
admission policies: clef-operator-model-namespaces admits clef's children only where a ClefModel
labelled clef.riotpiao.com/namespace-anchor=true is (its binding selects only those, so a write
costs one evaluation whatever the number of models: docs/performance.md), and the operator, run as
its ServiceAccount, keeps one model of each namespace it writes in labelled so: on the first
model, when a user strips the label, when the anchor is deleted, and after a restart.

Every wait is on a watch of the namespace's ClefModels (`GaplessWatch`) or on the object the
write makes; the watch also proves that no two live models were ever anchored at once.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from clef_devcluster.host_operator import OPERATOR_NAMESPACE, OPERATOR_SA, service_account_kubeconfig
from clef_devcluster.load import scale
from clef_operator import labels

from .conftest import Cluster, wait_for
from .operator_support import delete_models
from .watches import GaplessWatch, states

pytestmark = pytest.mark.cluster

NODE = "anchor-test-1"
ANCHOR = labels.NAMESPACE_ANCHOR
POLICY = "clef-operator-model-namespaces"
FENCE = "clef-operator-fence"  # kept: kubernetes/kubernetes#130887 (tests/cluster/test_shipping.py)
CLEFS = {labels.MANAGED_BY: labels.MANAGED_BY_VALUE}


@pytest.fixture
def identity(cluster: Cluster) -> Iterator[None]:
    """kustomize/base without its Deployment (ServiceAccount, RBAC, admission policies) and a node
    for the models; the admission policies but the fence removed afterwards, so that the rest of
    the session's tests (which write clef-labelled objects as the admin) do not meet them."""
    assert cluster.kubectl
    objects = scale.operator_identity(cluster.kubectl)

    def applied() -> bool:
        try:
            scale.kubectl_objects(cluster.kubeconfig, cluster.kubectl or "", "apply", objects)
        except subprocess.CalledProcessError:
            return False  # clef-system still terminating after an earlier test's removal
        return True

    wait_for(applied, 120, "kustomize/base (but its Deployment) applied")
    scale.add_gpu_node(cluster.kubeconfig, NODE, 20)
    try:
        yield
    finally:
        with contextlib.suppress(ApiException):
            cluster.core.delete_node(NODE)
        policies = [
            o
            for o in objects
            if o["kind"].startswith("ValidatingAdmissionPolicy") and o["metadata"]["name"] != FENCE
        ]
        scale.kubectl_objects(cluster.kubeconfig, cluster.kubectl, "delete", policies)


def _sa_client(cluster: Cluster, tmp_path: Path) -> client.ApiClient:
    path = service_account_kubeconfig(
        cluster.kubeconfig, OPERATOR_NAMESPACE, OPERATOR_SA, tmp_path / "sa.kubeconfig", 600
    )
    return config.new_client_from_config(config_file=str(path))


def _job_answer(sa: client.ApiClient, namespace: str) -> str:
    """The API server's answer to the operator's token creating a Job as clef renders one (a
    server-side dry run: admission runs, nothing is stored): "" when admitted."""
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"generateName": "probe-", "labels": CLEFS},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "containers": [{"name": "c", "image": scale.IMAGE}],
                }
            }
        },
    }
    try:
        client.BatchV1Api(sa).create_namespaced_job(namespace, body, dry_run="All")
    except ApiException as e:
        return str(e.body)
    return ""


def _label(cluster: Cluster, namespace: str, name: str, value: str | None) -> None:
    """What a user does with kubectl label (value None: the label removed)."""
    client.CustomObjectsApi(cluster.api).patch_namespaced_custom_object(
        scale.GROUP,
        scale.VERSION,
        namespace,
        scale.PLURAL,
        name,
        {"metadata": {"labels": {ANCHOR: value}}},
        _content_type="application/merge-patch+json",
    )


def test_only_an_anchored_clefmodel_lets_the_operators_token_write_there(
    cluster: Cluster, identity: None, namespace: str, tmp_path: Path
) -> None:
    """No ClefModel: refused.  A ClefModel without the label is no parameter of the binding:
    refused.  Labelled: admitted.  The label removed: refused again.  (No operator runs here.)"""
    sa = _sa_client(cluster, tmp_path)
    custom = client.CustomObjectsApi(cluster.api)
    try:
        # The wait covers the API server's first load of the policies.
        wait_for(lambda: POLICY in _job_answer(sa, namespace), 30, "a Job where no ClefModel is refused")
        custom.create_namespaced_custom_object(
            scale.GROUP, scale.VERSION, namespace, scale.PLURAL, scale.clefmodel("m-0")
        )
        _label(cluster, namespace, "m-0", "true")
        wait_for(
            lambda: _job_answer(sa, namespace) == "", 30, "a Job where an anchored ClefModel is admitted"
        )
        _label(cluster, namespace, "m-0", "false")  # any value but "true" anchors nothing
        wait_for(
            lambda: POLICY in _job_answer(sa, namespace),
            30,
            "a Job where the only ClefModel is not anchored refused",
            lambda: _job_answer(sa, namespace),
        )
        _label(cluster, namespace, "m-0", None)
        assert POLICY in _job_answer(sa, namespace)
    finally:
        sa.close()
        delete_models(cluster, namespace)


class Anchors:
    """The namespace's ClefModels, watched without gaps from before the operator starts."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.watch = GaplessWatch(
            client.CustomObjectsApi(cluster.api).list_namespaced_custom_object,
            scale.GROUP,
            scale.VERSION,
            namespace,
            scale.PLURAL,
        )

    def history(self) -> list[set[str]]:
        """The live anchored models in every state the namespace went through."""
        return [
            {
                name
                for name, m in state.items()
                if (m["metadata"].get("labels") or {}).get(ANCHOR) == "true"
                and not m["metadata"].get("deletionTimestamp")
            }
            for state in states(self.watch.initial, self.watch.snapshot())
        ]

    def now(self) -> set[str]:
        return self.history()[-1]

    def mark(self) -> int:
        """Where the history is now: `wait` after an action looks only at the states after it."""
        return len(self.history())

    def wait(
        self, check: Callable[[set[str]], bool], what: str, after: int = 0, gone_first: bool = False
    ) -> set[str]:
        """The first state after `after` that `check` accepts (with `gone_first`: one that follows
        a state with no live anchor, as a stripped label makes)."""

        def found() -> set[str] | None:
            seen_none = not gone_first
            for anchored in self.history()[after:]:
                seen_none = seen_none or not anchored
                if seen_none and check(anchored):
                    return anchored or {""}  # truthy for wait_for
            return None

        got = wait_for(found, 60, what, self.history)
        return got - {""}


def _replicas(cluster: Cluster, namespace: str, model: str, replicas: int, operator: Any) -> None:
    """A write the operator must make in the namespace: scale the model's serving Deployment (a
    patch, which the policy admits only where an anchor is), then the model Ready again."""
    client.CustomObjectsApi(cluster.api).patch_namespaced_custom_object(
        scale.GROUP,
        scale.VERSION,
        namespace,
        scale.PLURAL,
        model,
        {"spec": {"replicas": replicas}},
        _content_type="application/merge-patch+json",
    )

    def done() -> bool:
        deployments = cluster.apps.list_namespaced_deployment(
            namespace, label_selector=f"{labels.MODEL}={model}"
        ).items
        available = [d for d in deployments if (d.status.available_replicas or 0) == replicas]
        got = client.CustomObjectsApi(cluster.api).get_namespaced_custom_object(
            scale.GROUP, scale.VERSION, namespace, scale.PLURAL, model
        )
        conditions = {c["type"]: c for c in (got.get("status") or {}).get("conditions") or []}
        ready = conditions.get("Ready", {}).get("status") == "True"
        degraded = conditions.get("Degraded", {}).get("status") == "True"
        return bool(available) and ready and not degraded

    wait_for(done, 90, f"{model} at {replicas} replicas and Ready", operator.tail)


def test_the_operator_anchors_each_namespace_and_anchors_it_again(
    cluster: Cluster, identity: None, namespace: str, tmp_path: Path
) -> None:
    custom = client.CustomObjectsApi(cluster.api)

    def create(*names: str) -> None:
        scale.create_all(
            lambda b: custom.create_namespaced_custom_object(
                scale.GROUP, scale.VERSION, namespace, scale.PLURAL, b
            ),
            [scale.clefmodel(n) for n in names],
        )

    def all_ready(n: int) -> None:
        wait_for(
            lambda: scale.ready_models(cluster.api, namespace) == n, 120, f"{n} models Ready", operator.tail
        )

    anchors = Anchors(cluster, namespace)
    anchors.watch.start()
    operator = scale.Operator(cluster.kubeconfig, tmp_path / "op1", scope=("--namespace", namespace))
    try:
        # The first model of the namespace: anchored before its Deployment is written.
        create("m-0")
        assert anchors.wait(bool, "an anchor") == {"m-0"}
        all_ready(1)
        # More models, at once: m-0 anchors them all.
        create("m-1", "m-2", "m-3")
        all_ready(4)
        assert anchors.now() == {"m-0"}

        # A user strips the label: the model's own pass (its watch event) labels it again.
        mark = anchors.mark()
        _label(cluster, namespace, "m-0", None)
        assert anchors.wait(bool, "the namespace anchored again", mark, gone_first=True) == {"m-0"}
        _replicas(cluster, namespace, "m-1", 2, operator)

        # The anchor is deleted: its finalizing pass hands the label on first (to the last live
        # model by name: anchor.successors).
        custom.delete_namespaced_custom_object(scale.GROUP, scale.VERSION, namespace, scale.PLURAL, "m-0")
        assert anchors.wait(lambda a: a == {"m-3"}, "the anchor handed on to m-3") == {"m-3"}
        wait_for(lambda: scale.ready_models(cluster.api, namespace) == 3, 60, "m-0 gone", operator.tail)
        _replicas(cluster, namespace, "m-2", 2, operator)

        # Restart: the operator is down while the label goes and a model is added; its first
        # passes anchor the namespace again before any child of the new model is written.
        operator.stop()
        mark = anchors.mark()
        _label(cluster, namespace, "m-3", None)
        create("m-4")
        anchors.wait(lambda a: not a, "the label gone", mark)
        operator = scale.Operator(cluster.kubeconfig, tmp_path / "op2", scope=("--namespace", namespace))
        assert len(anchors.wait(bool, "an anchor after the restart", mark, gone_first=True)) == 1
        all_ready(4)
        _replicas(cluster, namespace, "m-3", 2, operator)
        _replicas(cluster, namespace, "m-4", 2, operator)

        # No state in which two live models were anchored at once, and not one refused write.
        assert max(len(a) for a in anchors.history()) == 1
        log = (tmp_path / "op1" / "operator.log").read_text() + (
            tmp_path / "op2" / "operator.log"
        ).read_text()
        for unwanted in ("ChildRejected", POLICY, "reconcile failed", "did not see the namespace anchor"):
            assert unwanted not in log, f"{unwanted!r} in the operator's log:\n{log}"
    finally:
        anchors.watch.stop()
        delete_models(cluster, namespace)
        operator.stop()
    anchors.watch.check()
