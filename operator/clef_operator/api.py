"""The ClefModel API (`clef.riotpiao.com/v1alpha1`): pydantic models of spec and status.

These models are the single source of truth for the CRD: `crdgen` turns them (and the CEL rules
attached to their fields) into `crds/clefmodel.yaml`.  Every rule is a `checks.Check`, kept next
to the field it checks and enforced twice: by the API server at admission and by
`ClefModelSpec.model_validate`, which the operator applies to every spec it reads (and which also
fills in the same defaults the API server applied).  The rules refuse whatever Kubernetes would
refuse in a child object (labels, tolerations, quantities, image references, paths), so a stored
ClefModel never gets stuck on a Deployment or Job the API server rejects.

Every status field the operator writes is declared here: the API server prunes undeclared fields
silently, and a pruned status field is a bug that no test of the planner would catch.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from clef_operator import syntax
from clef_operator.checks import Check, add_checks, for_each_entry, in_range, matching

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


def wire_name(field: str) -> str:
    """snake_case -> camelCase, keeping the unit MiB spelt as Kubernetes spells it."""
    return to_camel(field).replace("Mib", "MiB")


class ApiModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are an error, not ignored.

    `checks` are the object-level rules (those that relate fields); each is a CEL rule on the
    object in the CRD and runs on the wire form after the fields have parsed.
    """

    model_config = ConfigDict(
        alias_generator=wire_name, populate_by_name=True, extra="forbid", json_schema_extra=add_checks
    )
    checks: ClassVar[tuple[Check, ...]] = ()

    @model_validator(mode="after")
    def _enforce_checks(self) -> Self:
        if self.checks:
            wire = self.to_wire()
            for check in self.checks:
                check.enforce(wire)
        return self

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# --------------------------------------------------------------------------------------- spec


class Engine(StrEnum):
    CANDLE_VLLM = "candle-vllm"
    VLLM = "vllm"
    MISTRALRS = "mistralrs"


class Dtype(StrEnum):
    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"


DTYPE_BYTES = {Dtype.F16: 2, Dtype.BF16: 2, Dtype.F32: 4}


class Suite(StrEnum):
    KERNELS = "kernels"
    MODEL = "model"
    FULL = "full"


class VerificationMode(StrEnum):
    """What a verification proves (docs/verification.md, "Two modes").  `kernels`: clef-runtime
    verify inside the candidate image (clef's GDN kernels).  `endpoint`: the candidate's own engine,
    as one preview replica, answers golden prompts.  `both`: kernels first, then endpoint."""

    KERNELS = "kernels"
    ENDPOINT = "endpoint"
    PROBE = "probe"
    BOTH = "both"


class BuiltinPrompts(StrEnum):
    """Which of clef-runtime's built-in golden prompts run: all, all but the ≥ 8192-token one, none."""

    ALL = "all"
    SHORT = "short"
    NONE = "none"


# What a user of each engine expects: the kernels suite proves nothing about candle-vllm's,
# vLLM's or mistral.rs's own kernels, so their engine is asked.  Every engine has an endpoint
# dialect (ENGINE_DIALECT): `clef-runtime endpoint-check --dialect`.
DEFAULT_MODE = {engine: VerificationMode.ENDPOINT for engine in ("candle-vllm", "vllm", "mistralrs")}
ENGINE_DIALECT = {"candle-vllm": "candle-vllm", "vllm": "vllm", "mistralrs": "mistralrs"}


class Strategy(StrEnum):
    BLUE_GREEN = "BlueGreen"
    RECREATE = "Recreate"


def _no_backstep(path: str) -> bool:
    return not syntax.matches(syntax.BACKSTEP, path)


def no_nul(path: str) -> Check:
    """A NUL byte is valid JSON and stored as is, but no container can be started with it (argv,
    environment and mount paths are C strings): the pod would fail at every start."""
    return Check(
        f"!self.contains('{syntax.NUL_ESCAPE}')",
        f"{path}: must not contain a NUL character",
        lambda v: "\0" not in v,
    )


def image_reference(path: str, example: str) -> tuple[Check, Check]:
    return (
        matching(
            syntax.IMAGE_REFERENCE,
            f"{path}: must be an image reference [host[:port]/]path[:tag][@sha256:<digest>] such as {example}"
            " (no scheme, no spaces, lower-case path)",
        ),
        Check(
            syntax.IMAGE_NAME_LENGTH_RULE,
            f"{path}: the name before the tag or digest is at most {syntax.MAX_IMAGE_NAME} characters",
            syntax.image_name_fits,
        ),
    )


class PvcSource(ApiModel):
    """A PersistentVolumeClaim in the model's namespace that holds the weights."""

    claim_name: Annotated[
        str,
        matching(
            syntax.DNS1123_SUBDOMAIN,
            "spec.model.volume.pvc.claimName: must be the name of a PersistentVolumeClaim (a DNS subdomain)",
        ),
    ] = Field(max_length=253)


