"""`clef-runtime goldens`: prove the kernels, then record what they answer.

1. The kernels suite of `verify` runs at the checkpoint's GDN shape and the goldens' dtype: goldens
   are made only by kernels that were just proven, or a broken image would bless its own bug.
   A failing check writes no file and exits 1.
2. The checkpoint (safetensors, config.json, tokenizer, chat template) is loaded on the chosen op
   set (``--ops triton``, the default and what the operator runs; ``reference`` for slow, plain
   PyTorch goldens, without the kernel proof, recorded as such).
3. Each prompt is run greedily, one at a time, recording the ids and every step's top-k.

Exit codes as verify's: 0 written, 1 a kernel check failed, 2 could not run.  A JSON summary
(durations, peak GPU memory, compared tokens) goes to stdout.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from clef_contract.command import ExitCode
from clef_contract.goldens import PROVENANCE_KEYS, STDOUT, GoldensReport, build_goldens_report
from clef_runtime import __version__
from clef_runtime.chat import GOLDENS, ChatError, ChatTokenizer, checkpoint_text_files, tokenizer_config
from clef_runtime.choices import OPSETS
from clef_runtime.dtypes import NAMES
from clef_runtime.goldens.prompts import (
    builtin_prompts,
    check_prompts,
    check_templates,
    parse_user_prompts,
    user_prompts,
)
from clef_runtime.goldens.schema import (
    GoldenPrompt,
    Goldens,
    GoldensError,
    PromptSpec,
    cache_key,
    goldens_bytes,
    prompt_set_digest,
    write_goldens,
)

if TYPE_CHECKING:
    from clef_runtime.model import HybridModel

_HASH_BLOCK = 16 * 1024 * 1024


@dataclass(frozen=True)
class GoldensArgs:
    checkpoint: str
    out: str
    dtype: str = "f16"
    device: str | None = None
    ops: str = "triton"
    top_k: int = 5
    prompts: str | None = None  # a user prompt file, added to the built-in set
    prompts_json: str | None = None  # the same, inline
    max_new_tokens: int | None = None  # caps every prompt's new tokens
    termination_log: str | None = None  # the compact goldens report (goldens-report/v1)
    builtin: bool = True
    long_prompt: bool = True  # the built-in ≥ 8192-token prompt
    kernel_sizes: str | None = None  # model | reduced; default: model on cuda, reduced on cpu
    seed: int = 0


class GoldensFailed(Exception):
    """The kernel checks failed: no goldens from these kernels."""


def checkpoint_digest(directory: str | Path) -> str:
    """sha256 over the config, tokenizer, template and generation config, the weight index and
    every weight file's bytes: two checkpoints with the same shapes but other weights differ."""
    from clef_runtime.model.weights import safetensors_files

    d = Path(directory)
    h = hashlib.sha256()
    files = [*checkpoint_text_files(d)]
    index = d / "model.safetensors.index.json"
    if index.is_file():
        files.append(index)
    files += safetensors_files(d)
    for f in files:
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as fh:
            while block := fh.read(_HASH_BLOCK):
                h.update(block)
    return "sha256:" + h.hexdigest()


def _specs(args: GoldensArgs, tok: ChatTokenizer) -> list[PromptSpec]:
    specs = builtin_prompts(tok, long=args.long_prompt) if args.builtin else []
    if args.prompts:
        specs += user_prompts(args.prompts, tok)
    if args.prompts_json:
        specs += parse_user_prompts(args.prompts_json, "--prompts-json", tok)
    if not specs:
        raise GoldensError("no prompts: pass --prompts FILE or keep the built-in set")
    if args.max_new_tokens is not None:
        if not 1 <= args.max_new_tokens <= 4096:
            raise GoldensError(f"--max-new-tokens {args.max_new_tokens} must be within [1, 4096]")
        specs = [replace(s, max_new_tokens=min(s.max_new_tokens, args.max_new_tokens)) for s in specs]
    return specs


