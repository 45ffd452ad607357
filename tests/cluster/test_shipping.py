"""The shipping layer against a real API server: `kubectl apply -k` of kustomize/base and of the
homelab overlay, and the operator's RBAC proven exact.

The RBAC proof runs the operator the way its Deployment does (`clef-operator run
--all-namespaces`, liveness endpoint on), but on this host and authenticated as the ServiceAccount
clef-system/clef-operator with a TokenRequest token, so the API server's RBAC judges every request
by the rules kustomize/base ships.  It drives one ClefModel through every path that calls the API
server (verify and serve, a new revision switched in, the old one scaled down and deleted, an
unpullable image whose Job is deleted, a Job whose pod the API server refuses, goldens read from
a pod's log and stored in a ConfigMap, then deleted when edited by hand, deletion of the
ClefModel), then reads the API server's audit log (manifests/audit-policy.yaml logs exactly this
ServiceAccount's requests):

* nothing missing: no request was denied, and the rollout completed;
* nothing unused: every (group, resource, verb) the ClusterRoles grant appears among the allowed
  requests, except `update clefmodels/finalizers`, which only admission checks: that one is proven
  needed by showing the API server refuse the operator's kind of Job to a role without it.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_devcluster.checkpoints import write_chat_checkpoint
from clef_devcluster.config import ENGINE_IMAGE_PREFIX
from clef_devcluster.host_operator import (
    OPERATOR_NAMESPACE,
    OPERATOR_SA,
    service_account_kubeconfig,
)
from clef_devcluster.kustomize import BASE, HOMELAB, find, kustomize_build
from clef_devcluster.rbac_audit import (
    ADMISSION_ONLY,
    RbacComparison,
    audited_requests,
    compare_rbac,
    granted_to,
)
from clef_operator.labels import NAMESPACE_ANCHOR, VERIFICATION_KEY

from .conftest import Cluster, missing_prerequisite, wait_for
from .operator_support import (
    IMAGE_10,
    UNPULLABLE_IMAGE,
    V100,
    VERIFY_SECONDS,
    ElectedOperator,
    Models,
    clefmodel,
    delete_lease,
    delete_models,
    lease_holder,
    metric,
)

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]


# The label every object clef writes carries (kustomize/base/admission.yaml, clef-operator-managed-by).
CLEFS = {"app.kubernetes.io/managed-by": "clef"}


def anchored(body: dict[str, Any]) -> dict[str, Any]:
    """A ClefModel labelled as its namespace's anchor, as the operator labels one (no operator runs
    in the tests that use this; test_namespace_anchor.py shows it does)."""
    body["metadata"].setdefault("labels", {})[NAMESPACE_ANCHOR] = "true"
    return body


FENCE = "clef-operator-fence"  # kustomize/base/admission.yaml: the policy and its binding


def kubectl(cluster: Cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert cluster.kubectl, "the cluster tier needs kubectl"
    proc = subprocess.run(
        [cluster.kubectl, "--kubeconfig", str(cluster.kubeconfig), *args], capture_output=True, text=True
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def base(cluster: Cluster) -> Iterator[list[dict[str, Any]]]:
    """kustomize/base applied as a user would; removed afterwards, all but the CRD, which the
    rest of the session's tests use, and the fence (`clef-operator-fence`): an API server whose
    last binding of a built-in paramKind is deleted stops that kind's param informer for good
    (kubernetes/kubernetes#130887), so the fence would go on reading a frozen Lease for the rest
    of the tier (test_operator_leader's in-flight test then fails: op-a is never refused)."""
    assert cluster.kubectl
    objects = kustomize_build(cluster.kubectl, BASE)
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-k", str(BASE))
    try:
        yield objects
    finally:
        for o in reversed(objects):
            if o["kind"] == "CustomResourceDefinition" or o["metadata"]["name"] == FENCE:
                continue
            ns = o["metadata"].get("namespace")
            kubectl(
                cluster,
                "delete",
                o["kind"].lower(),
                o["metadata"]["name"],
                *(["-n", ns] if ns else []),
                "--ignore-not-found",
                "--wait=false",
                check=False,
            )


def test_base_applies_and_its_operator_pod_passes_restricted_pod_security(
    cluster: Cluster, base: list[dict[str, Any]]
) -> None:
    # The API server's PodSecurity admission enforces "restricted" in clef-system: a pod without
    # the settings is refused there (this is what makes the check below mean something) ...
    probe = kubectl(
        cluster, "-n", OPERATOR_NAMESPACE, "run", "pss-probe", "--image=registry.clef.test/x:1.0", "--dry-run=server",
        check=False,
    )  # fmt: skip
    assert probe.returncode != 0 and "PodSecurity" in probe.stderr, probe.stderr
    # ... while the operator's pod is admitted and (on kwok, which plays the kubelet) runs.
    if cluster.local is None:
        missing_prerequisite(
            "the operator's image would be pulled for real here; the admission check above ran (runs on the local cluster: unset CLEF_KUBECONFIG)"
        )
    deployment = find(base, "Deployment", "clef-operator")

    def available() -> bool:
        d = cluster.apps.read_namespaced_deployment(deployment["metadata"]["name"], OPERATOR_NAMESPACE)
        return bool(d.status and d.status.available_replicas == d.spec.replicas == 2)

    def events() -> str:
        items = cluster.core.list_namespaced_event(OPERATOR_NAMESPACE).items
        return "; ".join(f"{e.reason}: {e.message}" for e in items[-5:])

    wait_for(available, 60, "both operator replicas available", events)


def test_operator_rbac_is_exactly_what_it_uses(
    cluster: Cluster, base: list[dict[str, Any]], namespace: str, tmp_path: Path
) -> None:
    if cluster.local is None:
        missing_prerequisite(
            "needs the local cluster's API server audit log (manifests/audit-policy.yaml) (runs on the local cluster: unset CLEF_KUBECONFIG)"
        )
    audit = cluster.local.audit_log
    if not audit.exists():
        pytest.fail(
            f"no audit log at {audit}: the running cluster predates the audit policy; "
            "restart it (make cluster-down) and run again",
            pytrace=False,
        )
    offset = audit.stat().st_size
    cluster.image_table()
    sa_kubeconfig = service_account_kubeconfig(
        cluster.kubeconfig, OPERATOR_NAMESPACE, OPERATOR_SA, tmp_path / "operator.kubeconfig", 3600
    )
    # As the Deployment runs it: leader election on (the Lease deleted first, so its `create` is
    # exercised too) and the metrics endpoint, whose numbers are checked after the run.
    delete_lease(cluster)
    _allow_host_paths(cluster, str(tmp_path))  # where _drive_goldens writes its checkpoint
    operator = ElectedOperator(sa_kubeconfig, ["--all-namespaces"], tmp_path / "operator.log")
    granted = granted_to(base, OPERATOR_NAMESPACE, OPERATOR_SA)

    def audited() -> RbacComparison:
        with audit.open() as f:
            f.seek(offset)
            return compare_rbac(granted, audited_requests(f))

    try:
        try:
            kernels_run = _drive_every_api_path(Models(cluster, namespace), operator, tmp_path)
            samples = _settled_metrics(operator)
        except AssertionError as e:
            # A missing rule shows up as a rollout that never finishes; say which request it was.
            raise AssertionError(
                f"{e}\n--- the operator's requests, as audited ---\n{audited().explain()}"
            ) from None
    finally:
        # Releases what a failed run left (stripping the finalizer if the operator is gone), so
        # the namespace can go.
        delete_models(cluster, namespace)
        operator.stop()

    # The run's models were verified, so they had ledgers; `delete` on ConfigMaps in clef-system
    # is used (else the RBAC is not exact, below) and none is left.
    assert not _ledgers(cluster, namespace), "the finalizer deletes a deleted model's ledger"
    _check_metrics(kernels_run, samples, operator.tail())
    assert lease_holder(cluster) == "", "a clean stop hands the Lease back"
    result = audited()
    assert result.used, f"the audit log recorded no request by the operator ({audit})"
    assert result.exact, result.explain() + "\n--- operator log ---\n" + operator.tail()
    assert granted >= ADMISSION_ONLY

    # The one rule no request uses: without it, creating a child with blockOwnerDeletion is refused.
    _prove_finalizers_rule_needed(cluster, base, namespace)


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _ledgers(cluster: Cluster, namespace: str) -> list[str]:
    """The verdict ledgers in clef-system of models in `namespace` (annotation ledger-for)."""
    found: list[Any] = cluster.core.list_namespaced_config_map(OPERATOR_NAMESPACE).items
    return [
        cm.metadata.name
        for cm in found
        if (cm.metadata.annotations or {}).get("clef.riotpiao.com/ledger-for", "").startswith(f"{namespace}/")
    ]


def _rollout_counts(samples: Samples) -> dict[str, float]:
    return {
        "started": metric(samples, "clef_rollouts_started_total"),
        "completed": metric(samples, "clef_rollouts_completed_total"),
        "rejected": metric(samples, "clef_rollouts_rejected_total", reason="ImagePullFailed"),
        "rejected (refused pod)": metric(
            samples, "clef_rollouts_rejected_total", reason="VerificationPodRejected"
        ),
        "rejected (all)": metric(samples, "clef_rollouts_rejected_total"),
        "passed": metric(
            samples,
            "clef_verifications_total",
            outcome="Passed",
            suite="kernels",
            step="kernels",
            gpu_class=V100,
        ),
        "pass timed": metric(
            samples,
            "clef_verification_duration_seconds_count",
            outcome="Passed",
            suite="kernels",
            step="kernels",
            gpu_class=V100,
        ),
        "failed": metric(samples, "clef_verifications_total", outcome="Failed", reason="ImagePullFailed"),
        "switches": metric(samples, "clef_candidate_available_to_switch_seconds_count"),
    }


# The kernels-mode part of the run, as /metrics counted it before the goldens model: four
# rollouts started (create, args change, unpullable image, a refused pod), two completed, two
# rejected (the pull, the refused pod); one pass and one failed verification for the pull; two
# switches (the Service created, then patched).
KERNELS_RUN = {
    "started": 4, "completed": 2, "rejected": 1, "rejected (refused pod)": 1, "rejected (all)": 2,
    "passed": 1, "pass timed": 1, "failed": 1, "switches": 2,
}  # fmt: skip


def _check_metrics(kernels_run: Samples, samples: Samples, log: str) -> None:
    """The kernels-mode part's counters (scraped before the goldens model), then the end state:
    the forged goldens rejected once, still the leader, no errors, nothing queued or running, no
    models.  (The endpoint model's own counts are not pinned here: how often an endpoint rollout's
    Progressing turns True depends on timing.)"""
    got = _rollout_counts(kernels_run)
    assert got == KERNELS_RUN, f"/metrics after the kernels part: {got}\n--- operator log ---\n{log}"
    end = {
        "leader": metric(samples, "clef_operator_leader"),
        "rejected (goldens)": metric(samples, "clef_rollouts_rejected_total", reason="GoldensUntrusted"),
        "errors": metric(samples, "clef_reconcile_errors_total"),
        "queued": metric(samples, "clef_reconcile_queue_depth"),
        "running": metric(samples, "clef_reconciles_in_progress"),
        "models": metric(samples, "clef_models"),
    }
    want = {"leader": 1, "rejected (goldens)": 1, "errors": 0, "queued": 0, "running": 0, "models": 0}
    assert end == want, f"/metrics at the end: {end}\n--- operator log ---\n{log}"
    assert metric(samples, "clef_verification_duration_seconds_sum", outcome="Passed") > 0
    assert metric(samples, "clef_reconciles_total") >= 6


def _drive_every_api_path(models: Models, operator: ElectedOperator, tmp: Path) -> Samples:
    """Drives every API path; returns /metrics as they stood after the kernels-mode part."""
    name = "rbac"
    wait_for(operator.healthy, 60, "the operator's liveness endpoint", operator.tail)
    # 1. verified, created, served: Job, Deployment and Service created; nodes read.
    models.create(clefmodel(name, IMAGE_10, rollout={"scaleDownDelaySeconds": 0, "revisionHistoryLimit": 0}))
    models.wait_condition(name, "Ready", "True", "Available", timeout=VERIFY_SECONDS + 120)
    first = models.get(name)["status"]["activeRevision"]
    # 2. a new revision without a new Job (engine args are not verification inputs): the Service's
    #    selector patched, the old Deployment scaled to 0 and, beyond a history of 0, deleted.
    models.patch(name, {"spec": {"args": ["--max-num-seqs", "8"]}})
    models.wait_status(
        name, lambda s: s.get("activeRevision") not in (None, first), "the switch to the new revision", 120
    )

    def only_active_left() -> bool:
        active = models.get(name)["status"]["activeRevision"]
        return [d.metadata.name for d in models.deployments(name)] == [f"{name}-{active}"]

    wait_for(only_active_left, 120, "the old revision's Deployment deleted", operator.tail)
    models.wait_condition(name, "Progressing", "False", "RolloutComplete", timeout=60)
    # 3. an image that cannot be pulled: its Job is deleted at once.
    models.set_image(name, UNPULLABLE_IMAGE)
    models.wait_condition(name, "Verified", "False", "ImagePullFailed", timeout=120)
    key = models.get(name)["status"]["verificationKey"]

    def job_deleted() -> bool:
        return not [j for j in models.jobs(name) if (j.metadata.labels or {}).get(VERIFICATION_KEY) == key]

    wait_for(job_deleted, 60, "the unpullable image's Job deleted", operator.tail)
    # 3b. a pod the API server refuses (no such RuntimeClass): the Job's FailedCreate events listed.
    models.patch(name, {"spec": {"image": IMAGE_10, "runtimeClassName": "no-such-class"}})
    models.wait_condition(name, "Verified", "False", "VerificationPodRejected", timeout=120)
    # The pass that wrote that condition counts it right after; wait until nothing moves.
    wait_for(
        lambda: _rollout_counts(operator.metrics())["rejected (all)"] >= 2,
        30,
        "the refused pod counted in /metrics",
        operator.tail,
    )
    kernels_run = operator.metrics()
    # 4. endpoint verification: the goldens read from the goldens pod's log and stored in a
    #    ConfigMap; stored goldens edited by hand are deleted.
    _drive_goldens(models, operator, tmp)
    # 5. deleted: kopf takes its finalizer off.
    models.delete(name)
    wait_for(lambda: _gone(models, name), 60, "the ClefModel gone", operator.tail)
    assert operator.healthy(), "liveness after a full run"
    return kernels_run


def _drive_goldens(models: Models, operator: ElectedOperator, tmp: Path) -> None:
    name = "rbac-goldens"
    checkpoint = write_chat_checkpoint(tmp / "checkpoint")
    body = clefmodel(
        name,
        f"{ENGINE_IMAGE_PREFIX}candle-vllm:0.8.4",
        model={
            "name": "clef-flash",
            "path": "/models/clef-flash",
            "volume": {"hostPath": {"path": str(checkpoint)}},
        },
        service={"name": "rbac-goldens"},
        verification={
            "mode": "endpoint",
            "endpoint": {
                "runtimeImage": IMAGE_10,
                "builtinPrompts": "none",
                "prompts": [{"name": "hello", "text": "Hello."}],
                "maxNewTokens": 2,
            },
        },
    )
    models.create(body)
    core = models.cluster.core
    selector = "clef.riotpiao.com/component=goldens"

    def stored() -> list[Any]:
        return list(core.list_namespaced_config_map(models.ns, label_selector=selector).items)

    wait_for(lambda: stored(), VERIFY_SECONDS, "the goldens stored", operator.tail)
    # The forgery goes in after the run that made the goldens has concluded: the operator watches
    # the goldens ConfigMaps, so an edit during that run fails it at once (without the re-verify
    # below), and the re-verify would then start a new run that makes new goldens and passes.
    # With the verdict standing, the edit changes nothing until the re-verify reads the goldens.
    models.wait_condition(name, "Verified", "True", "Verified", timeout=VERIFY_SECONDS)
    (cm,) = stored()
    forged = {
        "clef.riotpiao.com/goldens": cm.metadata.annotations["clef.riotpiao.com/goldens"].replace("1", "2")
    }
    core.patch_namespaced_config_map(cm.metadata.name, models.ns, {"metadata": {"annotations": forged}})
    models.patch(name, {"metadata": {"annotations": {"clef.riotpiao.com/reverify": "forged"}}})
    models.wait_condition(name, "Verified", "False", "GoldensUntrusted", timeout=120)
    wait_for(lambda: not stored(), 60, "the untrusted goldens deleted", operator.tail)
    models.delete(name)
    wait_for(lambda: _gone(models, name), 60, "the goldens ClefModel gone", operator.tail)


def _settled_metrics(operator: ElectedOperator) -> Samples:
    """/metrics once the operator has caught up with the last deletion: a model's gauge and queue
    drop when its deletion's handler has run, a moment after the object is gone.  If they never
    settle, the last scrape is returned and `_check_metrics` names what stayed."""
    samples = operator.metrics()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(
        metric(samples, name)
        for name in ("clef_reconcile_queue_depth", "clef_reconciles_in_progress", "clef_models")
    ):
        time.sleep(0.5)
        samples = operator.metrics()
    return samples


def _gone(models: Models, name: str) -> bool:
    try:
        models.get(name)
    except ApiException as e:
        return e.status == 404
    return False


def _prove_finalizers_rule_needed(cluster: Cluster, base: list[dict[str, Any]], namespace: str) -> None:
    role = find(base, "ClusterRole", "clef-operator")
    without = [r for r in role["rules"] if "clefmodels/finalizers" not in r["resources"]]
    assert len(without) == len(role["rules"]) - 1
    probe = f"clef-rbac-probe-{uuid.uuid4().hex[:6]}"
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    cluster.core.create_namespaced_service_account(namespace, {"metadata": {"name": probe}})
    rbac.create_cluster_role({"metadata": {"name": probe}, "rules": without})
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": probe},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": probe},
            "subjects": [{"kind": "ServiceAccount", "name": probe, "namespace": namespace}],
        },
    )
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "probe",
            "namespace": namespace,
            "labels": CLEFS,
            # What render_job writes: the ClefModel as controller, blocking its deletion.
            "ownerReferences": [
                {
                    "apiVersion": "clef.riotpiao.com/v1alpha1",
                    "kind": "ClefModel",
                    "name": "probe",
                    "uid": str(uuid.uuid4()),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "containers": [{"name": "c", "image": "registry.clef.test/x:1.0"}],
                }
            }
        },
    }
    manifest = Path(cluster.kubeconfig).parent / f"{probe}.json"
    manifest.write_text(json.dumps(job))
    # The admission policies admit the operator's Jobs only where a ClefModel is (its anchor).
    custom = client.CustomObjectsApi(cluster.api)
    custom.create_namespaced_custom_object(
        "clef.riotpiao.com",
        "v1alpha1",
        namespace,
        "clefmodels",
        anchored(clefmodel("probe", verification={"required": False})),
    )
    try:

        def create_as(user: str) -> subprocess.CompletedProcess[str]:
            return kubectl(
                cluster, f"--as={user}", "create", "--dry-run=server", "-f", str(manifest), check=False
            )

        # RBAC bindings take effect within moments; the operator's own identity first.
        allowed = create_as(f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SA}")
        assert allowed.returncode == 0, allowed.stderr

        def refused() -> str | None:
            out = create_as(f"system:serviceaccount:{namespace}:{probe}")
            return out.stderr if out.returncode != 0 and "blockOwnerDeletion" in out.stderr else None

        wait_for(refused, 20, "the API server to refuse blockOwnerDeletion without clefmodels/finalizers")
    finally:
        manifest.unlink(missing_ok=True)
        custom.delete_namespaced_custom_object(
            "clef.riotpiao.com", "v1alpha1", namespace, "clefmodels", "probe"
        )
        with contextlib.suppress(ApiException):
            rbac.delete_cluster_role(probe)