class HostPathSource(ApiModel):
    """A directory on the node that holds the weights."""

    path: Annotated[
        str,
        Check(
            f"self.startsWith('/') && !self.matches(r'{syntax.BACKSTEP}')",
            "spec.model.volume.hostPath.path: must be an absolute path without '..' elements",
            lambda v: v.startswith("/") and _no_backstep(v),
        ),
        no_nul("spec.model.volume.hostPath.path"),
    ] = Field(max_length=1024)


class ModelVolume(ApiModel):
    """Where the weights come from; mounted read-only at `spec.model.path`."""

    checks = (
        Check(
            "has(self.pvc) != has(self.hostPath)",
            "spec.model.volume: set exactly one of pvc or hostPath",
            lambda v: ("pvc" in v) != ("hostPath" in v),
        ),
    )
    pvc: PvcSource | None = None
    host_path: HostPathSource | None = None
    sub_path: (
        Annotated[
            str,
            Check(
                f"!self.startsWith('/') && !self.matches(r'{syntax.BACKSTEP}')",
                "spec.model.volume.subPath: must be a relative path without '..' elements",
                lambda v: not v.startswith("/") and _no_backstep(v),
            ),
            no_nul("spec.model.volume.subPath"),
        ]
        | None
    ) = Field(
        default=None,
        max_length=1024,
        description="Directory inside the volume to mount (e.g. one model of many on a shared PVC).",
    )


class Architecture(ApiModel):
    """The hybrid model's shape.  Defaults are the `qwen3_5` preset; set a field to override it."""

    checks = (
        Check(
            "self.fullAttentionInterval <= self.numLayers",
            "spec.model.architecture.fullAttentionInterval: must not exceed numLayers (the model would have no"
            " attention layer)",
            lambda a: a["fullAttentionInterval"] <= a["numLayers"],
            field_path=".fullAttentionInterval",
        ),
        Check(
            "self.numAttentionHeads % self.numKeyValueHeads == 0",
            "spec.model.architecture.numKeyValueHeads: must divide numAttentionHeads",
            lambda a: a["numAttentionHeads"] % a["numKeyValueHeads"] == 0,
            field_path=".numKeyValueHeads",
        ),
        Check(
            "self.linearNumValueHeads % self.linearNumKeyHeads == 0",
            "spec.model.architecture.linearNumKeyHeads: must divide linearNumValueHeads (GDN value heads are"
            " grouped over key heads)",
            lambda a: a["linearNumValueHeads"] % a["linearNumKeyHeads"] == 0,
            field_path=".linearNumKeyHeads",
        ),
    )

    preset: Literal["qwen3_5"] = "qwen3_5"
    num_layers: Annotated[int, in_range("spec.model.architecture.numLayers", 1, 512)] = 32
    full_attention_interval: Annotated[
        int, in_range("spec.model.architecture.fullAttentionInterval", 1, 512)
    ] = Field(
        default=4, description="Every N-th layer is full attention; the others are Gated DeltaNet layers."
    )
    num_attention_heads: Annotated[int, in_range("spec.model.architecture.numAttentionHeads", 1, 1024)] = 16
    num_key_value_heads: Annotated[int, in_range("spec.model.architecture.numKeyValueHeads", 1, 1024)] = 4
    head_dim: Annotated[int, in_range("spec.model.architecture.headDim", 1, 1024)] = 256
    linear_num_key_heads: Annotated[int, in_range("spec.model.architecture.linearNumKeyHeads", 1, 1024)] = 16
    linear_num_value_heads: Annotated[
        int, in_range("spec.model.architecture.linearNumValueHeads", 1, 1024)
    ] = 32
    linear_key_head_dim: Annotated[int, in_range("spec.model.architecture.linearKeyHeadDim", 1, 1024)] = 128
    linear_value_head_dim: Annotated[int, in_range("spec.model.architecture.linearValueHeadDim", 1, 1024)] = (
        128
    )

    @property
    def full_attention_layers(self) -> int:
        return self.num_layers // self.full_attention_interval


# Where the weights cannot be mounted: the operator mounts its own volumes at /tmp (verification)
# and /dev/shm (serving), and Kubernetes refuses a second mount at one path; container runtimes
# refuse mounts over /proc and /sys, one over /dev would hide the devices; `/` would hide the image.
_TAKEN_MOUNT = r"^/*(tmp/*|(dev|proc|sys)(/.*)?)?$"
# A '.' or '..' element: /tmp/. is /tmp.
_DOT_ELEMENT = r"(^|/)\.\.?(/|$)"


