"""Endpoint verification at clef-flash's size: goldens, serve, endpoint-check; time, memory.

Endpoint verification at clef-flash's size on one GPU: goldens, then `clef-runtime serve`, then
`endpoint-check` against it; wall time and peak GPU memory of each (docs/verification.md,
"Endpoint verification").

The checkpoint is generated here, on the GPU, into /tmp: clef-flash's shapes (32 layers, 24 GDN
with 16 key / 32 value heads of 128, 8 attention, hidden 2560, vocabulary 248320) with an untied
head and the MLP width chosen so the f16 weights are 9.4 GiB (the homelab overlay's size), random
weights by `clef_runtime.model.checkpoint`'s rules, and the test fixture's tokenizer and template.

    PYTHONPATH=operator:runtime:contract:. python3 bench/measure_endpoint.py   # writes $OUT
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "runtime"))

from chat_checkpoint import write_chat_files  # noqa: E402

from clef_runtime.model import expected_tensors, preset  # noqa: E402
from clef_runtime.model.checkpoint import _generator, _init  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/measure-out"))
CKPT = Path("/tmp/clef-flash-sized")
TARGET_BYTES = 9.4 * 2**30
RESULTS: dict[str, Any] = {}
started = time.monotonic()


def save() -> None:
    (OUT / "endpoint-h200.json").write_text(json.dumps(RESULTS, indent=2) + "\n")


class GpuMemory:
    """Samples nvidia-smi's used memory (whole device: context, allocator cache) per phase."""

    def __init__(self) -> None:
        self.phase = "idle"
        self.peaks: dict[str, int] = {}
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
            ).stdout
            if out.strip():
                mib = int(out.split()[0])
                self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), mib)
            time.sleep(0.2)


def config_for_size() -> Any:
    base = preset("clef-flash").replace(tie_word_embeddings=False)

    def n_bytes(c: Any) -> int:
        return 2 * sum(int(torch.Size(e.shape).numel()) for e in expected_tensors(c).values())

    per_unit = n_bytes(base.replace(intermediate_size=2)) - n_bytes(base.replace(intermediate_size=1))
    width = base.intermediate_size + int((TARGET_BYTES - n_bytes(base)) / per_unit)
    return base.replace(intermediate_size=width // 128 * 128)


def make_checkpoint() -> None:
    t0 = time.monotonic()
    vocab_used = write_chat_files(CKPT, 4096)
    config = config_for_size()
    tensors = {}
    torch.set_default_device("cuda")
    for name, e in expected_tensors(config).items():
        gen = torch.Generator(device="cuda").manual_seed(_generator(0, name).initial_seed())
        tensors[name] = _init(name, e.shape, gen, config).to(torch.float16).cpu()
    torch.set_default_device("cpu")
    save_file(tensors, str(CKPT / "model.safetensors"), metadata={"format": "pt"})
    (CKPT / "config.json").write_text(json.dumps(config.to_hf_dict() | {"dtype": "float16"}))
    RESULTS["checkpoint"] = {
        "weightsBytes": sum(t.numel() * 2 for t in tensors.values()),
        "intermediateSize": config.intermediate_size,
        "hiddenSize": config.hidden_size,
        "layers": config.num_hidden_layers,
        "vocab": config.vocab_size,
        "tokenizerVocabUsed": vocab_used,
        "seconds": round(time.monotonic() - t0, 1),
    }
    save()


def cli(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clef_runtime", *args], capture_output=True, text=True, timeout=timeout
    )


def serve(dtype: str, dialect: str) -> tuple[subprocess.Popen, str]:
    ready = Path(f"/tmp/ready-{dtype}-{dialect}")
    ready.unlink(missing_ok=True)
    log = (OUT / f"serve-{dtype}-{dialect}.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "clef_runtime", "serve", "--checkpoint", str(CKPT), "--dtype", dtype,
         "--dialect", dialect, "--host", "127.0.0.1", "--port", "0", "--ready-file", str(ready)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    while not (ready.is_file() and ready.read_text().strip()):
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited {proc.returncode}")
        time.sleep(0.2)
    return proc, f"http://127.0.0.1:{int(ready.read_text())}"


def check(key: str, url: str, dialect: str, goldens: Path, mem: GpuMemory) -> None:
    mem.phase = key
    t0 = time.monotonic()
    proc = cli("endpoint-check", "--goldens", str(goldens), "--url", url, "--dialect", dialect,
               "--termination-log", str(OUT / f"{key}.compact.json"), "--report", str(OUT / f"{key}.json"),
               timeout=300)  # fmt: skip
    full = json.loads((OUT / f"{key}.json").read_text())
    RESULTS[key] = {
        "exitCode": proc.returncode,
        "wallSeconds": round(time.monotonic() - t0, 1),
        "summary": full["summary"],
        "logprobStats": full["logprobStats"],
        "perPromptSeconds": full["durations"],
        "divergences": [p["divergence"] | {"prompt": p["name"]} for p in full["prompts"] if p["divergence"]],
        "peakDeviceMiB": mem.peaks.get(key),
    }
    save()


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    RESULTS.update(
        date=time.strftime("%Y-%m-%d"),
        gpu=torch.cuda.get_device_name(0),
        torch=torch.__version__,
        triton=__import__("triton").__version__,
    )
    mem = GpuMemory()
    mem.phase = "generate checkpoint"
    make_checkpoint()
    goldens = OUT / "goldens-f16.json"
    mem.phase = "goldens"
    t0 = time.monotonic()
    proc = cli("goldens", "--checkpoint", str(CKPT), "--out", str(goldens), "--dtype", "f16", timeout=300)
    (OUT / "goldens.log").write_text(proc.stdout + proc.stderr)
    RESULTS["goldens"] = json.loads(proc.stdout) | {
        "wallSeconds": round(time.monotonic() - t0, 1),
        "peakDeviceMiB": mem.peaks.get("goldens"),
    }
    save()
    if proc.returncode != 0:
        return
    for dtype, dialect, client in (
        ("f16", "openai", "clef"),
        ("f16", "candle-vllm", "candle-vllm"),
        ("bf16", "openai", "clef"),
    ):
        if time.monotonic() - started > 330:
            RESULTS.setdefault("skipped", []).append(f"{dtype} {dialect}: out of time")
            break
        mem.phase = f"serve {dtype} {dialect} start"
        server, url = serve(dtype, dialect)
        try:
            check(f"check-{client}-serve-{dtype}", url, client, goldens, mem)
        finally:
            server.terminate()
            server.wait(60)
    RESULTS["peakDeviceMiB"] = mem.peaks
    RESULTS["totalSeconds"] = round(time.monotonic() - started, 1)
    save()


if __name__ == "__main__":
    main()
