"""`clef-runtime`: the runtime's command line (`verify`, `faults`, `version`; `bench` lives in
`clef_runtime.bench`; `goldens`, `serve` and `endpoint-check` in `clef_runtime.endpoint.cli`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from clef_contract.command import (
    DEVICE_ENV,
    DTYPES,
    FAULT_ENV,
    KERNEL_CONFIG_ENV,
    KERNEL_CONFIGS,
    SHAPE_FLAG,
    SHAPE_KEYS,
    SHAPES_ENV,
    SUITES,
    TERMINATION_LOG,
    TERMINATION_LOG_ENV,
    ExitCode,
)
from clef_runtime.endpoint.cli import ENDPOINT_COMMANDS, add_endpoint_parsers, endpoint_main

_EXITS = ", ".join(
    f"{int(code)} {code.name.lower().replace('_', ' ')}"
    for code in ExitCode
    if code != ExitCode.ENGINE_FAILED
)


def _verify_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help=f"prove this image's GDN kernels match the reference (exit {_EXITS})",
        description=(
            "Runs clef's Triton ops and the hybrid model against float64 references at the model's "
            "real head counts and dims, in the deployed dtype.  Full JSON report on stdout (or --report), "
            "compact report (≤ 4 KiB) to the termination log."
        ),
    )
    p.add_argument("--suite", default="full", help=f"{' | '.join(SUITES)} (default: full)")
    p.add_argument("--dtype", default="f16", help=f"{' | '.join(DTYPES)} (default: f16)")
    p.add_argument("--preset", default="qwen3_5", help="architecture preset when no --config/--checkpoint")
    p.add_argument("--config", help="a Hugging Face style config.json for the model's shape")
    p.add_argument(
        "--checkpoint", help="a checkpoint directory (config.json + safetensors) to run the model suite on"
    )
    p.add_argument("--device", help=f"cuda | cpu (default: ${DEVICE_ENV} or cuda)")
    p.add_argument("--shapes", help=f"model | reduced (default: ${SHAPES_ENV} or model)")
    p.add_argument(
        SHAPE_FLAG,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override the architecture's shape (repeatable): {', '.join(SHAPE_KEYS)}",
    )
    p.add_argument(
        "--kernel-config",
        help=f"the chunked delta rule's launch configuration: {' | '.join(KERNEL_CONFIGS)} "
        f"(default: ${KERNEL_CONFIG_ENV} or auto: the device decides; fma is the V100's)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the generated inputs and weights")
    p.add_argument("--tolerance-scale", type=float, default=1.0, help="multiply every tolerance (0.1-100)")
    p.add_argument("--report", help="write the full JSON report here instead of stdout")
    p.add_argument(
        "--termination-log",
        help=f"compact report path (default: ${TERMINATION_LOG_ENV} or {TERMINATION_LOG})",
    )


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] in ENDPOINT_COMMANDS:
        # Without the other commands' imports: endpoint-check runs on hosts without torch.
        return endpoint_main(words)
    parser = argparse.ArgumentParser(prog="clef-runtime", description="clef's GDN runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    _verify_parser(sub)
    sub.add_parser("faults", help=f"list the fault catalogue ({FAULT_ENV} values)")
    sub.add_parser("version", help="print the runtime version")
    from clef_runtime.bench import add_bench_parser

    add_bench_parser(sub)
    add_endpoint_parsers(sub)
    args = parser.parse_args(argv)

    if args.command == "version":
        from clef_runtime import __version__

        print(__version__)
        return 0
    if args.command == "faults":
        from clef_runtime.faults import CATALOGUE

        for f in CATALOGUE.values():
            print(f"{f.name:26s} {f.op:34s} {f.description}")
        return 0
    if args.command == "bench":
        from clef_runtime.bench import run_bench_command

        return run_bench_command(args)
    import os

    from clef_runtime.verify.run import VerifyArgs, emit, run_verify

    vargs = VerifyArgs(
        suite=args.suite,
        dtype=args.dtype,
        preset=args.preset,
        config=args.config,
        checkpoint=args.checkpoint,
        device=args.device,
        shapes=args.shapes,
        seed=args.seed,
        tolerance_scale=args.tolerance_scale,
        report=args.report,
        termination_log=args.termination_log,
        shape=tuple(args.shape),
        kernel_config=args.kernel_config,
    )
    report = run_verify(vargs)
    log = args.termination_log or os.environ.get(TERMINATION_LOG_ENV) or TERMINATION_LOG
    emit(report, sys.stdout, args.report, log)
    print(f"verify: {report.verdict}: {report.summary()}", file=sys.stderr)
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