class ModelSource(ApiModel):
    name: Annotated[
        str,
        matching(
            "^[A-Za-z0-9][A-Za-z0-9._/-]*$",
            "spec.model.name: use letters, digits and . _ / - (e.g. clef-flash)",
        ),
    ] = Field(max_length=128, description="The served model name (what clients put in `model`).")
    path: Annotated[
        str,
        Check(
            f"self.startsWith('/') && !self.matches(r'{_DOT_ELEMENT}')",
            "spec.model.path: must be an absolute path without '.' or '..' elements, such as /models/clef-flash",
            lambda v: v.startswith("/") and not syntax.matches(_DOT_ELEMENT, v),
        ),
        Check(
            f"!self.matches(r'{_TAKEN_MOUNT}')",
            "spec.model.path: not /, /tmp, or /dev, /proc, /sys or below (the operator and the container"
            " runtime mount there); use e.g. /models/clef-flash",
            lambda v: not syntax.matches(_TAKEN_MOUNT, v),
        ),
        no_nul("spec.model.path"),
    ] = Field(
        max_length=1024,
        description="Where the weights are inside the container (the volume is mounted here).",
    )
    volume: ModelVolume | None = None
    weights_mib: Annotated[int, in_range("spec.model.weightsMiB", 0, 16777216)] | None = Field(
        default=None,
        description="Size of the weights in MiB (all shards); improves the kvCacheTokens estimate.",
    )
    # The whole preset as the default: the API server checks a default against the rules at this
    # level before it fills in nested defaults.
    architecture: Architecture = Field(
        default_factory=Architecture, json_schema_extra={"default": Architecture().to_wire()}
    )


def _label_key_rule(name: str) -> str:
    """CEL: the string `name` is a label key (what `syntax.is_qualified_name` says)."""
    return f"{name}.matches(r'{syntax.QUALIFIED_NAME}') && !{name}.matches(r'{syntax.LONG_PREFIX}')"


