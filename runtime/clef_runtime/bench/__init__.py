"""`clef-runtime bench`: clef's GDN kernels timed side by side with flash-linear-attention at
Qwen3.5-9B shapes, against byte and FLOP floors and the copy bandwidth measured in the same run.

Importing this package must stay cheap and must not import triton: the CLI imports it to register
the subcommand before any other command (``verify`` on the CPU decides on the Triton interpreter
after that).  See docs/performance.md for the method and the device command.
"""

from __future__ import annotations

from clef_runtime.bench.command import add_bench_parser, run_bench_command

__all__ = ["add_bench_parser", "run_bench_command"]
