"""Probes of the serving revision end to end (issue 37): `flash` is verified and served from two
pods of a candle-vllm image whose engine answers its first FAULT_AFTER generation requests right
and every later one with the key-band fault (a GPU that goes bad while it serves: the runner's
`clef-runtime serve --fault-after`).  The comparison asks the promoted preview pod two prompts,
its first probe two more: its second probe, one interval later, is answered wrongly, while the
other pod (two probes, four requests) stays right.

In file order: the probe catches the bad pod within one interval and policy alert only reports
it (the pod keeps the serving label, watched without gaps); switched to cordon-pod, exactly that
pod leaves the serving label's selector and the other keeps serving; no probe went through a
Service: every probe Job asked one pod at its own address, and each pod's engine counted exactly
the requests of its own probes (runner pods have loopback IPs, so the selector is watched rather
than EndpointSlices).  The operator's /metrics agree with the probe Jobs at each step: a last-pass
series per serving pod at its newest passed probe's completion time (none for the cordoned pod),
each finished probe timed once, each failed one counted once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from clef_devcluster.checkpoints import write_chat_checkpoint
from clef_devcluster.config import ENGINE_IMAGE_PREFIX
from clef_devcluster.images import put_image
from clef_devcluster.procs import free_port

from .conftest import Cluster, wait_for
from .operator_support import (
    VERIFY_SECONDS,
    Models,
    OperatorProcess,
    delete_models,
    endpoint_model,
    metric,
    scrape,
)
from .watches import GaplessWatch, states

pytestmark = pytest.mark.cluster

ENGINE = f"{ENGINE_IMAGE_PREFIX}candle-vllm"
GOES_BAD = f"{ENGINE}:0.8.4-goes-bad"
NAME = "flash"
# Each probe asks both prompts (test_endpoint_mode shows the fault moves at least one of them).
# The comparison's two requests and the first probe's two are answered right, the fifth on is
# not: only the promoted preview pod gets that far by its second probe (the other pod, by its
# third, an interval later than this story needs).
PER_PROBE = 2
FAULT_AFTER = 4
# spec.verification.watch.intervalSeconds, also each probe Job's deadline: twice the least the
# field admits (60), since a probe (a process that imports torch) took ~41 s alone on a 2-core host
# and over 60 s beside the runtime tier, where every probe then timed out and none judged
INTERVAL = 120
PROBE_STEP = "clef.riotpiao.com/verification-step=probe"
POD_UID = "clef.riotpiao.com/probe-pod-uid"
SERVING_LABEL = "clef.riotpiao.com/model"


@dataclass
class Story:
    cluster: Cluster
    namespace: str
    models: Models
    operator: OperatorProcess
    checkpoint: Path
    # The pods a Service of the user's own selecting on the serving label would select.
    selected: GaplessWatch
    # Every probe Job, also those the operator deleted once a newer probe finished.
    probes: GaplessWatch
    metrics_port: int

    def serving_pods(self) -> list[client.V1Pod]:
        return list(
            self.cluster.core.list_namespaced_pod(
                self.namespace, label_selector="clef.riotpiao.com/component=serving"
            ).items
        )

    def selected_states(self) -> list[set[str]]:
        return [set(s) for s in states(self.selected.initial, self.selected.snapshot())]


def flash(checkpoint: Path, image: str, policy: str = "alert") -> dict[str, Any]:
    body = endpoint_model(NAME, checkpoint, image, 60, replicas=2)
    body["spec"]["verification"]["watch"] = {
        "intervalSeconds": INTERVAL,
        "prompts": PER_PROBE,
        "policy": policy,
    }
    return body


@pytest.fixture(scope="module")
def story(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    cluster.image_table()  # a missing harness runner is a stated skip
    root = tmp_path_factory.mktemp("watch")
    checkpoint = write_chat_checkpoint(root / "clef-flash")
    namespace = f"t-watch-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    port = free_port()
    operator = OperatorProcess(
        cluster.kubeconfig, namespace, root / "operator.log", [f"--metrics-bind-address=127.0.0.1:{port}"]
    )
    models = Models(cluster, namespace, operator)
    selected = GaplessWatch(
        cluster.core.list_namespaced_pod, namespace, label_selector=f"{SERVING_LABEL}={NAME}"
    )
    probes = GaplessWatch(cluster.batch.list_namespaced_job, namespace, label_selector=PROBE_STEP)
    operator.start()
    try:
        with selected, probes:
            yield Story(cluster, namespace, models, operator, checkpoint, selected, probes, port)
    finally:
        delete_models(cluster, namespace)
        operator.stop()
        cluster.core.delete_namespace(namespace)


def _probe_counts(story: Story) -> dict[str, int]:
    """Finished probes per pod UID, over every probe Job the namespace had."""
    done: dict[str, str] = {}
    for change in story.probes.caught_up():
        job = change.obj
        conditions = {c.type: c.status for c in (job.status.conditions or [])} if job.status else {}
        if conditions.get("Complete") == "True" or conditions.get("Failed") == "True":
            done[job.metadata.name] = job.metadata.annotations[POD_UID]
    counts: dict[str, int] = {}
    for uid in done.values():
        counts[uid] = counts.get(uid, 0) + 1
    return counts


def _probe_metrics(story: Story, serving: set[str]) -> None:
    """The operator's probe metrics agree with every probe Job the namespace had (the operator
    ran from before the first probe, so it counted each): waited for, as a pass records them just
    after the probe Job's watch event.  `serving`: the pods that should have a last-pass series."""
    jobs: dict[str, Any] = {}
    names = {p.metadata.uid: p.metadata.name for p in story.serving_pods()}

    def expected() -> dict[str, Any]:
        jobs.clear()
        for change in story.probes.snapshot():
            jobs[change.obj.metadata.name] = change.obj
        done = {"Complete": 0, "Failed": 0}
        last: dict[str, float] = {}
        for job in jobs.values():
            conditions = {c.type: c.status for c in (job.status.conditions or [])} if job.status else {}
            for kind in done:
                done[kind] += conditions.get(kind) == "True"
            pod = names.get(job.metadata.annotations[POD_UID], "")
            if conditions.get("Complete") == "True" and pod in serving:
                last[pod] = max(last.get(pod, 0.0), job.status.completion_time.timestamp())
        return {"timed": done["Complete"] + done["Failed"], "failed": done["Failed"], "last pass": last}

    def scraped() -> dict[str, Any]:
        samples = scrape(story.metrics_port, story.operator.tail)
        mine = {"namespace": story.namespace, "model": NAME}
        return {
            "timed": metric(samples, "clef_probe_duration_seconds_count"),
            "failed": metric(samples, "clef_probe_failures_total", **mine),
            "last pass": {
                dict(ls)["pod"]: v
                for (n, ls), v in samples.items()
                if n == "clef_probe_last_pass_timestamp_seconds" and set(mine.items()) <= ls
            },
        }

    wait_for(lambda: expected() == scraped(), 30, "/metrics to agree with the probe Jobs",
             lambda: f"Jobs say {expected()}, /metrics say {scraped()}")  # fmt: skip
    agreed = expected()
    print(f"probe metrics agree with the Jobs: {agreed}")
    assert set(agreed["last pass"]) == serving, "every serving pod passed a probe"


