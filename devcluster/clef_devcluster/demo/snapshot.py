"""What the demo reads of a ClefModel and its children at one poll."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GROUP, VERSION, PLURAL = "clef.riotpiao.com", "v1alpha1", "clefmodels"
STEP_LABEL = f"{GROUP}/verification-step"
PREVIEW_SINCE = f"{GROUP}/preview-since"


@dataclass
class Snapshot:
    """What one poll saw of one ClefModel and its children."""

    model: dict[str, Any]
    jobs: dict[str, str]  # name -> Pending | Running | Complete | Failed
    job_images: dict[str, str]
    job_steps: dict[str, str]  # name -> verify | goldens | endpoint (the Job's verification step)
    pods: dict[str, tuple[str, str, str]]  # verification pod -> (job, phase, node)
    deployments: dict[str, tuple[int, int]]  # name -> (replicas, available)
    service: tuple[str, str] | None  # (selected revision, ClusterIP)
    previews: set[str]  # Deployments running a candidate as a preview (no Service selects them)

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.model.get("status") or {})

    def condition(self, type_: str) -> dict[str, Any]:
        for c in self.status.get("conditions") or []:
            if c.get("type") == type_:
                return dict(c)
        return {}

    def current(self) -> bool:
        """The status was computed for the spec as it is now (not for the one before a patch)."""
        return self.status.get("observedGeneration") == self.model["metadata"].get("generation")


def read_snapshot(api: Any, namespace: str, name: str, service: str) -> Snapshot:
    """ClefModel `name`, its Jobs, verification pods and Deployments, and Service `service`
    (when it selects this model), as the API server has them now."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    model: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    selector = f"clef.riotpiao.com/model={name}"
    jobs: dict[str, str] = {}
    job_images: dict[str, str] = {}
    job_steps: dict[str, str] = {}
    # The client's models type every field Optional; what the API server returns for these has them.
    job_list: list[Any] = client.BatchV1Api(api).list_namespaced_job(namespace, label_selector=selector).items
    for j in job_list:
        conds = {c.type: c.status for c in (j.status.conditions or [])} if j.status else {}
        state = (
            "Complete"
            if conds.get("Complete") == "True"
            else "Failed"
            if conds.get("Failed") == "True"
            else "Running"
            if j.status and j.status.active
            else "Pending"
        )
        jobs[j.metadata.name] = state
        job_images[j.metadata.name] = j.spec.template.spec.containers[0].image
        job_steps[j.metadata.name] = (j.metadata.labels or {}).get(STEP_LABEL, "verify")
    pods: dict[str, tuple[str, str, str]] = {}
    core = client.CoreV1Api(api)
    pod_list: list[Any] = core.list_namespaced_pod(
        namespace,
        label_selector=f"clef.riotpiao.com/verifies={name},clef.riotpiao.com/component=verification",
    ).items
    for p in pod_list:
        labels = p.metadata.labels or {}
        job = labels.get("batch.kubernetes.io/job-name") or labels.get("job-name", "")
        pods[p.metadata.name] = (job, p.status.phase or "Pending", p.spec.node_name or "")
    deployment_list: list[Any] = (
        client.AppsV1Api(api).list_namespaced_deployment(namespace, label_selector=selector).items
    )
    deployments = {
        d.metadata.name: (d.spec.replicas or 0, (d.status.available_replicas or 0) if d.status else 0)
        for d in deployment_list
    }
    previews = {d.metadata.name for d in deployment_list if PREVIEW_SINCE in (d.metadata.annotations or {})}
    svc: tuple[str, str] | None = None
    try:
        s: Any = core.read_namespaced_service(service, namespace)
        if (s.spec.selector or {}).get("clef.riotpiao.com/model") == name:
            svc = ((s.spec.selector or {}).get("clef.riotpiao.com/revision", ""), s.spec.cluster_ip or "")
    except ApiException as e:
        if e.status != 404:
            raise
    return Snapshot(dict(model), jobs, job_images, job_steps, pods, deployments, svc, previews)
