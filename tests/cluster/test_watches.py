"""The gap-free watch (watches.py) that the "never happened" checks rest on sees what a poll cannot:
a state that lasted only between two API calls, and an object created and deleted at once.  If
these fail, "the Service never had zero endpoints" and "no Job was created" prove nothing."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from .conftest import Cluster, wait_for
from .objects import RUNTIME_IMAGE, python_command, verification_job
from .operator_support import EndpointWatch
from .watches import GaplessWatch

pytestmark = pytest.mark.cluster

SERVICE = "watched"


def endpoint_slice(ready: bool) -> client.V1EndpointSlice:
    return client.V1EndpointSlice(
        metadata=client.V1ObjectMeta(name=f"{SERVICE}-a", labels={"kubernetes.io/service-name": SERVICE}),
        address_type="IPv4",
        endpoints=[
            client.V1Endpoint(addresses=["10.0.0.1"], conditions=client.V1EndpointConditions(ready=ready))
        ],
    )


def test_endpoint_watch_sees_a_gap_that_lasted_two_api_calls(cluster: Cluster, namespace: str) -> None:
    discovery = client.DiscoveryV1Api(cluster.api)
    discovery.create_namespaced_endpoint_slice(namespace, endpoint_slice(ready=True))
    with EndpointWatch(cluster, namespace, SERVICE) as endpoints:
        # Not ready for as long as it takes to send the next request: no poll would see it.
        discovery.replace_namespaced_endpoint_slice(f"{SERVICE}-a", namespace, endpoint_slice(ready=False))
        discovery.replace_namespaced_endpoint_slice(f"{SERVICE}-a", namespace, endpoint_slice(ready=True))
        _wait_for_changes(endpoints.watch, 2)
    assert endpoints.counts == [1, 0, 1], endpoints.counts


def test_job_watch_sees_a_job_that_no_longer_exists(cluster: Cluster, namespace: str) -> None:
    job = verification_job("fleeting", RUNTIME_IMAGE, python_command("pass"))
    with GaplessWatch(cluster.batch.list_namespaced_job, namespace) as jobs:
        cluster.batch.create_namespaced_job(namespace, job)
        cluster.batch.delete_namespaced_job("fleeting", namespace, propagation_policy="Background")
        # Gone again: comparing a list before with a list after (the old check) sees nothing.
        wait_for(lambda: not cluster.batch.list_namespaced_job(namespace).items, 60, "the Job gone")
    assert [c.type for c in jobs.changes][:1] == ["ADDED"], [(c.type, c.name) for c in jobs.changes]
    assert jobs.initial == []


def test_caught_up_holds_every_change_a_list_already_shows(cluster: Cluster, namespace: str) -> None:
    # The watch lags the API server: a change the create call has returned from (or a list
    # already shows) may not have arrived yet.  caught_up() waits for it; snapshot() need not.
    cluster.batch.create_namespaced_job(
        namespace, verification_job("before", RUNTIME_IMAGE, python_command("pass"))
    )
    with GaplessWatch(cluster.batch.list_namespaced_job, namespace) as jobs:
        cluster.batch.create_namespaced_job(
            namespace, verification_job("after", RUNTIME_IMAGE, python_command("pass"))
        )
        assert ("ADDED", "after") in [(c.type, c.name) for c in jobs.caught_up()]
        cluster.batch.delete_namespaced_job("before", namespace, propagation_policy="Background")
        wait_for(lambda: "before" not in {j.metadata.name for j in cluster.batch.list_namespaced_job(namespace).items},
                 60, "the Job gone from a list")  # fmt: skip
        assert ("DELETED", "before") in [(c.type, c.name) for c in jobs.caught_up()]


def test_a_watch_the_server_refuses_fails_instead_of_relisting(cluster: Cluster, namespace: str) -> None:
    # The server refuses a watch it cannot serve: 410 Gone for a resourceVersion compacted away
    # (which a young cluster, not compacted yet, still serves), 400 for one that is no version at
    # all, which stands in for it here.  Either way the test must fail; a re-list would hide the gap.
    broken = GaplessWatch(cluster.batch.list_namespaced_job, namespace)
    broken.start(from_version="not-a-version")
    try:
        wait_for(lambda: broken.errors, 30, "the watch to fail")
    finally:
        broken.stop()
    with pytest.raises(AssertionError, match="broke"):
        broken.check()


def _wait_for_changes(w: GaplessWatch, n: int) -> Any:
    return wait_for(lambda: len(w.snapshot()) >= n, 30, f"{n} watch events", lambda: w.snapshot())
