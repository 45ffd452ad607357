"""`python -m clef_devcluster.load --probes N`: N endpoint-mode models whose serving pods are
probed (`spec.verification.watch`, the default 600 s interval), to measure what probes cost the
operator at that scale: its API requests per second, CPU and memory while every model is probed.

The data plane is modelled, not run: two cores cannot hold 1,000 engines.

* **One real model first** (`SEED`): its engine is the runner's stand-in (`clef-runtime serve`,
  candle-vllm's dialect) on a chat checkpoint written here, and its goldens Job, its comparison
  Job and its first probe Job really run.  The runner's memo is in load mode (runner/memo.py), so
  it keeps those three runs.
* **Then N-1 models at once**, the same spec but for the engine image, which kwok runs (Ready at
  once, answering nothing): their goldens, comparison and probe Jobs are real Jobs and pods of the
  API server, created, read and deleted by the operator as any other, whose containers replay the
  seed's runs (the same goldens bytes, the same reports).  The memo's ledger counts the replays;
  a miss would be a real run against an engine that is not there, and is reported.

Measured: the seed's time to its first probe; the N-1 models from created to Ready (goldens,
preview, comparison, promotion); then, after a settle, a window of `--probe-window` seconds
(default: one interval, so that every pod is probed once in it): the operator's requests by kind
from the audit log, its CPU and RSS, the probe Jobs created, and every model's Serving condition.
"""

from __future__ import annotations

import json
import shutil
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from ..checkpoints import write_chat_checkpoint
from ..runner.memo import LOAD_MARKER, MEMO_DIR, read_ledger
from . import scale

# A real engine: the runner serves it with `clef-runtime serve --dialect candle-vllm`.
SEED_ENGINE = "registry.clef.test/engines/candle-vllm:0.8.4"
# An image kwok runs (no entry under engines/): Ready at once, a digest in its imageID, no process.
KWOK_ENGINE = "registry.clef.test/kwok-engine@sha256:" + "5eed" * 16
RUNTIME = scale.IMAGE
SEED = "probed-seed"
CHECKPOINT_PATH = "/models/clef-flash"


def checkpoint_dir(cluster_dir: Path) -> Path:
    return cluster_dir / "probe-checkpoint"


def allow_checkpoint(identity: list[dict[str, Any]], cluster_dir: Path) -> list[dict[str, Any]]:
    """kustomize/base's objects with the one hostPath the probed models mount allowed (the base
    allows none: the admission policy clef-operator-host-paths, as an overlay would patch it)."""
    for doc in identity:
        if (
            doc["kind"] == "ValidatingAdmissionPolicy"
            and doc["metadata"]["name"] == "clef-operator-host-paths"
        ):
            allowed = next(v for v in doc["spec"]["variables"] if v["name"] == "allowed")
            allowed["expression"] = json.dumps([str(checkpoint_dir(cluster_dir))])
    return identity


def probed_model(name: str, image: str, checkpoint: Path, interval: int) -> dict[str, Any]:
    """An endpoint-mode model on the scale node, its serving pods probed every `interval` s, one
    goldens prompt a probe: the defaults but the interval and the built-in prompts (`short`: the
    8197-token prompt does not fit the chat checkpoint's 4096 positions)."""
    return scale.clefmodel(
        name,
        image=image,
        model={
            "name": "clef-flash",
            "path": CHECKPOINT_PATH,
            "volume": {"hostPath": {"path": str(checkpoint)}},
        },
        verification={
            "mode": "endpoint",
            "timeoutSeconds": 1800,
            "endpoint": {"runtimeImage": RUNTIME, "builtinPrompts": "short", "readyTimeoutSeconds": 600},
            "watch": {"intervalSeconds": interval},
        },
    )


