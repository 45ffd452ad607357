"""`clef-runtime verify` as the operator calls it: the values of its flags, the `--shape` keys,
the environment it reads and the exit codes it answers with.

The operator renders these into the verification Job; the runtime's command line accepts exactly
these.  A shape key here is a field of `ClefModel.spec.model.architecture` (which the operator
sends, every one, always) and of the Hugging Face config the runtime builds its model from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import IntEnum
from typing import Final

from clef_contract.report import Verdict

SUITES: Final = ("kernels", "model", "full")
DTYPES: Final = ("f16", "bf16", "f32")

# Where the runtime writes the compact report, and the path the operator gives Kubernetes as the
# container's terminationMessagePath: the same file, read back as the termination message.
TERMINATION_LOG: Final = "/dev/termination-log"

TERMINATION_LOG_ENV: Final = "CLEF_TERMINATION_LOG"
FAULT_ENV: Final = "CLEF_RUNTIME_FAULT"
DEVICE_ENV: Final = "CLEF_VERIFY_DEVICE"
SHAPES_ENV: Final = "CLEF_VERIFY_SHAPES"
# The chunked delta rule's launch configuration: "auto" decides from the device (tensor cores on
# Ampere and later, FMA on the V100); "fma" / "tensor-core" force one whatever the device, so the
# V100's configuration can be run on any GPU and on the CPU interpreter.
KERNEL_CONFIG_ENV: Final = "CLEF_KERNEL_CONFIG"
KERNEL_CONFIGS: Final = ("auto", "fma", "tensor-core")

# The user (and group) clef's runtime image runs as (images/runtime/Dockerfile's `USER`), which
# the operator sets on every pod that runs a verifier (kernels verify, goldens, comparison), so
# that they meet Pod Security "restricted": runAsNonRoot needs a numeric, non-zero user.
RUNTIME_UID: Final = 65532


class ExitCode(IntEnum):
    """What `verify` exits with.  The operator treats anything but PASS as "not verified"."""

    PASS = 0
    MISMATCH = 1  # a check failed: the candidate computes something else
    COULD_NOT_RUN = 2  # nothing trustworthy could be measured here (no GPU, bad config, ...)
    ENGINE_FAILED = 3  # endpoint-check only: the engine asked failed a prompt (HTTP 5xx, a crash)

    @classmethod
    def for_verdict(cls, verdict: Verdict) -> ExitCode:
        return {"pass": cls.PASS, "fail": cls.MISMATCH, "error": cls.COULD_NOT_RUN}[verdict]


SHAPE_FLAG: Final = "--shape"
# `--shape KEY=VALUE` key -> the architecture field it sets, in the order the operator sends them.
SHAPE_KEYS: Final[Mapping[str, str]] = {
    "layers": "num_layers",
    "full_attention_interval": "full_attention_interval",
    "attention_heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "linear_key_heads": "linear_num_key_heads",
    "linear_value_heads": "linear_num_value_heads",
    "linear_key_dim": "linear_key_head_dim",
    "linear_value_dim": "linear_value_head_dim",
}


class ShapeError(ValueError):
    """A `--shape` item the runtime cannot accept; the message names the item and what is wrong."""


def shape_flags(architecture: Mapping[str, int]) -> list[str]:
    """`["--shape=layers=32", ...]`: one flag per shape key, from the architecture's fields
    (`{"num_layers": 32, ...}`).  Every key, always: a missing field is a KeyError, not a flag
    quietly left out."""
    return [f"{SHAPE_FLAG}={key}={architecture[field]}" for key, field in SHAPE_KEYS.items()]


def parse_shape(items: Iterable[str]) -> dict[str, int]:
    """`("linear_key_heads=16", ...)` -> `{"linear_key_heads": 16}`; ShapeError on bad input."""
    out: dict[str, int] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in SHAPE_KEYS:
            raise ShapeError(
                f"{SHAPE_FLAG} {item!r}: expected KEY=VALUE with KEY one of {', '.join(SHAPE_KEYS)}"
            )
        try:
            n = int(value)
        except ValueError:
            raise ShapeError(f"{SHAPE_FLAG} {item!r}: {value!r} is not an integer") from None
        if n < 1:
            raise ShapeError(f"{SHAPE_FLAG} {item!r}: must be at least 1")
        out[key] = n
    return out