def test_homelab_overlay_applies_and_the_api_server_accepts_its_models(
    cluster: Cluster, base: list[dict[str, Any]]
) -> None:
    """The overlay as Git would hold it: the namespaced RBAC, the coder's two-port Service and both
    ClefModels, which pass the CRD's schema and CEL rules on a real API server (no operator runs
    here: the rollout is what the demo shows)."""
    assert cluster.kubectl
    objects = kustomize_build(cluster.kubectl, HOMELAB)
    try:
        kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-k", str(HOMELAB))
        custom = client.CustomObjectsApi(cluster.api)
        names = {
            m["metadata"]["name"]
            for m in custom.list_namespaced_custom_object(
                "clef.riotpiao.com", "v1alpha1", "homelab", "clefmodels"
            )["items"]
        }
        assert names == {"clef-flash", "coder"}
        svc = cluster.core.read_namespaced_service("coder-predictor", "homelab")
        assert sorted(p.port for p in svc.spec.ports) == [80, 8080] and svc.spec.cluster_ip
        binding = client.RbacAuthorizationV1Api(cluster.api).read_namespaced_role_binding(
            "clef-operator", "homelab"
        )
        assert binding.role_ref.name == "clef-operator"
        # The namespaced variant really is namespaced: the operator may not list Deployments of
        # another namespace, only of homelab (checked by the API server's own authorizer).
        user = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SA}"
        kubectl(cluster, "delete", "clusterrolebinding", "clef-operator", "--ignore-not-found")

        def can(ns: str) -> str:
            out = kubectl(
                cluster, f"--as={user}", "auth", "can-i", "list", "deployments", "-n", ns, check=False
            )
            return out.stdout.strip()

        wait_for(lambda: (can("homelab"), can("default")) == ("yes", "no"), 20, "RBAC scoped to homelab")
        assert find(objects, "Deployment", "clef-operator")["spec"]["template"]["spec"]["containers"][0][
            "args"
        ][1] == ("--namespace=homelab")
    finally:
        kubectl(cluster, "delete", "namespace", "homelab", "--ignore-not-found", "--wait=false", check=False)


