"""The kustomize trees, rendered by the pinned kubectl (`kubectl kustomize`), checked for structure:
what they contain, where, with which security settings and RBAC.  `tests/cluster/test_shipping.py`
applies the same trees to a real API server and runs the operator with their RBAC.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from kubectl_gate import require_kubectl

from clef_devcluster.host_operator import OPERATOR_NAMESPACE, OPERATOR_SA
from clef_devcluster.images import seed_table
from clef_devcluster.kustomize import BASE, DEMO, HOMELAB, find, kustomize_build
from clef_devcluster.rbac_audit import granted_to, rule_permissions
from clef_operator import anchor, labels
from clef_operator.api import ClefModelSpec
from clef_operator.cli import build_parser
from clef_operator.crdgen import render_crd_yaml
from clef_operator.kvcache import estimate_kv_cache_tokens

Objects = list[dict[str, Any]]


@pytest.fixture(scope="module")
def base() -> Objects:
    return kustomize_build(require_kubectl(), BASE)


@pytest.fixture(scope="module")
def homelab() -> Objects:
    return kustomize_build(require_kubectl(), HOMELAB)


@pytest.fixture(scope="module")
def demo() -> Objects:
    return kustomize_build(require_kubectl(), DEMO)


def kinds(objects: Objects) -> list[tuple[str, str]]:
    return sorted((o["kind"], o["metadata"]["name"]) for o in objects)


def operator_container(objects: Objects) -> dict[str, Any]:
    containers = find(objects, "Deployment", "clef-operator")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


# ------------------------------------------------------------------------------------ base


def test_the_fence_lease_is_installed_with_no_holder(base: Objects) -> None:
    """The fence policy's parameter is always there (no direct read by the API server on a cache
    miss), and admits everything until a replica takes it."""
    [lease] = [o for o in base if o["kind"] == "Lease"]
    fence = next(
        o
        for o in base
        if o["kind"] == "ValidatingAdmissionPolicyBinding" and o["metadata"]["name"] == "clef-operator-fence"
    )
    assert (lease["metadata"]["name"], lease["metadata"]["namespace"]) == (
        fence["spec"]["paramRef"]["name"],
        fence["spec"]["paramRef"]["namespace"],
    )
    assert not lease.get("spec", {}).get("holderIdentity")


def test_model_namespaces_evaluates_the_anchors_only(base: Objects, homelab: Objects) -> None:
    """clef-operator-model-namespaces is evaluated once per ClefModel its binding selects: the ones
    labelled as their namespace's anchor (the label the operator puts: clef_operator/anchor.py),
    not every ClefModel of the namespace (7.6 s a create at 1,000 models).  None there: refused.
    The namespaced variant keeps it (one evaluation a write; RBAC alone would admit a namespace
    bound with no model in it)."""
    for objects in (base, homelab):
        binding = find(objects, "ValidatingAdmissionPolicyBinding", "clef-operator-model-namespaces")
        assert binding["spec"]["paramRef"] == {
            "selector": {"matchLabels": {labels.NAMESPACE_ANCHOR: labels.NAMESPACE_ANCHOR_VALUE}},
            "parameterNotFoundAction": "Deny",
        }
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert "namespace" not in binding["spec"]["paramRef"], "the written object's namespace"
        policy = find(objects, "ValidatingAdmissionPolicy", "clef-operator-model-namespaces")
        assert policy["spec"]["paramKind"] == {
            "apiVersion": "clef.riotpiao.com/v1alpha1",
            "kind": "ClefModel",
        }
        assert policy["spec"]["failurePolicy"] == "Fail"
    assert anchor.POLICY == "clef-operator-model-namespaces"


def test_base_holds_exactly_the_operator_install(base: Objects) -> None:
    assert kinds(base) == [
        ("ClusterRole", "clef-operator"),
        ("ClusterRole", "clef-operator-nodes"),
        ("ClusterRoleBinding", "clef-operator"),
        ("ClusterRoleBinding", "clef-operator-nodes"),
        ("CustomResourceDefinition", "clefmodels.clef.riotpiao.com"),
        ("Deployment", "clef-operator"),
        ("Lease", "clef-operator"),
        ("Namespace", "clef-system"),
        ("Role", "clef-operator-lease"),
        ("Role", "clef-verdict-key"),
        ("Role", "clef-verdict-ledger"),
        ("RoleBinding", "clef-operator-lease"),
        ("RoleBinding", "clef-verdict-key"),
        ("RoleBinding", "clef-verdict-ledger"),
        ("ServiceAccount", "clef-operator"),
        ("ValidatingAdmissionPolicy", "clef-operator-fence"),
        ("ValidatingAdmissionPolicy", "clef-operator-host-paths"),
        ("ValidatingAdmissionPolicy", "clef-operator-ledgers"),
        ("ValidatingAdmissionPolicy", "clef-operator-managed-by"),
        ("ValidatingAdmissionPolicy", "clef-operator-model-namespaces"),
        ("ValidatingAdmissionPolicy", "clef-operator-no-secrets"),
        ("ValidatingAdmissionPolicy", "clef-operator-serving-label"),
        ("ValidatingAdmissionPolicyBinding", "clef-operator-fence"),
        ("ValidatingAdmissionPolicyBinding", "clef-operator-host-paths"),
        ("ValidatingAdmissionPolicyBinding", "clef-operator-ledgers"),
        ("ValidatingAdmissionPolicyBinding", "clef-operator-managed-by"),
        ("ValidatingAdmissionPolicyBinding", "clef-operator-model-namespaces"),
        ("ValidatingAdmissionPolicyBinding", "clef-operator-no-secrets"),
        ("ValidatingAdmissionPolicyBinding", "clef-operator-serving-label"),
    ]
    namespaced = [o for o in base if o["kind"] in ("Deployment", "ServiceAccount", "Role", "RoleBinding")]
    assert {o["metadata"]["namespace"] for o in namespaced} == {OPERATOR_NAMESPACE}
    ns = find(base, "Namespace", OPERATOR_NAMESPACE)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_base_crd_is_the_generated_one() -> None:
    # The base's copy exists because kustomize reads nothing outside its directory.
    copy = (BASE / "clefmodel-crd.yaml").read_text()
    assert copy == render_crd_yaml(), "kustomize/base/clefmodel-crd.yaml is stale: run `make crd`"


def test_operator_deployment_is_locked_down(base: Objects) -> None:
    deployment = find(base, "Deployment", "clef-operator")
    spec = deployment["spec"]
    # Two replicas, one acting (the Lease): an update starts the new pod before it stops an old one.
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = spec["template"]["spec"]
    spread = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert [t["podAffinityTerm"]["topologyKey"] for t in spread] == ["kubernetes.io/hostname"]
    assert spread[0]["podAffinityTerm"]["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    assert pod["serviceAccountName"] == OPERATOR_SA
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = operator_container(base)
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind]), f"resources.{kind}"
    # Read-only root: whatever must be written goes to a mounted emptyDir.
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    image = c["image"]
    assert re.fullmatch(r"[a-z0-9./-]+:[0-9]+\.[0-9]+\.[0-9]+", image), f"pinned version tag, not {image}"


@pytest.mark.parametrize("tree", ["base", "homelab"])
def test_operator_command_is_the_real_cli_and_probes_and_scrapes_hit_its_endpoint(
    tree: str, request: pytest.FixtureRequest
) -> None:
    objects: Objects = request.getfixturevalue(tree)
    c = operator_container(objects)
    assert c["command"] == ["clef-operator"]
    args = build_parser().parse_args(c["args"])  # exits (fails) on a flag the CLI does not have
    assert args.command == "run" and args.leader_elect and args.liveness is None
    assert args.all_namespaces or args.namespace
    # /healthz and /metrics are served by the metrics endpoint, in the leader and the standby alike.
    endpoint = urlsplit(f"http://{args.metrics_bind_address}")
    probe = c["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert probe["path"] == "/healthz"
    assert ports[probe["port"]] == endpoint.port
    assert endpoint.hostname == "0.0.0.0", "the kubelet probes and Prometheus scrapes the pod IP"
    annotations = find(objects, "Deployment", "clef-operator")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == endpoint.port
    assert annotations["prometheus.io/path"] == "/metrics"


def test_lease_rbac_is_the_one_lease_by_name(base: Objects) -> None:
    role = find(base, "Role", "clef-operator-lease")
    assert role["metadata"]["namespace"] == OPERATOR_NAMESPACE
    assert rule_permissions(role["rules"]) == {
        ("coordination.k8s.io", "leases", v) for v in ("get", "update", "create")
    }
    named = [r for r in role["rules"] if set(r["verbs"]) & {"get", "update"}]
    assert [r.get("resourceNames") for r in named] == [
        [build_parser().parse_args(["run"]).leader_elect_lease_name]
    ]


def _with_component(tmp_path: Path, component: str) -> Objects:
    """kustomize/base plus one optional component, as an overlay would include it."""
    here = tmp_path / "overlay"
    here.mkdir()
    rel = os.path.relpath(BASE.parent, here)
    (here / "kustomization.yaml").write_text(
        f"resources: [{rel}/base]\ncomponents: [{rel}/components/{component}]\n"
    )
    return kustomize_build(require_kubectl(), here)


def test_servicemonitor_component_scrapes_the_metrics_port(base: Objects, tmp_path: Path) -> None:
    objects = _with_component(tmp_path, "servicemonitor")
    assert kinds(objects) == sorted(
        [*kinds(base), ("Service", "clef-operator-metrics"), ("ServiceMonitor", "clef-operator")]
    )
    service = find(objects, "Service", "clef-operator-metrics")
    monitor = find(objects, "ServiceMonitor", "clef-operator")
    pod = find(objects, "Deployment", "clef-operator")["spec"]["template"]
    assert service["metadata"]["namespace"] == monitor["metadata"]["namespace"] == OPERATOR_NAMESPACE
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    [port] = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [port["name"]]
    assert monitor["spec"]["endpoints"][0]["path"] == pod["metadata"]["annotations"]["prometheus.io/path"]


def test_pdb_component_keeps_one_operator_through_a_drain(base: Objects, tmp_path: Path) -> None:
    objects = _with_component(tmp_path, "pdb")
    pdb = find(objects, "PodDisruptionBudget", "clef-operator")
    deployment = find(objects, "Deployment", "clef-operator")
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert deployment["spec"]["replicas"] - pdb["spec"]["maxUnavailable"] >= 1


def test_rbac_is_least_privilege(base: Objects) -> None:
    granted = granted_to(base, OPERATOR_NAMESPACE, OPERATOR_SA)  # refuses wildcards
    resources = {resource for _, resource, _ in granted}
    assert not resources & {"serviceaccounts", "serviceaccounts/token"}
    # ConfigMaps: the goldens only (listed and watched into the cache, created, deleted when
    # untrusted); never read one by name nor patched; logs only read (endpoint verification:
    # docs/operations.md, "Security").
    cluster_roles = [o for o in base if o["kind"] == "ClusterRole"]
    assert {
        v for role in cluster_roles for _, r, v in rule_permissions(role["rules"]) if r == "configmaps"
    } == {
        "list",
        "watch",
        "create",
        "delete",
    }
    # And the verdict ledger (issue 33): read, created, patched and deleted (with its model) in
    # the operator's own namespace only, where a namespace editor cannot write.
    ledger = find(base, "Role", "clef-verdict-ledger")
    assert ledger["metadata"]["namespace"] == OPERATOR_NAMESPACE
    assert rule_permissions(ledger["rules"]) == {
        ("", "configmaps", "get"),
        ("", "configmaps", "create"),
        ("", "configmaps", "patch"),
        ("", "configmaps", "delete"),
    }
    assert {v for _, r, v in granted if r == "pods/log"} == {"get"}
    # Pods: read, and patched only to add the serving label (clef-operator-serving-label).
    assert {v for _, r, v in granted if r == "pods"} == {"list", "watch", "patch"}
    # Secrets: only the operator's verdict key, read by name, and created on the first start, in
    # the operator's own namespace (issue 13: docs/operations.md, "What clef trusts").
    assert {(g, r, v) for g, r, v in granted if r == "secrets"} == {
        ("", "secrets", "get"),
        ("", "secrets", "create"),
    }
    key_role = find(base, "Role", "clef-verdict-key")
    assert key_role["metadata"]["namespace"] == OPERATOR_NAMESPACE
    gets = [rule for rule in key_role["rules"] if "get" in rule["verbs"]]
    assert [rule.get("resourceNames") for rule in gets] == [["clef-verdict-key"]]
    for role in (o for o in base if o["kind"] == "ClusterRole"):
        assert not any("secrets" in rule["resources"] for rule in role["rules"]), role["metadata"]["name"]
    verbs = {verb for _, _, verb in granted}
    assert not verbs & {"escalate", "bind", "impersonate", "deletecollection", "*"}
    # Only the finalizers subresource is updated (an admission check; see rbac.yaml); nothing
    # else is ever replaced wholesale: clef patches.
    assert {(g, r) for g, r, v in granted if v == "update"} == {
        ("clef.riotpiao.com", "clefmodels/finalizers"),
        ("coordination.k8s.io", "leases"),  # the Lease, by name (test_lease_rbac_is_the_one_lease_by_name)
    }
    # Cluster-scoped access is read-only and limited to nodes (listed and watched into the cache).
    nodes = find(base, "ClusterRole", "clef-operator-nodes")
    assert rule_permissions(nodes["rules"]) == {("", "nodes", "list"), ("", "nodes", "watch")}
    for binding in (o for o in base if o["kind"] == "ClusterRoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": OPERATOR_NAMESPACE}
        ]


def test_rbac_refuses_wildcards() -> None:
    with pytest.raises(ValueError, match="wildcard"):
        rule_permissions([{"apiGroups": [""], "resources": ["*"], "verbs": ["get"]}])


# ------------------------------------------------------------------------------------ homelab


def models(objects: Objects) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClefModel"}


def test_homelab_is_base_plus_the_two_models_in_their_namespace(homelab: Objects) -> None:
    assert set(models(homelab)) == {"clef-flash", "coder"}
    for o in homelab:
        if o["kind"] in ("ClefModel", "Service", "RoleBinding") and o["metadata"]["name"] not in (
            "clef-verdict-key",
            "clef-verdict-ledger",
            "clef-operator-lease",
        ):
            assert o["metadata"]["namespace"] == "homelab", o["metadata"]["name"]
    # Every spec is one the operator accepts (CEL rules are checked by the API server in the
    # cluster tier).
    for model in models(homelab).values():
        ClefModelSpec.model_validate(model["spec"])


def test_homelab_clef_flash_is_the_design_model(homelab: Objects) -> None:
    spec = ClefModelSpec.model_validate(models(homelab)["clef-flash"]["spec"])
    assert (spec.engine.value, spec.gpus, spec.dtype.value, spec.kv_fraction) == (
        "candle-vllm",
        1,
        "f16",
        0.30,
    )
    assert spec.service.name == "clef-serve"
    assert spec.image.startswith("registry.homelab.lan/")
    assert spec.verification.required and spec.verification.suite.value == "kernels"
    arch = spec.model.architecture
    assert (arch.full_attention_layers, arch.num_layers - arch.full_attention_layers) == (8, 24)
    # DESIGN: "about 66.8K KV tokens" on a V100-16GB.
    assert 66_000 < (estimate_kv_cache_tokens(spec, 16384) or 0) < 67_500


def test_homelab_coder_is_two_gpus_tp2_unverified_behind_its_two_port_service(homelab: Objects) -> None:
    spec = ClefModelSpec.model_validate(models(homelab)["coder"]["spec"])
    assert (spec.engine.value, spec.gpus, spec.effective_tensor_parallel, spec.dtype.value) == (
        "vllm",
        2,
        2,
        "f16",
    )
    assert spec.image.startswith("registry.homelab.lan/")
    assert spec.model.architecture.full_attention_interval == 1, "a plain transformer: no GDN layers"
    assert spec.verification.required is False
    assert spec.service.name == "coder-predictor"
    assert spec.service.adopt, "coder-predictor exists before clef: adopting it is opted into"
    svc = find(homelab, "Service", "coder-predictor")
    assert sorted(p["port"] for p in svc["spec"]["ports"]) == [80, 8080]
    assert {p["targetPort"] for p in svc["spec"]["ports"]} == {spec.service.container_port}
    # The selector is the operator's: a Service in Git that set one would be reverted by every sync.
    assert "selector" not in svc["spec"]


def test_homelab_uses_the_namespaced_rbac_variant(homelab: Objects, base: Objects) -> None:
    bindings = {(o["kind"], o["metadata"]["name"]) for o in homelab if o["kind"].endswith("Binding")}
    assert ("ClusterRoleBinding", "clef-operator") not in bindings, (
        "no cluster-wide grant in the namespaced variant"
    )
    rb = find(homelab, "RoleBinding", "clef-operator")
    assert rb["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "clef-operator",
    }
    # The operator watches exactly the namespaces it has a RoleBinding in.
    args = build_parser().parse_args(operator_container(homelab)["args"])
    role_namespaces = {
        o["metadata"]["namespace"]
        for o in homelab
        if o["kind"] == "RoleBinding" and o["roleRef"]["name"] == "clef-operator"
    }
    assert set(args.namespace) == role_namespaces == {"homelab"}
    # Same rules either way.
    assert granted_to(homelab, OPERATOR_NAMESPACE, OPERATOR_SA) == granted_to(
        base, OPERATOR_NAMESPACE, OPERATOR_SA
    )
    assert operator_container(homelab)["image"].startswith("registry.homelab.lan/clef/clef-operator:")


# ------------------------------------------------------------------------------------ demo


def test_demo_is_homelab_with_served_engines_verified_by_endpoint_and_no_in_cluster_operator(
    homelab: Objects, demo: Objects
) -> None:
    assert set(kinds(homelab)) - set(kinds(demo)) == {("Deployment", "clef-operator")}
    table = seed_table()
    for name in ("clef-flash", "coder"):
        spec, user = models(demo)[name]["spec"], models(homelab)[name]["spec"]
        entry = table.lookup(spec["image"])
        assert entry is not None and entry.kind == "serve", (
            f"{spec['image']} must be a serve image in the table"
        )
        assert (entry.dialect, entry.fault, entry.failure) == (spec["engine"], None, None), entry
        verification = spec["verification"]
        assert verification["mode"] == "endpoint", verification
        endpoint = verification["endpoint"]
        # Small enough for the CPU: one short prompt, a few tokens, no built-in prompt set.
        assert endpoint["builtinPrompts"] == "none" and len(endpoint["prompts"]) == 1, endpoint
        assert endpoint["maxNewTokens"] <= 8, endpoint
        # Nothing else differs from what the user's Git holds (the demo sets the hostPaths on top).
        assert {**spec, "image": user["image"], "verification": user["verification"]} == user


def test_demo_upgrade_images_mean_what_the_demo_says() -> None:
    from clef_devcluster.demo import story

    table = seed_table()
    bad = table.lookup(story.BROKEN_IMAGE)
    fixed = table.lookup(story.FIXED_IMAGE)
    assert bad is not None and (bad.kind, bad.dialect, bad.fault) == (
        "serve",
        "candle-vllm",
        "conv_key_band_zero",
    )
    assert fixed is not None and (fixed.kind, fixed.dialect, fixed.fault, fixed.failure) == (
        "serve",
        "candle-vllm",
        None,
        None,
    )


def test_kustomize_files_have_no_floating_image_tags() -> None:
    for path in sorted(Path(BASE).parent.rglob("*.yaml")):
        if path.name == "clefmodel-crd.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            for image in _images(doc):
                assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), f"{path}: {image}"


def _images(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [v for k, v in node.items() if k == "image" and isinstance(v, str)]
        return found + [i for v in node.values() for i in _images(v)]
    if isinstance(node, list):
        return [i for v in node for i in _images(v)]
    return []
