#!/opt/clef/bin/python
"""`candle-vllm` in the real-node tier's engine image: the CPU runtime image plus this file, at
/opt/clef/bin/candle-vllm (conftest.py, `runtime_images`).  The operator renders candle-vllm's
command line for the preview and serving pods; this serves it with `clef-runtime serve --dialect
candle-vllm` on the CPU, in the pod, on the checkpoint the pod mounts.

It reads what decides what is served (weights, dtype, host, port), as the cluster tier's runner
reads an engine's argv (clef_devcluster.runner.engine); the GPU flags (--d,
--gpu-memory-fraction) mean nothing on a CPU.  A healthy engine runs the reference op set (fast
on a CPU); one whose image sets CLEF_RUNTIME_FAULT runs clef's Triton kernels (under Triton's
interpreter), which carry the fault, as the runner's faulty engines do.
"""

from __future__ import annotations

import os
import sys

SWITCHES = frozenset({"--disable-prefix-cache", "--disable-cuda-graph", "--log", "--cpu"})


def serve_argv(argv: list[str], faulty: bool) -> list[str]:
    flags: dict[str, str] = {}
    i = 0
    while i < len(argv):
        if argv[i] in SWITCHES or i + 1 == len(argv) or argv[i + 1].startswith("--"):
            flags[argv[i]] = ""
            i += 1
        else:
            flags[argv[i]] = argv[i + 1]
            i += 2
    weights = flags.get("--w") or flags.get("--weight-path")
    if not weights:
        raise SystemExit("candle-vllm: --w (the weights folder) is required")
    return [
        "clef-runtime", "serve", "--dialect", "candle-vllm",
        "--checkpoint", weights.rstrip("/") or "/",
        "--dtype", flags.get("--dtype") or "bf16",
        "--host", flags.get("--h") or "0.0.0.0",
        "--port", flags.get("--p") or "2000",
        "--device", "cpu",
        "--ops", "triton" if faulty else "reference",
    ]  # fmt: skip


if __name__ == "__main__":
    argv = serve_argv(sys.argv[1:], bool(os.environ.get("CLEF_RUNTIME_FAULT")))
    print("candle-vllm (clef's real-node engine image): " + " ".join(argv), flush=True)
    os.execvp(argv[0], argv)