class Toleration(ApiModel):
    checks = (
        Check(
            "self.operator == 'Exists' || (has(self.key) && self.key != '')",
            "spec.tolerations[].key: required unless operator is Exists",
            lambda t: t["operator"] == "Exists" or bool(t.get("key")),
            field_path=".key",
        ),
        Check(
            "self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "spec.tolerations[].value: must be empty when operator is Exists",
            lambda t: t["operator"] != "Exists" or not t.get("value"),
            field_path=".value",
        ),
        Check(
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "spec.tolerations[].tolerationSeconds: only with effect NoExecute",
            lambda t: "tolerationSeconds" not in t or t.get("effect") == "NoExecute",
            field_path=".tolerationSeconds",
        ),
    )

    key: (
        Annotated[
            str,
            Check(
                f"self == '' || ({_label_key_rule('self')})",
                "spec.tolerations[].key: must be a label key ([prefix/]name, e.g. nvidia.com/gpu)",
                lambda v: v == "" or syntax.is_qualified_name(v),
            ),
        ]
        | None
    ) = Field(default=None, max_length=317)
    operator: Literal["Exists", "Equal"] = "Equal"
    value: (
        Annotated[
            str,
            matching(
                syntax.LABEL_VALUE,
                "spec.tolerations[].value: must be a label value (at most 63 letters, digits, '-', '_' or '.',"
                " starting and ending with a letter or digit)",
            ),
        ]
        | None
    ) = Field(default=None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


def _quantities(path: str) -> tuple[Check, ...]:
    """The rules on one map of `spec.resources` (requests or limits), whose name is `path`."""
    return (
        for_each_entry(
            f"k.matches(r'{syntax.STANDARD_RESOURCE}') || (k.matches(r'{syntax.EXTENDED_RESOURCE}')"
            f" && !k.matches(r'{syntax.LONG_PREFIX}') && !k.matches(r'{syntax.NATIVE_PREFIX}'))",
            f"{path}: keys must be cpu, memory, ephemeral-storage or an extended resource <domain>/<name>"
            " (e.g. example.com/fpga) outside kubernetes.io",
            lambda k, _: syntax.is_resource_name(k),
        ),
        for_each_entry(
            "isQuantity(self[k]) && !quantity(self[k]).isLessThan(quantity('0'))",
            f"{path}: values must be non-negative quantities such as 500m, 16Gi or 1e3",
            lambda _, v: (q := syntax.quantity(v)) is not None and q >= 0,
        ),
        for_each_entry(
            "!k.contains('/') || !isQuantity(self[k]) || quantity(self[k]).isInteger()",
            f"{path}: an extended resource (<domain>/<name>) takes a whole number",
            lambda k, v: "/" not in k or (q := syntax.quantity(v)) is None or q == q.to_integral_value(),
        ),
        Check(
            "!('nvidia.com/gpu' in self)",
            "spec.resources: do not set nvidia.com/gpu here; set spec.gpus (GPUs per replica) instead",
            lambda m: "nvidia.com/gpu" not in m,
        ),
    )


def _request_fits(resources: dict[str, dict[str, str]], name: str) -> bool:
    request = syntax.quantity(resources["requests"][name])
    limit = syntax.quantity(resources.get("limits", {}).get(name, ""))
    if syntax.is_extended_resource(name):
        return request is None or (limit is not None and request == limit)
    return request is None or limit is None or request <= limit


_REQUEST = "isQuantity(self.requests[k]) && isQuantity(self.limits[k])"


class Resources(ApiModel):
    """CPU, memory and other non-GPU resources of the engine and verification containers."""

    checks = (
        Check(
            f"!has(self.requests) || !has(self.limits) || self.requests.all(k, k.contains('/') || !(k in self.limits)"
            f" || !({_REQUEST}) || quantity(self.requests[k]).compareTo(quantity(self.limits[k])) <= 0)",
            "spec.resources.requests: a request must not exceed the limit of the same resource",
            lambda r: all(_request_fits(r, k) for k in r.get("requests", {}) if "/" not in k),
            field_path=".requests",
        ),
        Check(
            "!has(self.requests) || self.requests.all(k, !k.contains('/') || (has(self.limits) && k in self.limits"
            f" && ({_REQUEST}) && quantity(self.requests[k]).compareTo(quantity(self.limits[k])) == 0))",
            "spec.resources.requests: an extended resource (<domain>/<name>) cannot be overcommitted: give it a"
            " limit equal to the request",
            lambda r: all(_request_fits(r, k) for k in r.get("requests", {}) if "/" in k),
            field_path=".requests",
        ),
    )

    requests: Annotated[
        dict[str, Annotated[str, Field(max_length=64)]], *_quantities("spec.resources.requests")
    ] = Field(default_factory=dict, max_length=16)
    limits: Annotated[
        dict[str, Annotated[str, Field(max_length=64)]], *_quantities("spec.resources.limits")
    ] = Field(default_factory=dict, max_length=16)


class EnvVar(ApiModel):
    name: Annotated[
        str,
        matching(syntax.ENV_NAME, "spec.env[].name: must be a C identifier such as RUST_LOG"),
        Check(
            f"!self.matches(r'{syntax.RESERVED_ENV}')",
            "spec.env[].name: CLEF_* and TRITON_INTERPRET* are reserved: they steer the verification run (its"
            " shapes, device, fault injection and report), which must check what serving runs",
            lambda v: not syntax.matches(syntax.RESERVED_ENV, v),
        ),
        Check(
            f"!self.matches(r'{syntax.CODE_STEERING_ENV}')",
            "spec.env[].name: names that choose the code a process loads are refused ("
            + ", ".join(syntax.CODE_STEERING_ENV_NAMES)
            + "): the verification pod gets spec.env, and its verifier must run only its own code",
            lambda v: not syntax.matches(syntax.CODE_STEERING_ENV, v),
        ),
    ] = Field(max_length=256)
    value: Annotated[str, no_nul("spec.env[].value")] = Field(default="", max_length=8192)


class ServiceSpec(ApiModel):
    name: Annotated[
        str,
        matching(
            syntax.DNS1035_LABEL,
            "spec.service.name: must be a DNS-1035 label (lower case letters, digits and '-', starting"
            " with a letter, at most 63 characters), e.g. clef-serve",
        ),
    ] = Field(
        max_length=63,
        description="The stable Service.  clef creates it; an existing one is a conflict unless adopt is set.",
    )
    port: Annotated[int, in_range("spec.service.port", 1, 65535)] = 8000
    container_port: Annotated[int, in_range("spec.service.containerPort", 1, 65535)] = Field(
        default=8000, description="The port the engine listens on inside the pod."
    )
    adopt: bool = Field(
        default=False,
        description="Adopt an existing Service of this name that clef did not create: clef then changes only its"
        " selector, its `http` port and clef's annotations, and puts the original selector back when this"
        " ClefModel is deleted.  A Service controlled by another owner is never adopted.",
    )


_PROMPT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class EndpointPrompt(ApiModel):
    """A chat prompt added to the goldens (one user turn, rendered with the checkpoint's template,
    thinking off)."""

    name: Annotated[
        str,
        matching(
            _PROMPT_NAME,
            "spec.verification.endpoint.prompts[].name: use letters, digits and . _ - (e.g. homelab-question)",
        ),
    ] = Field(max_length=64)
    text: Annotated[
        str,
        Check(
            "self.size() > 0",
            "spec.verification.endpoint.prompts[].text: must not be empty",
            lambda v: len(v) > 0,
        ),
        no_nul("spec.verification.endpoint.prompts[].text"),
    ] = Field(max_length=16384)


def _unique_names(path: str) -> AfterValidator:
    """What the API server's list-map keyed by name enforces for the list at `path`."""

    def check(items: list[Any]) -> list[Any]:
        seen: set[str] = set()
        for i, item in enumerate(items):
            if item.name in seen:
                raise ValueError(f"{path}[{i}]: Duplicate value: name {item.name!r}")
            seen.add(item.name)
        return items

    return AfterValidator(check)


class EndpointSpec(ApiModel):
    """How the candidate's engine is asked (mode endpoint or both)."""

    checks = (
        Check(
            "self.builtinPrompts != 'none' || (has(self.prompts) && size(self.prompts) > 0)",
            "spec.verification.endpoint.prompts: builtinPrompts is none, so give at least one prompt",
            lambda e: e["builtinPrompts"] != "none" or len(e.get("prompts", [])) > 0,
            field_path=".prompts",
        ),
    )

    runtime_image: (
        Annotated[
            str,
            *image_reference("spec.verification.endpoint.runtimeImage", "registry.example/clef-runtime:1.0"),
        ]
        | None
    ) = Field(
        default=None,
        max_length=512,
        description="The clef runtime image that makes the goldens (on a GPU) and runs the comparison (on a CPU):"
        " a foreign engine's image does not bundle clef-runtime.  Required for modes endpoint and both.",
    )
    builtin_prompts: BuiltinPrompts = Field(
        default=BuiltinPrompts.ALL,
        description="clef-runtime's built-in prompt set: all, short (without the 8197-token prompt) or none.",
    )
    prompts: Annotated[list[EndpointPrompt], _unique_names("spec.verification.endpoint.prompts")] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description="Chat prompts added to the goldens.",
    )
    max_new_tokens: (
        Annotated[
            int,
            Check(
                "self >= 2 && self <= 4096",
                "spec.verification.endpoint.maxNewTokens: must be between 2 and 4096 (the first new token comes"
                " from the prompt's prefill; the second is the fewest that runs a decode step, where the conv"
                " and delta-rule states advance)",
                lambda v: 2 <= v <= 4096,
            ),
        ]
        | None
    ) = Field(
        default=None,
        description="Caps the new tokens of every prompt (unset: each prompt's own, 64 or 96 for the built-in"
        " ones); at least 2, so that a decode step runs.",
    )
    request_timeout_seconds: Annotated[
        int, in_range("spec.verification.endpoint.requestTimeoutSeconds", 1, 3600)
    ] = Field(default=600, description="Per request to the preview (endpoint-check --timeout).")
    ready_timeout_seconds: Annotated[
        int, in_range("spec.verification.endpoint.readyTimeoutSeconds", 10, 86400)
    ] = Field(
        default=1800,
        description="How long the preview replica may take to become Ready (loading weights takes minutes);"
        " then it fails as PreviewNotReady.",
    )


