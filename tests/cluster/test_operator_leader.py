"""Two operators, one Lease: the standby takes over when the leader stops renewing, and a leader
that was paused never writes again when it resumes (split brain).

Both run on this host with kustomize/base's RBAC, each with its own identity, which it puts in its
User-Agent: the API server's audit log (manifests/audit-policy.yaml logs the ServiceAccounts of
clef-system) then says which process made each request.  op-a runs as a second ServiceAccount
bound to the same roles, so that the test can take its access to the Lease away: a partition
between op-a and the Lease alone.  Short durations keep it quick: lease 8 s, renew deadline 5 s,
retry 1 s.

1. op-a leads (it started first), op-b stands by; a ClefModel is served.
2. SIGSTOP op-a.  The model is changed.  op-b takes the Lease no sooner than a lease duration
   after op-a's last renew, and rolls the change out.  The failover time is printed.
3. SIGSTOP op-b (so that nobody else acts on what follows), change the model again, take op-a's
   access to the Lease away, SIGCONT op-a: it cannot learn that it lost the Lease, its renew
   deadline has passed, and a change waits for it.  Its writes are refused (it counts them:
   clef_reconcile_errors_total{kind="fenced"}) and the audit log shows none after it resumed.
   Without the fence it would roll the change out (checked once by disabling it).
4. Give op-a its access back: it reads the Lease, finds op-b's name in it and exits
   (EXIT_LOST_LEASE).  SIGCONT op-b: it still holds the Lease and rolls out the second change.
"""

from __future__ import annotations

import json
import pwd
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from kubernetes import client
from kubernetes import config as kubernetes_config

from clef_devcluster.host_operator import (
    IMAGE_UID,
    OPERATOR_NAMESPACE,
    OPERATOR_SA,
    service_account_kubeconfig,
)
from clef_devcluster.kustomize import BASE, kustomize_build
from clef_operator.manager.leader import EXIT_LOST_LEASE, LEASE_NAME

from .conftest import Cluster, missing_prerequisite, wait_for
from .holding_proxy import HoldingProxy, holding_proxy
from .operator_support import (
    ElectedOperator,
    Models,
    clefmodel,
    delete_lease,
    delete_models,
    lease_holder,
    metric,
)

pytestmark = pytest.mark.cluster
DURATIONS = [
    "--leader-elect-lease-duration=8",
    "--leader-elect-renew-deadline=5",
    "--leader-elect-retry-period=1",
]
LEASE_SECONDS, RETRY_SECONDS = 8.0, 1.0
WRITES = {"create", "update", "patch", "delete", "deletecollection"}


PEER = "clef-operator-peer"


@dataclass
class Rbac:
    """kubeconfigs for the operator's ServiceAccount and for its peer, and the peer's Lease grant."""

    operator: Path
    peer: Path
    peer_lease_binding: dict[str, Any]


def _apply(cluster: Cluster, objects: list[dict[str, Any]], path: Path) -> bool:
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    argv = [cluster.kubectl or "kubectl", "--kubeconfig", str(cluster.kubeconfig)]
    return (
        subprocess.run(
            [*argv, "apply", "--server-side", "--force-conflicts", "-f", str(path)], capture_output=True
        ).returncode
        == 0
    )


def _as_peer(o: dict[str, Any]) -> dict[str, Any]:
    peer = json.loads(json.dumps(o))
    peer["metadata"] = {k: v for k, v in peer["metadata"].items() if k in ("name", "namespace", "labels")}
    peer["metadata"]["name"] += "-peer"
    peer["subjects"] = [{"kind": "ServiceAccount", "name": PEER, "namespace": OPERATOR_NAMESPACE}]
    return peer


