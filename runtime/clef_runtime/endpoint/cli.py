"""The command lines of `goldens`, `serve` and `endpoint-check` (argparse only: nothing here imports
torch, so `endpoint-check` starts on a CPU-only host without it)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any, TypeVar

from clef_contract.command import DTYPES, FAULT_ENV, TERMINATION_LOG, TERMINATION_LOG_ENV
from clef_contract.endpoint import (
    DIALECTS,
    ENDPOINT_DIALECT_ENV,
    ENDPOINT_URL_ENV,
    GOLDENS_ENV,
    GOLDENS_SHA256_ENV,
)
from clef_runtime.choices import SERVE_DIALECTS

T = TypeVar("T")
ENDPOINT_COMMANDS = ("goldens", "serve", "endpoint-check")


_TEXTS = {
    "goldens": (
        "prove the kernels, then record greedy answers to a prompt set (exit 0 written, 1, 2)",
        "Runs the kernels suite at the checkpoint's GDN shape, then the checkpoint greedily "
        "on the prompt set, recording ids and top-k logprobs with their provenance.",
    ),
    "serve": (
        "an OpenAI-compatible server on the bundled runtime (one request at a time)",
        "Serves /v1/models, /health, /v1/completions and /v1/chat/completions with greedy "
        "decoding on clef's kernels.  SIGTERM finishes the request in flight, then exits.",
    ),
    "endpoint-check": (
        "ask a serving engine the goldens' prompts and judge its answers (exit 0 pass, 1 mismatch, 2 could not run)",
        "Sends each golden prompt, greedily and one at a time, and applies the divergence rule "
        "(docs/verification.md, 'Endpoint verification').  Full JSON report on stdout (or --report), "
        "compact report (≤ 4 KiB) to the termination log.",
    ),
}


def _command(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    summary, description = _TEXTS[name]
    parser: argparse.ArgumentParser = sub.add_parser(name, help=summary, description=description)
    return parser


def _model_flags(p: argparse.ArgumentParser) -> None:
    """The flags of the commands that load a checkpoint (goldens, serve)."""
    p.add_argument(
        "--checkpoint", required=True, help="config.json, safetensors, tokenizer.json, chat template"
    )
    p.add_argument("--dtype", default="f16", help=f"{' | '.join(DTYPES)} (default: f16)")
    p.add_argument("--device", help="cuda | cpu (default: cuda)")
    p.add_argument("--ops", default="triton", help="triton (default; goldens prove it first) | reference")


def _goldens_parser(sub: argparse._SubParsersAction) -> None:
    p = _command(sub, "goldens")
    _model_flags(p)
    p.add_argument("--out", required=True, help="the goldens file to write; - prints it to stdout (one line)")
    p.add_argument("--prompts-json", help="prompts as --prompts takes them, inline (the operator's Job)")
    p.add_argument("--max-new-tokens", type=int, help="caps every prompt's new tokens (1-4096)")
    p.add_argument(
        "--termination-log",
        default=os.environ.get(TERMINATION_LOG_ENV),
        help=f"write the compact goldens report here (default: ${TERMINATION_LOG_ENV}; none when unset)",
    )
    p.add_argument("--top-k", type=int, default=5, help="candidates recorded per step (5-20, default 5)")
    p.add_argument("--prompts", help="a JSON prompt file added to the built-in set")
    p.add_argument("--no-builtin", action="store_true", help="only the prompts of --prompts")
    p.add_argument("--no-long", action="store_true", help="leave out the built-in ≥ 8192-token prompt")
    p.add_argument("--kernel-sizes", help="model | reduced (default: model on cuda, reduced on cpu)")
    p.add_argument("--seed", type=int, default=0, help="seed of the kernel checks' inputs")


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = _command(sub, "serve")
    _model_flags(p)
    p.add_argument("--dialect", default="openai", help=f"{' | '.join(SERVE_DIALECTS)} (default: openai)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model-name", help="the model id served (default: the checkpoint directory's name)")
    p.add_argument("--chat-template", help="a Jinja file replacing the checkpoint's chat template")
    p.add_argument("--max-prompt-tokens", type=int, default=32768)
    p.add_argument("--max-new-tokens", type=int, default=4096, help="the most a request may ask for")
    p.add_argument("--max-request-bytes", type=int, default=4 * 1024 * 1024)
    p.add_argument("--ready-file", help="write the bound port here once serving (for scripts and tests)")
    p.add_argument(
        "--fault-after",
        type=int,
        help="answer the first N generation requests with --ops reference, the rest with the Triton op set"
        f" carrying the fault named by {FAULT_ENV} (an engine that goes bad while it serves)",
    )


def _check_parser(sub: argparse._SubParsersAction) -> None:
    p = _command(sub, "endpoint-check")
    p.add_argument(
        "--goldens", default=os.environ.get(GOLDENS_ENV), help=f"goldens file (default: ${GOLDENS_ENV})"
    )
    p.add_argument(
        "--goldens-sha256",
        default=os.environ.get(GOLDENS_SHA256_ENV),
        help="sha256:<hex> the goldens (uncompressed) must hash to, or exit 2 before asking anything"
        f" (default: ${GOLDENS_SHA256_ENV}; the operator's Job always sets it)",
    )
    p.add_argument(
        "--url",
        default=os.environ.get(ENDPOINT_URL_ENV),
        help=f"engine base URL (default: ${ENDPOINT_URL_ENV})",
    )
    p.add_argument(
        "--dialect",
        default=os.environ.get(ENDPOINT_DIALECT_ENV),
        help=f"{' | '.join(DIALECTS)} (default: ${ENDPOINT_DIALECT_ENV})",
    )
    p.add_argument("--model", help="the model id to ask for (default: the first of GET /v1/models)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default 600)")
    p.add_argument("--near-tie-margin", type=float, default=None, help="nats (default: docs/verification.md)")
    p.add_argument(
        "--max-near-ties", type=int, default=None, help="default: a quarter of the prompts, at least 1"
    )
    p.add_argument("--prompt", action="append", default=[], help="only this golden prompt (repeatable)")
    p.add_argument(
        "--sample", type=int, help="ask only this many prompts (a probe of a serving pod; default: all)"
    )
    p.add_argument(
        "--sample-round",
        type=int,
        default=0,
        help="with --sample: which group of the prompts the dialect can ask, in file order and wrapping"
        " (default 0)",
    )
    p.add_argument("--report", help="write the full JSON report here instead of stdout")
    p.add_argument(
        "--termination-log",
        help=f"compact report path (default: ${TERMINATION_LOG_ENV} or {TERMINATION_LOG})",
    )


def add_endpoint_parsers(sub: argparse._SubParsersAction) -> None:
    _goldens_parser(sub)
    _serve_parser(sub)
    _check_parser(sub)


def endpoint_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="clef-runtime", description="clef's GDN runtime")
    add_endpoint_parsers(parser.add_subparsers(dest="command", required=True))
    return run_endpoint_command(parser.parse_args(argv))


def _from_args(cls: type[T], args: argparse.Namespace, **extra: Any) -> T:
    """The command's dataclass from the parsed flags of the same names (and `extra`)."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}  # type: ignore[arg-type]
    return cls(**(given | extra))


def run_endpoint_command(args: argparse.Namespace) -> int:
    if args.command == "goldens":
        from clef_runtime.goldens.make import GoldensArgs, run_goldens

        return run_goldens(
            _from_args(GoldensArgs, args, builtin=not args.no_builtin, long_prompt=not args.no_long)
        )
    if args.command == "serve":
        from clef_runtime.serve.command import ServeArgs, run_serve

        return run_serve(_from_args(ServeArgs, args))
    from clef_runtime.endpoint.check import CheckArgs, run_check

    log = args.termination_log or os.environ.get(TERMINATION_LOG_ENV) or TERMINATION_LOG
    return run_check(_from_args(CheckArgs, args, termination_log=log, only=tuple(args.prompt)))
