"""The ClefModel API (`clef.riotpiao.com/v1alpha1`): pydantic models of spec and status.

These models are the single source of truth for the CRD: `crdgen` turns them (and the CEL rules
attached to their fields) into `crds/clefmodel.yaml`.  The API server enforces the schema, so the
operator can trust a stored spec; `ClefModelSpec.model_validate` is still used on what it reads,
which also fills in the same defaults the API server applied.

Every status field the operator writes is declared here: the API server prunes undeclared fields
silently, and a pruned status field is a bug that no test of the planner would catch.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

GROUP = "clef.riotpiao.com"
VERSION = "v1alpha1"
KIND = "ClefModel"
PLURAL = "clefmodels"
SINGULAR = "clefmodel"
# `cm` belongs to ConfigMaps.
SHORT_NAMES = ["clef"]
API_VERSION = f"{GROUP}/{VERSION}"

# Longest ClefModel name: the Job `<name>-verify-<key10>-<r6>` carries its name in the
# `job-name` label, whose value is at most 63 characters.
MAX_MODEL_NAME = 38

DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
IMAGE_REFERENCE = r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


def cel(rule: str, message: str, *, field_path: str = "") -> dict[str, str]:
    """One `x-kubernetes-validations` entry.  Messages name the field and say how to fix it."""
    # Static messages: messageExpression with string() of a number is costed as unbounded by the
    # API server's CEL estimator and would make the whole CRD exceed its budget.
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def rules(*entries: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(entries)}


def int_range(path: str, low: int, high: int) -> dict[str, Any]:
    return rules(cel(f"self >= {low} && self <= {high}", f"{path}: must be between {low} and {high}"))


def wire_name(field: str) -> str:
    """snake_case -> camelCase, keeping the unit MiB spelt as Kubernetes spells it."""
    return to_camel(field).replace("Mib", "MiB")


class ApiModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are an error, not ignored."""

    model_config = ConfigDict(alias_generator=wire_name, populate_by_name=True, extra="forbid")

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# --------------------------------------------------------------------------------------- spec


class Engine(StrEnum):
    CANDLE_VLLM = "candle-vllm"
    VLLM = "vllm"


class Dtype(StrEnum):
    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"


DTYPE_BYTES = {Dtype.F16: 2, Dtype.BF16: 2, Dtype.F32: 4}


class Suite(StrEnum):
    KERNELS = "kernels"
    MODEL = "model"
    FULL = "full"


class Strategy(StrEnum):
    BLUE_GREEN = "BlueGreen"
    RECREATE = "Recreate"


class PvcSource(ApiModel):
    """A PersistentVolumeClaim in the model's namespace that holds the weights."""

    claim_name: str = Field(
        max_length=253,
        json_schema_extra=rules(
            cel(
                f"self.matches(r'{DNS1123_SUBDOMAIN}')",
                "spec.model.volume.pvc.claimName: must be the name of a PersistentVolumeClaim (a DNS subdomain)",
            )
        ),
    )


class HostPathSource(ApiModel):
    """A directory on the node that holds the weights."""

    path: str = Field(
        max_length=1024,
        json_schema_extra=rules(
            cel("self.startsWith('/')", "spec.model.volume.hostPath.path: must be an absolute path")
        ),
    )


class ModelVolume(ApiModel):
    """Where the weights come from; mounted read-only at `spec.model.path`."""

    pvc: PvcSource | None = None
    host_path: HostPathSource | None = None
    sub_path: str | None = Field(
        default=None,
        max_length=1024,
        description="Directory inside the volume to mount (e.g. one model of many on a shared PVC).",
        json_schema_extra=rules(
            cel(
                "!self.startsWith('/') && !self.contains('..')",
                "spec.model.volume.subPath: must be a relative path without '..'",
            )
        ),
    )


