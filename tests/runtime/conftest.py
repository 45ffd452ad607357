"""Shared fixtures for the runtime kernel tests: device choice, seeded RNG, dtype parameters and the
gating of the GPU tier.

* CPU tier (unmarked tests): run wherever the suite runs -- on CPU under ``TRITON_INTERPRET=1``,
  or on CUDA with compiled kernels when a GPU is present and the interpreter is off.
* GPU tier (``@pytest.mark.gpu``): real model shapes on CUDA with compiled kernels; skipped with a
  reason without a CUDA device or under the interpreter (too slow at those shapes), and failed
  instead with ``CLEF_REQUIRE_GPU=1`` (``make test-gpu``).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterator

import pytest
import torch
from devices import tier_device

from clef_runtime.dtypes import NAMES, torch_dtype
from clef_runtime.interpreter import interpreting, round_bf16_like_gpus

# Must precede the first `import triton` (see tests/conftest.py, which normally got here first).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

RandN = Callable[..., torch.Tensor]


if interpreting():
    # The kernels package applies it on import too; the tests that call Triton directly need it
    # before that import.
    round_bf16_like_gpus()


def _gpu_skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "skip: no CUDA device (the gpu tier runs on a CUDA host: make test-gpu)"
    if interpreting():
        return "skip: TRITON_INTERPRET is set; the gpu tier runs compiled kernels (make test-gpu)"
    return None


def gpu_required() -> bool:
    """``CLEF_REQUIRE_GPU=1`` (set by ``make test-gpu``): a GPU tier that cannot run is a failure,
    not a skip, so a machine without a GPU cannot pass it by skipping every test."""
    return os.environ.get("CLEF_REQUIRE_GPU", "") not in ("", "0")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "gpu" not in item.keywords:
        return
    reason = _gpu_skip_reason()
    if reason is None:
        return
    if gpu_required():
        pytest.fail(
            f"gpu tier required (CLEF_REQUIRE_GPU) but {reason.removeprefix('skip: ')}", pytrace=False
        )
    pytest.skip(reason)


@pytest.fixture(scope="session")
def device() -> torch.device:
    """Where the CPU-tier tests run: CUDA when kernels are compiled for it, else the CPU."""
    return tier_device()


@pytest.fixture(scope="session")
def gpu_device() -> torch.device:
    """The device of ``@pytest.mark.gpu`` tests (which are skipped when it is missing)."""
    return torch.device("cuda")


@pytest.fixture(params=list(NAMES))
def dtype_name(request: pytest.FixtureRequest) -> str:
    """ "f32", "bf16", "f16": the keys of `clef_runtime.tolerances`."""
    return str(request.param)


# f16 under both launch configurations of the chunked delta rule: the tensor-core one (what the
# interpreter and Ampere-or-later GPUs take by themselves) and the FMA one (the homelab's V100),
# forced (`clef_runtime.kernel_config`).  bf16 and f32 take what the device decides.
DTYPE_CONFIGS = (("f32", "auto"), ("bf16", "auto"), ("f16", "tensor-core"), ("f16", "fma"))


@pytest.fixture(params=DTYPE_CONFIGS, ids=["f32", "bf16", "f16-tensor-core", "f16-fma"])
def dtype_config(request: pytest.FixtureRequest) -> tuple[str, str]:
    """``(dtype name, kernel config)``: every dtype, and f16 under both launch configurations."""
    name, config = request.param
    return str(name), str(config)


@pytest.fixture(params=["tensor-core", "fma"])
def f16_kernel_config(request: pytest.FixtureRequest) -> str:
    """The two launch configurations an f16-only test of the chunked delta rule runs under."""
    return str(request.param)


@pytest.fixture
def dtype(dtype_name: str) -> torch.dtype:
    return torch_dtype(dtype_name)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> torch.Generator:
    """A CPU generator seeded from the test's id: fresh inputs per test and per parameter set,
    identical on every rerun and every machine."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def randn(rng: torch.Generator, device: torch.device) -> RandN:
    """``randn(*shape, dtype=torch.float32, scale=1.0, on=None)``: normal samples drawn in float32
    on the CPU (so values do not depend on the device), then cast and moved to ``on`` (default: the
    `device` fixture)."""

    def make(
        *shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0, on: torch.device | None = None
    ) -> torch.Tensor:
        t = torch.randn(*shape, generator=rng, dtype=torch.float32) * scale
        return t.to(dtype=dtype, device=on if on is not None else device)

    return make


@pytest.fixture(autouse=True)
def _no_fault(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fault left in the caller's environment must not change what an ordinary test computes;
    fault tests set ``CLEF_RUNTIME_FAULT`` themselves."""
    monkeypatch.delenv("CLEF_RUNTIME_FAULT", raising=False)
    monkeypatch.delenv("CLEF_KERNEL_CONFIG", raising=False)  # likewise a forced launch config
    yield
