"""`make demo`: DESIGN's homelab story, end to end, on the local control plane.

python -m clef_devcluster.demo [--state-dir DIR]        run it (what `make demo` does)
python -m clef_devcluster.demo --real-vllm               the coder on real vLLM (`make demo-vllm`)
python -m clef_devcluster.demo [--state-dir DIR] down   stop its operator and cluster (`make demo-down`)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..cluster import LocalCluster
from .narration import rel
from .story import DEFAULT_STATE_DIR, Demo, stop_demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clef_devcluster.demo", description="clef's demo (make demo)"
    )
    parser.add_argument(
        "--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="where the demo cluster lives"
    )
    parser.add_argument(
        "--real-vllm",
        action="store_true",
        help="the coder on real vLLM's CPU build instead of the stand-in (make demo-vllm)",
    )
    parser.add_argument("command", nargs="?", choices=["run", "down"], default="run")
    args = parser.parse_args(argv)
    if args.command == "down":
        cluster = LocalCluster(args.state_dir)
        if not cluster.ledger.load():
            print(f"demo: nothing is running from {rel(args.state_dir.resolve())}", file=sys.stderr)
            return 0
        ok = stop_demo(cluster)
        if ok:
            print(
                f"demo: stopped the operator and the cluster from {rel(args.state_dir.resolve())}",
                file=sys.stderr,
            )
        return 0 if ok else 1
    try:
        return Demo(args.state_dir, real_vllm=args.real_vllm).run()
    except KeyboardInterrupt:
        print(
            "\ndemo: interrupted; whatever started is still running: `make demo-down` stops it",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