def _prove_kernels(args: GoldensArgs, config: Any, device: Any) -> str:
    from clef_runtime.opset import get_opset
    from clef_runtime.verify import kernels as ksuite
    from clef_runtime.verify.report import Report

    sizes_name = args.kernel_sizes or ("model" if device.type == "cuda" else "reduced")
    sizes = {"model": ksuite.MODEL_SIZES, "reduced": ksuite.REDUCED_SIZES}[sizes_name]
    c = config
    heads = (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim)
    shape = ksuite.GdnShape(*heads, conv_width=c.linear_conv_kernel_dim)
    fast = get_opset("triton", qkv_split=shape.qkv_split)
    checks = ksuite.run_kernels_suite(
        fast, get_opset("reference"), shape, sizes, args.dtype, device, seed=args.seed
    )
    verdict = Report(
        suite="kernels", dtype=args.dtype, device=str(device), runtime_version=__version__, shapes=sizes_name
    )
    verdict.checks.extend(checks)
    failing = verdict.failing  # the most specific first: "key channel band [a, b) is zero"
    if failing:
        first = failing[0]
        raise GoldensFailed(
            f"kernel checks {len(checks) - len(failing)}/{len(checks)}: "
            f"{first.detail or first.name} (no goldens from kernels that fail their own checks)"
        )
    return f"{len(checks)}/{len(checks)} ({sizes_name} sizes)"


def _versions() -> tuple[str, str]:
    import torch

    try:
        import triton

        triton_version = str(triton.__version__)
    except ImportError:
        triton_version = "unavailable"
    return str(torch.__version__), triton_version


