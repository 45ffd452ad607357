"""`python -m clef_devcluster.load --verified N`: N ClefModels that need verification, whose Jobs
really run (`clef-runtime verify` on this host, through the local cluster's runner), queued by
the scheduler behind the scale node's GPUs (`--verify-gpus`: how many run at once).

The models are parked (`replicas: 0`): verified, Ready, and holding no GPU, so that the node's GPUs
bound the verification Jobs alone (a serving pod would hold its GPU for good, and the plain mode
measures serving).  Per model, from the API server's timestamps (whole seconds):

* `to_job`: the model created -> its verification Job created (the operator's latency, queueing
  behind other models' passes included);
* `queued`: Job created -> its pod started (the scheduler waiting for a GPU);
* `ran`: pod started -> Job complete (the verification itself);
* `to_ready`: Job complete -> the model Ready (the operator's latency: the watch, a pass, the
  verdict, a parked Deployment, the status write).

And overall: first model created -> last model Ready, against the Jobs' own span (first pod
started -> last Job complete).  Jobs and pods are recorded while they live (a poll every 2 s),
since a finished verification's Job may go before the end.
"""

from __future__ import annotations

import statistics
import threading
import time
from datetime import datetime
from typing import Any

from kubernetes import client

from clef_operator import labels

from . import scale

VERIFY_TIMEOUT_SECONDS = 7200


def verified_model(name: str) -> dict[str, Any]:
    """A parked model whose kernels are verified by a real `clef-runtime verify` (the runner runs
    it with the reduced shapes on this host's CPU), on the scale node."""
    return scale.clefmodel(
        name,
        replicas=0,
        verification={"required": True, "mode": "kernels", "timeoutSeconds": VERIFY_TIMEOUT_SECONDS},
    )


def _stamp(text: str | None) -> float | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


class Recorder(threading.Thread):
    """Every verification Job and pod of the namespace, as last seen, until stopped."""

    def __init__(self, api: client.ApiClient, namespace: str, every: float = 2.0) -> None:
        super().__init__(name="verified-recorder", daemon=True)
        self.api, self.namespace, self.every = api, namespace, every
        self.jobs: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        selector = f"{labels.COMPONENT}={labels.COMPONENT_VERIFICATION}"
        batch, core = client.BatchV1Api(self.api), client.CoreV1Api(self.api)
        while not self.stopping.wait(self.every):
            try:
                for j in scale.list_all(batch.list_namespaced_job, self.namespace, label_selector=selector):
                    self.jobs[j.metadata.name] = self.api.sanitize_for_serialization(j)
                for p in scale.list_all(core.list_namespaced_pod, self.namespace, label_selector=selector):
                    self.pods[p.metadata.name] = self.api.sanitize_for_serialization(p)
            except Exception as e:  # a poll is retried; the load test goes on
                print(f"load: recorder: {e}", flush=True)

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


def _job_times(job: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, float | None]:
    complete = next(
        (
            c.get("lastTransitionTime")
            for c in (job.get("status") or {}).get("conditions") or []
            if c.get("type") == "Complete" and c.get("status") == "True"
        ),
        None,
    )
    owned = [
        p
        for p in pods
        if any(r.get("uid") == job["metadata"]["uid"] for r in p["metadata"].get("ownerReferences") or [])
    ]
    started = [s for p in owned if (s := _stamp((p.get("status") or {}).get("startTime")))]
    return {
        "created": _stamp(job["metadata"]["creationTimestamp"]),
        "pod_started": min(started) if started else None,
        "complete": _stamp(complete),
    }


def _ready_at(model: dict[str, Any]) -> float | None:
    for c in (model.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            return _stamp(c.get("lastTransitionTime"))
    return None


def summary(values: list[float]) -> dict[str, float]:
    """p50, p99 (nearest rank) and max, seconds."""
    if not values:
        return {}
    ordered = sorted(values)
    rank = -(-99 * len(ordered) // 100) - 1  # ceil(0.99 n), 1-based
    return {
        "n": len(ordered),
        "p50": statistics.median(ordered),
        "p99": ordered[rank],
        "max": ordered[-1],
    }


def measure(models: list[dict[str, Any]], recorder: Recorder) -> dict[str, Any]:
    """Per-model latencies and the overall span (module docstring)."""
    pods = list(recorder.pods.values())
    per: dict[str, list[float]] = {"to_job": [], "queued": [], "ran": [], "to_ready": []}
    starts, completes = [], []
    for m in models:
        name = m["metadata"]["name"]
        jobs = [
            j for j in recorder.jobs.values() if (j["metadata"].get("labels") or {}).get(labels.MODEL) == name
        ]
        if not jobs:
            continue
        job = min(jobs, key=lambda j: j["metadata"]["creationTimestamp"])  # the first verification
        t = _job_times(job, pods)
        created, ready = _stamp(m["metadata"]["creationTimestamp"]), _ready_at(m)
        if created is not None and t["created"] is not None:
            per["to_job"].append(t["created"] - created)
        if t["created"] is not None and t["pod_started"] is not None:
            per["queued"].append(t["pod_started"] - t["created"])
            starts.append(t["pod_started"])
        if t["pod_started"] is not None and t["complete"] is not None:
            per["ran"].append(t["complete"] - t["pod_started"])
        if t["complete"] is not None:
            completes.append(t["complete"])
            if ready is not None:
                per["to_ready"].append(ready - t["complete"])
    created_all = [s for m in models if (s := _stamp(m["metadata"]["creationTimestamp"]))]
    ready_all = [r for m in models if (r := _ready_at(m))]
    return {
        "jobs_seen": len(recorder.jobs),
        "latency_seconds": {k: summary(v) for k, v in per.items()},
        "ready_seconds": max(ready_all) - min(created_all) if ready_all and created_all else None,
        "jobs_span_seconds": max(completes) - min(starts) if completes and starts else None,
    }


def run_verified(api: client.ApiClient, n: int, timeout: float, namespace: str) -> dict[str, Any]:
    """Create N verified models at once and wait until all are Ready; measure (module docstring)."""
    custom = client.CustomObjectsApi(api)
    scale.ensure_namespace(api, namespace)
    recorder = Recorder(api, namespace)
    recorder.start()
    started = time.time()
    try:
        scale.create_all(
            lambda b: custom.create_namespaced_custom_object(
                scale.GROUP, scale.VERSION, namespace, scale.PLURAL, b
            ),
            [verified_model(f"v-{i:04d}") for i in range(n)],
        )
        created = time.time() - started
        polled = scale.wait_until(
            lambda: scale.ready_models(api, namespace) >= n,
            timeout,
            f"{n} verified ClefModels Ready",
            every=5.0,
        )
        time.sleep(3)  # the last Jobs' final state reaches the recorder
    finally:
        recorder.stop()
    models = scale.list_all(
        custom.list_namespaced_custom_object, scale.GROUP, scale.VERSION, namespace, scale.PLURAL
    )
    return {
        "create_seconds": round(created, 1),
        "polled_seconds": round(polled + created, 1),
        **measure(models, recorder),
    }
