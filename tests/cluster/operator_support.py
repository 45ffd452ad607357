"""Running the operator against the cluster tier's cluster, and reading what it did.

The operator runs as a real subprocess (`clef-operator run --namespace NS`), so tests can kill
it with SIGKILL mid-rollout and start it again, exactly as a crashing pod would be.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_devcluster.host_operator import OPERATOR_NAMESPACE, clef_flash, spawn_operator, stop_operator
from clef_devcluster.procs import free_port
from clef_operator.api import GROUP, PLURAL, VERSION
from clef_operator.manager.leader import LEASE_NAME

from .conftest import Cluster, wait_for
from .watches import GaplessWatch, states

REPO = Path(__file__).resolve().parents[2]
IMAGE_10 = "registry.clef.test/clef-runtime:1.0"
IMAGE_11 = "registry.clef.test/clef-runtime:1.1"
KEY_BAND_IMAGE = "registry.clef.test/clef-runtime:1.0-conv_key_band_zero"
HANG_IMAGE = "registry.clef.test/clef-runtime:hang"
UNPULLABLE_IMAGE = "registry.clef.test/clef-runtime:unpullable"
V100 = "Tesla-V100-SXM2-16GB"

# A real `clef-runtime verify` on the host's CPU (reduced shapes, Triton interpreter) takes well
# under a minute; waits allow this much plus start-up, and stay inside pytest's 900 s per test so
# a stuck rollout fails with the ClefModel's status and the operator's log, not a bare timeout.
VERIFY_SECONDS = float(os.environ.get("CLEF_TEST_VERIFY_TIMEOUT", "600"))


class OperatorProcess:
    """`clef-operator run` for one namespace, as a subprocess with its log in a file."""

    def __init__(self, kubeconfig: Path, namespace: str, log_path: Path, args: Sequence[str] = ()) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.log_path = log_path
        self.args = tuple(args)  # more `clef-operator run` flags
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        log = self.log_path.open("ab")
        log.write(f"\n===== start {self.starts} =====\n".encode())
        log.flush()
        self.proc = spawn_operator(["run", "--namespace", self.namespace, *self.args], self.kubeconfig, log)
        log.close()

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when the node or the container dies."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no operator log)"


class ElectedOperator:
    """`clef-operator run ... --leader-elect --metrics-bind-address=127.0.0.1:PORT` on this host,
    as the Deployment runs it (`args`: the scope and any election durations)."""

    def __init__(
        self, kubeconfig: Path, args: Sequence[str], log: Path, identity: str = "", uid: int | None = None
    ) -> None:
        self.port = free_port()
        self.log = log
        self.identity = identity
        argv = ["run", *args, "--leader-elect", f"--metrics-bind-address=127.0.0.1:{self.port}"]
        if identity:
            argv.append(f"--leader-elect-identity={identity}")
        with log.open("ab") as out:
            self.proc = spawn_operator(argv, kubeconfig, out, uid)

    def get(self, path: str) -> str | None:
        return http_get(self.port, path)

    def healthy(self) -> bool:
        return self.get("/healthz") is not None

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """Every sample of /metrics, keyed by name and labels."""
        return scrape(self.port, self.tail)

    def signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        """SIGTERM (a clean stop hands the Lease back), SIGKILL if it does not go."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)  # a paused one could not act on SIGTERM
        stop_operator(self.proc)

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def http_get(port: int, path: str) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return str(r.read().decode())
    except OSError:
        return None


def scrape(port: int, tail: Callable[[], str]) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an operator's /metrics on this host, keyed by name and labels."""
    from prometheus_client.parser import text_string_to_metric_families

    text = http_get(port, "/metrics")
    assert text is not None, f"no /metrics from the operator:\n{tail()}"
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def metric(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when there is none)."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls)


def lease_holder(cluster: Cluster) -> str:
    try:
        lease: Any = client.CoordinationV1Api(cluster.api).read_namespaced_lease(
            LEASE_NAME, OPERATOR_NAMESPACE
        )
    except ApiException as e:
        if e.status == 404:
            return ""
        raise
    return str(lease.spec.holder_identity or "")


def delete_lease(cluster: Cluster) -> None:
    """A Lease left by an operator that was killed would make the next one wait its duration out."""
    with contextlib.suppress(ApiException):
        client.CoordinationV1Api(cluster.api).delete_namespaced_lease(LEASE_NAME, OPERATOR_NAMESPACE)


