"""The operator at scale, measured on a local control plane: the pieces `make load-test`
(`python -m clef_devcluster.load`) and the cluster tier's small version
(tests/cluster/test_scale.py) share.

The operator runs from this checkout as its ServiceAccount (kustomize/base's RBAC, a TokenRequest
token), so the API server's audit log (manifests/audit-policy.yaml) records exactly its requests.
Models need no verification and land on a fake GPU node of their own (`gpu_node`: a taint keeps
everything else off it), so the numbers are the operator's and the control plane's, not a
verification Job's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ..gpunode import kwok_gpu_node
from ..host_operator import (
    OPERATOR_NAMESPACE,
    OPERATOR_SA,
    OPERATOR_USER,
    clef_flash,
    service_account_kubeconfig,
    spawn_operator,
    stop_operator,
)
from ..kustomize import BASE, kustomize_build
from ..procs import free_port
from ..rest import Rest, object_path

GROUP, VERSION, PLURAL = "clef.riotpiao.com", "v1alpha1", "clefmodels"
SCALE_PRODUCT = "Scale-Test-GPU"
SCALE_TAINT = "clef.riotpiao.com/scale-test"
IMAGE = "registry.clef.test/clef-runtime:1.0"
PAGE = 500


# ------------------------------------------------------------------------------ the cluster


def gpu_node(name: str, gpus: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A kwok node with `gpus` GPUs and room for twice as many pods, tainted so that only the
    scale test's pods (which tolerate it) land there.  Returns (node, its status)."""
    return kwok_gpu_node(
        name,
        product=SCALE_PRODUCT,
        taint=SCALE_TAINT,
        gpus=gpus,
        memory_mib=81920,
        room={"cpu": "4096", "memory": "64Ti", "pods": str(2 * gpus + 10)},
    )


def add_gpu_node(kubeconfig: Path, name: str, gpus: int) -> None:
    rest = Rest(kubeconfig)
    node, status = gpu_node(name, gpus)
    rest.apply(node)
    rest.patch_status(object_path(node), status)


def operator_identity(kubectl: str) -> list[dict[str, Any]]:
    """kustomize/base without the operator's Deployment: its namespace, ServiceAccount, RBAC and
    the CRD, so that the operator can run on this host as that ServiceAccount."""
    return [doc for doc in kustomize_build(kubectl, BASE) if doc["kind"] != "Deployment"]


def kubectl_objects(kubeconfig: Path, kubectl: str, verb: str, objects: list[dict[str, Any]]) -> None:
    """`kubectl apply --server-side` or `kubectl delete` of `objects`."""
    extra = ["--server-side"] if verb == "apply" else ["--ignore-not-found", "--wait=false"]
    subprocess.run(
        [kubectl, "--kubeconfig", str(kubeconfig), verb, *extra, "-f", "-"],
        input=yaml.safe_dump_all(objects),
        text=True,
        check=True,
        capture_output=True,
    )