class Architecture(ApiModel):
    """The hybrid model's shape.  Defaults are the `qwen3_5` preset; set a field to override it."""

    preset: Literal["qwen3_5"] = "qwen3_5"
    num_layers: int = Field(
        default=32, json_schema_extra=int_range("spec.model.architecture.numLayers", 1, 512)
    )
    full_attention_interval: int = Field(
        default=4,
        description="Every N-th layer is full attention; the others are Gated DeltaNet layers.",
        json_schema_extra=int_range("spec.model.architecture.fullAttentionInterval", 1, 512),
    )
    num_attention_heads: int = Field(
        default=16, json_schema_extra=int_range("spec.model.architecture.numAttentionHeads", 1, 1024)
    )
    num_key_value_heads: int = Field(
        default=4, json_schema_extra=int_range("spec.model.architecture.numKeyValueHeads", 1, 1024)
    )
    head_dim: int = Field(
        default=256, json_schema_extra=int_range("spec.model.architecture.headDim", 1, 1024)
    )
    linear_num_key_heads: int = Field(
        default=16, json_schema_extra=int_range("spec.model.architecture.linearNumKeyHeads", 1, 1024)
    )
    linear_num_value_heads: int = Field(
        default=32, json_schema_extra=int_range("spec.model.architecture.linearNumValueHeads", 1, 1024)
    )
    linear_key_head_dim: int = Field(
        default=128, json_schema_extra=int_range("spec.model.architecture.linearKeyHeadDim", 1, 1024)
    )
    linear_value_head_dim: int = Field(
        default=128, json_schema_extra=int_range("spec.model.architecture.linearValueHeadDim", 1, 1024)
    )

    @property
    def full_attention_layers(self) -> int:
        return self.num_layers // self.full_attention_interval


ARCHITECTURE_RULES = rules(
    cel(
        "self.fullAttentionInterval <= self.numLayers",
        "spec.model.architecture.fullAttentionInterval: must not exceed numLayers (the model would have no"
        " attention layer)",
        field_path=".fullAttentionInterval",
    ),
    cel(
        "self.numAttentionHeads % self.numKeyValueHeads == 0",
        "spec.model.architecture.numKeyValueHeads: must divide numAttentionHeads",
        field_path=".numKeyValueHeads",
    ),
    cel(
        "self.linearNumValueHeads % self.linearNumKeyHeads == 0",
        "spec.model.architecture.linearNumKeyHeads: must divide linearNumValueHeads (GDN value heads are grouped"
        " over key heads)",
        field_path=".linearNumKeyHeads",
    ),
)


class ModelSource(ApiModel):
    name: str = Field(
        max_length=128,
        description="The served model name (what clients put in `model`).",
        json_schema_extra=rules(
            cel(
                "self.matches('^[A-Za-z0-9][A-Za-z0-9._/-]*$')",
                "spec.model.name: use letters, digits and . _ / - (e.g. clef-flash)",
            )
        ),
    )
    path: str = Field(
        max_length=1024,
        description="Where the weights are inside the container (the volume is mounted here).",
        json_schema_extra=rules(
            cel(
                "self.startsWith('/')", "spec.model.path: must be an absolute path such as /models/clef-flash"
            )
        ),
    )
    volume: ModelVolume | None = Field(
        default=None,
        json_schema_extra=rules(
            cel(
                "has(self.pvc) != has(self.hostPath)",
                "spec.model.volume: set exactly one of pvc or hostPath",
            )
        ),
    )
    weights_mib: int | None = Field(
        default=None,
        description="Size of the weights in MiB (all shards); improves the kvCacheTokens estimate.",
        json_schema_extra=int_range("spec.model.weightsMiB", 0, 16777216),
    )
    # The whole preset as the default: the API server checks a default against the rules at this
    # level before it fills in nested defaults.
    architecture: Architecture = Field(
        default_factory=Architecture,
        json_schema_extra={"default": Architecture().to_wire(), **ARCHITECTURE_RULES},
    )


