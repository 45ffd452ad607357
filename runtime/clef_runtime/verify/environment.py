"""Where `verify` runs: the device, the shape profile and the report paths, from flags and env.

Nothing here imports Triton: on a CPU host the interpreter must be switched on (TRITON_INTERPRET=1)
before the first `import triton`, so the device is settled first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from clef_contract.command import DEVICE_ENV, SHAPES_ENV, TERMINATION_LOG, TERMINATION_LOG_ENV
from clef_runtime.interpreter import interpreting

DEVICES = ("cuda", "cpu")
SHAPE_PROFILES = ("model", "reduced")


class CannotRun(Exception):
    """`verify` cannot measure anything here (exit 2): the message says why and what to do."""


@dataclass(frozen=True)
class Placement:
    device: str  # "cuda" or "cpu"
    shapes: str  # "model" or "reduced"
    termination_log: str


def resolve_placement(
    device_flag: str | None, shapes_flag: str | None, termination_flag: str | None
) -> Placement:
    device = (device_flag or os.environ.get(DEVICE_ENV) or "cuda").strip().lower()
    if device not in DEVICES:
        raise CannotRun(f"device {device!r} is not one of {', '.join(DEVICES)} (--device or {DEVICE_ENV})")
    shapes = (shapes_flag or os.environ.get(SHAPES_ENV) or "model").strip().lower()
    if shapes not in SHAPE_PROFILES:
        raise CannotRun(
            f"shape profile {shapes!r} is not one of {', '.join(SHAPE_PROFILES)} (--shapes or {SHAPES_ENV})"
        )
    if device == "cpu":
        # The Triton kernels run on the CPU only through the interpreter, which must be on before
        # triton is imported; verify owns its process, so it may switch it on itself.
        os.environ["TRITON_INTERPRET"] = "1"
    elif interpreting():
        raise CannotRun("TRITON_INTERPRET is set but the device is cuda: unset it, or pass --device cpu")
    log = termination_flag or os.environ.get(TERMINATION_LOG_ENV) or TERMINATION_LOG
    return Placement(device=device, shapes=shapes, termination_log=log)


def check_device(placement: Placement) -> str:
    """The device's name for the report; raises CannotRun when the device is not usable."""
    import torch

    if placement.device == "cuda":
        if not torch.cuda.is_available():
            raise CannotRun(
                "no CUDA device is visible (torch.cuda.is_available() is False): the verification pod "
                "needs a GPU (check the nvidia.com/gpu limit and runtimeClassName), or run with --device cpu"
            )
        return str(torch.cuda.get_device_name(0))
    return "cpu (Triton interpreter)"
