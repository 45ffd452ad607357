"""The operator's client of the API server: its credentials and the write fence (`api_client`),
discovery (`serves`), the operator's own namespace, and what keeps the client lean between bursts
of passes (each API method's validator built ahead, `build_validators`; idle pooled connections
closed, `close_idle_connections`)."""

from __future__ import annotations

import inspect
import os
import queue
from collections.abc import Callable
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from clef_operator.manager import leader

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

# The API methods a pass may call (the lists run at start-up already).  Each builds its argument
# validator on its first call (pydantic, in the kubernetes client; ~100 objects each, kept for
# good): `Kube.warm_up` builds them before the first burst of passes.
PASS_METHODS = {
    "apps": ("create_namespaced_deployment", "delete_namespaced_deployment", "patch_namespaced_deployment"),
    "batch": ("create_namespaced_job", "delete_namespaced_job"),
    "core": (
        "create_namespaced_config_map",
        "create_namespaced_event",
        "create_namespaced_secret",
        "create_namespaced_service",
        "delete_namespaced_config_map",
        "patch_namespaced_pod",
        "list_namespaced_event",
        "patch_namespaced_service",
        "read_namespaced_config_map",
        "read_namespaced_pod_log",
        "read_namespaced_secret",
        "patch_namespaced_config_map",
        "read_namespaced_service",
    ),
    "custom": ("patch_namespaced_custom_object", "patch_namespaced_custom_object_status"),
}


def api_client(fenced: bool = True, pool: int | None = None) -> client.ApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG).  Fenced:
    every write refused while this replica cannot prove it holds the Lease (`leader`); reads and
    watches pass.  `pool`: connections kept open (one per reconcile worker and watch)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    if pool is not None:
        configuration.connection_pool_maxsize = pool
    api = leader.FencedApiClient(configuration=configuration) if fenced else client.ApiClient(configuration)
    api.user_agent = leader.user_agent()
    return api


def serves(api: client.ApiClient, group: str, version: str, plural: str) -> bool:
    """Whether the API server serves `plural` in `group/version` (discovery: no RBAC needed)."""
    try:
        found: Any = client.CustomObjectsApi(api).get_api_resources(group, version)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return found is not None and any(r.name == plural for r in found.resources or [])


def operator_namespace() -> str:
    """The operator's own namespace: its pod's (POD_NAMESPACE, from the downward API), else
    CLEF_OPERATOR_NAMESPACE, else the kubeconfig context's namespace, else `default`."""
    for name in ("POD_NAMESPACE", "CLEF_OPERATOR_NAMESPACE"):
        if os.environ.get(name):
            return os.environ[name]
    try:
        _, context = config.list_kube_config_contexts()
        return str((context or {}).get("context", {}).get("namespace") or "default")
    except (config.ConfigException, OSError):
        return "default"


def build_validators(apis: Any) -> None:
    """Build the argument validator of every method in PASS_METHODS, read from `apis` by API name
    (`core`, `apps`, ...): what a first call would build mid-burst and keep for good."""
    for api_name, names in PASS_METHODS.items():
        api = getattr(apis, api_name)
        for name in names:
            _build_validator(getattr(api, name))


def _build_validator(method: Callable[..., Any]) -> None:
    """Call an API method with none of its required arguments: its validator is built (pydantic
    builds it on first call) and refuses the call, so nothing is sent.  A method without required
    arguments would send a request: it is not called."""
    parameters = inspect.signature(method).parameters.values()
    required = [
        p for p in parameters if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if not required:
        return
    try:
        method()
    except (TypeError, ValueError):  # pydantic's ValidationError is a ValueError
        return
    raise RuntimeError(f"{method.__name__} was called without its arguments")  # pragma: no cover


def close_idle_connections(api: client.ApiClient) -> int:
    """Close the idle connections of every pool of `api` (urllib3's pools keep them in a queue,
    with None for a free slot); a connection in use is left alone.  Without urllib3's pools (a
    client of another shape) nothing is closed."""
    manager = getattr(getattr(api, "rest_client", None), "pool_manager", None)
    pools = getattr(manager, "pools", None)
    if pools is None:
        return 0
    closed = 0
    for key in pools.keys():  # noqa: SIM118 (the container refuses iteration)
        kept = getattr(pools.get(key), "pool", None)
        if kept is None:
            continue
        taken = []
        while True:
            try:
                taken.append(kept.get(block=False))
            except queue.Empty:
                break
        for conn in taken:
            if conn is not None:
                conn.close()
                closed += 1
        for _ in taken:
            try:
                kept.put(None, block=False)
            except queue.Full:  # a request made a connection meanwhile: its slot is taken
                break
    return closed
