"""`make demo-vllm`: the demo with the coder on real vLLM instead of the stand-in.

The coder's image becomes the local cluster's real-vLLM engine image (`engine: real-vllm` in
images.yaml: the runner starts vLLM's CPU build, hack/engines/vllm-cpu-venv.sh, for its pods), by
digest, so that the preview is the revision that serves; its checkpoint becomes the decisive one
(`clef_devcluster.decisive`: the shapes vLLM's CPU kernels take, greedy choices with margins),
in bf16 (vLLM's CPU gated-delta-net path takes no f16), and its goldens the built-in set's chat
prompts, MAX_NEW_TOKENS each.  Everything else in the story is the same.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ..images import seed_table
from ..runner.real_engine import API_SERVER
from ..runner.worker import real_vllm_venv

__all__ = [
    "API_SERVER",
    "IMAGE",
    "STEP1_TIMEOUT",
    "coder_patches",
    "missing",
    "pinned_image",
    "write_checkpoint",
]

IMAGE = "registry.clef.test/engines/vllm:0.32.0-cpu"
# vLLM's CPU build starts in 3-6 min on a 2-core machine; goldens (the kernel proof, then the
# prompts on interpreted Triton, ~2 s a token on a loaded 2-core machine) and the comparison take
# minutes more.  The demo caps every prompt at MAX_NEW_TOKENS (the full set's 512 tokens take
# ~20 min of goldens there; tests/engines/test_devcluster_vllm.py runs them all).
MAX_NEW_TOKENS = 16
READY_TIMEOUT = 900
JOB_TIMEOUT = 1800
STEP1_TIMEOUT = 2400.0


def pinned_image() -> str:
    entry = seed_table(faults=[]).lookup(IMAGE)
    assert entry is not None and entry.engine == "real-vllm", (
        f"{IMAGE} is not a real-vllm image in images.yaml"
    )
    return entry.image_id


def missing() -> str | None:
    """Why the variant cannot run here (real vLLM not installed), or None."""
    venv = real_vllm_venv()
    return venv if isinstance(venv, str) else None


def write_checkpoint(out: Path) -> Path:
    """The decisive checkpoint's bf16 variant, copied to `out` (under the one node directory the
    demo's admission policy lets the operator mount); trained first if the cache lacks it."""
    from .. import decisive

    source = decisive.build() / "bf16"
    same = all(
        (out / f.name).is_file() and (out / f.name).read_bytes() == f.read_bytes() for f in source.iterdir()
    )
    if not same:
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(source, out)
    return out


def builtin_chat_prompts(checkpoint: Path) -> list[dict[str, str]]:
    """The built-in set's chat prompts for this checkpoint's tokenizer, as user prompts: all but
    the 8197-token one and the 1-token one, which vLLM 0.32.0's CPU conv path fails (HTTP 500,
    `causal_conv1d_fwd_cpu: expect x to be transposed`; docs/verification.md)."""
    from clef_runtime.chat import ChatTokenizer
    from clef_runtime.goldens.prompts import builtin_prompts

    specs = builtin_prompts(ChatTokenizer.from_dir(checkpoint), long=False)
    return [{"name": p.name, "text": p.text} for p in specs if p.kind == "chat"]


def coder_patches(checkpoint: Path) -> list[dict[str, Any]]:
    """The coder's spec for real vLLM: its image by digest, bf16, and endpoint verification with
    the built-in chat prompts and deadlines that allow vLLM's start on a CPU."""
    verification = {
        "mode": "endpoint",
        "timeoutSeconds": JOB_TIMEOUT,
        "endpoint": {
            "runtimeImage": "registry.clef.test/clef-runtime:1.0",
            "builtinPrompts": "none",
            "prompts": builtin_chat_prompts(checkpoint),
            "maxNewTokens": MAX_NEW_TOKENS,
            "requestTimeoutSeconds": 600,
            "readyTimeoutSeconds": READY_TIMEOUT,
        },
    }
    ops = [
        {"op": "replace", "path": "/spec/image", "value": pinned_image()},
        {"op": "replace", "path": "/spec/dtype", "value": "bf16"},
        {"op": "replace", "path": "/spec/verification", "value": verification},
    ]
    return [{"target": {"kind": "ClefModel", "name": "coder"}, "patch": json.dumps(ops)}]
