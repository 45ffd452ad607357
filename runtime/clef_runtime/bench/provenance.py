"""What a bench record says about where it ran: the device, the versions, the checkout, FLA's
environment and backend."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path
from typing import Any

import torch


def device_info(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {"name": platform.processor() or platform.machine() or "cpu", "type": "cpu"}
    props = torch.cuda.get_device_properties(device)
    return {
        "type": "cuda",
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sms": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)) or None,
        "cuda": torch.version.cuda,
    }


def git_commit() -> str | None:
    """The checkout's commit, with ``-dirty`` where the files differ from it (a working tree
    copied onto a bench host without its new commits reads as its old commit, dirty)."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=7"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def versions(fla_version: str | None) -> dict[str, Any]:
    import triton

    from clef_runtime import __version__

    v: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": getattr(triton, "__version__", "unknown"),
        "clef_runtime": __version__,
        "fla": fla_version,
        "git": git_commit(),
    }
    try:
        from importlib.metadata import version

        v["fla_core"] = version("fla-core") if fla_version else None
    except Exception:
        v["fla_core"] = None
    return v


def fla_backend(flashqla_loaded: bool) -> str:
    from importlib.util import find_spec

    from clef_runtime.bench.fla_peer import fla_chunk_backend

    try:
        importable = flashqla_loaded or find_spec("flash_qla") is not None
    except (ImportError, ValueError):
        importable = False
    return fla_chunk_backend(importable)


def fla_env() -> dict[str, str]:
    from clef_runtime.bench.fla_peer import fla_environment

    return fla_environment()
