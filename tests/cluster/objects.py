"""Builders for the objects the cluster tests create, shaped like what the operator renders."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from clef_devcluster.config import COMPONENT_LABEL, VERIFICATION

RUNTIME_IMAGE = "registry.clef.test/clef-runtime:1.0"


def python_command(code: str) -> list[str]:
    # `python` resolves to the project's venv through the runner's PATH, as in a runtime image.
    return ["python", "-c", code]


def gpu_resources(gpus: int) -> client.V1ResourceRequirements:
    # Extended resources cannot be overcommitted: a limit alone sets the request to match.
    return client.V1ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)})


def verification_job(
    name: str,
    image: str,
    command: list[str] | None,
    *,
    args: list[str] | None = None,
    gpus: int = 1,
    env: dict[str, str] | None = None,
    extra_env: list[client.V1EnvVar] | None = None,
    message_policy: str = "File",
    deadline_seconds: int | None = 300,
    grace_seconds: int | None = None,
) -> client.V1Job:
    labels = {COMPONENT_LABEL: VERIFICATION, "clef.riotpiao.com/model": "harness-test"}
    env_vars = [client.V1EnvVar(name=k, value=v) for k, v in (env or {}).items()] + list(extra_env or [])
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1JobSpec(
            backoff_limit=0,
            active_deadline_seconds=deadline_seconds,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    runtime_class_name="nvidia",
                    automount_service_account_token=False,
                    termination_grace_period_seconds=grace_seconds,
                    containers=[
                        client.V1Container(
                            name="verify",
                            image=image,
                            command=command,
                            args=args,
                            env=env_vars or None,
                            termination_message_policy=message_policy,
                            resources=gpu_resources(gpus),
                        )
                    ],
                ),
            ),
        ),
    )


def job_condition(job: client.V1Job, kind: str) -> client.V1JobCondition | None:
    for c in (job.status.conditions or []) if job.status else []:
        if c.type == kind and c.status == "True":
            return c
    return None


def serving_deployment(name: str, replicas: int, gpus: int) -> client.V1Deployment:
    labels = {COMPONENT_LABEL: "serving", "app": name}
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels={"app": name}),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    runtime_class_name="nvidia",
                    containers=[
                        client.V1Container(
                            name="engine",
                            image=RUNTIME_IMAGE,
                            args=["serve", "--dtype", "f16"],
                            resources=gpu_resources(gpus),
                        )
                    ],
                ),
            ),
        ),
    )


def describe_pods(core: client.CoreV1Api, namespace: str, selector: str) -> list[dict[str, Any]]:
    """A compact view of pods for failure messages."""
    out = []
    for p in core.list_namespaced_pod(namespace, label_selector=selector).items:
        statuses = [
            {"name": s.name, "state": s.state.to_dict() if s.state else None}
            for s in (p.status.container_statuses or [])
        ]
        out.append(
            {
                "name": p.metadata.name,
                "node": p.spec.node_name,
                "phase": p.status.phase,
                "conditions": [(c.type, c.status, c.reason, c.message) for c in p.status.conditions or []],
                "containers": statuses,
            }
        )
    return out
