"""`ClefModelSpec`, the top level of the spec, with the rules that relate its parts (tensor
parallelism against the heads, what each engine and verification mode needs), and the parts too
small for a module of their own (`spec.service`, `spec.rollout`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from clef_operator import syntax
from clef_operator.api.base import ApiModel, image_reference, label_key_rule, no_nul, unique_names
from clef_operator.api.enums import DEFAULT_MODE, Dtype, Engine, Strategy, VerificationMode
from clef_operator.api.model_source import ModelSource
from clef_operator.api.pods import EnvVar, Resources, Toleration
from clef_operator.api.verification import VerificationSpec
from clef_operator.checks import Check, for_each_entry, in_range, matching


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


# Engines whose tensor-parallel degree is always every GPU of the pod, and why.
_TP_IS_GPUS = {
    "candle-vllm": "candle-vllm shards only by tensor parallelism",
    "mistralrs": "mistralrs takes every GPU of the pod (tensor parallel over all of them, or its layers"
    " mapped across them) and has no flag for a degree",
}


def _tp_is_gpus(engine: str, why: str) -> Check:
    """spec.tensorParallel, when set, must equal spec.gpus for `engine`."""
    return Check(
        f"self.engine != '{engine}' || !has(self.tensorParallel) || self.tensorParallel == self.gpus",
        f"spec.tensorParallel: {why}, so tensorParallel must equal spec.gpus (or be left out)",
        lambda s: s["engine"] != engine or _tp(s) == s["gpus"],
        field_path=".tensorParallel",
    )


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
        *(_tp_is_gpus(engine, why) for engine, why in _TP_IS_GPUS.items()),
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
            label_key_rule("k"),
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
    env: Annotated[list[EnvVar], unique_names("spec.env")] = Field(
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
