"""Which launch configuration the chunked delta rule takes, by name.

``auto`` lets the device decide (`clef_runtime.ops.delta_rule_common.tensor_core_dots`): tensor
cores for 16-bit inputs on Ampere and later and under the interpreter, FMA on the V100 (sm70, no
MMA in Triton 3.6).  ``fma`` and ``tensor-core`` force one of the two whatever the device, so
the homelab's V100 configuration (FMA tiles, row-by-row triangular solve, IEEE float32 dots) runs
numerically on the CPU interpreter and on an H200.  float32 has one configuration only (its IEEE
dots are FMA loops everywhere), so forcing ``tensor-core`` leaves it on FMA.

Like the fault (`clef_runtime.faults`), the name is read once, when the op set is built
(`clef_runtime.opset.get_opset`); an unknown name is an error, never a quiet ``auto``.  Nothing
here imports Triton: `verify` resolves the name before the first ``import triton``.
"""

from __future__ import annotations

import os

from clef_contract.command import KERNEL_CONFIG_ENV, KERNEL_CONFIGS

AUTO = "auto"
FMA = "fma"
TENSOR_CORE = "tensor-core"


class UnknownKernelConfigError(ValueError):
    pass


def kernel_config(name: str | None = None) -> str:
    """`name`, or ``CLEF_KERNEL_CONFIG`` when `name` is None, or ``auto`` when neither is set.
    Raises `UnknownKernelConfigError` on a name that is not one of `KERNEL_CONFIGS`."""
    source = "kernel config" if name is not None else KERNEL_CONFIG_ENV
    value = (name if name is not None else os.environ.get(KERNEL_CONFIG_ENV, "")).strip().lower()
    value = value or AUTO
    if value not in KERNEL_CONFIGS:
        raise UnknownKernelConfigError(f"{source}={value!r} is not one of {', '.join(KERNEL_CONFIGS)}")
    return value


def forced_tensor_cores(config: str) -> bool | None:
    """The ``tensor_cores`` argument of the chunked delta rule: None lets the device decide."""
    return None if config == AUTO else config == TENSOR_CORE
