"""`ClefModelStatus`: conditions, the revisions, and the records of finished verifications.
Every status field the operator writes is declared here: the API server prunes undeclared fields
silently."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field

from clef_operator.api.base import ApiModel
from clef_operator.api.enums import Dtype, Suite


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