def _first_failed_probe(story: Story, pod_uid: str) -> tuple[Any, Any] | None:
    """(the pod's first probe Job, its first failed one), once a probe Job of it has failed."""
    jobs: dict[str, Any] = {}
    for change in story.probes.caught_up():
        if change.obj.metadata.annotations[POD_UID] == pod_uid:
            jobs[change.obj.metadata.name] = change.obj
    ordered = sorted(jobs.values(), key=lambda j: j.metadata.creation_timestamp)
    failed = [
        j for j in ordered
        if j.status and any(c.type == "Failed" and c.status == "True" for c in j.status.conditions or [])
    ]  # fmt: skip
    return (ordered[0], failed[0]) if failed else None


def test_a_pod_that_goes_bad_is_caught_within_one_interval_and_alert_only_reports(story: Story) -> None:
    models = story.models
    entry = put_image(story.cluster.core, GOES_BAD, "serve", dialect="candle-vllm",
                      fault="conv_key_band_zero", fault_after=FAULT_AFTER)  # fmt: skip
    pinned = f"{ENGINE}@sha256:{entry.digest}"
    models.create(flash(story.checkpoint, pinned))
    models.wait_condition(NAME, "Ready", "True", "Available", timeout=VERIFY_SECONDS)
    consistent = models.wait_condition(NAME, "Serving", "True", "Consistent", timeout=INTERVAL)
    passed_at = time.monotonic()
    print(f"first probes: {consistent['message']}")
    pods = {p.metadata.name: p for p in story.serving_pods()}
    assert len(pods) == 2, list(pods)
    # Caught by the bad pod's next probe, one interval after the passing one (waited for one
    # interval more: the probe's own run, up to its deadline).
    found = models.wait_condition(NAME, "Serving", "False", "ProbeMismatch", timeout=2 * INTERVAL + 30)
    print(f"caught {time.monotonic() - passed_at:.0f}s after the passing probe: {found['message']}")
    bad = next(name for name in pods if f"pod {name} on node" in found["message"])
    good = next(name for name in pods if name != bad)
    first, failed = wait_for(lambda: _first_failed_probe(story, pods[bad].metadata.uid), 30,
                             f"a failed probe Job of {bad}")  # fmt: skip
    assert failed.metadata.name != first.metadata.name, "the first probe passed"
    gap = (failed.metadata.creation_timestamp - first.metadata.creation_timestamp).total_seconds()
    assert gap <= INTERVAL + 5, f"the failing probe started {gap:.0f}s after the first, not one interval"
    assert pods[bad].spec.node_name in found["message"]
    assert "expected id" in found["message"] and "the engine said" in found["message"]
    assert f"pod {good} " not in found["message"]
    models.wait_events(NAME, "ProbeFailed")
    # Alert: reported, and the pod kept the serving label through every pass until now.
    assert all({bad, good} <= s for s in story.selected_states()[-1:]), "both pods still selected"
    first = next(i for i, s in enumerate(story.selected_states()) if {bad, good} <= s)
    assert all({bad, good} <= s for s in story.selected_states()[first:]), "alert never removed a pod"
    # Both still serve: the bad pod's series stays at its last passed probe.
    _probe_metrics(story, {bad, good})


