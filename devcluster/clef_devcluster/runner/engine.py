"""A serve image's engine command, translated into the stand-in that really serves.

The local cluster has no candle-vllm or vLLM binary (and no GPU): a pod whose image is a `serve`
entry of the image table runs `clef-runtime serve` instead, in the entry's HTTP dialect, on the
checkpoint the engine was pointed at, bound to the pod's own address.  Only what decides what is
served is read from the engine's argv (weights, port, dtype, model name, chat template); flags
about GPUs, memory and parallelism mean nothing on the CPU and are listed as ignored.  Pure: the
worker supplies the pod IP and the volume mapping.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..images import ImageEntry

# The engines' own defaults (candle-vllm's --p, vLLM's --port).
DEFAULT_PORT = {"candle-vllm": 2000, "vllm": 8000, "openai": 8000}
# dtype spellings -> clef-runtime's.
DTYPES = {
    "f16": "f16",
    "float16": "f16",
    "half": "f16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "f32": "f32",
    "float32": "f32",
    "float": "f32",
}
# vLLM flags that take no value (so that the word after one is not read as its value).
_VLLM_SWITCHES = frozenset(
    {
        "--enforce-eager",
        "--trust-remote-code",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--disable-log-requests",
        "--disable-log-stats",
        "--enable-chunked-prefill",
        "--no-enable-chunked-prefill",
    }
)
_CANDLE_SWITCHES = frozenset({"--disable-prefix-cache", "--disable-cuda-graph", "--log", "--cpu"})


class EngineArgvError(ValueError):
    """The engine's argv cannot be served: what a real engine prints before exiting 2."""


@dataclass(frozen=True)
class EngineCommand:
    argv: list[str]
    port: int
    ignored: list[str]
    # What the engine needs in its environment (a real engine's; the stand-in needs nothing).
    env: dict[str, str] = field(default_factory=dict)


def parse_flags(args: list[str], switches: frozenset[str] = frozenset()) -> tuple[dict[str, str], list[str]]:
    """`--flag value`, `--flag=value` and switches (no value) -> ({flag: value}, positionals).
    A flag followed by another flag, or at the end, is a switch (value "")."""
    flags: dict[str, str] = {}
    positionals: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--") and "=" in arg:
            name, _, value = arg.partition("=")
            flags[name] = value
        elif (
            arg.startswith("-")
            and arg not in switches
            and i + 1 < len(args)
            and not args[i + 1].startswith("-")
        ):
            flags[arg] = args[i + 1]
            i += 1
        elif arg.startswith("-"):
            flags[arg] = ""
        else:
            positionals.append(arg)
        i += 1
    return flags, positionals


def _pick(flags: dict[str, str], *names: str) -> str | None:
    for name in names:
        if name in flags:
            return flags.pop(name)
    return None


def _dtype(value: str | None, checkpoint: str) -> str:
    if value is None or value == "auto":
        # vLLM's `auto`: the checkpoint's own dtype (config.json), as vLLM reads it.
        try:
            config = json.loads((Path(checkpoint) / "config.json").read_text())
            value = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
        except (OSError, ValueError):
            value = "bfloat16"
    if value not in DTYPES:
        raise EngineArgvError(f"--dtype {value!r} is not one of {', '.join(sorted(DTYPES))}")
    return DTYPES[value]


def _port(value: str | None, dialect: str) -> int:
    if value is None:
        return DEFAULT_PORT[dialect]
    try:
        port = int(value)
    except ValueError:
        raise EngineArgvError(f"port {value!r} is not a number") from None
    if not 0 < port < 65536:
        raise EngineArgvError(f"port {port} is out of range")
    return port


def _ignored(flags: dict[str, str], positionals: list[str]) -> list[str]:
    return [f"{k}={v}" if v else k for k, v in flags.items()] + positionals


def translate(
    argv: list[str], entry: ImageEntry, pod_ip: str, host_path: Callable[[str], str]
) -> EngineCommand:
    """The serve image's engine argv -> `clef-runtime serve ...` on `pod_ip`.

    `host_path` maps a path inside the container to this host's (the pod's volumes)."""
    dialect = entry.dialect or "openai"
    binary = Path(argv[0]).name if argv else ""
    if binary != entry.engine_binary:
        raise EngineArgvError(f"{binary!r} is not the engine of this image ({entry.engine_binary})")
    if dialect == "candle-vllm":
        return _candle_vllm(argv[1:], entry, pod_ip, host_path)
    if dialect == "vllm":
        return _vllm(argv[1:], entry, pod_ip, host_path)
    return _clef(argv[1:], entry, pod_ip, host_path)


def _serve_argv(entry: ImageEntry, checkpoint: str, pod_ip: str, port: int, dtype: str) -> list[str]:
    argv = [
        "clef-runtime",
        "serve",
        "--dialect",
        entry.dialect or "openai",
        "--checkpoint",
        checkpoint,
        "--host",
        pod_ip,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--ops",
        entry.engine_ops,
        "--device",
        "cpu",
    ]
    return argv + _fault_after(entry)


