"""`make load-test` (`python -m clef_devcluster.load`): the operator at scale on a local control
plane of its own.  docs/performance.md ("Operator at scale") has the numbers and how to read them.

1. a fresh control plane (`.load/cluster`), kustomize/base's ServiceAccount and RBAC, a fake node
   with room for every pod (`scale.gpu_node`);
2. the floor: N plain Deployments shaped like a model's, created at once; seconds until all are
   Available (what the control plane alone needs);
3. the operator from this checkout, as its ServiceAccount; N ClefModels (verification not
   required) created at once; seconds until all are Ready;
4. idle: the operator's API requests per second over a window, from the audit log (watches
   aside), its CPU, its RSS; the events it posted;
5. every model deleted: RSS again, and what the operator still holds (its `clef-state` probe).

`--verified N` instead measures N models whose verification Jobs really run (verified.py);
`--probes N` N endpoint-mode models whose serving pods are probed (probes.py); `--admission N` what
admission costs one of the operator's writes in a namespace of N models (admission.py).  Prints a
table and writes JSON (`--json`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config

from clef_operator.manager import memory

from ..cluster import LocalCluster, build
from ..config import REPO_ROOT, missing_prerequisites
from ..kustomize import find_kubectl
from . import admission, probes, scale, verified

FLOOR_NS, MODELS_NS, VERIFIED_NS, PROBED_NS = "scale-floor", "scale-models", "scale-verified", "scale-probed"
ADMISSION_NS = "scale-admission"


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def floor(api: client.ApiClient, n: int, timeout: float) -> dict[str, float]:
    """N plain Deployments at once: seconds until the last is Available (by the Available
    condition's transition time, and as polled)."""
    apps = client.AppsV1Api(api)
    scale.ensure_namespace(api, FLOOR_NS)
    bodies = [scale.plain_deployment(f"plain-{i:04d}") for i in range(n)]
    started = time.time()
    scale.create_all(lambda b: apps.create_namespaced_deployment(FLOOR_NS, b), bodies)  # type: ignore[arg-type]
    created = time.time() - started
    polled = scale.wait_until(
        lambda: scale.available_deployments(api, FLOOR_NS, "clef-scale/floor=true") >= n,
        timeout,
        f"{n} plain Deployments Available",
        every=1.0,
    )
    items = scale.list_all(apps.list_namespaced_deployment, FLOOR_NS)
    first = min(d.metadata.creation_timestamp.timestamp() for d in items)
    last = max(
        c.last_transition_time.timestamp()
        for d in items
        for c in d.status.conditions or []
        if c.type == "Available" and c.status == "True"
    )
    client.CoreV1Api(api).delete_namespace(FLOOR_NS)
    scale.wait_until(lambda: _gone(api, FLOOR_NS), timeout, f"namespace {FLOOR_NS} deleted", every=1.0)
    return {"create_seconds": created, "available_seconds": last - first, "polled_seconds": polled + created}


def _gone(api: client.ApiClient, namespace: str) -> bool:
    try:
        client.CoreV1Api(api).read_namespace(namespace)
    except client.exceptions.ApiException as e:
        return e.status == 404
    return False


def models_ready(api: client.ApiClient, n: int, timeout: float, prefix: str = "m") -> dict[str, float]:
    custom = client.CustomObjectsApi(api)
    scale.ensure_namespace(api, MODELS_NS)
    bodies = [scale.clefmodel(f"{prefix}-{i:04d}") for i in range(n)]
    started = time.time()
    scale.create_all(
        lambda b: custom.create_namespaced_custom_object(
            scale.GROUP, scale.VERSION, MODELS_NS, scale.PLURAL, b
        ),
        bodies,
    )
    created = time.time() - started
    polled = scale.wait_until(
        lambda: scale.ready_models(api, MODELS_NS) >= n, timeout, f"{n} ClefModels Ready", every=2.0
    )
    models = scale.list_all(
        custom.list_namespaced_custom_object, scale.GROUP, scale.VERSION, MODELS_NS, scale.PLURAL
    )
    first = min(_stamp(m["metadata"]["creationTimestamp"]) for m in models)
    last = max(
        _stamp(c["lastTransitionTime"])
        for m in models
        for c in m["status"]["conditions"]
        if c["type"] == "Ready" and c["status"] == "True"
    )
    return {"create_seconds": created, "ready_seconds": last - first, "polled_seconds": polled + created}


def idle(operator: scale.Operator, audit: Path, settle: float, window: float) -> dict[str, Any]:
    time.sleep(settle)
    offset = 0
    cpu0, t0 = operator.cpu_seconds(), time.time()
    time.sleep(window)
    cpu1, t1 = operator.cpu_seconds(), time.time()
    # Requests are logged when they complete: give the last ones a moment to reach the log.
    time.sleep(2)
    rate = scale.request_rate(audit, offset, t0, t1)
    return {
        "window_seconds": round(t1 - t0, 1),
        "requests": rate.requests,
        "requests_per_second": round(rate.per_second, 3),
        "requests_by_kind": rate.by_kind,
        "cpu_percent_of_a_core": round(100 * (cpu1 - cpu0) / (t1 - t0), 2),
        "rss_mib": round(operator.rss_mib(), 1),
        "memory": operator.memory(),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    kubectl = find_kubectl()
    assert kubectl, "no kubectl"
    build(log=print)
    cluster = LocalCluster(Path(args.state_dir))
    if cluster.running():
        cluster.down()
    print(f"load: control plane up in {cluster.up():.1f}s ({cluster.dir})", flush=True)
    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "models": args.admission or args.verified or args.probes or args.models,
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "cycles": [],
    }
    operator: scale.Operator | None = None
    try:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        api.configuration.connection_pool_maxsize = 32
        identity = scale.operator_identity(kubectl)
        if args.probes:
            identity = probes.allow_checkpoint(identity, cluster.dir)
        scale.kubectl_objects(cluster.kubeconfig, kubectl, "apply", identity)
        if args.admission:
            result["admission"] = admission.run_admission(
                api, cluster.kubeconfig, cluster.dir / "admission", args.admission, args.samples, ADMISSION_NS
            )
            result["loadavg_end"] = os.getloadavg()
            return result
        gpus = args.verify_gpus if args.verified else (args.probes or args.models) + 10
        scale.add_gpu_node(cluster.kubeconfig, "scale-1", gpus)
        if not args.no_floor and not args.verified and not args.probes:
            result["floor"] = floor(api, args.models, args.timeout)
            print(f"load: floor {result['floor']}", flush=True)
        operator = scale.Operator(cluster.kubeconfig, cluster.dir / "load", args.operator_arg or ())
        scale.wait_until(operator.synced, 120, "the operator's cache synced")
        # At rest: the operator hands start-up's memory back after its cache synced and again
        # after kopf's start (trims at most every 30 s): wait for both, whatever --settle says.
        _wait_for_trim(args.settle)
        result["rss_mib_no_models"] = round(operator.rss_mib(), 1)
        result["memory_no_models"] = operator.memory()
        operator.report("no models")
        if args.verified:
            result["verified"] = verified.run_verified(api, args.verified, args.timeout, VERIFIED_NS)
            result["verify_gpus"] = gpus
            print(f"load: verified {result['verified']}", flush=True)
        if args.probes:
            opts = {"models": args.probes, "interval": args.probe_interval, "settle": args.settle,
                    "window": args.probe_window or args.probe_interval, "timeout": args.timeout}  # fmt: skip
            result["probes"] = probes.run_probes(
                api, cluster.dir, operator, cluster.audit_log, PROBED_NS, opts
            )
        for cycle in range(0 if args.verified or args.probes else args.cycles):
            result["cycles"].append(one_cycle(api, operator, cluster.audit_log, args, cycle))
        result["loadavg_end"] = os.getloadavg()
    except BaseException:
        if operator is not None:
            print("--- operator log ---\n" + operator.tail(), file=sys.stderr)
        raise
    finally:
        if operator is not None:
            operator.stop()
        if not args.keep_cluster:
            cluster.down()
    return result


def one_cycle(
    api: client.ApiClient, operator: scale.Operator, audit: Path, args: argparse.Namespace, cycle: int
) -> dict[str, Any]:
    """N models created, Ready, idle, deleted until the operator holds nothing for them; RSS at
    idle and after the deletion (a cycle's names are its own: the last cycle's Services may still
    be on their way out)."""
    out: dict[str, Any] = {"loadavg_start": os.getloadavg()}
    events_before = scale.count(api, MODELS_NS, "events")
    out["ready"] = models_ready(api, args.models, args.timeout, prefix=f"c{cycle}")
    print(f"load: cycle {cycle}: models {out['ready']}", flush=True)
    out["idle"] = idle(operator, audit, args.settle, args.idle_seconds)
    operator.report(f"cycle {cycle}: idle with {args.models} models")
    out["events"] = scale.count(api, MODELS_NS, "events") - events_before
    out["held_with_models"] = operator.held()
    scale.delete_namespace_objects(api, MODELS_NS)
    out["delete_seconds"] = round(
        scale.wait_until(
            lambda: scale.count(api, MODELS_NS, "models") == 0 and not _held_models(operator),
            args.timeout,
            "every model deleted and forgotten",
            every=1.0,
        ),
        1,
    )
    # The operator hands freed memory back once deletions went quiet, at most every 30 s: wait
    # for that trim, whatever --settle says.
    _wait_for_trim(args.settle)
    out["rss_mib_after_delete"] = round(operator.rss_mib(), 1)
    out["memory_after_delete"] = operator.memory()
    out["held_after_delete"] = operator.held()
    operator.report(f"cycle {cycle}: after deleting them")
    # The cache's tombstones of the deleted objects are per-model state too, until they expire
    # (cache.GONE_SECONDS); then one more trim.
    scale.wait_until(
        lambda: operator.held().get("tombstones", 1) == 0, args.timeout, "tombstones expired", every=2.0
    )
    _wait_for_trim()
    out["rss_mib_after_tombstones"] = round(operator.rss_mib(), 1)
    out["memory_after_tombstones"] = operator.memory()
    operator.report(f"cycle {cycle}: tombstones expired")
    print(f"load: cycle {cycle}: after delete {out['memory_after_delete']}", flush=True)
    out["loadavg_end"] = os.getloadavg()
    return out


def _wait_for_trim(settle: float = 0.0) -> None:
    """Long enough for the operator's next trim once its work went quiet (it trims at most every
    TRIM_EVERY_SECONDS), or `settle` if longer."""
    time.sleep(max(settle, memory.TRIM_AFTER_SECONDS + memory.TRIM_EVERY_SECONDS + 2))


def _held_models(operator: scale.Operator) -> int:
    """What the operator still holds per model; -1 (not done) while its probe does not answer."""
    held = operator.state()
    if held is None:
        return -1
    held = held.get("clef-state") or {}
    return sum(held.get(k, 0) for k in ("clefmodels", "deployments", "jobs", "pods", "loops"))


def table(r: dict[str, Any]) -> str:
    rows = [("models", r["models"]), ("cpus / load average at start", f"{r['cpus']} / {r['loadavg_start']}")]
    if "floor" in r:
        rows.append(("plain Deployments all Available (floor), s", round(r["floor"]["available_seconds"], 1)))
    if "admission" in r:
        a = r["admission"]
        for key, what in (("anchor", "the namespace's anchor"), ("every_model", "every ClefModel")):
            s = a[key]
            rows.append(
                (
                    f"admission: a Job's dry run, parameters {what}: p50/p90/max/mean, ms",
                    f"{s['p50_ms']} / {s['p90_ms']} / {s['max_ms']} / {s['mean_ms']} (n={s['n']})",
                )
            )
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    rows.append(("RSS with no models, MiB", r["rss_mib_no_models"]))
    if "verified" in r:
        v = r["verified"]
        rows += [
            ("verified models / GPUs (Jobs at once)", f"{r['models']} / {r['verify_gpus']}"),
            ("verified: all Ready after, s", v["ready_seconds"]),
            ("verified: the Jobs' own span, s", v["jobs_span_seconds"]),
        ]
        rows += [(f"verified: {k} p50/p99/max, s", _pct(s)) for k, s in v["latency_seconds"].items()]
    if "probes" in r:
        rows += _probe_rows(r["probes"])
    for i, c in enumerate(r["cycles"]):
        rows += [
            (f"[{i}] load average at start", c["loadavg_start"]),
            (f"[{i}] ClefModels all Ready, s", round(c["ready"]["ready_seconds"], 1)),
            (f"[{i}] idle API requests/s (watches aside)", c["idle"]["requests_per_second"]),
            (f"[{i}] idle CPU, % of a core", c["idle"]["cpu_percent_of_a_core"]),
            (f"[{i}] RSS at idle with the models, MiB", c["idle"]["rss_mib"]),
            (f"[{i}] RSS after deleting them, MiB", c["rss_mib_after_delete"]),
            (f"[{i}] RSS once their tombstones expired, MiB", c["rss_mib_after_tombstones"]),
            (f"[{i}] events posted", c["events"]),
            (f"[{i}] held after deletion", c["held_after_delete"]),
        ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _probe_rows(p: dict[str, Any]) -> list[tuple[str, Any]]:
    w = p["window"]
    return [
        ("probes: interval, s", p["interval_seconds"]),
        ("probes: the real model's first probe passed after, s", p["seed_probed_seconds"]),
        ("probes: the other models all Ready, s", p["ready"]["ready_seconds"]),
        ("probes: window, s", w["window_seconds"]),
        ("probes: probe Jobs created in the window", w["probe_jobs_created"]),
        ("probes: API requests/s (watches aside)", w["requests_per_second"]),
        ("probes: requests by kind", w["requests_by_kind"]),
        ("probes: CPU, % of a core", w["cpu_percent_of_a_core"]),
        ("probes: RSS max / at the end, MiB", f"{w['rss_mib_max']} / {w['rss_mib_end']}"),
        ("probes: models by Serving status/reason", w["serving"]),
        ("probes: memo: the real runs / replays", f"{p['seed_runs']} / {p['replays']}"),
    ]


def _pct(s: dict[str, float]) -> str:
    return f"{s['p50']:.0f} / {s['p99']:.0f} / {s['max']:.0f} (n={s['n']:.0f})" if s else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clef_devcluster.load", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--idle-seconds", type=float, default=120.0, help="the idle window")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds before each measurement")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--state-dir", default=str(REPO_ROOT / ".load" / "cluster"))
    parser.add_argument("--json", default=str(REPO_ROOT / ".load" / "result.json"))
    parser.add_argument(
        "--cycles", type=int, default=1, help="create, idle, delete this many times in one operator life"
    )
    parser.add_argument(
        "--verified",
        type=int,
        default=0,
        metavar="N",
        help="instead: N parked models whose verification Jobs really run (clef-runtime verify on this host)",
    )
    parser.add_argument(
        "--verify-gpus", type=int, default=2, help="with --verified: the node's GPUs, so Jobs at once"
    )
    parser.add_argument(
        "--probes",
        type=int,
        default=0,
        metavar="N",
        help="instead: N endpoint-mode models whose serving pods are probed (one real, the rest replayed)",
    )
    parser.add_argument(
        "--probe-interval", type=int, default=600, help="with --probes: watch.intervalSeconds"
    )
    parser.add_argument(
        "--probe-window",
        type=float,
        default=0,
        help="with --probes: the measured window, s (default: one interval)",
    )
    parser.add_argument(
        "--admission",
        type=int,
        default=0,
        metavar="N",
        help="instead: admission's cost of one operator write in a namespace of N models (no operator runs)",
    )
    parser.add_argument("--samples", type=int, default=30, help="with --admission: dry runs per binding")
    parser.add_argument("--no-floor", action="store_true", help="skip the plain-Deployment floor")
    parser.add_argument("--keep-cluster", action="store_true")
    parser.add_argument("--operator-arg", action="append", help="passed to clef-operator run (repeatable)")
    args = parser.parse_args(argv)
    missing = missing_prerequisites()
    if missing:
        print(f"load test: cannot run here: {missing}", file=sys.stderr)
        return 2
    result = run(args)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    print(table(result))
    print(f"load: JSON in {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