class WatchPolicy(StrEnum):
    """What a failed probe of a serving pod does (docs/verification.md, "Watching the serving
    revision").  `alert`: the Serving condition and a Warning event.  `cordon-pod`: also takes
    the serving label off that pod, so no Service that selects on it sends it traffic.
    `rollback`: cordon-pod, and the revision's verdict is failed in service (a signed record of
    step `probe`), so that the newest earlier revision verified on the same GPU class serves."""

    ALERT = "alert"
    CORDON_POD = "cordon-pod"
    ROLLBACK = "rollback"


class WatchSpec(ApiModel):
    """Probes of the serving revision: every serving pod, at its own address, is asked a few of
    the signed goldens' prompts every `intervalSeconds`, by a CPU-only Job, judged by the rule
    of the endpoint verification."""

    interval_seconds: Annotated[int, in_range("spec.verification.watch.intervalSeconds", 60, 3600)] = Field(
        default=600,
        description="Seconds between two probes of one serving pod (60 to 3600: a finished probe Job is kept"
        " until the next one, and the API server removes it an hour after it finished).",
    )
    prompts: Annotated[int, in_range("spec.verification.watch.prompts", 1, 16)] = Field(
        default=1,
        description="Golden prompts asked per probe; each probe asks the next ones, so that every prompt is"
        " asked in turn.",
    )
    policy: WatchPolicy = Field(
        default=WatchPolicy.ALERT,
        description="alert (condition and event), cordon-pod (also remove the failing pod from the serving"
        " label's selector) or rollback (cordon-pod, record the revision as failed in service, and serve the"
        " newest earlier revision verified on the same GPU class, when one is kept).",
    )


class VerificationSpec(ApiModel):
    checks = (
        Check(
            "!has(self.endpoint) || !has(self.mode) || self.mode != 'kernels'",
            "spec.verification.endpoint: has no effect with mode kernels; remove it or choose mode endpoint or both",
            lambda v: "endpoint" not in v or v.get("mode") != "kernels",
            field_path=".endpoint",
        ),
    )

    mode: VerificationMode | None = Field(
        default=None,
        description="kernels (clef-runtime verify in the image), endpoint (the engine answers golden prompts"
        " from a preview replica) or both.  Default per engine: endpoint for candle-vllm, vllm and mistralrs.",
    )
    endpoint: EndpointSpec | None = None
    watch: WatchSpec | None = Field(
        default=None,
        description="Probe the serving pods with the goldens while they serve (modes endpoint and both).",
    )
    suite: Suite = Suite.KERNELS
    timeout_seconds: Annotated[int, in_range("spec.verification.timeoutSeconds", 10, 86400)] = Field(
        default=1800,
        description="The verification Job's activeDeadlineSeconds: a verification still running then fails.",
    )
    tolerance_scale: Annotated[float, in_range("spec.verification.toleranceScale", 0.1, 100.0)] | None = (
        Field(
            default=None,
            description="Multiplies every check's tolerance (`verify --tolerance-scale`); unset: the runtime's own.",
        )
    )
    image: (
        Annotated[
            str,
            *image_reference("spec.verification.image", "registry.example/clef-runtime:1.0"),
        ]
        | None
    ) = Field(
        default=None,
        max_length=512,
        description="Run verification in this image instead of spec.image (serving is then pinned to spec.image as"
        " written, not to a verified digest).",
    )
    command: list[Annotated[str, Field(max_length=1024), no_nul("spec.verification.command[]")]] = Field(
        default_factory=list,
        max_length=16,
        description="Replaces `clef-runtime verify` (the flags are still appended).",
    )
    required: bool = Field(
        default=True,
        description="false: roll out without verification (Verified stays Unknown, reason VerificationNotRequired).",
    )