def test_cordon_pod_removes_exactly_the_bad_pod_from_the_selector(story: Story) -> None:
    models = story.models
    before = len(story.selected.snapshot())
    bad_message = models.condition(NAME, "Serving")["message"]
    pods = {p.metadata.name for p in story.serving_pods()}
    bad = next(name for name in pods if f"pod {name} on node" in bad_message)
    good = next(name for name in pods if name != bad)
    models.patch(NAME, {"spec": {"verification": {"watch": {"policy": "cordon-pod"}}}})
    cordoned = models.wait_condition(NAME, "Serving", "False", "PodCordoned", timeout=30)
    assert bad in cordoned["message"] and "1 pod(s) of revision" in cordoned["message"]
    models.wait_events(NAME, "PodCordoned")
    wait_for(lambda: story.selected_states()[-1] == {good}, 30, f"the selector to hold only {good}",
             lambda: str(story.selected_states()[-1]))  # fmt: skip
    after = story.selected.snapshot()[before:]
    left = [c.name for c in after if c.type == "DELETED"]
    assert left == [bad], f"exactly the bad pod left the selector: {[(c.type, c.name) for c in after]}"
    still = story.cluster.core.read_namespaced_pod(bad, story.namespace)
    assert still.status.phase == "Running" and SERVING_LABEL not in (still.metadata.labels or {}), (
        "cordoned, not deleted: it is there to be looked at"
    )
    _probe_metrics(story, {good})


def test_no_probe_goes_through_a_service(story: Story) -> None:
    services = story.cluster.core.list_namespaced_service(story.namespace).items
    addresses = {s.spec.cluster_ip for s in services} | {s.metadata.name for s in services}
    pods = {p.metadata.uid: p for p in story.serving_pods()}
    asked: dict[str, str] = {}
    for change in story.probes.caught_up():
        job = change.obj
        argv = job.spec.template.spec.containers[0].command
        url = argv[argv.index("--url") + 1]
        uid = job.metadata.annotations[POD_UID]
        asked[job.metadata.name] = url
        assert uid in pods, f"{job.metadata.name} asked a pod that is not a serving pod of {NAME}"
        assert url == f"http://{pods[uid].status.pod_ip}:8000", (job.metadata.name, url)
        assert not any(a and a in url for a in addresses), f"{job.metadata.name} asked a Service: {url}"
    assert len(asked) >= 4, asked
    # Each engine counted exactly its own probes' requests, PER_PROBE each (the promoted preview,
    # the pod that went bad, also the comparison's two): a probe in flight is counted by the engine
    # before its Job finishes, so this is waited for, not sampled.
    bad = next(p for p in pods.values() if f"pod {p.metadata.name} on node" in _serving_message(story))
    comparison = {uid: 2 if pod is bad else 0 for uid, pod in pods.items()}

    def counted() -> dict[str, tuple[int, int]]:
        counts = _probe_counts(story)
        found = {
            pod.metadata.name: (
                httpx.get(f"http://{pod.status.pod_ip}:8000/health", timeout=10).json()["requests"],
                PER_PROBE * counts.get(uid, 0) + comparison[uid],
            )
            for uid, pod in pods.items()
        }
        return found

    wait_for(lambda: all(a == b for a, b in counted().values()), 60,
             "each engine's request count to be its own probes' and the comparison's", counted)  # fmt: skip


def _serving_message(story: Story) -> str:
    return str(story.models.condition(NAME, "Serving")["message"])