def _stand_in_pod(name: str, service_account: str) -> dict[str, Any]:
    """A pod object that never runs (a scheduling gate nobody lifts), for a token to be bound to:
    the process on this host then carries a projected token's claims, its pod's name included."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": OPERATOR_NAMESPACE},
        "spec": {
            "serviceAccountName": service_account,
            "schedulingGates": [{"name": "clef.riotpiao.com/never-scheduled"}],
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "operator",
                    "image": "clef-operator:never-run",
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


def _pod_uid(cluster: Cluster, name: str) -> str:
    return str(client.CoreV1Api(cluster.api).read_namespaced_pod(name, OPERATOR_NAMESPACE).metadata.uid)


@pytest.fixture(scope="module")
def rbac(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rbac]:
    """kustomize/base's namespace, ServiceAccount, RBAC and admission policies (not its
    Deployment), applied as a user would and left in place (test_shipping applies and removes the
    whole base), and a peer ServiceAccount bound to the same roles (removed afterwards).  Each
    process's token is bound to a pod named as its identity (op-a as the peer, op-b as the
    operator), as a replica's projected token is bound to its pod: the fence policy tells the
    replicas apart by it."""
    if cluster.local is None or cluster.kubectl is None:
        missing_prerequisite(
            "needs the local cluster's API server audit log (runs on the local cluster: unset CLEF_KUBECONFIG)"
        )
    kinds = {
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    }  # fmt: skip
    objects = [o for o in kustomize_build(cluster.kubectl, BASE) if o["kind"] in kinds]
    bindings = [_as_peer(o) for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    sa = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": PEER, "namespace": OPERATOR_NAMESPACE},
    }
    pods = [_stand_in_pod("op-a", PEER), _stand_in_pod("op-b", OPERATOR_SA)]
    peer_objects = [sa, *bindings, *pods]
    where = tmp_path_factory.mktemp("rbac")
    # A namespace still terminating from an earlier run refuses objects for a while.
    wait_for(lambda: _apply(cluster, objects + peer_objects, where / "rbac.json"), 60, "the RBAC applied")
    try:
        yield Rbac(
            operator=service_account_kubeconfig(
                cluster.kubeconfig, OPERATOR_NAMESPACE, OPERATOR_SA, where / "operator.kubeconfig", 3600,
                pod=("op-b", _pod_uid(cluster, "op-b")),
            ),
            peer=service_account_kubeconfig(
                cluster.kubeconfig, OPERATOR_NAMESPACE, PEER, where / "peer.kubeconfig", 3600,
                pod=("op-a", _pod_uid(cluster, "op-a")),
            ),
            peer_lease_binding=next(b for b in bindings if b["roleRef"]["name"] == "clef-operator-lease"),
        )  # fmt: skip
    finally:
        for o in reversed(peer_objects):
            ns = o["metadata"].get("namespace")
            argv = [cluster.kubectl, "--kubeconfig", str(cluster.kubeconfig), "delete", o["kind"].lower()]
            subprocess.run(
                [*argv, o["metadata"]["name"], *(["-n", ns] if ns else []), "--ignore-not-found"],
                capture_output=True,
            )


def _may_read_lease(cluster: Cluster, user: str) -> bool:
    argv = [cluster.kubectl or "kubectl", "--kubeconfig", str(cluster.kubeconfig), f"--as={user}"]
    out = subprocess.run(
        [*argv, "auth", "can-i", "get", f"leases/{LEASE_NAME}", "-n", OPERATOR_NAMESPACE],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() == "yes"


@contextmanager
def _elected_pair(
    cluster: Cluster, namespace: str, rbac: Rbac, tmp_path: Path, a_kubeconfig: Path
) -> Iterator[tuple[ElectedOperator, ElectedOperator]]:
    """op-a (the peer, through `a_kubeconfig`) takes the Lease, then op-b stands by."""
    delete_lease(cluster)
    started: list[ElectedOperator] = []

    def start(identity: str, kubeconfig: Path) -> ElectedOperator:
        op = ElectedOperator(
            kubeconfig, ["--namespace", namespace, *DURATIONS], tmp_path / f"{identity}.log", identity
        )
        started.append(op)
        return op

    try:
        a = start("op-a", a_kubeconfig)
        wait_for(lambda: lease_holder(cluster) == "op-a", 60, "op-a to take the Lease", a.tail)
        b = start("op-b", rbac.operator)
        wait_for(b.healthy, 60, "op-b's /healthz", b.tail)
        # The standby's own check: the API server refuses its (dry-run) writes while op-a leads.
        wait_for(
            lambda: metric(b.metrics(), "clef_fence_in_force") == 1,
            3 * LEASE_SECONDS,
            "op-b to find the fence in force (clef_fence_in_force 1)",
            b.tail,
        )
        yield a, b
    finally:
        _apply(cluster, [rbac.peer_lease_binding], tmp_path / "binding.json")
        for op in started:
            if op.proc.poll() is None:
                op.signal(signal.SIGCONT)
        delete_models(cluster, namespace)
        for op in started:
            op.stop()
        delete_lease(cluster)


@pytest.fixture
def pair(
    cluster: Cluster, namespace: str, rbac: Rbac, tmp_path: Path
) -> Iterator[tuple[ElectedOperator, ElectedOperator]]:
    with _elected_pair(cluster, namespace, rbac, tmp_path, rbac.peer) as both:
        yield both


def _audited(audit: Path, offset: int, identity: str, since: datetime) -> list[dict[str, Any]]:
    """The requests that the process `identity` made from `since` on (its User-Agent names it)."""
    out = []
    with audit.open() as f:
        f.seek(offset)
        for line in f:
            event = json.loads(line)
            if f"({identity})" not in event.get("userAgent", "") or event.get("stage") not in (
                "ResponseStarted",
                "ResponseComplete",
            ):
                continue
            received = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
            if received >= since:
                out.append(event)
    return out


def _writes(events: list[dict[str, Any]]) -> list[str]:
    """The writes among `events` that the API server did not refuse.  A refused request changes
    nothing: a resumed leader cut off from the Lease (its RoleBinding deleted) may still try to
    renew it, and the API server answers that 403 (seen on 2026-12-07: the renew went out as an
    update of the Lease it held before it froze).  A write without a status counts."""
    return sorted(
        {
            f"{e['verb']} {e.get('requestURI', '')}"
            for e in events
            if e["verb"] in WRITES and e.get("responseStatus", {}).get("code", 0) < 400
        }
    )


def test_standby_takes_over_and_a_resumed_leader_writes_nothing(
    cluster: Cluster,
    namespace: str,
    rbac: Rbac,
    pair: tuple[ElectedOperator, ElectedOperator],
    tmp_path: Path,
) -> None:
    a, b = pair
    assert cluster.local is not None
    audit = cluster.local.audit_log
    offset = audit.stat().st_size
    models = Models(cluster, namespace)
    name = "leader"
    models.create(clefmodel(name, verification={"required": False}))
    models.wait_condition(name, "Ready", "True", "Available", timeout=120)
    first = models.get(name)["status"]["activeRevision"]
    assert (metric(a.metrics(), "clef_operator_leader"), metric(b.metrics(), "clef_operator_leader")) == (
        1,
        0,
    )

    # 2. The leader freezes; the standby waits out the lease, takes over and acts.
    a.signal(signal.SIGSTOP)
    paused = time.monotonic()
    models.patch(name, {"spec": {"args": ["--max-num-seqs", "8"]}})
    wait_for(lambda: lease_holder(cluster) == "op-b", 60, "op-b to take the Lease", b.tail)
    failover = time.monotonic() - paused
    second = models.wait_status(
        name, lambda s: s.get("activeRevision") not in (None, first), "op-b to roll out the change", 120
    )["activeRevision"]
    reconciled = time.monotonic() - paused
    print(
        f"\nfailover: op-b took the Lease {failover:.1f}s after op-a froze; the change served after {reconciled:.1f}s"
    )
    # A's last renew was at most a retry period before it froze; B waited a full lease from there.
    assert failover >= LEASE_SECONDS - RETRY_SECONDS - 0.5, f"op-b took over after {failover:.1f}s"
    assert metric(b.metrics(), "clef_operator_leader") == 1

    # 3. B freezes too, a change waits, and A resumes cut off from the Lease: it must not act.
    b.signal(signal.SIGSTOP)
    models.patch(name, {"spec": {"args": ["--max-num-seqs", "4"]}})
    binding = rbac.peer_lease_binding["metadata"]
    client.RbacAuthorizationV1Api(cluster.api).delete_namespaced_role_binding(
        binding["name"], binding["namespace"]
    )
    peer = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{PEER}"
    wait_for(lambda: not _may_read_lease(cluster, peer), 30, "op-a's access to the Lease gone")
    resumed = datetime.now(UTC)
    a.signal(signal.SIGCONT)

    def fenced() -> float:
        return metric(a.metrics(), "clef_reconcile_errors_total", kind="fenced")

    wait_for(
        lambda: fenced() >= 1 or _writes(_audited(audit, offset, "op-a", resumed)),
        60,
        "op-a to attempt the change",
        a.tail,
    )
    after_resume = _audited(audit, offset, "op-a", resumed)
    assert not _writes(after_resume), f"op-a wrote after resuming:\n{_writes(after_resume)}\n{a.tail()}"
    assert fenced() >= 1 and a.proc.poll() is None, "its writes were refused; it is still there"
    assert metric(a.metrics(), "clef_operator_leader") == 1, "it has not learnt that it lost the Lease"

    # 4. A reads the Lease again: it finds B there and exits.  B resumes and acts.
    assert _apply(cluster, [rbac.peer_lease_binding], tmp_path / "peer-binding.json")
    try:
        code = a.proc.wait(60)
    except subprocess.TimeoutExpired:
        code = None
    assert code == EXIT_LOST_LEASE, f"op-a once it could read the Lease again: {code}\n{a.tail()}"
    b.signal(signal.SIGCONT)
    models.wait_status(
        name,
        lambda s: s.get("activeRevision") not in (None, first, second),
        "op-b to roll out the second change",
        120,
    )
    assert lease_holder(cluster) == "op-b"
    before_pause = _audited(audit, offset, "op-a", datetime.min.replace(tzinfo=UTC))
    assert _writes(before_pause), (
        "the audit log names op-a's writes while it led (else the check proves nothing)"
    )
    assert not _writes(_audited(audit, offset, "op-a", resumed)), a.tail()
    assert _writes(_audited(audit, offset, "op-b", resumed)), "op-b's writes after it resumed are seen"


def _fenced_out(kubeconfig: Path, namespace: str) -> bool:
    """Whether the fence now refuses a write (a server-side dry run: nothing is stored) made with
    `kubeconfig`'s pod-bound token; any other refusal is an error."""
    api = client.CoreV1Api(kubernetes_config.new_client_from_config(str(kubeconfig)))
    event = {
        "metadata": {"generateName": "fence-probe-", "namespace": namespace},
        "involvedObject": {"kind": "Namespace", "name": namespace, "namespace": namespace},
        "reason": "FenceProbe",
        "message": "a dry run: is this replica fenced out?",
    }
    try:
        api.create_namespaced_event(namespace, event, dry_run="All")
    except client.ApiException as e:
        if e.status == 403 and "clef-operator-fence" in str(e.body):
            return True
        raise
    finally:
        api.api_client.close()
    return False


