"""Pure manifest rendering: spec (+ revision facts) -> Deployment, verification Job, Service.

Nothing here reads the cluster or the clock; the same inputs always give the same dicts, which is
what makes revisions (hashes of these renderings) stable across operator restarts.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from clef_contract.command import RUNTIME_UID, TERMINATION_LOG, TERMINATION_LOG_ENV, shape_flags
from clef_operator import labels
from clef_operator.api import (
    API_VERSION,
    KIND,
    ClefModelSpec,
    Dtype,
    Engine,
    ServiceSpec,
    Suite,
)
from clef_operator.kvcache import MIB, kv_budget_bytes_per_gpu
from clef_operator.revision import deployment_name, job_name, short_hash

VERIFY_CONTAINER = "verify"
ENGINE_CONTAINER = "engine"
JOB_TTL_SECONDS = 3600

VLLM_DTYPE = {Dtype.F16: "float16", Dtype.BF16: "bfloat16", Dtype.F32: "float32"}
READINESS_PATH = {Engine.CANDLE_VLLM: "/v1/models", Engine.VLLM: "/health", Engine.MISTRALRS: "/health"}


@dataclass(frozen=True)
class Owner:
    """The ClefModel that owns what is rendered."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def _fraction(value: float) -> str:
    return f"{value:g}"