def condition(model: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (model.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def _models(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    custom = client.CustomObjectsApi(api)
    found: list[dict[str, Any]] = scale.list_all(
        custom.list_namespaced_custom_object, scale.GROUP, scale.VERSION, namespace, scale.PLURAL
    )
    return found


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _serving(api: client.ApiClient, namespace: str) -> dict[str, int]:
    """How many models say Serving, by status/reason."""
    out: dict[str, int] = {}
    for m in _models(api, namespace):
        c = condition(m, "Serving")
        k = f"{c.get('status', 'absent')}/{c.get('reason', '-')}"
        out[k] = out.get(k, 0) + 1
    return out


def seed(api: client.ApiClient, namespace: str, checkpoint: Path, interval: int, timeout: float) -> float:
    """The real model: seconds until its first probe passed (Serving=True)."""
    custom = client.CustomObjectsApi(api)
    body = probed_model(SEED, SEED_ENGINE, checkpoint, interval)
    custom.create_namespaced_custom_object(scale.GROUP, scale.VERSION, namespace, scale.PLURAL, body)

    def probed() -> bool:
        m: dict[str, Any] = custom.get_namespaced_custom_object(  # type: ignore[assignment]
            scale.GROUP, scale.VERSION, namespace, scale.PLURAL, SEED
        )
        ready = condition(m, "Ready")
        if condition(m, "Verified").get("status") == "False" or ready.get("reason") == "ChildRejected":
            raise RuntimeError(f"the seed model is stuck: {condition(m, 'Verified')} {ready}")
        return condition(m, "Serving").get("status") == "True"

    return scale.wait_until(probed, timeout, "the seed model's first probe to pass", every=2.0)


def the_rest(
    api: client.ApiClient, namespace: str, checkpoint: Path, n: int, interval: int, timeout: float
) -> dict[str, float]:
    """N models at once, replaying the seed's runs: seconds from the first created to the last
    Ready (from the API server's timestamps), and as polled."""
    custom = client.CustomObjectsApi(api)
    bodies = [probed_model(f"probed-{i:04d}", KWOK_ENGINE, checkpoint, interval) for i in range(n)]
    started = time.time()
    scale.create_all(
        lambda b: custom.create_namespaced_custom_object(
            scale.GROUP, scale.VERSION, namespace, scale.PLURAL, b
        ),
        bodies,
    )
    created = time.time() - started
    polled = scale.wait_until(
        lambda: scale.ready_models(api, namespace) >= n + 1,
        timeout,
        f"{n + 1} probed models Ready",
        every=5.0,
    )
    models = [m for m in _models(api, namespace) if m["metadata"]["name"] != SEED]
    first = min(_stamp(m["metadata"]["creationTimestamp"]) for m in models)
    last = max(_stamp(condition(m, "Ready")["lastTransitionTime"]) for m in models)
    return {"create_seconds": round(created, 1), "ready_seconds": round(last - first, 1),
            "polled_seconds": round(polled + created, 1)}  # fmt: skip


def window(
    operator: scale.Operator,
    audit: Path,
    api: client.ApiClient,
    namespace: str,
    settle: float,
    seconds: float,
) -> dict[str, Any]:
    """The steady state with every model probed: requests, CPU, RSS over `seconds`."""
    time.sleep(settle)
    cpu0, t0 = operator.cpu_seconds(), time.time()
    rss: list[float] = []
    while time.time() - t0 < seconds:
        rss.append(operator.rss_mib())
        time.sleep(min(10.0, max(0.0, seconds - (time.time() - t0))))
    cpu1, t1 = operator.cpu_seconds(), time.time()
    time.sleep(2)  # requests are logged when they complete
    rate = scale.request_rate(audit, 0, t0, t1)
    return {
        "window_seconds": round(t1 - t0, 1),
        "requests_per_second": round(rate.per_second, 3),
        "requests_by_kind": rate.by_kind,
        "probe_jobs_created": rate.by_kind.get("create jobs", 0),
        "cpu_percent_of_a_core": round(100 * (cpu1 - cpu0) / (t1 - t0), 2),
        "rss_mib_max": round(max(rss), 1),
        "rss_mib_end": round(operator.rss_mib(), 1),
        "memory_end": operator.memory(),
        "held": operator.held(),
        "serving": _serving(api, namespace),
    }


def run_probes(
    api: client.ApiClient,
    cluster_dir: Path,
    operator: scale.Operator,
    audit: Path,
    namespace: str,
    opts: dict[str, Any],
) -> dict[str, Any]:
    """The whole probe phase (module docstring).  `opts`: models, interval, window, settle, timeout."""
    memo_dir = cluster_dir / MEMO_DIR
    shutil.rmtree(memo_dir, ignore_errors=True)  # this run's runs only
    memo_dir.mkdir(parents=True)
    (memo_dir / LOAD_MARKER).touch()
    checkpoint = write_chat_checkpoint(checkpoint_dir(cluster_dir))
    scale.ensure_namespace(api, namespace)
    out: dict[str, Any] = {"interval_seconds": opts["interval"]}
    out["seed_probed_seconds"] = round(seed(api, namespace, checkpoint, opts["interval"], opts["timeout"]), 1)
    print(f"load: probes: the seed model probed after {out['seed_probed_seconds']}s", flush=True)
    out["seed_runs"] = read_ledger(memo_dir)
    out["ready"] = the_rest(api, namespace, checkpoint, opts["models"] - 1, opts["interval"], opts["timeout"])
    print(f"load: probes: {opts['models']} models Ready: {out['ready']}", flush=True)
    out["window"] = window(operator, audit, api, namespace, opts["settle"], opts["window"])
    ledger = read_ledger(memo_dir)
    out["replays"] = {k: ledger[k] - out["seed_runs"][k] for k in ledger}
    print(f"load: probes: window {out['window']}; replays {out['replays']}", flush=True)
    return out
