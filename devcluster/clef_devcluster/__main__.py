"""`python -m clef_devcluster build|up|down|status|env|check` (see docs/local-cluster.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from .cluster import ClusterError, ClusterRunning, LocalCluster, build
from .config import DEFAULT_STATE_DIR, default_binaries, missing_prerequisites
from .procs import is_alive


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m clef_devcluster")
    parser.add_argument(
        "--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="where certs, logs and data live"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the cached binaries if missing")
    b.add_argument(
        "--if-possible",
        action="store_true",
        help="exit 0 quietly when a prerequisite (Go) is missing; the cluster tests then say so and skip",
    )
    u = sub.add_parser("up", help="start the local cluster (builds first if needed)")
    u.add_argument(
        "--attach",
        type=Path,
        metavar="KUBECONFIG",
        help="start only kwok and the runner against an existing cluster (kind)",
    )
    u.add_argument(
        "--real-node",
        action="store_true",
        help="also start a real node (containerd + kubelet, as root; `build.sh node` first)",
    )
    sub.add_parser("down", help="stop everything started from --state-dir")
    sub.add_parser("status", help="what is running")
    sub.add_parser("env", help='shell exports for kubectl: eval "$(python -m clef_devcluster env)"')
    sub.add_parser("check", help="print what is missing to run the local cluster (exit 3 if anything)")
    return parser


def _check(cluster: LocalCluster, args: argparse.Namespace) -> int:
    missing = missing_prerequisites()
    print(missing or "ok: everything needed is present")
    return 3 if missing else 0


def _build(cluster: LocalCluster, args: argparse.Namespace) -> int:
    missing = missing_prerequisites()
    if missing and default_binaries().missing():
        if args.if_possible:
            # The test run says it, once, in its summary.
            return 0
        print(f"cluster: {missing}", file=sys.stderr)
        return 3
    build()
    return 0


def _up(cluster: LocalCluster, args: argparse.Namespace) -> int:
    try:
        build()
        seconds = cluster.up(external_kubeconfig=args.attach)
    except ClusterRunning as e:
        print(f"cluster: {e}", file=sys.stderr)
        return 0
    except ClusterError as e:
        print(f"cluster: {e}", file=sys.stderr)
        return 1
    if args.real_node:
        from .realnode import NodeError, RealNode

        try:
            node_seconds = RealNode(cluster).up()
        except NodeError as e:
            print(f"cluster: real node: {e}", file=sys.stderr)
            cluster.down()
            return 1
        print(f"cluster: real node `localhost` Ready in {node_seconds:.1f}s", file=sys.stderr)
    print(f"cluster: up in {seconds:.1f}s; to use it:", file=sys.stderr)
    print("\n".join(cluster.env_lines()))
    return 0


def _down(cluster: LocalCluster, args: argparse.Namespace) -> int:
    report = cluster.down()
    if not report.clean:
        print(
            f"cluster: still running: {report.survivors}; ports still listening: "
            f"{report.ports_still_listening}",
            file=sys.stderr,
        )
        return 1
    print(f"cluster: stopped ({', '.join(report.stopped) or 'nothing was running'})", file=sys.stderr)
    return 0


def _status(cluster: LocalCluster, args: argparse.Namespace) -> int:
    records = cluster.ledger.load()
    if not records:
        print("cluster: not running")
        return 3
    state = cluster.state()
    for r in records:
        print(f"{r.name:<24} pid {r.pid:<8} {'running' if is_alive(r) else 'DEAD'}")
    print(f"server     {state.get('server', '(external) ' + str(state.get('externalKubeconfig')))}")
    print(f"kubeconfig {cluster.active_kubeconfig()}")
    print(f"logs       {cluster.logs}")
    return 0 if all(is_alive(r) for r in records) else 1


def _env(cluster: LocalCluster, args: argparse.Namespace) -> int:
    print("\n".join(cluster.env_lines()))
    return 0


COMMANDS: dict[str, Callable[[LocalCluster, argparse.Namespace], int]] = {
    "check": _check,
    "build": _build,
    "up": _up,
    "down": _down,
    "status": _status,
    "env": _env,
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return COMMANDS[args.command](LocalCluster(args.state_dir), args)


if __name__ == "__main__":
    sys.exit(main())
