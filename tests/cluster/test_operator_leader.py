"""Two operators, one Lease: the standby takes over when the leader stops renewing, and a leader
that was paused never writes again when it resumes (split brain).

Both run on this host as the ServiceAccount clef-system/clef-operator (kustomize/base's RBAC),
each with its own identity, which it puts in its User-Agent: the API server's audit log
(manifests/audit-policy.yaml logs that ServiceAccount's requests) then says which process made
each request.  Short durations keep it quick: lease 8 s, renew deadline 5 s, retry 1 s.

1. A leads (it started first), B stands by; a ClefModel is served.
2. SIGSTOP A.  The model is changed.  B takes the Lease no sooner than a lease duration after A's
   last renew, and rolls the change out.  The failover time is printed.
3. SIGSTOP B (so that nothing else acts), change the model again, SIGCONT A: A finds the Lease
   held by B and exits (EXIT_LOST_LEASE); in the audit log it made no write after resuming,
   although a change was waiting for it.  SIGCONT B: it still holds the Lease and rolls out the
   second change.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from clef_devcluster.host_operator import OPERATOR_NAMESPACE, OPERATOR_SA, service_account_kubeconfig
from clef_devcluster.kustomize import BASE, kustomize_build
from clef_operator.leader import EXIT_LOST_LEASE

from .conftest import Cluster, missing_prerequisite, wait_for
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


@pytest.fixture(scope="module")
def operator_rbac(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kustomize/base's namespace, ServiceAccount and RBAC (not its Deployment), applied as a user
    would; left in place (test_shipping applies and removes the whole base).  Returns a kubeconfig
    for the ServiceAccount."""
    if cluster.local is None or cluster.kubectl is None:
        missing_prerequisite(
            "needs the local cluster's API server audit log (runs on the local cluster: unset CLEF_KUBECONFIG)"
        )
    kinds = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    objects = [o for o in kustomize_build(cluster.kubectl, BASE) if o["kind"] in kinds]
    manifest = tmp_path_factory.mktemp("rbac") / "rbac.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))

    def applied() -> bool:  # a namespace still terminating from an earlier run refuses objects
        out = subprocess.run(
            [
                cluster.kubectl or "",
                "--kubeconfig",
                str(cluster.kubeconfig),
                "apply",
                "--server-side",
                "-f",
                str(manifest),
            ],
            capture_output=True,
            text=True,
        )
        return out.returncode == 0

    wait_for(applied, 60, "kustomize/base's RBAC applied")
    return service_account_kubeconfig(
        cluster.kubeconfig, OPERATOR_NAMESPACE, OPERATOR_SA, manifest.parent / "operator.kubeconfig", 3600
    )


@pytest.fixture
def pair(
    cluster: Cluster, namespace: str, operator_rbac: Path, tmp_path: Path
) -> Iterator[tuple[ElectedOperator, ElectedOperator]]:
    delete_lease(cluster)
    started: list[ElectedOperator] = []

    def start(identity: str) -> ElectedOperator:
        op = ElectedOperator(
            operator_rbac, ["--namespace", namespace, *DURATIONS], tmp_path / f"{identity}.log", identity
        )
        started.append(op)
        return op

    try:
        a = start("op-a")
        wait_for(lambda: lease_holder(cluster) == "op-a", 60, "op-a to take the Lease", a.tail)
        b = start("op-b")
        wait_for(b.healthy, 60, "op-b's /healthz", b.tail)
        yield a, b
    finally:
        for op in started:
            if op.proc.poll() is None:
                op.signal(signal.SIGCONT)
        delete_models(cluster, namespace)
        for op in started:
            op.stop()
        delete_lease(cluster)


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
    return sorted({f"{e['verb']} {e.get('requestURI', '')}" for e in events if e["verb"] in WRITES})


def test_standby_takes_over_and_a_resumed_leader_writes_nothing(
    cluster: Cluster, namespace: str, pair: tuple[ElectedOperator, ElectedOperator]
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

    # 3. B freezes too, a change waits, and A resumes: it must not act on it.
    b.signal(signal.SIGSTOP)
    models.patch(name, {"spec": {"args": ["--max-num-seqs", "4"]}})
    resumed = datetime.now(UTC)
    a.signal(signal.SIGCONT)
    try:
        code = a.proc.wait(60)
    except subprocess.TimeoutExpired:
        code = None
    b.signal(signal.SIGCONT)
    third = models.wait_status(
        name,
        lambda s: s.get("activeRevision") not in (None, first, second),
        "op-b to roll out the second change",
        120,
    )["activeRevision"]

    before_pause = _audited(audit, offset, "op-a", datetime.min.replace(tzinfo=UTC))
    assert _writes(before_pause), (
        "the audit log names op-a's writes while it led (else the check below proves nothing)"
    )
    after_resume = _audited(audit, offset, "op-a", resumed)
    assert not _writes(after_resume), f"op-a wrote after resuming:\n{_writes(after_resume)}\n{a.tail()}"
    assert _writes(_audited(audit, offset, "op-b", resumed)), "op-b's writes after it resumed are seen"
    assert code == EXIT_LOST_LEASE, f"op-a after resuming: {code}\n{a.tail()}"
    assert lease_holder(cluster) == "op-b"
    assert third != second