class Toleration(ApiModel):
    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "self.operator != 'Exists' || !has(self.value)",
                "spec.tolerations[].value: must be empty when operator is Exists",
                field_path=".value",
            )
        )
    )

    key: str | None = Field(default=None, max_length=317)
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = Field(default=None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


QUANTITY_MAP_RULES = rules(
    cel(
        "!('nvidia.com/gpu' in self)",
        "spec.resources: do not set nvidia.com/gpu here; set spec.gpus (GPUs per replica) instead",
    ),
)


class Resources(ApiModel):
    """CPU, memory and other non-GPU resources of the engine and verification containers."""

    requests: dict[str, str] = Field(
        default_factory=dict,
        max_length=16,
        json_schema_extra={"additionalProperties": {"type": "string", "maxLength": 64}, **QUANTITY_MAP_RULES},
    )
    limits: dict[str, str] = Field(
        default_factory=dict,
        max_length=16,
        json_schema_extra={"additionalProperties": {"type": "string", "maxLength": 64}, **QUANTITY_MAP_RULES},
    )


class EnvVar(ApiModel):
    name: str = Field(
        max_length=256,
        json_schema_extra=rules(
            cel(f"self.matches(r'{ENV_NAME}')", "spec.env[].name: must be a C identifier such as RUST_LOG")
        ),
    )
    value: str = Field(default="", max_length=8192)


class ServiceSpec(ApiModel):
    name: str = Field(
        max_length=63,
        description="The stable Service.  Adopted if it exists: only its selector is ever patched.",
        json_schema_extra=rules(
            cel(
                f"self.matches(r'{DNS1035_LABEL}')",
                "spec.service.name: must be a DNS-1035 label (lower case letters, digits and '-', starting"
                " with a letter, at most 63 characters), e.g. clef-serve",
            )
        ),
    )
    port: int = Field(default=8000, json_schema_extra=int_range("spec.service.port", 1, 65535))
    container_port: int = Field(
        default=8000,
        description="The port the engine listens on inside the pod.",
        json_schema_extra=int_range("spec.service.containerPort", 1, 65535),
    )


class VerificationSpec(ApiModel):
    suite: Suite = Suite.KERNELS
    timeout_seconds: int = Field(
        default=1800,
        description="The verification Job's activeDeadlineSeconds: a verification still running then fails.",
        json_schema_extra=int_range("spec.verification.timeoutSeconds", 10, 86400),
    )
    tolerance_scale: float | None = Field(
        default=None,
        description="Multiplies every check's tolerance (`verify --tolerance-scale`); unset: the runtime's own.",
        json_schema_extra=rules(
            cel(
                "self >= 0.1 && self <= 100.0",
                "spec.verification.toleranceScale: must be between 0.1 and 100",
            )
        ),
    )
    image: str | None = Field(
        default=None,
        max_length=512,
        description="Run verification in this image instead of spec.image (serving is then pinned to spec.image as"
        " written, not to a verified digest).",
        json_schema_extra=rules(
            cel(
                f"self.matches(r'{IMAGE_REFERENCE}')",
                "spec.verification.image: must be an image reference such as registry.example/clef-runtime:1.0",
            )
        ),
    )
    command: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Replaces `clef-runtime verify` (the flags are still appended).",
        json_schema_extra={"items": {"type": "string", "maxLength": 1024}},
    )
    required: bool = Field(
        default=True,
        description="false: roll out without verification (Verified stays Unknown, reason VerificationNotRequired).",
    )


class RolloutSpec(ApiModel):
    strategy: Strategy = Strategy.BLUE_GREEN
    scale_down_delay_seconds: int = Field(
        default=30, json_schema_extra=int_range("spec.rollout.scaleDownDelaySeconds", 0, 86400)
    )
    revision_history_limit: int = Field(
        default=2,
        description="Old Deployments kept at 0 replicas for instant rollback.",
        json_schema_extra=int_range("spec.rollout.revisionHistoryLimit", 0, 10),
    )