class RolloutSpec(ApiModel):
    strategy: Strategy = Strategy.BLUE_GREEN
    scale_down_delay_seconds: Annotated[int, in_range("spec.rollout.scaleDownDelaySeconds", 0, 86400)] = 30
    revision_history_limit: Annotated[int, in_range("spec.rollout.revisionHistoryLimit", 0, 10)] = Field(
        default=2, description="Old Deployments kept at 0 replicas for instant rollback."
    )


def _tp(spec: dict[str, Any]) -> int:
    return int(spec.get("tensorParallel", spec["gpus"]))


def _divides_heads(spec: dict[str, Any], *heads: str) -> bool:
    arch = spec["model"]["architecture"]
    return all(arch[h] % _tp(spec) == 0 for h in heads)


_TP = "(has(self.tensorParallel) ? self.tensorParallel : self.gpus)"


def _default_mode_cel() -> str:
    """CEL: the engine's default mode (DEFAULT_MODE), for a spec that sets none."""
    out = f"'{VerificationMode.KERNELS.value}'"
    for engine, mode in sorted(DEFAULT_MODE.items()):
        out = f"(self.engine == '{engine}' ? '{mode.value}' : {out})"
    return out


# CEL: the mode in effect.
_MODE = f"(has(self.verification.mode) ? self.verification.mode : {_default_mode_cel()})"


def effective_mode(spec: dict[str, Any] | ClefModelSpec) -> VerificationMode:
    """spec.verification.mode, else the engine's default (wire dict or parsed spec)."""
    if isinstance(spec, ClefModelSpec):
        return spec.verification.mode or DEFAULT_MODE.get(spec.engine.value, VerificationMode.KERNELS)
    mode = spec.get("verification", {}).get("mode")
    return VerificationMode(mode) if mode else DEFAULT_MODE.get(spec["engine"], VerificationMode.KERNELS)


def _asks_endpoint(spec: dict[str, Any]) -> bool:
    return effective_mode(spec) is not VerificationMode.KERNELS and spec["verification"]["required"]


def _endpoint_checks() -> tuple[Check, ...]:
    """The rules of modes endpoint and both (the engine is asked): what they need from the spec."""
    asks = f"self.verification.required && {_MODE} != 'kernels'"
    return (
        Check(
            f"!({asks}) || (has(self.verification.endpoint) && has(self.verification.endpoint.runtimeImage))",
            "spec.verification.endpoint.runtimeImage: required for verification mode endpoint or both (the default"
            " for every engine): the clef runtime image that makes the goldens and compares; or set"
            " spec.verification.mode: kernels",
            lambda s: not _asks_endpoint(s) or "runtimeImage" in s["verification"].get("endpoint", {}),
            field_path=".verification.endpoint.runtimeImage",
        ),
        Check(
            f"!({asks}) || has(self.model.volume)",
            "spec.model.volume: required for verification mode endpoint or both: the goldens are made from the"
            " mounted checkpoint",
            lambda s: not _asks_endpoint(s) or "volume" in s["model"],
            field_path=".model.volume",
        ),
        Check(
            f"!has(self.verification.watch) || ({asks})",
            "spec.verification.watch: probes ask the serving engine the signed goldens, which exist only when"
            " verification.required is true and the mode is endpoint or both (the default for every engine)",
            lambda s: "watch" not in s["verification"] or _asks_endpoint(s),
            field_path=".verification.watch",
        ),
        Check(
            f"{_MODE} != 'endpoint' || (!has(self.verification.image)"
            " && (!has(self.verification.command) || size(self.verification.command) == 0))",
            "spec.verification.image: a kernels verifier (verification.image or .command) does not run in mode"
            " endpoint; remove it or choose mode both",
            lambda s: (
                effective_mode(s) is not VerificationMode.ENDPOINT
                or ("image" not in s["verification"] and not s["verification"].get("command"))
            ),
            field_path=".verification.image",
        ),
    )


