"""`clef-runtime serve`: load a checkpoint on the chosen op set and serve it until SIGTERM.

The op set is built once, at start, with the fault named by ``CLEF_RUNTIME_FAULT`` (the runtime's
fault catalogue), so a serving engine can be made wrong the way the incident's was.  With
``--fault-after N`` the first N generation requests are answered by the ``--ops reference`` set
and every later one by the Triton op set carrying that fault: an engine (or a GPU) that goes bad
while it serves, after it passed its verification.  ``/health`` counts the generation requests
answered (``requests``), so a test can tell which pod was asked what.  SIGTERM and
SIGINT stop accepting requests, let the one in flight finish, and exit 0.

``--dialect candle-vllm`` behaves as candle-vllm does where that changes ids (its source at
36fe5d9; `clef_runtime.chat.CANDLE_VLLM`): message content trimmed, tokenizer_config.json's
template first, special tokens added when encoding, config.json's eos ids with the tokenizer's eos
token as the stop set, ``max_tokens + 1`` tokens returned, the reply's content trimmed, thinking
on unless the request turns it off.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from clef_contract.command import FAULT_ENV, ExitCode
from clef_runtime.choices import OPSETS
from clef_runtime.choices import SERVE_DIALECTS as DIALECTS
from clef_runtime.dtypes import NAMES

if TYPE_CHECKING:
    from clef_runtime.model import HybridModel
    from clef_runtime.serve.http import ClefHTTPServer


@dataclass(frozen=True)
class ServeArgs:
    checkpoint: str
    dtype: str = "f16"
    device: str | None = None
    ops: str = "triton"
    dialect: str = "openai"
    host: str = "0.0.0.0"
    port: int = 8000
    model_name: str | None = None
    chat_template: str | None = None
    max_prompt_tokens: int = 32768
    max_new_tokens: int = 4096
    max_request_bytes: int = 4 * 1024 * 1024
    ready_file: str | None = None
    fault_after: int | None = None


def _check(args: ServeArgs) -> str | None:
    for flag, value, allowed in (
        ("--dialect", args.dialect, DIALECTS),
        ("--ops", args.ops, OPSETS),
        ("--dtype", args.dtype, NAMES),
    ):
        if value not in allowed:
            return f"{flag} {value!r} is not one of {', '.join(allowed)}"
    if min(args.max_prompt_tokens, args.max_new_tokens, args.max_request_bytes) < 1:
        return "--max-prompt-tokens, --max-new-tokens and --max-request-bytes must be positive"
    if args.fault_after is not None:
        from clef_runtime.faults import UnknownFaultError, active_fault

        try:
            fault = active_fault()
        except UnknownFaultError as exc:
            return str(exc)
        if args.fault_after < 0 or fault is None or args.ops != "reference":
            return (
                f"--fault-after {args.fault_after}: needs a number of requests (0 or more), --ops reference"
                f" (what answers before) and {FAULT_ENV} naming the fault that answers after"
            )
    if not (Path(args.checkpoint) / "config.json").is_file():
        return f"--checkpoint {args.checkpoint}: no config.json there"
    return None


def build_server(args: ServeArgs) -> ClefHTTPServer:
    from clef_runtime.verify.environment import check_device, resolve_placement

    placement = resolve_placement(args.device, "model", None)  # settles TRITON_INTERPRET first
    check_device(placement)

    from clef_runtime.chat import CANDLE_VLLM, HF, ChatTokenizer
    from clef_runtime.dtypes import torch_dtype
    from clef_runtime.generation import Generation, greedy
    from clef_runtime.model import HybridModel, ModelConfig
    from clef_runtime.opset import get_opset
    from clef_runtime.serve.http import ClefHTTPServer, Service
    from clef_runtime.serve.requests import Generate, Limits
    from clef_runtime.serve.responses import Shaper

    ckpt = Path(args.checkpoint)
    template = Path(args.chat_template).read_text() if args.chat_template else None
    candle = args.dialect == "candle-vllm"
    tok = ChatTokenizer.from_dir(ckpt, template=template, rendering=CANDLE_VLLM if candle else HF)
    config = ModelConfig.from_json(ckpt)
    opset = get_opset(args.ops, qkv_split=config.qkv_split)  # reads CLEF_RUNTIME_FAULT
    model = HybridModel.from_checkpoint(
        ckpt, config=config, opset=opset, dtype=torch_dtype(args.dtype), device=placement.device
    )
    limits = Limits(
        max_prompt_tokens=args.max_prompt_tokens,
        max_new_tokens=args.max_new_tokens,
        max_positions=config.max_position_embeddings,
        vocab_size=config.vocab_size,
    )

    turn = _fault_turn(args, model, config.qkv_split)

    def generate(req: Generate) -> Generation:
        turn()
        k = max(req.top_logprobs or 0, 1)
        return greedy(
            model,
            req.prompt_ids,
            returned_tokens(args.dialect, req.max_tokens),
            top_k=k,
            stop_ids=tok.stop_ids,
            ignore_eos=req.ignore_eos,
        )

    shaper = Shaper(args.dialect, args.model_name or ckpt.resolve().name, tok.piece, tok.decode)
    service = Service(args.dialect, shaper, tok, limits, generate)
    return ClefHTTPServer((args.host, args.port), service, args.max_request_bytes)


def _fault_turn(
    args: ServeArgs, model: HybridModel, qkv_split: tuple[int, int, int] | None
) -> Callable[[], None]:
    """What each generation request calls first (under the one generation lock): with
    --fault-after N, the model's op set becomes the faulty Triton one from request N+1 on."""
    after = args.fault_after
    if after is None:
        return lambda: None
    from clef_runtime.opset import get_opset

    faulty = get_opset("triton", qkv_split=qkv_split)  # reads CLEF_RUNTIME_FAULT
    served = [0]

    def turn() -> None:
        served[0] += 1
        if served[0] == after + 1:
            print(f"serve: request {served[0]}: from now on the faulty op set answers", file=sys.stderr)
            model.opset = faulty

    return turn


def returned_tokens(dialect: str, max_tokens: int) -> int:
    """How many tokens a request for `max_tokens` gets without a stop: candle-vllm returns one
    more (its scheduler checks the length after appending the token it just sampled)."""
    return max_tokens + 1 if dialect == "candle-vllm" else max_tokens


def run_serve(args: ServeArgs) -> int:
    problem = _check(args)
    if problem is not None:
        print(f"serve: {problem}", file=sys.stderr)
        return int(ExitCode.COULD_NOT_RUN)
    try:
        server = build_server(args)
    except Exception as exc:  # nothing is served: say why and exit "could not run"
        print(f"serve: cannot start: {type(exc).__name__}: {exc}", file=sys.stderr)
        return int(ExitCode.COULD_NOT_RUN)

    def stop(signum: int, frame: FrameType | None) -> None:
        # shutdown() waits for serve_forever to return, so it cannot run on serve_forever's thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    host, port = str(server.server_address[0]), int(server.server_address[1])
    print(f"serve: {args.dialect} on http://{host}:{port} ({args.ops} ops, {args.dtype})", file=sys.stderr)
    if args.ready_file:
        Path(args.ready_file).write_text(f"{port}\n")
    try:
        server.serve_forever()
    finally:
        server.server_close()  # joins the request threads: the one in flight finishes
    print("serve: stopped", file=sys.stderr)
    return 0
