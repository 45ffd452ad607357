"""The choices a spec makes (engine, dtype, suite, verification mode, prompts, rollout strategy,
watch policy) and each engine's defaults."""

from __future__ import annotations

from enum import StrEnum


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


class WatchPolicy(StrEnum):
    """What a failed probe of a serving pod does (docs/verification.md, "Watching the serving
    revision").  `alert`: the Serving condition and a Warning event.  `cordon-pod`: also takes
    the serving label off that pod, so no Service that selects on it sends it traffic.
    `rollback`: cordon-pod, and the revision's verdict is failed in service (a signed record of
    step `probe`), so that the newest earlier revision verified on the same GPU class serves."""

    ALERT = "alert"
    CORDON_POD = "cordon-pod"
    ROLLBACK = "rollback"