def test_operator_start_up_check_sees_whether_the_crd_is_served(cluster: Cluster) -> None:
    """`clef-operator run` exits with a message instead of watching nothing when the CRD is
    missing (kopf's resource scanning is off, so it would not notice the CRD arrive later)."""
    from clef_operator.apiclient import serves

    assert serves(cluster.api, "clef.riotpiao.com", "v1alpha1", "clefmodels")
    assert not serves(cluster.api, "clef.riotpiao.com", "v1alpha1", "clefmodelz")
    assert not serves(cluster.api, "absent.clef.test", "v1", "things")


def _allow_host_paths(cluster: Cluster, *prefixes: str) -> None:
    """What a cluster's admin does to let ClefModels take weights from these node directories."""
    client.AdmissionregistrationV1Api(cluster.api).patch_validating_admission_policy(
        "clef-operator-host-paths",
        [{"op": "replace", "path": "/spec/variables/0/expression", "value": json.dumps(list(prefixes))}],
    )


# How a pod could take what the operator's token was not given, and the policy that refuses it.
# Each is a change to a pod template that passes every policy (`_clean_pod`).
STEALS: dict[str, tuple[str, dict[str, Any]]] = {
    "env": ("no-secrets", {"env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]}),
    "envFrom": ("no-secrets", {"envFrom": [{"secretRef": {"name": "db"}}]}),
    "secret-volume": ("no-secrets", {"volumes": [{"name": "s", "secret": {"secretName": "db"}}]}),
    "projected-secret": ("no-secrets", {"volumes": [{"name": "s", "projected": {"sources": [{"secret": {"name": "db"}}]}}]}),
    "token-automount": ("no-secrets", {"automountServiceAccountToken": True}),
    "other-service-account": ("no-secrets", {"serviceAccountName": "admin"}),
    "projected-token": ("no-secrets", {"volumes": [{"name": "s", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token"}}]}}]}),
    "csi-volume": ("no-secrets", {"volumes": [{"name": "s", "csi": {"driver": "secrets-store.csi.k8s.io"}}]}),
    "host-network": ("no-secrets", {"hostNetwork": True}),
    "host-pid": ("no-secrets", {"hostPID": True}),
    "privileged": ("no-secrets", {"privileged": True}),
    "kubelet-dir": ("host-paths", {"volumes": [{"name": "s", "hostPath": {"path": "/var/lib/kubelet"}}]}),
    "prefix-lookalike": ("host-paths", {"volumes": [{"name": "s", "hostPath": {"path": "/srv/models-x"}}]}),
}  # fmt: skip


def _pod(kind: str, change: dict[str, Any]) -> dict[str, Any]:
    """A pod template as clef renders one (no token, no Secret), with `change` applied."""
    container: dict[str, Any] = {"name": "c", "image": "registry.clef.test/x:1.0", "command": ["cat", "/s/x"]}
    spec: dict[str, Any] = {
        "restartPolicy": "Never" if kind == "Job" else "Always",
        "automountServiceAccountToken": False,
    }
    for key, value in change.items():
        if key in ("env", "envFrom"):
            container[key] = value
        elif key == "privileged":
            container["securityContext"] = {"privileged": value}
        else:
            spec[key] = value
    if "volumes" in spec:
        container["volumeMounts"] = [{"name": "s", "mountPath": "/s"}]
    return {**spec, "containers": [container]}


def _dry_run(sa: Any, namespace: str, kind: str, name: str, pod: dict[str, Any]) -> str:
    """The API server's answer to creating a Job or Deployment of `pod` (a server-side dry run,
    which passes admission as a create would and leaves nothing): "" when admitted, else the
    message."""
    template = {"metadata": {"labels": {"app": name}}, "spec": pod}
    try:
        if kind == "Job":
            body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": CLEFS},
                    "spec": {"template": template}}  # fmt: skip
            client.BatchV1Api(sa).create_namespaced_job(namespace, body, dry_run="All")
        else:
            body = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": CLEFS},
                    "spec": {"selector": {"matchLabels": {"app": name}}, "template": template}}  # fmt: skip
            client.AppsV1Api(sa).create_namespaced_deployment(namespace, body, dry_run="All")
    except ApiException as e:
        return str(e.body)
    return ""


def test_the_operators_token_cannot_reach_what_it_was_not_given(
    cluster: Cluster, base: list[dict[str, Any]], namespace: str, tmp_path: Path
) -> None:
    """Issue 33, finding 6: with its RBAC alone, the ServiceAccount created a Job in another
    namespace that took a Secret into its environment, then read it through `pods/log`.  The
    admission policies of kustomize/base/admission.yaml refuse, from this ServiceAccount, every
    Job or Deployment whose pod takes a Secret or a ServiceAccount token, runs in its node's
    namespaces or privileged, or mounts a node directory the admin did not list; and any Job,
    Deployment or ConfigMap in a namespace that holds no ClefModel (labelled as its anchor:
    test_namespace_anchor.py).  Each refusal must
    come from the policy named for it; a template as clef renders it is admitted, where a model
    is.  The operator's own writes pass them all (test_operator_rbac_is_exactly_what_it_uses)."""
    from kubernetes import config

    # The base as shipped (the homelab test before this one takes its ClusterRoleBinding away).
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-k", str(BASE))
    _allow_host_paths(cluster, "/srv/models")
    sa = config.new_client_from_config(
        config_file=str(
            service_account_kubeconfig(
                cluster.kubeconfig, OPERATOR_NAMESPACE, OPERATOR_SA, tmp_path / "operator.kubeconfig", 600
            )
        )
    )
    cluster.core.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="db"), string_data={"password": "x"})
    )
    custom = client.CustomObjectsApi(cluster.api)
    custom.create_namespaced_custom_object(
        "clef.riotpiao.com",
        "v1alpha1",
        namespace,
        "clefmodels",
        anchored(clefmodel("here", verification={"required": False})),
    )
    empty = f"{namespace}-nomodel"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=empty)))
    try:
        # The wait covers the API server's first load of the policies and their parameters.
        for kind in ("Job", "Deployment"):
            clean = _pod(kind, {"volumes": [{"name": "s", "hostPath": {"path": "/srv/models/clef-flash"}}]})
            wait_for(lambda k=kind, c=clean: not _dry_run(sa, namespace, k, "clean", c), 30,
                     f"a {kind} as clef renders it admitted")  # fmt: skip
            for way, (policy, change) in STEALS.items():
                answer = wait_for(
                    lambda w=way, k=kind, c=change, p=policy: (
                        lambda a: a if f"clef-operator-{p}" in a else ""
                    )(_dry_run(sa, namespace, k, f"steal-{w.lower()}", _pod(k, c))),
                    30,
                    f"a {kind} by {way} refused by clef-operator-{policy}",
                    lambda w=way, k=kind, c=change: _dry_run(sa, namespace, k, "x", _pod(k, c)),
                )
                assert "Forbidden" in answer or "forbidden" in answer, answer
            # Where no ClefModel is, not even a clean one.
            wait_for(
                lambda k=kind, c=clean: "clef-operator-model-namespaces" in _dry_run(sa, empty, k, "clean", c),
                30, f"a {kind} where no model is refused",
            )  # fmt: skip
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(sa).create_namespaced_config_map(
                empty, {"metadata": {"name": "x", "labels": CLEFS}}, dry_run="All"
            )
        assert "clef-operator-model-namespaces" in str(refused.value.body), refused.value.body
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(sa).create_namespaced_config_map(
                empty, {"metadata": {"name": "x"}}, dry_run="All"
            )
        assert "clef-operator-managed-by" in str(refused.value.body), refused.value.body
        # A verdict ledger only in the operator's own namespace, and only under a ledger's name.
        ledger = {**CLEFS, "clef.riotpiao.com/component": "ledger"}
        for where, name in ((empty, "clef-ledger-x"), (OPERATOR_NAMESPACE, "coredns")):
            with pytest.raises(ApiException) as refused:
                client.CoreV1Api(sa).create_namespaced_config_map(
                    where, {"metadata": {"name": name, "labels": ledger}}, dry_run="All"
                )
            assert "clef-operator-ledgers" in str(refused.value.body), (where, name, refused.value.body)
        client.CoreV1Api(sa).create_namespaced_config_map(
            OPERATOR_NAMESPACE, {"metadata": {"name": "clef-ledger-x", "labels": ledger}}, dry_run="All"
        )
    finally:
        _allow_host_paths(cluster)
        sa.close()
        custom.delete_namespaced_custom_object(
            "clef.riotpiao.com", "v1alpha1", namespace, "clefmodels", "here"
        )
        cluster.core.delete_namespace(empty)