def clefmodel(name: str, image: str = IMAGE_10, **spec: Any) -> dict[str, Any]:
    """clef-flash as in DESIGN: 1 GPU, f16, kvFraction 0.30, Service clef-serve."""
    body: dict[str, Any] = {
        **clef_flash(image),
        "nodeSelector": {"nvidia.com/gpu.product": V100},
        "service": {"name": "clef-serve"},
        "verification": {"timeoutSeconds": int(VERIFY_SECONDS)},
        "rollout": {"scaleDownDelaySeconds": 5},
    }
    body.update(spec)
    # The kernels mode unless a test asks the engine (candle-vllm defaults to endpoint).
    verification = body["verification"]
    if "endpoint" not in verification and verification.get("required", True):
        verification.setdefault("mode", "kernels")
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClefModel", "metadata": {"name": name}, "spec": body}


# Endpoint mode on the local cluster: the runtime image that makes goldens and compares, and two
# short chat prompts (a few new tokens each: the engine runs on the CPU).
ENDPOINT_RUNTIME = IMAGE_10
ENDPOINT_PROMPTS = [
    {"name": "capital", "text": "What is the capital of France?"},
    {"name": "count", "text": "Count from one to five."},
]
ENDPOINT_MAX_NEW_TOKENS = 6


def endpoint_model(
    name: str,
    checkpoint: Path,
    image: str,
    ready_timeout: int,
    model_path: str = "/models/clef-flash",
    **spec: Any,
) -> dict[str, Any]:
    """A ClefModel in mode endpoint on the chat checkpoint at `checkpoint` (a host directory,
    mounted at `model_path`), asked ENDPOINT_PROMPTS only; `spec` adds or replaces fields."""
    return clefmodel(
        name,
        image,
        dtype="f16",
        model={
            "name": "clef-flash",
            "path": "/models/clef-flash",
            "volume": {"hostPath": {"path": str(checkpoint)}},
        },
        verification={
            "mode": "endpoint",
            "timeoutSeconds": int(VERIFY_SECONDS),
            "endpoint": {
                "runtimeImage": ENDPOINT_RUNTIME,
                "builtinPrompts": "none",
                "prompts": ENDPOINT_PROMPTS,
                "maxNewTokens": ENDPOINT_MAX_NEW_TOKENS,
                "requestTimeoutSeconds": 120,
                "readyTimeoutSeconds": ready_timeout,
            },
        },
        rollout={"scaleDownDelaySeconds": 2, "revisionHistoryLimit": 1},
        **spec,
    )