def clefmodel(name: str, **spec: Any) -> dict[str, Any]:
    """A model that needs no verification, on the scale node, behind a Service of its own."""
    body: dict[str, Any] = {
        **clef_flash(IMAGE),
        "nodeSelector": {"nvidia.com/gpu.product": SCALE_PRODUCT},
        "tolerations": [{"key": SCALE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
        "service": {"name": name},
        "verification": {"required": False},
    }
    body.update(spec)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClefModel", "metadata": {"name": name}, "spec": body}


def plain_deployment(name: str) -> dict[str, Any]:
    """The floor's unit: a Deployment shaped like a model's serving one (1 replica, 1 GPU, same
    node), with nothing driving it but the control plane."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"clef-scale/floor": "true"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": SCALE_PRODUCT},
                    "tolerations": [{"key": SCALE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [
                        {"name": "engine", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                    ],
                },
            },
        },
    }


def create_all(
    create: Callable[[dict[str, Any]], Any], bodies: Iterable[dict[str, Any]], threads: int = 16
) -> None:
    """Create every object at once (as `kubectl apply` of a large manifest would, in parallel)."""
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, bodies))


def wait_until(probe: Callable[[], bool], timeout: float, what: str, every: float = 0.5) -> float:
    """Seconds until `probe` held; TimeoutError naming `what` after `timeout`."""
    start = time.monotonic()
    while not probe():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)
    return time.monotonic() - start


def _patiently(call: Callable[[], Any], tries: int = 10) -> Any:
    """`call`, again after a pause when an overloaded API server answers 429 or 5xx (a list
    that asked for a page while it lagged its own store says 504 "Too large resource
    version"): the load test measures the operator, and must not stop at the server's hiccup."""
    for attempt in range(tries):
        try:
            return call()
        except ApiException as e:
            if attempt == tries - 1 or not (e.status == 429 or (e.status or 0) >= 500):
                raise
            time.sleep(1 + attempt)
    raise AssertionError("unreachable")


def list_all(fn: Callable[..., Any], *args: Any, **kw: Any) -> list[Any]:
    """Every item of a list call, page by page (a large list in one response is slow)."""
    items: list[Any] = []
    token: str | None = None
    while True:
        more: dict[str, Any] = {"_continue": token} if token else {}
        page: Any = _patiently(partial(fn, *args, limit=PAGE, **more, **kw))
        if isinstance(page, dict):
            items.extend(page["items"])
            token = page["metadata"].get("continue")
        else:
            items.extend(page.items)
            token = page.metadata._continue
        if not token:
            return items


def ready_models(api: client.ApiClient, namespace: str) -> int:
    custom = client.CustomObjectsApi(api)
    models = list_all(custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL)
    return sum(
        1
        for m in models
        if any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (m.get("status") or {}).get("conditions") or []
        )
    )


def available_deployments(api: client.ApiClient, namespace: str, selector: str) -> int:
    items = list_all(client.AppsV1Api(api).list_namespaced_deployment, namespace, label_selector=selector)
    return sum(1 for d in items if d.status and (d.status.available_replicas or 0) >= 1)


def count(api: client.ApiClient, namespace: str, what: str) -> int:
    core, apps, custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
    fns: dict[str, Callable[[], list[Any]]] = {
        "models": lambda: list_all(custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL),
        "deployments": lambda: list_all(apps.list_namespaced_deployment, namespace),
        "pods": lambda: list_all(core.list_namespaced_pod, namespace),
        "events": lambda: [
            e
            for e in list_all(core.list_namespaced_event, namespace)
            if e.reporting_component == "clef.riotpiao.com/operator"
        ],
    }
    return len(fns[what]())


def delete_namespace_objects(api: client.ApiClient, namespace: str) -> None:
    custom = client.CustomObjectsApi(api)
    for m in list_all(custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL):
        try:
            custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, m["metadata"]["name"])
        except ApiException as e:
            if e.status != 404:
                raise


def ensure_namespace(api: client.ApiClient, name: str) -> None:
    try:
        client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    except ApiException as e:
        if e.status != 409:
            raise

    def has_sa() -> bool:
        try:
            client.CoreV1Api(api).read_namespaced_service_account("default", name)
        except ApiException:
            return False
        return True

    wait_until(has_sa, 30, f"ServiceAccount {name}/default")


# ------------------------------------------------------------------------------ the operator


class Operator:
    """`clef-operator run` from this checkout, as its ServiceAccount, with its liveness endpoint
    (which carries the `clef-state` probe: what the operator holds, per kind)."""

    def __init__(
        self,
        admin_kubeconfig: Path,
        workdir: Path,
        args: Iterable[str] = (),
        scope: Iterable[str] = ("--all-namespaces",),
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = service_account_kubeconfig(
            admin_kubeconfig, OPERATOR_NAMESPACE, OPERATOR_SA, workdir / "operator.kubeconfig", 7200
        )
        self.port = free_port()
        self.log = workdir / "operator.log"
        with self.log.open("ab") as out:
            self.proc = spawn_operator(
                ["run", *scope, f"--liveness=http://127.0.0.1:{self.port}/healthz", *args],
                kubeconfig,
                out,
            )

    def state(self) -> dict[str, Any] | None:
        """The liveness endpoint's probes (None while it does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=5) as r:
                found: dict[str, Any] = json.loads(r.read() or b"{}")
                return found
        except (OSError, ValueError):
            return None

    def held(self) -> dict[str, int]:
        state = self.state() or {}
        held: dict[str, int] = state.get("clef-state") or {}
        return held

    def synced(self) -> bool:
        return bool(self.held().get("synced"))

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def memory(self) -> dict[str, float]:
        """RSS and where it is, MiB (smaps_rollup: anonymous = heap, malloc arenas, Python's
        object arenas, thread stacks; file = the interpreter and the extension modules mapped),
        and the thread count."""
        rollup = Path(f"/proc/{self.proc.pid}/smaps_rollup").read_text().splitlines()
        kib = {line.split()[0].rstrip(":"): int(line.split()[1]) for line in rollup[1:]}
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        threads = int(status.split("Threads:", 1)[1].split()[0])
        return {
            "rss_mib": round(kib["Rss"] / 1024, 1),
            "anonymous_mib": round(kib["Anonymous"] / 1024, 1),
            "file_mib": round((kib["Rss"] - kib["Anonymous"]) / 1024, 1),
            "threads": threads,
        }

    def report(self, label: str, timeout: float = 60.0) -> None:
        """With CLEF_MEMORY_REPORT=FILE in the environment (the operator's debug hook,
        clef_operator.manager.memory), a report appended to FILE under `label`: SIGUSR1, then wait until
        it is written.  Nothing without it.  A report allocates (a snapshot with tracing: tens of
        MiB): take RSS before it."""
        path = os.environ.get("CLEF_MEMORY_REPORT")
        if not path:
            return
        target = Path(path)
        with target.open("a") as f:
            f.write(f"=== {label}: RSS {self.rss_mib():.1f} MiB\n")
        before = target.read_text(errors="replace").count("--- memory report")
        os.kill(self.proc.pid, signal.SIGUSR1)
        wait_until(
            lambda: target.read_text(errors="replace").count("--- memory report") > before,
            timeout,
            f"the operator's memory report in {path}",
        )

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        stop_operator(self.proc)


# ------------------------------------------------------------------------------ the audit log


@dataclass(frozen=True)
class RequestRate:
    seconds: float
    requests: int
    by_kind: dict[str, int]

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def _timestamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def request_rate(
    audit_log: Path, offset: int, start: float, end: float, user: str = OPERATOR_USER
) -> RequestRate:
    """Requests by `user` received in [start, end] (epoch seconds), watches aside (a watch is one
    long request; its renewal every few minutes is the only traffic an idle informer makes)."""
    kinds: Counter[str] = Counter()
    seen: set[str] = set()
    with audit_log.open() as f:
        f.seek(offset)
        for line in f:
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("user", {}).get("username") != user or event.get("verb") == "watch":
                continue
            if event.get("auditID") in seen:
                continue
            when = _timestamp(event["requestReceivedTimestamp"])
            if not start <= when <= end:
                continue
            seen.add(event.get("auditID", ""))
            ref = event.get("objectRef") or {}
            kinds[f"{event['verb']} {ref.get('resource', event.get('requestURI', '?'))}"] += 1
    return RequestRate(end - start, sum(kinds.values()), dict(kinds))
