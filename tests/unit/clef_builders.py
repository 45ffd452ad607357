"""Builders for the operator's unit tests: specs, reports, and `World`, an in-memory stand-in for
the *effects* of the planner's actions (what the Deployment, Job and endpoint controllers would
do), so rollouts can be stepped through, interrupted and resumed.  The cluster tier uses a real
API server instead; this is only for the pure planner."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from clef_contract.report import SCHEMA_VERSION as REPORT_SCHEMA_VERSION
from clef_operator import labels
from clef_operator.actions import (
    Action,
    AnnotateDeployment,
    CreateConfigMap,
    CreateDeployment,
    CreateJob,
    CreateService,
    DeleteConfigMap,
    DeleteDeployment,
    DeleteJob,
    Event,
    LabelPod,
    PatchServicePorts,
    PatchServiceSelector,
    ReplaceTemplate,
    ScaleDeployment,
)
from clef_operator.api import ClefModelSpec, ClefModelStatus, Dtype, Suite, Verdict, VerificationRecord
from clef_operator.observed import (
    ConfigMapState,
    DeploymentState,
    JobState,
    ModelRef,
    NodeState,
    Observed,
    PodState,
    ServiceState,
)
from clef_operator.render import Owner, render_job
from clef_operator.renderings import renderings
from clef_operator.rollout import Plan, plan_rollout

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
# The operator's verdict key in these tests (the real one is 32 random bytes in a Secret).
VERDICT_KEY = b"clef-unit-test-verdict-key-32byte"
GOOD = "registry.clef.test/clef-runtime:1.0"
GOOD2 = "registry.clef.test/clef-runtime:1.1"
FAULTY = "registry.clef.test/clef-runtime:fault-conv-key-band"


def digest_for(image: str) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(image.encode()).hexdigest()


def base_spec_dict(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "engine": "candle-vllm",
        "image": GOOD,
        "model": {
            "name": "clef-flash",
            "path": "/models/clef-flash",
            "volume": {"hostPath": {"path": "/srv/models"}},
        },
        "dtype": "f16",
        "kvFraction": 0.30,
        "gpus": 1,
        "service": {"name": "clef-serve"},
        "rollout": {"scaleDownDelaySeconds": 30},
    }
    spec.update(overrides)
    # These tests are of the kernels mode unless they say otherwise (candle-vllm defaults to endpoint).
    verification = spec.setdefault("verification", {})
    if "endpoint" not in verification:
        verification.setdefault("mode", "kernels")
    return spec


def make_spec(**overrides: Any) -> ClefModelSpec:
    return ClefModelSpec.model_validate(base_spec_dict(**overrides))


def verification_job(owner: Owner, spec: ClefModelSpec, run: str = "") -> dict[str, Any]:
    """The verification Job a pass renders for `spec` in re-verify `run`."""
    rendered = renderings(owner, spec)
    return render_job(owner, spec, rendered.key, rendered.verification_pod, run)


def report(
    verdict: str = "pass",
    suite: str = "kernels",
    dtype: str = "f16",
    failing: list[dict[str, str]] | None = None,
    error: str | None = None,
    summary: str = "token ids 420/420, conv absmax 0 ≤ 1e-3",
    **extra: Any,
) -> str:
    body: dict[str, Any] = {
        "schemaVersion": REPORT_SCHEMA_VERSION,
        "verdict": verdict,
        "summary": summary,
        "failing": failing or [],
        "suite": suite,
        "dtype": dtype,
        "device": "Tesla V100-SXM2-16GB",
        "runtimeVersion": "0.1.0",
        "error": error,
    }
    body.update(extra)
    return json.dumps(body)


KEY_BAND_FAILURE = [
    {
        "name": "ops.causal_conv1d.coverage",
        "op": "causal_conv1d",
        "detail": "causal_conv1d: key channel band [2048, 4096) is zero",
    }
]


@dataclass
class World:
    """The cluster as the planner would observe it, advanced by applying its actions."""

    spec: ClefModelSpec
    model: ModelRef = field(default_factory=lambda: ModelRef("clef-flash", "default", "uid-1", 1))
    now: datetime = T0
    deployments: dict[str, DeploymentState] = field(default_factory=dict)
    jobs: dict[str, JobState] = field(default_factory=dict)
    pods: dict[str, PodState] = field(default_factory=dict)
    service: ServiceState | None = None
    status: ClefModelStatus = field(default_factory=ClefModelStatus)
    events: list[Event] = field(default_factory=list)
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_plan: Plan | None = None
    config_maps: dict[str, ConfigMapState] = field(default_factory=dict)
    logs: dict[str, bytes] = field(default_factory=dict)
    # The operator's ledger (verdicts.py): None keeps none, as before it existed.
    ledger: dict[str, VerificationRecord] | None = field(default_factory=dict)
    nodes: list[NodeState] = field(default_factory=list)

    def observed(self) -> Observed:
        return Observed(
            deployments=tuple(self.deployments.values()),
            jobs=tuple(self.jobs.values()),
            pods=tuple(self.pods.values()),
            service=self.service,
            config_maps=tuple(self.config_maps.values()),
            logs=dict(self.logs),
            ledger=None if self.ledger is None else dict(self.ledger),
            nodes=tuple(self.nodes),
        )

    def plan(self) -> Plan:
        return plan_rollout(self.model, self.spec, self.observed(), self.status, self.now, VERDICT_KEY)

    def step(self) -> Plan:
        """One reconcile: plan, apply the actions, store the status."""
        p = self.plan()
        if p.ledger is not None:
            self.ledger = p.ledger  # written before status, as reconcile does
        for action in p.actions:
            self.apply(action)
        self.status = p.status
        self.last_plan = p
        return p

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    # ---- effects of actions
    def apply(self, action: Action) -> None:
        effect = self._EFFECTS.get(type(action))
        if effect is None:  # pragma: no cover - a new action type needs an effect here
            raise AssertionError(f"unknown action {action}")
        effect(self, action)

    def _create_job(self, action: CreateJob) -> None:
        m = action.manifest
        name = m["metadata"]["name"]
        assert name not in self.jobs, f"Job {name} created twice"
        self.manifests[name] = dict(m)
        component = m["metadata"]["labels"][labels.COMPONENT]
        self.jobs[name] = JobState(
            name=name,
            key=m["metadata"]["labels"].get(labels.VERIFICATION_KEY, ""),
            uid=f"uid-{name}",
            created_at=self.now,
            component=component,
            step=m["metadata"]["labels"].get(labels.STEP, ""),
            annotations=dict(m["metadata"].get("annotations", {})),
            command=tuple(m["spec"]["template"]["spec"]["containers"][0]["command"]),
        )
        self.pods[name + "-pod"] = PodState(
            name=name + "-pod",
            component=component,
            job_name=name,
            created_at=self.now,
            owner_uids=(f"uid-{name}",),
            uid=f"uid-{name}-pod",
            node_gpu_product="Tesla-V100-SXM2-16GB",
        )

    def _create_config_map(self, action: CreateConfigMap) -> None:
        m = action.manifest
        name = m["metadata"]["name"]
        assert name not in self.config_maps, f"ConfigMap {name} created twice"
        self.manifests[name] = dict(m)
        self.config_maps[name] = ConfigMapState(
            name=name,
            labels=dict(m["metadata"]["labels"]),
            annotations=dict(m["metadata"]["annotations"]),
            binary_data={k: base64.b64decode(v) for k, v in m["binaryData"].items()},
        )

    def _delete_config_map(self, action: DeleteConfigMap) -> None:
        del self.config_maps[action.name]

    def _delete_job(self, action: DeleteJob) -> None:
        self.jobs.pop(action.name)
        self.pods = {k: p for k, p in self.pods.items() if p.job_name != action.name}

    def _create_deployment(self, action: CreateDeployment) -> None:
        m = action.manifest
        name = m["metadata"]["name"]
        assert name not in self.deployments, f"Deployment {name} created twice"
        self.manifests[name] = dict(m)
        self.deployments[name] = DeploymentState(
            name=name,
            revision=m["metadata"]["labels"][labels.REVISION],
            replicas=m["spec"]["replicas"],
            annotations=dict(m["metadata"]["annotations"]),
            created_at=self.now,
            template=m["spec"]["template"],
        )

    def _scale_deployment(self, action: ScaleDeployment) -> None:
        d = self.deployments[action.name]
        self.deployments[action.name] = replace(
            d,
            replicas=action.replicas,
            annotations=_merge(d.annotations, action.annotations),
            generation=d.generation + 1,
        )

    def _annotate_deployment(self, action: AnnotateDeployment) -> None:
        d = self.deployments[action.name]
        self.deployments[action.name] = replace(d, annotations=_merge(d.annotations, action.annotations))

    def _delete_deployment(self, action: DeleteDeployment) -> None:
        del self.deployments[action.name]

    def _create_service(self, action: CreateService) -> None:
        assert self.service is None, "Service created while one exists"
        m = action.manifest
        self.service = ServiceState(
            name=m["metadata"]["name"],
            selector=dict(m["spec"]["selector"]),
            annotations=dict(m["metadata"]["annotations"]),
            owned=True,
            cluster_ip="10.96.0.42",
            ports=tuple(m["spec"]["ports"]),
        )

    def _patch_service_selector(self, action: PatchServiceSelector) -> None:
        assert self.service is not None and self.service.name == action.name
        self.service = replace(
            self.service,
            selector=dict(action.selector),
            annotations={**self.service.annotations, **action.annotations},
        )

    def _patch_service_ports(self, action: PatchServicePorts) -> None:
        assert self.service is not None and self.service.name == action.name
        self.service = replace(self.service, ports=tuple(action.ports))

    def _replace_template(self, action: ReplaceTemplate) -> None:
        d = self.deployments[action.name]
        self.deployments[action.name] = replace(d, template=action.template, generation=d.generation + 1)

    def _label_pod(self, action: LabelPod) -> None:
        pod = self.pods.get(action.name)
        if pod is not None:  # gone: no error, as in writes.VANISHED_IS_DONE
            value = action.labels.get(labels.MODEL, pod.serving_label)
            self.pods[action.name] = replace(pod, serving_label=value or "")

    def _event(self, action: Event) -> None:
        self.events.append(action)

    _EFFECTS: ClassVar[dict[type, Callable[[Any, Any], None]]] = {
        CreateJob: _create_job,
        CreateConfigMap: _create_config_map,
        DeleteConfigMap: _delete_config_map,
        DeleteJob: _delete_job,
        CreateDeployment: _create_deployment,
        ScaleDeployment: _scale_deployment,
        AnnotateDeployment: _annotate_deployment,
        DeleteDeployment: _delete_deployment,
        CreateService: _create_service,
        PatchServiceSelector: _patch_service_selector,
        PatchServicePorts: _patch_service_ports,
        ReplaceTemplate: _replace_template,
        LabelPod: _label_pod,
        Event: _event,
    }

    # ---- what controllers and kubelets would do
    def settle(self) -> None:
        """Every Deployment reaches its desired replica count, all available."""
        for name, d in self.deployments.items():
            self.deployments[name] = replace(
                d,
                observed_generation=d.generation,
                status_replicas=d.replicas,
                ready_replicas=d.replicas,
                available_replicas=d.replicas,
                updated_replicas=d.replicas,
            )

    def job_pod(self, job: str) -> PodState:
        return next(p for p in self.pods.values() if p.job_name == job)

    def set_job_pod(self, job: str, **changes: Any) -> None:
        pod = self.job_pod(job)
        self.pods[pod.name] = replace(pod, **changes)

    def finish_job(
        self,
        job: str | None = None,
        *,
        exit_code: int = 0,
        message: str | None = None,
        image: str | None = None,
        image_id: str | None = None,
        gpu_product: str = "Tesla-V100-SXM2-16GB",
    ) -> str:
        """The verification pod ran to the end; the Job controller records the outcome."""
        job = job or self.current_job()
        if message is None:
            message = report(suite=self.spec.verification.suite.value, dtype=self.spec.dtype.value)
        image = image or self.spec.image
        if image_id is None:
            image_id = f"{image.split(':')[0]}@{digest_for(image)}"
        self.set_job_pod(
            job,
            phase="Succeeded" if exit_code == 0 else "Failed",
            terminated=True,
            exit_code=exit_code,
            termination_message=message,
            image_id=image_id,
            node_name="worker-1",
            node_gpu_product=gpu_product,
            node_gpu_memory_mib=16384,
        )
        j = replace(self.jobs[job], finished_at=self.now)
        if exit_code == 0:
            self.jobs[job] = replace(j, complete=True)
        else:
            self.jobs[job] = replace(
                j,
                failed=True,
                failed_reason="BackoffLimitExceeded",
                failed_message="Job has reached the specified backoff limit",
            )
        return job

    def current_job(self) -> str:
        active = [j for j in self.jobs.values() if not j.finished]
        assert len(active) == 1, f"expected one running Job, got {[j.name for j in active]}"
        return active[0].name

    def active_deployment(self) -> DeploymentState | None:
        if self.service is None:
            return None
        rev = self.service.selector.get(labels.REVISION)
        return next((d for d in self.deployments.values() if d.revision == rev), None)

    def condition(self, type_: str) -> tuple[str, str, str]:
        c = next(c for c in self.status.conditions if c.type == type_)
        return c.status.value, c.reason, c.message

    def event_reasons(self) -> list[str]:
        return [e.reason for e in self.events]

    def deploy_first(self) -> None:
        """First deploy to the steady state: verified, available, selected."""
        self.step()
        self.finish_job()
        self.step()
        self.settle()
        self.step()
        self.step()


def _merge(current: Any, changes: Any) -> dict[str, str]:
    out = dict(current)
    for k, v in changes.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def kinds(plan: Plan) -> list[str]:
    return [type(a).__name__ for a in plan.actions if not isinstance(a, Event)]


def passed_record(key: str = "k1", **changes: Any) -> VerificationRecord:
    """A passing verdict on a V100, unsigned (verdicts.sign makes it one the operator trusts)."""
    record = VerificationRecord(
        key=key,
        image=GOOD,
        digest=f"registry.clef.test/clef-runtime@{digest_for(GOOD)}",
        gpu_class="Tesla-V100-SXM2-16GB",
        dtype=Dtype.F16,
        suite=Suite.KERNELS,
        verdict=Verdict.PASSED,
        reason="Verified",
        summary="token ids 420/420",
        job=f"clef-flash-verify-{key}",
        job_uid=f"uid-job-{key}",
        finished_at=T0.isoformat(),
    )
    return record.model_copy(update=changes)