def _through(proxy: HoldingProxy, kubeconfig: Path, out: Path) -> Path:
    """`kubeconfig` with its server reached through `proxy` (same address, so the same TLS name)."""
    config = yaml.safe_load(kubeconfig.read_text())
    for c in config["clusters"]:
        c["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    out.touch(mode=0o600)
    out.write_text(yaml.safe_dump(config))
    return out


def _upstream(kubeconfig: Path) -> tuple[str, int]:
    url = urlparse(yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"])
    assert url.hostname == "127.0.0.1" and url.port, url
    return url.hostname, url.port


def test_a_write_in_flight_when_the_lease_changes_hands_is_refused(
    cluster: Cluster, namespace: str, rbac: Rbac, tmp_path: Path
) -> None:
    """The write the client's fence cannot stop: checked while op-a led, sent, and delivered only
    after op-b took over (the network held it, or op-a froze between check and send).  op-a talks
    to the API server through a relay that holds every byte op-a sends from the moment a change is
    made; op-a's reconcile writes go into it with its fence open, its renews stall, op-b takes the
    Lease, and then the relay delivers everything (op-a stopped meanwhile, so that what it reads
    back cannot make it exit mid-judgement).  The API server refuses each of op-a's writes
    that arrives after the takeover (kustomize/base/admission.yaml, clef-operator-fence), and at
    least one arrives (else this proves nothing).  Without the policy, the held writes land."""
    assert cluster.local is not None
    audit = cluster.local.audit_log
    offset = audit.stat().st_size
    with (
        holding_proxy(_upstream(rbac.peer)) as proxy,
        _elected_pair(cluster, namespace, rbac, tmp_path, _through(proxy, rbac.peer, tmp_path / "a.kubeconfig"))
        as (a, b),
    ):  # fmt: skip
        models = Models(cluster, namespace)
        name = "inflight"
        models.create(clefmodel(name, verification={"required": False}))
        models.wait_condition(name, "Ready", "True", "Available", timeout=120)

        proxy.hold()
        held_from = datetime.now(UTC)
        models.patch(name, {"spec": {"args": ["--max-num-seqs", "8"]}})
        wait_for(lambda: lease_holder(cluster) == "op-b", 60, "op-b to take the Lease", b.tail)
        lease: Any = client.CoordinationV1Api(cluster.api).read_namespaced_lease(
            LEASE_NAME, OPERATOR_NAMESPACE
        )
        took_over = lease.spec.acquire_time
        # The fence reads the Lease from the API server's informer cache, a few ms to ~100 ms behind
        # etcd under load (docs/operations.md, "Running two replicas"): deliver once it has seen
        # the takeover, as a write held for longer than that window would arrive.
        read_at = time.monotonic()
        wait_for(
            lambda: _fenced_out(rbac.peer, namespace),
            30,
            "the fence to see op-b's Lease (never: its Lease informer is frozen, as after a deleted"
            " binding, kubernetes/kubernetes#130887)",
            b.tail,
        )
        fence_lag = time.monotonic() - read_at
        held = proxy.held_bytes
        # op-a stopped while its held bytes go through: else the Lease read among them can tell it
        # that it lost, and its exit closes the connection of a write the API server is still
        # judging (a 504 "context canceled" that neither lands nor meets the fence)
        a.signal(signal.SIGSTOP)
        proxy.release()

        def late_writes() -> list[dict[str, Any]]:
            return [
                e for e in _audited(audit, offset, "op-a", took_over)
                if e["verb"] in WRITES and e.get("stage") == "ResponseComplete"
            ]  # fmt: skip

        def late_object_writes() -> list[dict[str, Any]]:
            # op-a's writes of the objects it reconciles: a held renew of the Lease loses on the
            # Lease's resourceVersion, not to the fence
            return [e for e in late_writes() if "/leases/" not in e.get("requestURI", "")]

        wait_for(late_object_writes, 60, f"op-a's held writes to arrive ({held} bytes held)", a.tail)
        landed = [  # the Lease's among them: a renew landing now would take op-b's Lease back
            f"{e['verb']} {e['requestURI']} -> {e['responseStatus'].get('code')}"
            for e in late_writes()
            if e["responseStatus"].get("code", 0) < 400
        ]
        assert not landed, f"op-a's writes landed after op-b took the Lease at {took_over}:\n" + "\n".join(
            landed
        )
        refused = [e["responseStatus"].get("message", "") for e in late_object_writes()]
        assert all("clef-operator-fence" in m for m in refused), refused
        print(
            f"\nin flight: {held} bytes held from {held_from:%H:%M:%S.%f}; op-b took over at {took_over};"
            f" the fence saw it {fence_lag * 1000:.0f} ms after the Lease read;"
            f" {len(refused)} of op-a's writes arrived after it and were refused"
        )
        a.signal(signal.SIGCONT)
        # op-a's held renew arrives too, and loses: it learns that it lost the Lease and exits.
        try:
            code = a.proc.wait(60)
        except subprocess.TimeoutExpired:
            code = None
        assert code == EXIT_LOST_LEASE, f"op-a after its held renew: {code}\n{a.tail()}"
        models.wait_status(
            name, lambda st: st.get("observedGeneration") == models.get(name)["metadata"]["generation"],
            "op-b to reconcile the change", 120,
        )  # fmt: skip


def test_the_operator_starts_as_a_uid_with_no_passwd_entry(
    cluster: Cluster, namespace: str, rbac: Rbac, tmp_path: Path
) -> None:
    """The operator image runs as 65532, a UID no passwd entry names, with HOME=/tmp and no USER:
    kopf's own fallback identity (getpass.getuser()) raised KeyError there and the pod crash-looped
    on start, which no tier saw while each ran the operator as this host's root.  Here it starts as
    that UID, elects itself, serves /healthz and reconciles a model to Ready."""
    with pytest.raises(KeyError):
        pwd.getpwuid(IMAGE_UID)  # else this host names the UID, and the start below proves nothing
    delete_lease(cluster)
    op = ElectedOperator(
        rbac.operator,
        ["--namespace", namespace, *DURATIONS],
        tmp_path / "image-uid.log",
        "op-b_uid",
        IMAGE_UID,
    )
    try:
        wait_for(lambda: lease_holder(cluster) == "op-b_uid" or op.proc.poll() is not None, 60,
                 "the operator to take the Lease", op.tail)  # fmt: skip
        assert op.proc.poll() is None, f"the operator exited ({op.proc.returncode}):\n{op.tail()}"
        wait_for(op.healthy, 60, "the operator's /healthz", op.tail)
        models = Models(cluster, namespace)
        models.create(clefmodel("uid", verification={"required": False}))
        models.wait_condition("uid", "Ready", "True", "Available", timeout=120)
        assert "getpwuid" not in op.log.read_text(errors="replace"), op.tail()
    finally:
        delete_models(cluster, namespace)
        op.stop()
        delete_lease(cluster)
