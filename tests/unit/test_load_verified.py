"""The verified load test's arithmetic (`clef_devcluster.load.verified`): per-model latencies from
the API server's timestamps, and the summary the docs quote.  The run itself is `make load-test`'s
(`--verified N`), on a control plane of its own."""

from __future__ import annotations

from typing import Any

from clef_devcluster.load import verified
from clef_operator import labels


def test_summary_is_the_median_the_nearest_rank_99th_and_the_max() -> None:
    assert verified.summary([]) == {}
    s = verified.summary([float(x) for x in range(1, 101)])
    assert (s["n"], s["p50"], s["p99"], s["max"]) == (100, 50.5, 99.0, 100.0)
    s = verified.summary([3.0, 1.0, 2.0])
    assert (s["p50"], s["p99"], s["max"]) == (2.0, 3.0, 3.0)


def _model(name: str, created: str, ready: str | None) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True", "lastTransitionTime": ready}] if ready else []
    return {"metadata": {"name": name, "creationTimestamp": created}, "status": {"conditions": conditions}}


def _job(name: str, model: str, uid: str, created: str, complete: str | None) -> dict[str, Any]:
    done = [{"type": "Complete", "status": "True", "lastTransitionTime": complete}] if complete else []
    return {
        "metadata": {"name": name, "uid": uid, "creationTimestamp": created, "labels": {labels.MODEL: model}},
        "status": {"conditions": done},
    }


def _pod(job_uid: str, started: str) -> dict[str, Any]:
    return {"metadata": {"ownerReferences": [{"uid": job_uid}]}, "status": {"startTime": started}}


def test_latencies_split_the_operator_from_the_queue_and_the_verification() -> None:
    recorder = verified.Recorder.__new__(verified.Recorder)
    recorder.jobs = {
        "a-v": _job("a-v", "a", "ua", "2026-12-02T00:00:02Z", "2026-12-02T00:00:30Z"),
        "b-v": _job("b-v", "b", "ub", "2026-12-02T00:00:03Z", "2026-12-02T00:01:00Z"),
    }
    recorder.pods = {"pa": _pod("ua", "2026-12-02T00:00:05Z"), "pb": _pod("ub", "2026-12-02T00:00:31Z")}
    models = [
        _model("a", "2026-12-02T00:00:00Z", "2026-12-02T00:00:31Z"),
        _model("b", "2026-12-02T00:00:01Z", "2026-12-02T00:01:04Z"),
    ]
    m = verified.measure(models, recorder)
    lat = m["latency_seconds"]
    assert lat["to_job"]["max"] == 2.0  # created -> Job created
    assert sorted([lat["queued"]["p50"], lat["queued"]["max"]]) == [15.5, 28.0]  # 3 and 28
    assert lat["ran"]["max"] == 29.0  # pod started -> Job complete (b: 31 -> 60)
    assert lat["to_ready"]["max"] == 4.0  # Job complete -> Ready (b: 60 -> 64)
    assert m["ready_seconds"] == 64.0  # first created -> last Ready
    assert m["jobs_span_seconds"] == 55.0  # first pod started -> last Job complete
