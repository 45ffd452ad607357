"""The runner's verify memo (clef_devcluster/runner/memo.py) gives the operator what a real run
gives it: the same verdict, reason, message and summary, the same termination message and pod
log, through the same pod lifecycle (Running, then Succeeded or Failed)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from clef_devcluster.runner.memo import MEMO_DIR, read_ledger

from .conftest import Cluster, missing_prerequisite
from .operator_support import IMAGE_10, KEY_BAND_IMAGE, VERIFY_SECONDS, Models, clefmodel, operator_running
from .watches import GaplessWatch

pytestmark = pytest.mark.cluster

VERIFICATION_SELECTOR = "clef.riotpiao.com/component=verification"


def _verdict(models: Models, name: str, status: str) -> dict[str, Any]:
    """What the operator concluded from the run: its Verified condition and its record."""
    verified = models.wait_condition(name, "Verified", status, timeout=VERIFY_SECONDS + 60)
    record = models.get(name)["status"]["verifications"][0]
    # The message names the model and its Job: those differ between two models, replay or not.
    message = str(verified.get("message")).replace(record["job"], "<its job>")
    message = message.replace(f"clefmodel/{name} ", "clefmodel/<it> ")
    return {
        "condition": {"status": verified.get("status"), "reason": verified.get("reason"), "message": message},
        "record": {k: record.get(k) for k in ("verdict", "reason", "summary", "digest", "dtype", "suite")},
    }


def _pod_result(cluster: Cluster, namespace: str, job: str) -> dict[str, Any]:
    pods = cluster.core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items
    assert len(pods) == 1, [p.metadata.name for p in pods]
    pod = pods[0]
    terminated = pod.status.container_statuses[0].state.terminated
    return {
        "pod": pod.metadata.name,
        "phase": pod.status.phase,
        "exit": terminated.exit_code,
        "message": terminated.message,
        "log": cluster.core.read_namespaced_pod_log(pod.metadata.name, namespace, container="verify"),
    }


def _phases(watch: GaplessWatch, pod: str) -> list[str]:
    seen: list[str] = []
    for change in watch.changes:
        phase = change.obj.status.phase if change.obj.status else None
        if change.name == pod and phase and (not seen or seen[-1] != phase):
            seen.append(phase)
    return seen


def test_a_replayed_verify_gives_the_operator_the_real_runs_verdict(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    if cluster.local is None:
        missing_prerequisite(
            "the verify memo is the local runner's (runs on the local cluster: unset CLEF_KUBECONFIG)"
        )
    memo_dir = cluster.local.dir / MEMO_DIR
    if not memo_dir.is_dir():
        missing_prerequisite("the verify memo is off in this session (CLEF_VERIFY_MEMO=0): unset it")
    # An env value of this test's own makes keys no other run of the session has: the first run
    # of each is real, the second (same spec, another ClefModel) is replayed.
    env = [{"name": "MEMO_TEST_RUN", "value": uuid.uuid4().hex}]
    images = {"good": IMAGE_10, "bad": KEY_BAND_IMAGE}
    expected = {"good": "True", "bad": "False"}
    runner_log = cluster.local.logs / "runner.log"
    with operator_running(cluster, namespace, tmp_path) as op:
        models = Models(cluster, namespace, op)
        before = read_ledger(memo_dir)
        for kind, image in images.items():
            models.create(clefmodel(f"real-{kind}", image, env=env, service={"name": f"real-{kind}"}))
        real = {kind: _verdict(models, f"real-{kind}", expected[kind]) for kind in images}
        after_real = read_ledger(memo_dir)
        assert after_real["miss"] - before["miss"] == 2 and after_real["hit"] == before["hit"], (
            before,
            after_real,
        )

        pods = GaplessWatch(cluster.core.list_namespaced_pod, namespace, label_selector=VERIFICATION_SELECTOR)
        with pods:
            for kind, image in images.items():
                models.create(clefmodel(f"replay-{kind}", image, env=env, service={"name": f"replay-{kind}"}))
            replayed = {kind: _verdict(models, f"replay-{kind}", expected[kind]) for kind in images}
        after_replay = read_ledger(memo_dir)
        assert after_replay["hit"] - after_real["hit"] == 2 and after_replay["miss"] == after_real["miss"], (
            after_real,
            after_replay,
        )
        differing = [
            (kind, part, field, real[kind][part][field], replayed[kind][part][field])
            for kind in images
            for part in ("condition", "record")
            for field in real[kind][part]
            if replayed[kind][part][field] != real[kind][part][field]
        ]
        assert not differing, "\n".join(map(str, differing))

        names = [f"{which}-{kind}" for which in ("real", "replay") for kind in images]
        jobs = {m: models.get(m)["status"]["verifications"][0]["job"] for m in names}
        results = {m: _pod_result(cluster, namespace, job) for m, job in jobs.items()}
        log_text = runner_log.read_text(errors="replace")
        for kind in images:
            first, second = results[f"real-{kind}"], results[f"replay-{kind}"]
            assert f"{namespace}/{second['pod']}/verify: replayed from memo" in log_text
            assert f"{namespace}/{first['pod']}/verify: replayed from memo" not in log_text
            assert {k: second[k] for k in ("phase", "exit", "message", "log")} == {
                k: first[k] for k in ("phase", "exit", "message", "log")
            }
            assert second["message"] and second["log"], second
            # The operator sees the replayed pod as it sees a real one: running, then terminal.
            assert _phases(pods, second["pod"])[-2:] == ["Running", first["phase"]], _phases(
                pods, second["pod"]
            )