class ClefModelSpec(ApiModel):
    """A hybrid Gated-DeltaNet model served from a verified image behind a stable Service."""

    checks = (
        Check(
            "!has(self.tensorParallel) || self.gpus % self.tensorParallel == 0",
            "spec.tensorParallel: must divide spec.gpus (GPUs per replica)",
            lambda s: s["gpus"] % _tp(s) == 0,
            field_path=".tensorParallel",
        ),
        Check(
            f"self.model.architecture.numAttentionHeads % {_TP} == 0"
            f" && self.model.architecture.numKeyValueHeads % {_TP} == 0",
            "spec.tensorParallel: (default spec.gpus) must divide model.architecture.numAttentionHeads and"
            " numKeyValueHeads; choose a tensor-parallel degree that does",
            lambda s: _divides_heads(s, "numAttentionHeads", "numKeyValueHeads"),
            field_path=".tensorParallel",
        ),
        Check(
            f"self.model.architecture.linearNumKeyHeads % {_TP} == 0"
            f" && self.model.architecture.linearNumValueHeads % {_TP} == 0",
            "spec.tensorParallel: (default spec.gpus) cannot shard the GDN layers: it must divide"
            " model.architecture.linearNumKeyHeads and linearNumValueHeads",
            lambda s: _divides_heads(s, "linearNumKeyHeads", "linearNumValueHeads"),
            field_path=".tensorParallel",
        ),
        Check(
            "self.engine != 'candle-vllm' || !has(self.tensorParallel) || self.tensorParallel == self.gpus",
            "spec.tensorParallel: candle-vllm shards only by tensor parallelism, so tensorParallel must equal"
            " spec.gpus (or be left out)",
            lambda s: s["engine"] != "candle-vllm" or _tp(s) == s["gpus"],
            field_path=".tensorParallel",
        ),
        Check(
            "self.engine != 'mistralrs' || !has(self.tensorParallel) || self.tensorParallel == self.gpus",
            "spec.tensorParallel: mistralrs takes every GPU of the pod (tensor parallel over all of them, or"
            " its layers mapped across them) and has no flag for a degree, so tensorParallel must equal"
            " spec.gpus (or be left out)",
            lambda s: s["engine"] != "mistralrs" or _tp(s) == s["gpus"],
            field_path=".tensorParallel",
        ),
        Check(
            "self.engine != 'mistralrs' || has(self.gpuMemoryMiB)",
            "spec.gpuMemoryMiB: required for engine mistralrs (its KV cache is sized in MiB per GPU,"
            " --pa-memory-mb: kvFraction x the memory left after the weights); e.g. 32768 for a V100-32GB",
            lambda s: s["engine"] != "mistralrs" or "gpuMemoryMiB" in s,
            field_path=".gpuMemoryMiB",
        ),
        Check(
            "self.engine != 'vllm' || has(self.gpuMemoryMiB)",
            "spec.gpuMemoryMiB: required for engine vllm (its KV cache is sized in bytes: kvFraction x the memory"
            " left after the weights); e.g. 32768 for a V100-32GB",
            lambda s: s["engine"] != "vllm" or "gpuMemoryMiB" in s,
            field_path=".gpuMemoryMiB",
        ),
        Check(
            "!has(self.verification.image) || self.image.contains('@sha256:')",
            "spec.image: must be a digest reference (repo@sha256:<digest>) when spec.verification.image is"
            " set: a verifier running another image cannot tell which digest of spec.image will serve",
            lambda s: "image" not in s["verification"] or "@sha256:" in s["image"],
            field_path=".image",
        ),
        *(_endpoint_checks()),
        Check(
            "self.verification.required || !has(self.verification.image)",
            "spec.verification.image: has no effect when verification.required is false; remove one of them",
            lambda s: s["verification"]["required"] or "image" not in s["verification"],
            field_path=".verification.image",
        ),
    )

    engine: Engine = Field(
        description="The serving engine preset that turns these fields into argv: candle-vllm, vllm or"
        " mistralrs (mistral.rs 0.8.1; it loads Qwen3.5 only in the image-and-text layout, so the weights"
        " volume must hold that layout, docs/api.md)."
    )
    image: Annotated[
        str,
        *image_reference("spec.image", "registry.example/candle-vllm:sm70"),
    ] = Field(
        max_length=512,
        description="The serving image: the unit of verification.  Tags are resolved to the digest that passed.",
    )
    model: ModelSource
    dtype: Dtype
    kv_fraction: Annotated[
        float,
        Check(
            "self > 0.0 && self <= 0.95",
            "spec.kvFraction: must be in (0, 0.95], e.g. 0.30",
            lambda v: 0 < v <= 0.95,
        ),
    ] = Field(description="Fraction of the GPU memory left after the weights that the KV cache gets.")
    gpus: Annotated[
        int,
        Check(
            "self >= 1 && self <= 16",
            "spec.gpus: must be between 1 and 16 (GPUs per replica)",
            lambda v: 1 <= v <= 16,
        ),
    ] = Field(default=1, description="GPUs per replica.")
    tensor_parallel: Annotated[int, in_range("spec.tensorParallel", 1, 16)] | None = Field(
        default=None,
        description="Tensor-parallel degree; defaults to spec.gpus.  candle-vllm and mistralrs: must equal"
        " spec.gpus (they shard over every GPU of the pod).",
    )
    gpu_memory_mib: Annotated[int, in_range("spec.gpuMemoryMiB", 1024, 4194304)] | None = Field(
        default=None,
        description="Memory of one GPU in MiB.  Defaults to the node label nvidia.com/gpu.memory of the verification"
        " pod's node (kvCacheTokens estimate); required for engines vllm and mistralrs.",
    )
    replicas: Annotated[int, in_range("spec.replicas", 0, 64)] = Field(
        default=1, description="Serving replicas; 0 keeps a parked (verified, not serving) Deployment."
    )
    runtime_class_name: Annotated[
        str,
        matching(
            syntax.DNS1123_SUBDOMAIN,
            "spec.runtimeClassName: must name a RuntimeClass (a DNS subdomain), e.g. nvidia",
        ),
    ] = Field(default="nvidia", max_length=253)
    node_selector: Annotated[
        dict[str, Annotated[str, Field(max_length=63)]],
        for_each_entry(
            _label_key_rule("k"),
            "spec.nodeSelector: keys must be label keys ([prefix/]name: a DNS subdomain of at most 253 characters,"
            " then a name of at most 63 letters, digits, '-', '_' or '.'), e.g. nvidia.com/gpu.product",
            lambda k, _: syntax.is_qualified_name(k),
        ),
        for_each_entry(
            f"self[k].matches(r'{syntax.LABEL_VALUE}')",
            "spec.nodeSelector: values must be label values (at most 63 letters, digits, '-', '_' or '.', starting"
            " and ending with a letter or digit), e.g. Tesla-V100-SXM2-16GB",
            lambda _, v: syntax.matches(syntax.LABEL_VALUE, v),
        ),
    ] = Field(default_factory=dict, max_length=32)
    run_as_user: Annotated[int, in_range("spec.runAsUser", 1, 2147483647)] | None = Field(
        default=None,
        description="The UID the engine's serving pods run as, with runAsNonRoot (Pod Security restricted);"
        " unset: the image's own user (engine images often run as root).  Verification pods always run"
        " as clef's runtime user, 65532.",
    )
    tolerations: list[Toleration] = Field(default_factory=list, max_length=16)
    resources: Resources = Field(default_factory=Resources, json_schema_extra={"default": {}})
    env: Annotated[list[EnvVar], _unique_names("spec.env")] = Field(
        default_factory=list,
        max_length=64,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    args: list[Annotated[str, Field(max_length=1024), no_nul("spec.args[]")]] = Field(
        default_factory=list,
        max_length=64,
        description="Extra engine arguments, appended to the preset's argv (never through a shell).",
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


class Verifier(StrEnum):
    """Who judged: clef-runtime verify in the serving image (`clef`), or a user-supplied verifier
    (spec.verification.image or .command set: `custom`), whose pass is never called clef's."""

    CLEF = "clef"
    CUSTOM = "custom"


class Step(StrEnum):
    """Which step of a verification a record speaks for.  `kernels`: the verify Job (the whole
    verification in mode kernels); `goldens`, `preview`, `endpoint`: the steps of the endpoint
    mode, of which only `endpoint` (the comparison) concludes a pass.  `probe`: a probe of the
    serving revision that failed under watch policy rollback (the verdict failed in service)."""

    KERNELS = "kernels"
    GOLDENS = "goldens"
    PREVIEW = "preview"
    ENDPOINT = "endpoint"
    PROBE = "probe"


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
    node_driver: str | None = Field(
        default=None,
        max_length=64,
        description="The NVIDIA driver of the node it ran on (node label nvidia.com/cuda.driver-version.full);"
        " recorded, not part of the verification key.",
    )
    node_cuda_runtime: str | None = Field(
        default=None,
        max_length=64,
        description="The CUDA runtime of the node it ran on (node label nvidia.com/cuda.runtime-version.full);"
        " recorded, not part of the verification key.",
    )
    dtype: Dtype
    suite: Suite
    verdict: Verdict
    reason: str = Field(max_length=128)
    summary: str = Field(default="", max_length=1024)
    failing: list[FailingCheck] = Field(default_factory=list, max_length=5)
    device: str | None = Field(default=None, max_length=256)
    runtime_version: str | None = Field(default=None, max_length=128)
    job: str = Field(max_length=63)
    job_uid: str = Field(default="", max_length=64, description="The UID of the Job that produced it.")
    finished_at: str = Field(max_length=64)
    verifier: Verifier = Field(
        default=Verifier.CLEF, description="clef's own checks, or a user-supplied verifier."
    )
    run: str = Field(
        default="", max_length=64, description="The re-verify run it belongs to (empty: none was requested)."
    )
    superseded: bool = Field(
        default=False, description="A re-verify was requested after this verdict; it no longer counts."
    )
    generation: int | None = Field(
        default=None, description="The ClefModel's metadata.generation the run was made for."
    )
    step: Step = Field(
        default=Step.KERNELS,
        description="The step: kernels (the verify Job), goldens, preview, endpoint (the comparison) or probe"
        " (a probe of the serving revision failed it in service, watch policy rollback).",
    )
    final: bool = Field(
        default=True,
        description="Whether it concludes the verification (a failure always does; a pass of goldens, of the"
        " preview, or of the kernels in mode both does not).",
    )
    signature: str = Field(
        default="",
        max_length=128,
        description="HMAC-SHA256 by the operator's key: a record without a valid one is ignored and dropped.",
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
        default=None,
        max_length=256,
        description="The last clef.riotpiao.com/reverify value acted on (values over 128 characters: their"
        " sha256).",
    )
    reverify_runs: int | None = Field(
        default=None, description="How many re-verify requests were acted on (each is a new run)."
    )
    ignored_verdicts: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list,
        max_length=16,
        description="Fingerprints of verdicts ignored as untrusted (one UntrustedVerdictIgnored event each).",
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
