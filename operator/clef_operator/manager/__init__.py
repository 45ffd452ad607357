"""clef's controller manager: what runs the reconcile passes, beside kopf (which runs only the
process's lifecycle: `handlers`).  client-go's parts, in Python:

| module | job |
|---|---|
| `cache` | the informer cache: list + watch per kind, the planner's snapshots by model |
| `workqueue` | the work queue: keys deduplicated, one pass per key at a time, one heap of deadlines, per-key backoff |
| `workers` | the threads that take keys from the queue and run a pass (handed in: `reconcile`) |
| `leader` | leader election through a Lease, and the fence on every write |
| `metrics` | Prometheus metrics and the `/metrics` and `/healthz` endpoint |
| `probe_metrics` | the metrics of the probes of the serving revision: last pass per pod, duration, failures |
| `memory` | malloc tuning: arenas limited, thread caches off, memory handed back when work goes quiet |

Why not kopf's per-object handlers: measured with the load test at 1,000 ClefModels on 2 cores,
docs/architecture.md ("kopf's role") gives the numbers.
"""
