"""The dtype names clef uses everywhere (flags, tolerances, reports): ``f32``, ``bf16``, ``f16``.

Importing this module does not import torch: the CLI checks a ``--dtype`` before torch (and
Triton, which must see ``TRITON_INTERPRET`` first) is loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clef_contract.command import DTYPES

if TYPE_CHECKING:
    import torch

# The names the operator may send (`--dtype`), one list on both sides of the seam.
NAMES: tuple[str, ...] = tuple(DTYPES)


def torch_dtypes() -> dict[str, torch.dtype]:
    """``{"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}``."""
    import torch

    return {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a name in `NAMES` (KeyError otherwise)."""
    return torch_dtypes()[name]


def dtype_name(dtype: torch.dtype) -> str:
    """``"f32"`` / ``"bf16"`` / ``"f16"``, else torch's own name (``"float64"``)."""
    for name, d in torch_dtypes().items():
        if d == dtype:
            return name
    return str(dtype).removeprefix("torch.")