def _fault_after(entry: ImageEntry) -> list[str]:
    """An engine that goes bad while it serves (`faultAfter` in its entry)."""
    return [] if entry.fault_after is None else ["--fault-after", str(entry.fault_after)]


def _candle_vllm(
    args: list[str], entry: ImageEntry, pod_ip: str, host_path: Callable[[str], str]
) -> EngineCommand:
    flags, positionals = parse_flags(args, _CANDLE_SWITCHES)
    weights = _pick(flags, "--w", "--weight-path")
    if not weights:
        raise EngineArgvError("candle-vllm: --w (the weights folder) is required")
    checkpoint = host_path(weights.rstrip("/") or "/")
    port = _port(_pick(flags, "--p", "--port"), "candle-vllm")
    _pick(flags, "--h", "--host")  # the pod's address, whatever it asked to bind
    dtype = _dtype(_pick(flags, "--dtype") or "bf16", checkpoint)
    argv = _serve_argv(entry, checkpoint, pod_ip, port, dtype)
    model = _pick(flags, "--m", "--model-id")
    if model:
        argv += ["--model-name", model]
    return EngineCommand(argv, port, _ignored(flags, positionals))


def _vllm(args: list[str], entry: ImageEntry, pod_ip: str, host_path: Callable[[str], str]) -> EngineCommand:
    if not args or args[0] != "serve":
        raise EngineArgvError("vllm: only `vllm serve <model> ...` is served")
    flags, positionals = parse_flags(args[1:], _VLLM_SWITCHES)
    model = _pick(flags, "--model") or (positionals.pop(0) if positionals else None)
    if not model:
        raise EngineArgvError("vllm serve: the model (a path) is required")
    checkpoint = host_path(model)
    port = _port(_pick(flags, "--port"), "vllm")
    _pick(flags, "--host")
    dtype = _dtype(_pick(flags, "--dtype"), checkpoint)
    argv = _serve_argv(entry, checkpoint, pod_ip, port, dtype)
    # vLLM serves the model under the path it was given unless told a name.
    names = _pick(flags, "--served-model-name")
    argv += ["--model-name", (names.split()[0] if names else model)]
    template = _pick(flags, "--chat-template")
    if template:
        argv += ["--chat-template", host_path(template)]
    return EngineCommand(argv, port, _ignored(flags, positionals))


def _clef(args: list[str], entry: ImageEntry, pod_ip: str, host_path: Callable[[str], str]) -> EngineCommand:
    """engine `clef`: `clef-runtime serve ...` is the engine itself; only its address and paths move."""
    if not args or args[0] != "serve":
        raise EngineArgvError("clef-runtime: only `clef-runtime serve ...` is served")
    flags, positionals = parse_flags(args[1:])
    checkpoint = _pick(flags, "--checkpoint")
    if not checkpoint:
        raise EngineArgvError("clef-runtime serve: --checkpoint is required")
    port = _port(_pick(flags, "--port"), "openai")
    _pick(flags, "--host")
    argv = [
        "clef-runtime",
        "serve",
        "--checkpoint",
        host_path(checkpoint),
        "--host",
        pod_ip,
        "--port",
        str(port),
    ]
    flags.setdefault("--dialect", entry.dialect or "openai")
    if "--chat-template" in flags:
        flags["--chat-template"] = host_path(flags["--chat-template"])
    for name, value in flags.items():
        argv += [name, value] if value else [name]
    return EngineCommand(argv + _fault_after(entry) + positionals, port, [])


def is_engine_command(argv: list[str], entry: ImageEntry) -> bool:
    """Whether a serve image's container runs its engine (served by the stand-in) rather than
    another program of the image (clef-runtime verify, python: run as a `good` image runs them)."""
    if entry.kind != "serve" or not argv or Path(argv[0]).name != entry.engine_binary:
        return False
    return entry.dialect != "openai" or argv[1:2] == ["serve"]


# How a serve image's engine fails, when its entry says it does (`failure`): the process a
# real engine would be, minus the engine.
_CRASH = (
    "import sys, time\n"
    "print('{binary}: loading weights from {checkpoint}', flush=True)\n"
    "time.sleep(1)\n"
    "sys.exit(\"thread 'main' panicked: DriverError(CUDA_ERROR_ILLEGAL_ADDRESS, \\\"an illegal memory "
    'access was encountered\\") (clef local cluster: image kind serve, failure crash)")\n'
)
_NEVER_READY = (
    "import time\n"
    "print('{binary}: loading weights from {checkpoint} (clef local cluster: failure never-ready: "
    "this engine never answers)', flush=True)\n"
    "time.sleep(10**9)\n"
)


def failing_argv(entry: ImageEntry, command: EngineCommand) -> list[str]:
    """The stand-in for an engine whose entry says `failure`: crash exits 1 a second after start
    (a panic on stderr), never-ready runs and never listens."""
    checkpoint = command.argv[command.argv.index("--checkpoint") + 1]
    script = _CRASH if entry.failure == "crash" else _NEVER_READY
    return ["python", "-c", script.format(binary=entry.engine_binary, checkpoint=checkpoint)]