def engine_argv(spec: ClefModelSpec) -> list[str]:
    """The engine preset: spec fields -> the engine's own flags (docs/api.md, "Engine presets")."""
    tp = spec.effective_tensor_parallel
    port = str(spec.service.container_port)
    if spec.engine is Engine.CANDLE_VLLM:
        # candle-vllm wants the weight folder with its trailing slash, device ordinals for its
        # tensor-parallel ranks, and a KV fraction of the memory left after loading.
        weights = spec.model.path.rstrip("/") + "/"
        argv = [
            "candle-vllm",
            "--w",
            weights,
            "--dtype",
            spec.dtype.value,
            "--d",
            ",".join(str(i) for i in range(tp)),
            "--gpu-memory-fraction",
            _fraction(spec.kv_fraction),
            "--h",
            "0.0.0.0",
            "--p",
            port,
        ]
    elif spec.engine is Engine.MISTRALRS:
        argv = mistralrs_argv(spec)
    else:
        # vLLM's --gpu-memory-utilization covers weights and activations too, so the same
        # "fraction of what the weights leave" is given as an explicit byte count.
        assert spec.gpu_memory_mib is not None, "the CRD requires spec.gpuMemoryMiB for vllm"
        argv = [
            "vllm",
            "serve",
            spec.model.path,
            "--served-model-name",
            spec.model.name,
            "--dtype",
            VLLM_DTYPE[spec.dtype],
            "--tensor-parallel-size",
            str(tp),
            "--kv-cache-memory-bytes",
            str(kv_budget_bytes_per_gpu(spec, spec.gpu_memory_mib)),
            "--host",
            "0.0.0.0",
            "--port",
            port,
        ]
        if spec.gpus // tp > 1:
            argv += ["--pipeline-parallel-size", str(spec.gpus // tp)]
    return argv + list(spec.args)


def mistralrs_argv(spec: ClefModelSpec) -> list[str]:
    """mistral.rs 0.8.1 (`mistralrs serve`, its model type auto-detected from config.json).  It has
    no flag for a served name (clients ask for `default`), nor for a tensor-parallel degree: it
    uses every GPU of the pod, which the CRD makes spec.gpus.  Its KV cache (PagedAttention, on by
    default on CUDA) gets `--pa-memory-mb` per GPU, which mistral.rs takes as is (its
    `--pa-memory-fraction` would also count the weights).  Its prefix cache is off: in 0.8.1 it
    hands one request's GDN state to the next that shares a prefix (docs/verification.md, "The
    real-engine tier"), and the preview replica that is verified runs this same argv."""
    assert spec.gpu_memory_mib is not None, "the CRD requires spec.gpuMemoryMiB for mistralrs"
    return [
        "mistralrs",
        "serve",
        "-m",
        spec.model.path,
        "--dtype",
        spec.dtype.value,
        "--pa-memory-mb",
        str(kv_budget_bytes_per_gpu(spec, spec.gpu_memory_mib) // MIB),
        "--prefix-cache-n",
        "0",
        "--host",
        "0.0.0.0",
        "--port",
        str(spec.service.container_port),
    ]


def verify_argv(spec: ClefModelSpec) -> list[str]:
    """`clef-runtime verify ...` (docs/architecture.md, "The verification command")."""
    verification = spec.verification
    argv = list(verification.command) or ["clef-runtime", "verify"]
    argv += ["--suite", verification.suite.value, "--dtype", spec.dtype.value]
    arch = spec.model.architecture
    argv += ["--preset", arch.preset]
    # Every shape field, always: the Job checks the served model's heads and dims, whatever the
    # preset's defaults are (clef-runtime verify --shape).
    argv += shape_flags(arch.model_dump())
    if verification.suite is not Suite.KERNELS and spec.model.volume is not None:
        argv += ["--checkpoint", VERIFIER_MODEL_PATH]
    if verification.tolerance_scale is not None:
        argv += ["--tolerance-scale", f"{verification.tolerance_scale:g}"]
    return argv


def _resources(spec: ClefModelSpec) -> dict[str, Any]:
    limits: dict[str, Any] = dict(spec.resources.limits)
    limits[labels.GPU_RESOURCE] = str(spec.gpus)
    out: dict[str, Any] = {"limits": limits}
    if spec.resources.requests:
        out["requests"] = dict(spec.resources.requests)
    return out


def _env(spec: ClefModelSpec, extra: dict[str, str] | None = None) -> list[dict[str, str]]:
    return env_with([{"name": e.name, "value": e.value} for e in spec.env], extra or {})


def env_with(env: list[dict[str, str]], extra: dict[str, str]) -> list[dict[str, str]]:
    """`env` plus the entries of `extra` whose names it does not set."""
    names = {e["name"] for e in env}
    return env + [{"name": name, "value": value} for name, value in extra.items() if name not in names]


# Where a verifier (kernels verify, goldens) finds the checkpoint: a path of clef's, not
# spec.model.path, which a namespace editor could point at the verifier's own code (mounting the
# weights volume over site-packages) to run code of their own in its place.
VERIFIER_MODEL_PATH = "/clef/model"


def model_volume(
    spec: ClefModelSpec, mount_path: str | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The weights volume and its read-only mount, at spec.model.path or at `mount_path`."""
    volume = spec.model.volume
    if volume is None:
        return [], []
    source: dict[str, Any]
    if volume.pvc is not None:
        source = {"persistentVolumeClaim": {"claimName": volume.pvc.claim_name, "readOnly": True}}
    else:
        assert volume.host_path is not None, "the CRD requires exactly one volume source"
        source = {"hostPath": {"path": volume.host_path.path, "type": "Directory"}}
    mount: dict[str, Any] = {"name": "model", "mountPath": mount_path or spec.model.path, "readOnly": True}
    if volume.sub_path:
        mount["subPath"] = volume.sub_path
    return [{"name": "model", **source}], [mount]


def placement(spec: ClefModelSpec) -> dict[str, Any]:
    """spec.nodeSelector and spec.tolerations, which every pod clef creates for the model carries
    (docs/api.md): serving, preview, kernels verification, goldens and the comparison Job alike.
    A pool kept for the model (a taint, a label) is where all of its pods run."""
    out: dict[str, Any] = {}
    if spec.node_selector:
        out["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        out["tolerations"] = [t.to_wire() for t in spec.tolerations]
    return out


def scheduling(spec: ClefModelSpec) -> dict[str, Any]:
    """`placement` plus the runtime class, for the pods that use the GPU; no service-account
    token and no Service variables for any of them."""
    return {
        "runtimeClassName": spec.runtime_class_name,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        **placement(spec),
    }


CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
# A verifier's container: CONTAINER_SECURITY on a read-only root (its one writable path is the
# `tmp` emptyDir at /tmp, where the runtime image keeps HOME and Triton's cache).
VERIFIER_CONTAINER_SECURITY = {**CONTAINER_SECURITY, "readOnlyRootFilesystem": True}
# A verifier's pod (kernels verify, goldens, comparison): it runs `clef-runtime`, which needs no
# privilege and runs as any UID, so clef sets the runtime image's own user rather than trusting
# the image's USER.  With VERIFIER_CONTAINER_SECURITY this is everything Pod Security
# "restricted" asks for (docs/operations.md, "Pods").
VERIFIER_POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": RUNTIME_UID,
    "runAsGroup": RUNTIME_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
TMP_VOLUME = {"name": "tmp", "emptyDir": {}}
TMP_MOUNT = {"name": "tmp", "mountPath": "/tmp"}


def serving_pod_security(spec: ClefModelSpec) -> dict[str, Any]:
    """The container runtime's default syscall filter, which engines are built and tested under.
    The user is the image's (vLLM's and candle-vllm's images run as root) unless spec.runAsUser
    names one: then the pod runs as that UID, non-root, and meets Pod Security "restricted"."""
    out: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if spec.run_as_user is not None:
        out = {"runAsNonRoot": True, "runAsUser": spec.run_as_user, **out}
    return out


def gpu_pin(spec: ClefModelSpec, gpu_class: str | None) -> dict[str, str]:
    """spec.nodeSelector plus the GPU class a verdict is for: a verdict speaks for one class, so
    serving pods go only where it passed (nvidia.com/gpu.product, GPU feature discovery's label)."""
    selector = dict(spec.node_selector)
    if gpu_class:
        selector[labels.NODE_GPU_PRODUCT] = gpu_class
    return selector


def driver_terms(drivers: tuple[str, ...]) -> list[dict[str, Any]]:
    """Node selector terms (any of them) that admit exactly the nodes whose driver, as
    `observed.node_versions` reads it, is one of `drivers`: the full label, or, on a node without
    it, the three deprecated parts; "" is a node that reports neither (no full label and not all
    three parts)."""
    full, parts = labels.NODE_DRIVER_VERSION, labels.NODE_DRIVER_PARTS
    no_full = {"key": full, "operator": "DoesNotExist"}
    known = sorted({d for d in drivers if d})
    terms: list[dict[str, Any]] = []
    if known:
        terms.append({"matchExpressions": [{"key": full, "operator": "In", "values": known}]})
    for d in known:
        split = d.split(".")
        if len(split) == len(parts) and all(split):
            by_part = [{"key": k, "operator": "In", "values": [v]} for k, v in zip(parts, split, strict=True)]
            terms.append({"matchExpressions": [no_full, *by_part]})
    if "" in drivers:
        terms += [{"matchExpressions": [no_full, {"key": k, "operator": "DoesNotExist"}]} for k in parts]
    return terms


def driver_affinity(drivers: tuple[str, ...]) -> dict[str, Any]:
    """Required node affinity to the nodes of `drivers` (`driver_terms`)."""
    required = {"nodeSelectorTerms": driver_terms(drivers)}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def render_serving_pod_spec(
    spec: ClefModelSpec, image: str, gpu_class: str | None = None, drivers: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """The serving pod, running `image` (a pinned `repo@sha256:...` once verified) on nodes of
    `gpu_class` (the class its verdict passed on; None: no verdict, spec.nodeSelector as written)
    whose driver is one of `drivers` (those a verdict covers, `plan_drivers`; None: no pin)."""
    volumes, mounts = model_volume(spec)
    # Tensor-parallel ranks talk through shared memory; the default 64 MiB /dev/shm is too small.
    volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
    mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    probe = {"httpGet": {"path": READINESS_PATH[spec.engine], "port": "http"}, "periodSeconds": 10}
    container = {
        "name": ENGINE_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": engine_argv(spec),
        "ports": [{"name": "http", "containerPort": spec.service.container_port, "protocol": "TCP"}],
        "env": _env(spec),
        "resources": _resources(spec),
        "volumeMounts": mounts,
        # Loading weights takes minutes; the startup probe holds liveness off until then.
        "startupProbe": {**probe, "failureThreshold": 180},
        "readinessProbe": {**probe, "failureThreshold": 3},
        "livenessProbe": {**probe, "failureThreshold": 6},
        # An engine that panics at start (no libcuda without runtimeClassName) says why in its
        # last log lines; this puts them in the pod status, and from there in the ClefModel.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": CONTAINER_SECURITY,
    }
    placed = scheduling(spec)
    pinned = gpu_pin(spec, gpu_class)
    if pinned:
        placed["nodeSelector"] = pinned
    if drivers is not None:
        placed["affinity"] = driver_affinity(drivers)
    return {
        **placed,
        "terminationGracePeriodSeconds": 30,
        "securityContext": serving_pod_security(spec),
        "containers": [container],
        "volumes": volumes,
    }


def serving_revision(
    spec: ClefModelSpec, image: str, gpu_class: str | None = None, drivers: tuple[str, ...] | None = None
) -> str:
    return short_hash(render_serving_pod_spec(spec, image, gpu_class, drivers))


def verification_image(spec: ClefModelSpec) -> str:
    return spec.verification.image or spec.image


def verifier_pull_policy(image: str) -> str:
    """A tag moves, so a verifier pulls it every time: the verdict must belong to what the
    registry serves now.  A digest cannot move: the node's copy is that image, and asking the
    registry again would only make the verdict depend on the registry being up."""
    return "IfNotPresent" if "@sha256:" in image else "Always"


def render_verification_pod_spec(spec: ClefModelSpec) -> dict[str, Any]:
    volumes: list[dict[str, Any]] = [dict(TMP_VOLUME)]
    mounts: list[dict[str, Any]] = [dict(TMP_MOUNT)]
    if spec.verification.suite is not Suite.KERNELS:
        model_volumes, model_mounts = model_volume(spec, VERIFIER_MODEL_PATH)
        volumes += model_volumes
        mounts += model_mounts
    container = {
        "name": VERIFY_CONTAINER,
        "image": verification_image(spec),
        "imagePullPolicy": verifier_pull_policy(verification_image(spec)),
        "command": verify_argv(spec),
        "env": _env(spec, {TERMINATION_LOG_ENV: TERMINATION_LOG, "TRITON_CACHE_DIR": "/tmp/triton"}),
        "resources": _resources(spec),
        "volumeMounts": mounts,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "securityContext": copy.deepcopy(VERIFIER_CONTAINER_SECURITY),
    }
    return {
        **scheduling(spec),
        "restartPolicy": "Never",
        "securityContext": copy.deepcopy(VERIFIER_POD_SECURITY),
        "containers": [container],
        "volumes": volumes,
    }


def object_labels(model: str, component: str) -> dict[str, str]:
    """The labels of a child that belongs to no revision (goldens, comparison)."""
    return {labels.MODEL: model, labels.COMPONENT: component, labels.MANAGED_BY: labels.MANAGED_BY_VALUE}


def _labels(model: str, revision: str, component: str) -> dict[str, str]:
    return {
        labels.MODEL: model,
        labels.REVISION: revision,
        labels.COMPONENT: component,
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
    }


def render_deployment(
    owner: Owner,
    spec: ClefModelSpec,
    image: str,
    replicas: int,
    annotations: dict[str, str],
    gpu_class: str | None = None,
    drivers: tuple[str, ...] | None = None,
    pod: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The Deployment of one revision: the serving pod (`pod` where the pass rendered it already)
    and its hash, the revision."""
    if pod is None:
        pod = render_serving_pod_spec(spec, image, gpu_class, drivers)
    revision = short_hash(pod)
    deployment_labels = _labels(owner.name, revision, labels.COMPONENT_SERVING)
    template = {"metadata": {"labels": serving_pod_labels(deployment_labels)}, "spec": pod}
    # The rendering travels with the Deployment, so its drift can be reverted whatever spec the
    # ClefModel holds now (`children.rendered_template` checks it against the revision).
    annotations = {**annotations, labels.POD_TEMPLATE: json.dumps(template, sort_keys=True)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(owner.name, revision),
            "namespace": owner.namespace,
            "labels": deployment_labels,
            "annotations": dict(annotations),
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels.pod_selector(owner.name, revision)},
            # One Deployment per revision is never rolled in place; if someone edits it anyway,
            # Recreate avoids asking for twice the GPUs.
            "strategy": {"type": "Recreate"},
            "revisionHistoryLimit": 1,
            "progressDeadlineSeconds": 1800,
            "template": template,
        },
    }


def render_job(owner: Owner, spec: ClefModelSpec, key: str, pod: dict[str, Any], run: str) -> dict[str, Any]:
    """The verification Job of the current spec, of verification key `key` and verification pod
    `pod` (`renderings`), in re-verify `run` (verdicts.run_id)."""
    job_labels = {**_labels(owner.name, key, labels.COMPONENT_VERIFICATION), labels.VERIFICATION_KEY: key}
    annotations = {labels.IMAGE: spec.image}
    if run:
        annotations[labels.REVERIFY_RUN] = run
    pod = copy.deepcopy(pod)
    return job_manifest(owner, job_name(owner.name, key, run), job_labels, annotations, spec, pod)


def job_manifest(
    owner: Owner,
    name: str,
    job_labels: dict[str, str],
    annotations: dict[str, str],
    spec: ClefModelSpec,
    pod: dict[str, Any],
) -> dict[str, Any]:
    """A Job of the model that runs once (no retries), within spec.verification.timeoutSeconds,
    and is cleaned up an hour after it finished; its pods carry its labels, the model's name under
    `verifies` instead of `model` (`verification_pod_labels`)."""
    metadata: dict[str, Any] = {"name": name, "namespace": owner.namespace, "labels": job_labels}
    if annotations:
        metadata["annotations"] = annotations
    metadata["ownerReferences"] = [owner.reference()]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": spec.verification.timeout_seconds,
            "ttlSecondsAfterFinished": JOB_TTL_SECONDS,
            "template": {"metadata": {"labels": verification_pod_labels(job_labels)}, "spec": pod},
        },
    }


def serving_pod_labels(deployment_labels: dict[str, str]) -> dict[str, str]:
    """A serving pod's labels as its Deployment creates it: the model's name under `revision-of`,
    never under `model`, the serving label, which the operator adds once the revision holds a
    signed, passed verdict (`children.label_verified_pods`): a preview is never selected by it."""
    out = {k: v for k, v in deployment_labels.items() if k != labels.MODEL}
    out[labels.REVISION_OF] = deployment_labels[labels.MODEL]
    return out


def verification_pod_labels(job_labels: dict[str, str]) -> dict[str, str]:
    """A verification pod's labels: its Job's, with the model's name under `verifies`, never
    under `model`, which only serving pods carry (docs/operations.md, "Selecting serving pods")."""
    out = {k: v for k, v in job_labels.items() if k != labels.MODEL}
    out[labels.VERIFIES] = job_labels[labels.MODEL]
    return out


def service_annotations(model: str, revision: str) -> dict[str, str]:
    return {labels.SERVICE_MODEL: model, labels.SERVICE_ACTIVE_REVISION: revision}


SERVICE_PORT_NAME = "http"


def service_port(service: ServiceSpec) -> dict[str, Any]:
    """The one Service port clef owns (by its name, `http`), of spec.service: on a Service clef
    created and on an adopted one alike; other ports of an adopted Service are left as they are."""
    return {
        "name": SERVICE_PORT_NAME,
        "port": service.port,
        "targetPort": service.container_port,
        "protocol": "TCP",
    }


def render_service(owner: Owner, spec: ClefModelSpec, revision: str) -> dict[str, Any]:
    """A Service clef creates (owned, so it goes with the ClefModel).  An existing one is adopted
    (spec.service.adopt) instead: only its selector, its `http` port and clef's annotations are
    ever changed."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": spec.service.name,
            "namespace": owner.namespace,
            "labels": {labels.MODEL: owner.name, labels.MANAGED_BY: labels.MANAGED_BY_VALUE},
            "annotations": service_annotations(owner.name, revision),
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "type": "ClusterIP",
            "selector": labels.selector(owner.name, revision),
            "ports": [service_port(spec.service)],
        },
    }