SPEC_RULES = rules(
    cel(
        "!has(self.tensorParallel) || self.gpus % self.tensorParallel == 0",
        "spec.tensorParallel: must divide spec.gpus (GPUs per replica)",
        field_path=".tensorParallel",
    ),
    cel(
        "self.model.architecture.numAttentionHeads % (has(self.tensorParallel) ? self.tensorParallel : self.gpus) == 0"
        " && self.model.architecture.numKeyValueHeads % (has(self.tensorParallel) ? self.tensorParallel : self.gpus) == 0",
        "spec.tensorParallel: (default spec.gpus) must divide model.architecture.numAttentionHeads and"
        " numKeyValueHeads; choose a tensor-parallel degree that does",
        field_path=".tensorParallel",
    ),
    cel(
        "self.model.architecture.linearNumKeyHeads % (has(self.tensorParallel) ? self.tensorParallel : self.gpus) == 0"
        " && self.model.architecture.linearNumValueHeads % (has(self.tensorParallel) ? self.tensorParallel : self.gpus)"
        " == 0",
        "spec.tensorParallel: (default spec.gpus) cannot shard the GDN layers: it must divide"
        " model.architecture.linearNumKeyHeads and linearNumValueHeads",
        field_path=".tensorParallel",
    ),
    cel(
        "self.engine != 'candle-vllm' || !has(self.tensorParallel) || self.tensorParallel == self.gpus",
        "spec.tensorParallel: candle-vllm shards only by tensor parallelism, so tensorParallel must equal spec.gpus"
        " (or be left out)",
        field_path=".tensorParallel",
    ),
    cel(
        "self.engine != 'vllm' || has(self.gpuMemoryMiB)",
        "spec.gpuMemoryMiB: required for engine vllm (its KV cache is sized in bytes: kvFraction x the memory left"
        " after the weights); e.g. 32768 for a V100-32GB",
        field_path=".gpuMemoryMiB",
    ),
    cel(
        "self.verification.required || !has(self.verification.image)",
        "spec.verification.image: has no effect when verification.required is false; remove one of them",
        field_path=".verification.image",
    ),
)


class ClefModelSpec(ApiModel):
    """A hybrid Gated-DeltaNet model served from a verified image behind a stable Service."""

    model_config = ConfigDict(json_schema_extra=SPEC_RULES)

    engine: Engine = Field(description="The serving engine preset that turns these fields into argv.")
    image: str = Field(
        max_length=512,
        description="The serving image: the unit of verification.  Tags are resolved to the digest that passed.",
        json_schema_extra=rules(
            cel(
                f"self.matches(r'{IMAGE_REFERENCE}')",
                "spec.image: must be an image reference such as registry.example/candle-vllm:sm70 (no scheme, no spaces)",
            )
        ),
    )
    model: ModelSource
    dtype: Dtype
    kv_fraction: float = Field(
        description="Fraction of the GPU memory left after the weights that the KV cache gets.",
        json_schema_extra=rules(
            cel(
                "self > 0.0 && self <= 0.95",
                "spec.kvFraction: must be in (0, 0.95], e.g. 0.30",
            )
        ),
    )
    gpus: int = Field(
        default=1,
        description="GPUs per replica.",
        json_schema_extra=rules(
            cel(
                "self >= 1 && self <= 16",
                "spec.gpus: must be between 1 and 16 (GPUs per replica)",
            )
        ),
    )
    tensor_parallel: int | None = Field(
        default=None,
        description="Tensor-parallel degree; defaults to spec.gpus.",
        json_schema_extra=int_range("spec.tensorParallel", 1, 16),
    )
    gpu_memory_mib: int | None = Field(
        default=None,
        description="Memory of one GPU in MiB.  Defaults to the node label nvidia.com/gpu.memory of the verification"
        " pod's node (kvCacheTokens estimate); required for engine vllm.",
        json_schema_extra=int_range("spec.gpuMemoryMiB", 1024, 4194304),
    )
    replicas: int = Field(
        default=1,
        description="Serving replicas; 0 keeps a parked (verified, not serving) Deployment.",
        json_schema_extra=int_range("spec.replicas", 0, 64),
    )
    runtime_class_name: str = Field(
        default="nvidia",
        max_length=253,
        json_schema_extra=rules(
            cel(
                f"self.matches(r'{DNS1123_SUBDOMAIN}')",
                "spec.runtimeClassName: must name a RuntimeClass (a DNS subdomain), e.g. nvidia",
            )
        ),
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        max_length=32,
        json_schema_extra={
            "additionalProperties": {"type": "string", "maxLength": 63},
            **rules(
                cel("self.all(k, k.size() <= 317)", "spec.nodeSelector: keys are at most 317 characters")
            ),
        },
    )
    tolerations: list[Toleration] = Field(default_factory=list, max_length=16)
    resources: Resources = Field(default_factory=Resources, json_schema_extra={"default": {}})
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    args: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Extra engine arguments, appended to the preset's argv (never through a shell).",
        json_schema_extra={"items": {"type": "string", "maxLength": 1024}},
    )
    service: ServiceSpec
    verification: VerificationSpec = Field(
        default_factory=VerificationSpec, json_schema_extra={"default": {}}
    )
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, json_schema_extra={"default": {}})

    @property
    def effective_tensor_parallel(self) -> int:
        return self.tensor_parallel if self.tensor_parallel is not None else self.gpus


