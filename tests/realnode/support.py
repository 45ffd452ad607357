"""What the real-node tier's model tests share: ClefModel objects, their conditions, their
namespace's events, a namespace that enforces Pod Security "restricted", and a watch on models."""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client, watch

from clef_operator.api import GROUP, PLURAL, VERSION

from .conftest import RealCluster, watch_until

RESTRICTED = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn", "audit")}


def restricted_namespace(real: RealCluster, ns: str) -> None:
    real.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns, labels=RESTRICTED)))
    watch_until(
        real.core.list_namespaced_service_account, lambda sas: sas or None, 30, f"ServiceAccount {ns}/default",
        namespace=ns, field_selector="metadata.name=default",
    )  # fmt: skip
    # The namespace really enforces the profile: a pod without its settings is refused.
    probe = real.run_kubectl(
        "-n", ns, "run", "pss-probe", "--image=registry.clef.test/x:1.0", "--dry-run=server", check=False
    )  # fmt: skip
    assert probe.returncode != 0 and "PodSecurity" in probe.stderr, probe.stderr


def model_object(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClefModel", "metadata": {"name": name}, "spec": spec}


def condition(model: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (model.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return None


def events_of(real: RealCluster, ns: str) -> str:
    events = real.core.list_namespaced_event(ns).items
    return "\n".join(
        f"{e.involved_object.kind}/{e.involved_object.name}: {e.reason}: {e.message}" for e in events[-20:]
    )


def delete_namespace(real: RealCluster, custom: client.CustomObjectsApi, ns: str) -> None:
    for m in custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]:
        custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, m["metadata"]["name"])
    real.core.delete_namespace(ns)


def watch_models(
    custom: client.CustomObjectsApi, ns: str, done: Any, timeout: float, describe: Any
) -> dict[str, Any]:
    """watch_until for custom objects (plain dicts, not models)."""
    deadline = time.monotonic() + timeout
    listed = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
    found = done(listed["items"])
    if found:
        return dict(found)
    rv = listed["metadata"]["resourceVersion"]
    objects = {m["metadata"]["name"]: m for m in listed["items"]}
    w = watch.Watch()
    while (left := deadline - time.monotonic()) > 0:
        for event in w.stream(
            custom.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL,
            resource_version=rv, timeout_seconds=max(1, int(min(left, 20))),
        ):  # fmt: skip
            obj = event["object"]
            rv = obj["metadata"]["resourceVersion"]
            objects[obj["metadata"]["name"]] = obj
            found = done(list(objects.values()))
            if found:
                w.stop()
                return dict(found)
        # A watch that ended without news: look at the events once more (a refusal is an event).
        found = done(list(objects.values()))
        if found:
            return dict(found)
    raise AssertionError(
        f"timed out after {timeout:.0f}s waiting for the ClefModel to be Ready\n{describe()}"
    )