def make_goldens(args: GoldensArgs, summary: dict[str, Any]) -> Goldens:
    """Build the goldens (raising CannotRun, GoldensError, ChatError or GoldensFailed)."""
    from clef_runtime.verify.environment import check_device, resolve_placement

    _check_args(args)
    ckpt = Path(args.checkpoint)
    placement = resolve_placement(args.device, "model", None)  # settles TRITON_INTERPRET first

    import torch

    from clef_runtime.dtypes import torch_dtype
    from clef_runtime.model import HybridModel, ModelConfig
    from clef_runtime.opset import get_opset

    gpu_class = check_device(placement)
    device = torch.device(placement.device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    config = ModelConfig.from_json(ckpt)
    tok = ChatTokenizer.from_dir(ckpt, rendering=GOLDENS)
    check_templates(ckpt, tokenizer_config(ckpt))
    specs = _specs(args, tok)
    check_prompts(specs, config.vocab_size, config.max_position_embeddings)
    durations: dict[str, float] = {}
    summary["durations"] = durations

    t0 = time.perf_counter()
    kernel_checks = (
        _prove_kernels(args, config, device) if args.ops == "triton" else "not run (reference op set)"
    )
    durations["kernels"] = round(time.perf_counter() - t0, 3)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the suite's cached blocks: the model needs the room on a 16 GB card
    t0 = time.perf_counter()
    digest = checkpoint_digest(ckpt)
    durations["digest"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    opset = get_opset(args.ops, qkv_split=config.qkv_split)
    model = HybridModel.from_checkpoint(
        ckpt, config=config, opset=opset, dtype=torch_dtype(args.dtype), device=device
    )
    durations["load"] = round(time.perf_counter() - t0, 3)

    t0 = time.perf_counter()
    prompts, per_prompt = _generate(model, specs, tok, args.top_k)
    durations["generate"] = round(time.perf_counter() - t0, 3)
    summary["perPrompt"] = per_prompt
    summary["promptTokens"] = {s.name: len(s.prompt_ids) for s in specs}
    if device.type == "cuda":
        summary["peakGpuMemoryBytes"] = int(torch.cuda.max_memory_allocated())
    provenance = _provenance(args, digest, specs, gpu_class, kernel_checks)
    return Goldens(provenance, cache_key(provenance), tok.stop_ids, tuple(prompts))


def _check_args(args: GoldensArgs) -> None:
    from clef_runtime.verify.environment import CannotRun

    for flag, value, allowed in (("--dtype", args.dtype, NAMES), ("--ops", args.ops, OPSETS)):
        if value not in allowed:
            raise CannotRun(f"{flag} {value!r} is not one of {', '.join(allowed)}")
    if not 5 <= args.top_k <= 20:
        raise CannotRun(f"--top-k {args.top_k} must be within [5, 20]")
    if not (Path(args.checkpoint) / "config.json").is_file():
        raise CannotRun(f"--checkpoint {args.checkpoint}: no config.json there")


def _generate(
    model: HybridModel, specs: list[PromptSpec], tok: ChatTokenizer, top_k: int
) -> tuple[list[GoldenPrompt], dict[str, float]]:
    """Every prompt's greedy continuation with its top-k, and the seconds each took."""
    from clef_runtime.generation import greedy

    prompts, seconds = [], {}
    for spec in specs:
        started = time.perf_counter()
        gen = greedy(model, spec.prompt_ids, spec.max_new_tokens, top_k=top_k, stop_ids=tok.stop_ids)
        seconds[spec.name] = round(time.perf_counter() - started, 3)
        prompts.append(
            GoldenPrompt(
                spec=spec,
                ids=tuple(gen.ids),
                logprobs=tuple(gen.logprobs),
                top_ids=tuple(tuple(t) for t in gen.top_ids),
                top_logprobs=tuple(tuple(t) for t in gen.top_logprobs),
                top_pieces=tuple(tuple(tok.piece(i) for i in top) for top in gen.top_ids),
                finish_reason=gen.finish_reason,
            )
        )
    return prompts, seconds


def _provenance(
    args: GoldensArgs, digest: str, specs: list[PromptSpec], gpu_class: str, kernel_checks: str
) -> dict[str, Any]:
    torch_version, triton_version = _versions()
    return {
        "checkpointDigest": digest,
        "dtype": args.dtype,
        "runtimeVersion": __version__,
        "promptSetDigest": prompt_set_digest(specs),
        "gpuClass": gpu_class,
        "opSet": args.ops,
        "kernelChecks": kernel_checks,
        "topK": args.top_k,
        "createdAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "torch": torch_version,
        "triton": triton_version,
    }


def run_goldens(args: GoldensArgs, out: TextIO = sys.stdout) -> int:
    from clef_runtime.faults import UnknownFaultError
    from clef_runtime.model import ConfigError, WeightsError
    from clef_runtime.verify.environment import CannotRun

    summary: dict[str, Any] = {"checkpoint": args.checkpoint, "dtype": args.dtype, "ops": args.ops}
    started = time.perf_counter()
    goldens: Goldens | None = None
    data = b""
    try:
        goldens = make_goldens(args, summary)
        data = goldens_bytes(goldens)
        if args.out != STDOUT:
            write_goldens(goldens, args.out)
        summary["bytes"] = len(data)
        summary["sha256"] = "sha256:" + hashlib.sha256(data).hexdigest()
        summary["comparedTokens"] = goldens.compared_tokens
        summary["provenance"] = goldens.provenance
        code = ExitCode.PASS
    except GoldensFailed as exc:
        summary["error"] = str(exc)
        code = ExitCode.MISMATCH
    except (CannotRun, GoldensError, ChatError, ConfigError, WeightsError, UnknownFaultError, OSError) as exc:
        summary["error"] = str(exc)
        code = ExitCode.COULD_NOT_RUN
    summary.setdefault("durations", {})["total"] = round(time.perf_counter() - started, 3)
    summary["exitCode"] = int(code)
    if args.out == STDOUT:
        # The file alone on stdout, last and in one write: the operator finds it in the pod's log
        # by its sha256 (stderr, which a log interleaves, carries the summary).
        print(json.dumps(summary, indent=2), file=sys.stderr, flush=True)
        if code == ExitCode.PASS:
            out.buffer.write(data) if hasattr(out, "buffer") else out.write(data.decode())
            out.flush()
    else:
        out.write(json.dumps(summary, indent=2) + "\n")
    if args.termination_log:
        _write_report(args.termination_log, _compact(code, summary, goldens, data))
    where = "stdout" if args.out == STDOUT else args.out
    verdict = f"wrote {where}" if code == ExitCode.PASS else f"no goldens: {summary['error']}"
    print(f"goldens: {verdict}", file=sys.stderr)
    return int(code)


def _compact(code: int, summary: dict[str, Any], goldens: Goldens | None, data: bytes) -> GoldensReport:
    verdict = {ExitCode.PASS: "pass", ExitCode.MISMATCH: "fail"}.get(ExitCode(code), "error")
    if goldens is None or code != ExitCode.PASS:
        error = str(summary.get("error", "")) or "no goldens"
        return GoldensReport(verdict, error if verdict == "fail" else "", "", 0, "", {}, 0, 0, 0, error)
    prov = goldens.provenance
    return GoldensReport(
        verdict="pass",
        summary=f"{len(goldens.prompts)} prompts, {goldens.compared_tokens} tokens, kernel checks {prov['kernelChecks']}",
        sha256=summary["sha256"],
        bytes=len(data),
        cache_key=goldens.cache_key,
        provenance={k: str(prov.get(k, "")) for k in PROVENANCE_KEYS},
        top_k=goldens.top_k,
        prompts=len(goldens.prompts),
        tokens=goldens.compared_tokens,
    )


def _write_report(path: str, report: GoldensReport) -> None:
    try:
        Path(path).write_text(build_goldens_report(report))
    except OSError as exc:
        print(f"goldens: cannot write the compact report to {path}: {exc}", file=sys.stderr)