# ------------------------------------------------------------------------------------- status


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """metav1.Condition."""

    type: str = Field(max_length=316)
    status: ConditionStatus
    reason: str = Field(max_length=1024)
    message: str = Field(default="", max_length=32768)
    last_transition_time: str = Field(max_length=64)
    observed_generation: int | None = None


class FailingCheck(ApiModel):
    name: str = Field(max_length=256)
    op: str = Field(default="", max_length=256)
    detail: str = Field(default="", max_length=1024)


class Verdict(StrEnum):
    PASSED = "Passed"
    FAILED = "Failed"


class VerificationRecord(ApiModel):
    """One finished verification: what ran, where, and what it concluded."""

    key: str = Field(max_length=64, description="Verification key: hash of the verification inputs.")
    image: str = Field(max_length=512, description="spec.image as written when it ran.")
    digest: str | None = Field(
        default=None, max_length=1024, description="The image the verification pod ran (repo@sha256:...)."
    )
    gpu_class: str | None = Field(
        default=None, max_length=256, description="Node label nvidia.com/gpu.product."
    )
    gpu_memory_mib: int | None = Field(default=None)
    dtype: Dtype
    suite: Suite
    verdict: Verdict
    reason: str = Field(max_length=128)
    summary: str = Field(default="", max_length=1024)
    failing: list[FailingCheck] = Field(default_factory=list, max_length=5)
    device: str | None = Field(default=None, max_length=256)
    runtime_version: str | None = Field(default=None, max_length=128)
    job: str = Field(max_length=63)
    finished_at: str = Field(max_length=64)
    superseded: bool = Field(
        default=False, description="A re-verify was requested after this verdict; it no longer counts."
    )


class ClefModelStatus(ApiModel):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=8,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    active_revision: str | None = Field(default=None, max_length=63, description="What the Service selects.")
    active_image: str | None = Field(
        default=None, max_length=1024, description="The image the active revision runs."
    )
    active_spec: dict[str, Any] | None = Field(
        default=None,
        description="The spec the active revision was rendered from (to recreate its Deployment if deleted"
        " while a newer spec is held back).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    candidate_revision: str | None = Field(
        default=None, max_length=63, description="The revision being rolled out."
    )
    candidate_image: str | None = Field(default=None, max_length=1024)
    verification_key: str | None = Field(
        default=None,
        max_length=64,
        description="The verification key of the current spec (and re-verify request).",
    )
    verification_job: str | None = Field(default=None, max_length=63)
    observed_reverify: str | None = Field(
        default=None, max_length=256, description="The last clef.riotpiao.com/reverify value acted on."
    )
    verifications: list[VerificationRecord] = Field(
        default_factory=list, max_length=16, description="Recent verdicts, newest first."
    )
    kv_cache_tokens: int | None = Field(default=None, description="Estimated KV cache tokens per replica.")
    gpu_memory_mib: int | None = Field(default=None, description="GPU memory used for the estimate.")
    gpus_requested: int | None = Field(
        default=None, description="GPUs the serving replicas request (gpus x replicas)."
    )
    service_name: str | None = Field(default=None, max_length=63)
    service_adopted: bool | None = Field(
        default=None, description="The Service existed before clef and is not owned."
    )
