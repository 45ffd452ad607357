"""Where `verify` runs: the device, the shape profile, the kernel launch configuration and the
report paths, from flags and env.

Nothing here imports Triton: on a CPU host the interpreter must be switched on (TRITON_INTERPRET=1)
before the first `import triton`, so the device is settled first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from clef_contract.command import (
    DEVICE_ENV,
    KERNEL_CONFIG_ENV,
    SHAPES_ENV,
    TERMINATION_LOG,
    TERMINATION_LOG_ENV,
)
from clef_runtime.interpreter import interpreting
from clef_runtime.kernel_config import UnknownKernelConfigError, kernel_config

DEVICES = ("cuda", "cpu")
SHAPE_PROFILES = ("model", "reduced")


class CannotRun(Exception):
    """`verify` cannot measure anything here (exit 2): the message says why and what to do."""


@dataclass(frozen=True)
class Placement:
    device: str  # "cuda" or "cpu"
    shapes: str  # "model" or "reduced"
    termination_log: str
    kernel_config: str = "auto"  # `clef_runtime.kernel_config`: "auto", "fma" or "tensor-core"


def resolve_placement(
    device_flag: str | None,
    shapes_flag: str | None,
    termination_flag: str | None,
    kernel_config_flag: str | None = None,
) -> Placement:
    device = (device_flag or os.environ.get(DEVICE_ENV) or "cuda").strip().lower()
    if device not in DEVICES:
        raise CannotRun(f"device {device!r} is not one of {', '.join(DEVICES)} (--device or {DEVICE_ENV})")
    shapes = (shapes_flag or os.environ.get(SHAPES_ENV) or "model").strip().lower()
    if shapes not in SHAPE_PROFILES:
        raise CannotRun(
            f"shape profile {shapes!r} is not one of {', '.join(SHAPE_PROFILES)} (--shapes or {SHAPES_ENV})"
        )
    try:  # the flag, else CLEF_KERNEL_CONFIG, read here once and handed to the op sets
        config = kernel_config(kernel_config_flag)
    except UnknownKernelConfigError as exc:
        raise CannotRun(f"{exc} (--kernel-config or {KERNEL_CONFIG_ENV})") from None
    if device == "cpu":
        # The Triton kernels run on the CPU only through the interpreter, which must be on before
        # triton is imported; verify owns its process, so it may switch it on itself.
        os.environ["TRITON_INTERPRET"] = "1"
    elif interpreting():
        raise CannotRun("TRITON_INTERPRET is set but the device is cuda: unset it, or pass --device cpu")
    log = termination_flag or os.environ.get(TERMINATION_LOG_ENV) or TERMINATION_LOG
    return Placement(device=device, shapes=shapes, termination_log=log, kernel_config=config)


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


def ran_kernel_config(placement: Placement, dtype_name: str) -> str:
    """The launch configuration the chunked delta rule takes here, for the report: ``fma`` or
    ``tensor-core``, with `` (forced)`` when ``--kernel-config`` chose it rather than the device.
    Imports Triton: call it once the placement is settled."""
    import torch

    from clef_runtime.dtypes import torch_dtype
    from clef_runtime.kernel_config import forced_tensor_cores
    from clef_runtime.ops.delta_rule_common import tensor_core_dots

    forced = forced_tensor_cores(placement.kernel_config)
    tc = tensor_core_dots(torch_dtype(dtype_name), torch.device(placement.device), forced)
    return ("tensor-core" if tc else "fma") + ("" if forced is None else " (forced)")
