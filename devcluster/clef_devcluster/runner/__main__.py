"""`python -m clef_devcluster.runner --state-dir DIR --kubeconfig FILE`: the runner as a process
(`up` starts it)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from ..config import ENGINE_IMAGE_PREFIX, VERIFICATION_SELECTOR
from ..rest import Rest
from .watch import Runner, log


class _Shutdown(BaseException):
    pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clef_devcluster.runner")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=64)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s", stream=sys.stderr
    )
    runner = Runner(Rest(args.kubeconfig), args.state_dir.resolve(), workers=args.workers)

    def on_signal(signum: int, _frame: object) -> None:
        raise _Shutdown(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(
        "runner up (pid %d), running pods with %s or an image under %s",
        os.getpid(),
        VERIFICATION_SELECTOR,
        ENGINE_IMAGE_PREFIX,
    )
    try:
        runner.serve(ready_file=args.state_dir / "run" / "runner.ready")
    except _Shutdown:
        log.info("runner stopping")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        runner.shutdown()
    # Worker threads may sit in HTTP calls to a server that is already gone; do not wait for them.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