class Models:
    """ClefModels in one namespace, through the real API server."""

    def __init__(self, cluster: Cluster, namespace: str, operator: OperatorProcess | None = None) -> None:
        self.cluster = cluster
        self.ns = namespace
        self.operator = operator
        self.custom = client.CustomObjectsApi(cluster.api)

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        obj: Any = self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, body)
        return dict(obj)

    def get(self, name: str) -> dict[str, Any]:
        obj: Any = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)
        return dict(obj)

    def patch(self, name: str, patch: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, name, patch, _content_type="application/merge-patch+json"
        )

    def set_image(self, name: str, image: str) -> None:
        self.patch(name, {"spec": {"image": image}})

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        for c in self.get(name).get("status", {}).get("conditions", []):
            if c["type"] == type_:
                return dict(c)
        return {}

    def describe(self, name: str) -> str:
        try:
            status = self.get(name).get("status", {})
        except ApiException as e:
            status = {"error": e.reason}
        brief = {k: v for k, v in status.items() if k != "verifications"}
        text = json.dumps(brief, indent=1)[:3000]
        if self.operator is not None:
            text += f"\n--- operator log ---\n{self.operator.tail()}"
        return text

    def wait_condition(
        self, name: str, type_: str, status: str, reason: str | None = None, timeout: float = 60
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            try:
                c = self.condition(name, type_)
            except ApiException:
                return None
            if c.get("status") == status and (reason is None or c.get("reason") == reason):
                return c
            return None

        what = f"{name} {type_}={status}" + (f" ({reason})" if reason else "")
        return wait_for(probe, timeout, what, lambda: self.describe(name))

    def wait_status(
        self, name: str, check: Callable[[dict[str, Any]], bool], what: str, timeout: float = 60
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            status = self.get(name).get("status", {})
            return status if check(status) else None

        return wait_for(probe, timeout, what, lambda: self.describe(name))

    # ---- children
    def deployments(self, model: str) -> list[client.V1Deployment]:
        items: list[Any] = self.cluster.apps.list_namespaced_deployment(
            self.ns, label_selector=f"clef.riotpiao.com/model={model}"
        ).items
        return items

    def deployment_of(self, model: str, revision: str) -> client.V1Deployment:
        return self.cluster.apps.read_namespaced_deployment(f"{model}-{revision}", self.ns)

    def jobs(self, model: str) -> list[client.V1Job]:
        items: list[Any] = self.cluster.batch.list_namespaced_job(
            self.ns, label_selector=f"clef.riotpiao.com/model={model}"
        ).items
        return items

    def events(self, model: str) -> list[client.CoreV1Event]:
        items: list[Any] = self.cluster.core.list_namespaced_event(
            self.ns, field_selector=f"involvedObject.name={model},involvedObject.kind=ClefModel"
        ).items
        return items

    def event_reasons(self, model: str) -> list[str]:
        return [e.reason for e in self.events(model)]

    def wait_events(self, model: str, *reasons: str, timeout: float = 30) -> list[str]:
        """Wait until every reason has an event, and return all reasons seen.

        The operator posts events after the change they describe (kopf queues them), so a test
        that has just seen the change must wait for its event rather than read the list once.
        """
        wanted = set(reasons)
        seen: list[str] = []

        def posted() -> bool:
            seen[:] = self.event_reasons(model)
            return wanted <= set(seen)

        wait_for(posted, timeout, f"events {sorted(wanted)} on {model}", lambda: seen)
        return seen


def image_of(deployment: client.V1Deployment) -> str:
    return deployment.spec.template.spec.containers[0].image  # type: ignore[union-attr,index]


def ready_endpoints(cluster: Cluster, namespace: str, service: str) -> int:
    slices: list[Any] = (
        client.DiscoveryV1Api(cluster.api)
        .list_namespaced_endpoint_slice(namespace, label_selector=f"kubernetes.io/service-name={service}")
        .items
    )
    return ready_in(slices)


def ready_in(slices: Iterable[Any]) -> int:
    """Ready endpoints across a Service's EndpointSlices (no conditions reads as ready)."""
    return sum(1 for s in slices for e in (s.endpoints or []) if e.conditions is None or e.conditions.ready)


class EndpointWatch:
    """Watches the Service's EndpointSlices without gaps (`watches.GaplessWatch`) and gives the
    ready count in every state they went through, so a test can prove the Service never had zero
    ready endpoints during a rollout, however briefly.  A broken watch fails the test."""

    def __init__(self, cluster: Cluster, namespace: str, service: str) -> None:
        self.watch = GaplessWatch(
            client.DiscoveryV1Api(cluster.api).list_namespaced_endpoint_slice,
            namespace,
            label_selector=f"kubernetes.io/service-name={service}",
        )

    @property
    def counts(self) -> list[int]:
        """The ready count at the start and after every change to any of the slices."""
        return [ready_in(state.values()) for state in states(self.watch.initial, self.watch.snapshot())]

    def __enter__(self) -> EndpointWatch:
        self.watch.start()
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.watch.__exit__(exc_type, *rest)


def model_watch(cluster: Cluster, namespace: str, name: str) -> GaplessWatch:
    """Every change to ClefModel `name` (its status included), without gaps, once started."""
    return GaplessWatch(
        client.CustomObjectsApi(cluster.api).list_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        field_selector=f"metadata.name={name}",
    )


def delete_models(cluster: Cluster, namespace: str, timeout: float = 30) -> None:
    """Delete the namespace's ClefModels while the operator still runs, so it can release them
    (they carry its finalizer); whatever is left after `timeout` loses the finalizer, so the
    namespace can go even when a test failed with the operator dead."""
    custom = client.CustomObjectsApi(cluster.api)

    def names() -> list[str]:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        return [m["metadata"]["name"] for m in items]

    for name in names():
        with contextlib.suppress(ApiException):
            custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    deadline = time.monotonic() + timeout
    while names() and time.monotonic() < deadline:
        time.sleep(0.5)
    for name in names():
        with contextlib.suppress(ApiException):
            custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"metadata": {"finalizers": None}},
                _content_type="application/merge-patch+json",
            )


@contextmanager
def operator_running(
    cluster: Cluster, namespace: str, log_dir: Path, args: Sequence[str] = ()
) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster.kubeconfig, namespace, log_dir / f"operator-{namespace}.log", args)
    op.start()
    try:
        yield op
    finally:
        if not op.alive():
            op.start()
        delete_models(cluster, namespace)
        op.stop()


def gpus_in_use(cluster: Cluster, node: str) -> int:
    pods: list[Any] = cluster.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    used = 0
    for p in pods:
        if p.status.phase in ("Succeeded", "Failed"):
            continue
        for c in p.spec.containers:
            limits = (c.resources.limits or {}) if c.resources else {}
            used += int(limits.get("nvidia.com/gpu", 0))
    return used


def wait_gpus_free(cluster: Cluster, node: str, needed: int, capacity: int, timeout: float = 120) -> None:
    """Pods of earlier tests' namespaces may still be terminating on the shared nodes."""
    wait_for(
        lambda: capacity - gpus_in_use(cluster, node) >= needed,
        timeout,
        f"{needed} free GPUs on {node}",
        lambda: f"{gpus_in_use(cluster, node)} of {capacity} in use",
    )
