"""`spec.model`: the served model's name, where its weights are (volume, path inside the
container) and its architecture."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from clef_operator import syntax
from clef_operator.api.base import ApiModel, no_nul
from clef_operator.checks import Check, in_range, matching


def _no_backstep(path: str) -> bool:
    return not syntax.matches(syntax.BACKSTEP, path)


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
