"""`spec.verification`: the mode, the kernels verifier, the endpoint mode's prompts
(`endpoint`) and the probes of the serving revision (`watch`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from clef_operator.api.base import ApiModel, image_reference, no_nul, unique_names
from clef_operator.api.enums import BuiltinPrompts, Suite, VerificationMode, WatchPolicy
from clef_operator.checks import Check, in_range, matching

_PROMPT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_RUNTIME_EXAMPLE = "registry.example/clef-runtime:1.0"
# The two optional images of clef's runtime: the endpoint mode's and the kernels verifier's.
RuntimeImage = Annotated[str, *image_reference("spec.verification.endpoint.runtimeImage", _RUNTIME_EXAMPLE)]
VerifierImage = Annotated[str, *image_reference("spec.verification.image", _RUNTIME_EXAMPLE)]


def _optional_image(description: str) -> Any:
    """The Field of an optional image reference (at most 512 characters)."""
    return Field(default=None, max_length=512, description=description)


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

    runtime_image: RuntimeImage | None = _optional_image(
        "The clef runtime image that makes the goldens (on a GPU) and runs the comparison (on a CPU):"
        " a foreign engine's image does not bundle clef-runtime.  Required for modes endpoint and both."
    )
    builtin_prompts: BuiltinPrompts = Field(
        default=BuiltinPrompts.ALL,
        description="clef-runtime's built-in prompt set: all, short (without the 8197-token prompt) or none.",
    )
    prompts: Annotated[list[EndpointPrompt], unique_names("spec.verification.endpoint.prompts")] = Field(
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


class WatchSpec(ApiModel):
    """Probes of the serving revision: every serving pod, at its own address, is asked a few of
    the signed goldens' prompts every `intervalSeconds`, by a CPU-only Job, judged by the rule
    of the endpoint verification."""

    interval_seconds: Annotated[int, in_range("spec.verification.watch.intervalSeconds", 60, 3600)] = Field(
        default=600,
        description="Seconds between two probes of one serving pod (60 to 3600; a probe must finish within"
        " it).  A finished probe Job is kept until the pod's next probe has finished, then deleted.",
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
    image: VerifierImage | None = _optional_image(
        "Run verification in this image instead of spec.image (serving is then pinned to spec.image as"
        " written, not to a verified digest)."
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
