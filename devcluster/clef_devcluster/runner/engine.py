"""A serve image's engine command, translated into the stand-in that really serves.

The local cluster has no candle-vllm, vLLM or mistral.rs binary (and no GPU): a pod whose image is a `serve`
entry of the image table runs `clef-runtime serve` instead, in the entry's HTTP dialect, on the
checkpoint the engine was pointed at, bound to the pod's own address.  Only what decides what is
served is read from the engine's argv (weights, port, dtype, model name, chat template); flags
about GPUs, memory and parallelism mean nothing on the CPU and are listed as ignored.  Pure but for
reading the checkpoint's config.json: the worker supplies the pod IP and the volume mapping.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..images import ImageEntry

# The engines' own defaults (candle-vllm's --p, vLLM's --port, mistral.rs's --port).
DEFAULT_PORT = {"candle-vllm": 2000, "vllm": 8000, "mistralrs": 1234, "openai": 8000}
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
# mistral.rs 0.8.1 (mistralrs-cli's src/args): its switches, its short flags' long names, the flags
# that may be given more than once (clap refuses any other flag given twice), and the model types
# `serve` takes as a subcommand that load Qwen3.5 (only as the image-and-text model).
_MISTRALRS_SWITCHES = frozenset({"--cpu", "--no-kv-cache", "--ui", "--enable-search"})
_MISTRALRS_SHORT = {"-m": "--model-id", "-p": "--port", "-t": "--tokenizer", "-a": "--arch", "-n": "--device-layers",
                    "-f": "--quantized-file", "-l": "--log", "-c": "--chat-template", "-j": "--jinja-explicit"}  # fmt: skip
_MISTRALRS_REPEATABLE = frozenset({"--device-layers"})
_MISTRALRS_MODEL_TYPES = ("auto", "multimodal")
# What mistral.rs's `--dtype auto` is on a CPU: the first of bf16, f16 that candle computes in.
_MISTRALRS_AUTO_DTYPE = "bf16"


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
    if dialect == "mistralrs":
        return _mistralrs(argv[1:], entry, pod_ip, host_path)
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


def _mistralrs(
    args: list[str], entry: ImageEntry, pod_ip: str, host_path: Callable[[str], str]
) -> EngineCommand:
    """`mistralrs serve [auto|multimodal] -m <dir> ...` (mistral.rs 0.8.1).  It serves the model
    as `default` (the first id of its /v1/models), and loads Qwen3.5 only in the image-and-text
    layout, so a text-only checkpoint is refused here as the real engine refuses it."""
    if not args or args[0] != "serve":
        raise EngineArgvError("mistralrs: only `mistralrs serve ...` is served")
    named = [
        _MISTRALRS_SHORT.get(a.partition("=")[0], a.partition("=")[0]) for a in args[1:] if a.startswith("-")
    ]
    repeated = sorted({n for n in named if named.count(n) > 1} - _MISTRALRS_REPEATABLE)
    if repeated:
        raise EngineArgvError(f"the argument '{repeated[0]}' cannot be used multiple times")
    flags, positionals = parse_flags(args[1:], _MISTRALRS_SWITCHES)
    flags = {_MISTRALRS_SHORT.get(k, k): v for k, v in flags.items()}
    if positionals and positionals[0] in _MISTRALRS_MODEL_TYPES:
        positionals.pop(0)
    elif positionals:
        raise EngineArgvError(
            f"mistralrs serve: model type {positionals[0]!r}: Qwen3.5 loads only as {' or '.join(_MISTRALRS_MODEL_TYPES)}"
        )
    model = _pick(flags, "--model-id")
    if not model:
        raise EngineArgvError("mistralrs serve: -m/--model-id (the model directory) is required")
    checkpoint = host_path(model)
    _require_image_text_layout(checkpoint)
    port = _port(_pick(flags, "--port"), "mistralrs")
    _pick(flags, "--host")
    dtype = (_pick(flags, "--dtype") or "auto").lower()
    if dtype not in ("auto", "bf16", "f16", "f32"):
        raise EngineArgvError(f"--dtype: Model DType `{dtype}` is not supported (auto, bf16, f16, f32)")
    argv = _serve_argv(entry, checkpoint, pod_ip, port, _MISTRALRS_AUTO_DTYPE if dtype == "auto" else dtype)
    argv += ["--model-name", "default"]
    template = _pick(flags, "--jinja-explicit") or _pick(flags, "--chat-template")
    if template and template.endswith(".json"):
        raise EngineArgvError(
            f"mistralrs serve: chat template {template}: the stand-in serves a Jinja file only"
        )
    if template:
        argv += ["--chat-template", host_path(template)]
    return EngineCommand(argv, port, _ignored(flags, positionals))


def _require_image_text_layout(checkpoint: str) -> None:
    """mistral.rs 0.8.1 knows Qwen3.5 only as `Qwen3_5ForConditionalGeneration` (a text_config and
    a vision_config); clef_devcluster.checkpoints.write_image_text_layout writes one."""
    try:
        config = json.loads((Path(checkpoint) / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise EngineArgvError(f"mistralrs serve: {checkpoint}/config.json: {e}") from None
    if not (isinstance(config, dict) and "text_config" in config and "vision_config" in config):
        raise EngineArgvError(
            f"mistralrs serve: {checkpoint} is not in Qwen3.5's image-and-text layout"
            " (Qwen3_5ForConditionalGeneration: text_config and vision_config), the only Qwen3.5 mistral.rs 0.8.1 loads"
        )


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