SERVING_POD = {
    **CLEFS,
    "clef.riotpiao.com/component": "serving",
    "clef.riotpiao.com/revision-of": "here",
    "clef.riotpiao.com/revision": "r1",
}
VERIFICATION_POD = {
    **CLEFS,
    "clef.riotpiao.com/component": "verification",
    "clef.riotpiao.com/verifies": "here",
}


def _patch_pod(sa: Any, namespace: str, name: str, body: dict[str, Any]) -> str:
    """The API server's answer to the operator's token patching pod `name` (a dry run)."""
    try:
        client.CoreV1Api(sa).patch_namespaced_pod(name, namespace, body, dry_run="All")
    except ApiException as e:
        return str(e.body)
    return ""


def test_the_operators_token_only_adds_the_serving_label_to_a_pod(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """Issue 33, finding 5: the operator gives a pod the serving label only once its revision is
    verified, which takes `patch pods`; RBAC alone would let the token change any pod's image.
    clef-operator-serving-label admits one change: `clef.riotpiao.com/model=<revision-of>` added
    to, or removed from, a serving pod clef created."""
    from kubernetes import config

    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-k", str(BASE))
    sa = config.new_client_from_config(
        config_file=str(
            service_account_kubeconfig(
                cluster.kubeconfig, OPERATOR_NAMESPACE, OPERATOR_SA, tmp_path / "operator.kubeconfig", 600
            )
        )
    )
    held = {"schedulingGates": [{"name": "clef.test/held"}], "automountServiceAccountToken": False}
    container = {"name": "engine", "image": "registry.clef.test/x:1.0"}
    for name, pod_labels in (
        ("serving", SERVING_POD),
        ("verify", VERIFICATION_POD),
        ("theirs", {"app": "x"}),
    ):
        body = {"metadata": {"name": name, "labels": pod_labels}, "spec": {**held, "containers": [container]}}
        cluster.core.create_namespaced_pod(namespace, body)
    serving_label = {"metadata": {"labels": {"clef.riotpiao.com/model": "here"}}}
    try:
        wait_for(lambda: not _patch_pod(sa, namespace, "serving", serving_label), 30,
                 "the serving label added to a serving pod admitted")  # fmt: skip
        cluster.core.patch_namespaced_pod("serving", namespace, serving_label)
        unlabel = {"metadata": {"labels": {"clef.riotpiao.com/model": None}}}
        assert not _patch_pod(sa, namespace, "serving", unlabel), "and removed"
        refused = {
            "another model's label": ("serving", {"metadata": {"labels": {"clef.riotpiao.com/model": "there"}}}),
            "the revision-of label": ("serving", {"metadata": {"labels": {"clef.riotpiao.com/revision-of": "x"}}}),
            "another label": ("serving", {"metadata": {"labels": {"app": "mine"}}}),
            "a label removed": ("serving", {"metadata": {"labels": {"clef.riotpiao.com/revision": None}}}),
            "an annotation": ("serving", {"metadata": {"annotations": {"a": "b"}}}),
            "the image": ("serving", {"spec": {"containers": [{"name": "engine", "image": "evil:1"}]}}),
            "a verification pod": ("verify", serving_label),
            "a pod clef did not make": ("theirs", serving_label),
        }  # fmt: skip
        for what, (name, body) in refused.items():
            answer = _patch_pod(sa, namespace, name, body)
            assert "clef-operator-serving-label" in answer, (what, answer)
    finally:
        sa.close()
        for name in ("serving", "verify", "theirs"):
            cluster.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
