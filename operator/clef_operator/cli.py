"""`clef-operator` command line.

clef-operator run [--namespace NS ... | --all-namespaces] [--kubeconfig FILE] [--liveness URL]
                  [--leader-elect [--leader-elect-lease-duration S ...]] [--metrics-bind-address HOST:PORT]
                  [--resync-seconds S] [--workers N]
clef-operator crd            print the ClefModel CRD (the same as crds/clefmodel.yaml)
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from typing import Any

from clef_operator import __version__


def _run(args: argparse.Namespace) -> int:
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    from clef_operator.manager import memory

    # Before the first thread (metrics, election, watches, reconciles) allocates.
    memory.limit_arenas()
    memory.install_report()
    import kopf

    import clef_operator.handlers  # noqa: F401  (registers the handlers)

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # kopf logs every watch event it hands to a handler; clef logs its decisions itself.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    from clef_operator.api import GROUP, PLURAL, VERSION
    from clef_operator.apiclient import api_client, serves

    error = _setup(args)
    if error:
        print(f"clef-operator: {error}", file=sys.stderr)
        return 2
    # Started before the CRD, the cache's ClefModel informer would only be refused (and retry) and
    # no model would ever be planned: say so and stop instead.
    if not serves(api_client(), GROUP, VERSION, PLURAL):
        print(
            f"clef-operator: the API server does not serve {PLURAL}.{GROUP}/{VERSION}: install the CRD first"
            " (kubectl apply -f crds/clefmodel.yaml, or kubectl apply -k kustomize/base)",
            file=sys.stderr,
        )
        return 3
    from clef_operator.handlers import start_watching
    from clef_operator.manager import leader
    from clef_operator.manager.workers import Tuning

    namespaces = args.namespace or None
    tuning = Tuning(tuple(namespaces or ()), args.resync_seconds, args.workers)
    # The cache lists and watches from now on, also while this replica stands by (reads pass the
    # fence): when it takes over, its cache is synced and only kopf and the workers have to start.
    watching = start_watching(tuning)
    elector = _elect(args) if args.leader_elect else None
    try:
        kopf.run(
            # Without an identity kopf builds one from getpass.getuser(), which raises in a
            # container that runs as a UID with no passwd entry (the images' 65532, or any UID a
            # platform assigns).  The election's identity needs no user database.
            identity=_kopf_identity(leader.identity()),
            standalone=True,
            clusterwide=namespaces is None,
            namespaces=namespaces or (),
            liveness_endpoint=args.liveness,
            memo=kopf.Memo(tuning=tuning, watching=watching),
        )
    finally:
        if elector is not None:
            elector.release()
    return 0


def _kopf_identity(name: str) -> Any:
    """`name` as kopf's peering identity type (a NewType of str that kopf does not export)."""
    from kopf._core.engines.peering import Identity

    return Identity(name)


def _elect(args: argparse.Namespace) -> Any:
    """Block until this replica holds the Lease (a standby waits here, serving only /metrics and
    /healthz); the election thread then keeps renewing it, or ends the process when it is lost."""
    from clef_operator.apiclient import api_client, operator_namespace
    from clef_operator.manager import leader, metrics

    elector = leader.Elector(
        api_client(fenced=False),
        operator_namespace(),
        leader.identity(),
        args.timing,
        name=args.leader_elect_lease_name,
        on_change=lambda leading: metrics.LEADER.set(1 if leading else 0),
        # A namespace it may write Events in: one it serves (or its own, serving all of them).
        check_fence=leader.fence_probe(
            api_client(fenced=False), (args.namespace or [operator_namespace()])[0]
        ),
        on_fence=lambda in_force: metrics.FENCE_IN_FORCE.set(1 if in_force else 0),
    )
    args.elector = elector
    elector.start()
    while not elector.leading.wait(1.0):
        pass
    return elector


def _setup(args: argparse.Namespace) -> str:
    """Election timing, identity and the metrics endpoint; an error message for bad flags."""
    from clef_operator.manager import leader, metrics

    try:
        args.timing = leader.LeaseTiming(
            args.leader_elect_lease_duration, args.leader_elect_renew_deadline, args.leader_elect_retry_period
        )
        address = metrics.parse_bind_address(args.metrics_bind_address) if args.metrics_bind_address else None
    except ValueError as e:
        return str(e)
    refused = leader.identity_refused(
        args.leader_elect_identity, socket.gethostname(), bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    )
    if refused:
        return refused
    leader.set_identity(args.leader_elect_identity or leader.default_identity())
    metrics.LEADER.set(0 if args.leader_elect else 1)
    metrics.FENCE_IN_FORCE.set(-1)
    args.elector = None
    if address is not None:
        metrics.serve(address, lambda: args.elector is None or args.elector.healthy())
    return ""


def _crd(_: argparse.Namespace) -> int:
    from clef_operator.crdgen import render_crd_yaml

    sys.stdout.write(render_crd_yaml())
    return 0


def _seconds(env: str, default: float) -> float:
    value = os.environ.get(env)
    try:
        return float(value) if value else default
    except ValueError:
        raise SystemExit(f"clef-operator: {env}: expected seconds, not {value!r}") from None


def _election_flags(run: argparse.ArgumentParser) -> None:
    env = os.environ.get
    run.add_argument(
        "--leader-elect",
        action="store_true",
        default=env("CLEF_LEADER_ELECT", "") not in ("", "0", "false"),
        help="run as one of several replicas: reconcile only while holding the Lease (env CLEF_LEADER_ELECT=1)",
    )
    run.add_argument("--leader-elect-lease-name", default=env("CLEF_LEADER_ELECT_LEASE_NAME", "clef-operator"),
                     help="the Lease, in the operator's namespace (default clef-operator)")  # fmt: skip
    run.add_argument("--leader-elect-identity", default=env("CLEF_LEADER_ELECT_IDENTITY", ""),
                     help="this replica's name in the Lease (default: hostname and a random suffix)")  # fmt: skip
    for flag, default, what in (
        ("lease-duration", 15.0, "a standby waits this long after the last renew it saw before taking over"),
        ("renew-deadline", 10.0, "the leader stops writing this long after its last successful renew"),
        ("retry-period", 2.0, "how often the leader renews and a standby looks"),
    ):
        name = "CLEF_LEADER_ELECT_" + flag.upper().replace("-", "_")
        run.add_argument(f"--leader-elect-{flag}", type=float, default=_seconds(name, default),
                         metavar="SECONDS", help=f"{what} (default {default:.0f}; env {name})")  # fmt: skip


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests check kustomize/base's Deployment args against it)."""
    parser = argparse.ArgumentParser(prog="clef-operator", description="clef's Kubernetes operator")
    parser.add_argument("--version", action="version", version=f"clef-operator {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="reconcile ClefModels until stopped")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", help="watch this namespace (repeatable)")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (default)")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    run.add_argument("--liveness", help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz")
    run.add_argument(
        "--resync-seconds",
        type=_positive,
        default=300.0,  # manager.workers.RESYNC_SECONDS (not imported here: it would load the client)
        help="re-plan every model this often with no event, from the cache (default 300)",
    )
    run.add_argument(
        "--workers", type=_at_least_one, default=24, help="reconciles running at once (default 24)"
    )
    run.add_argument("--verbose", "-v", action="store_true")
    _election_flags(run)
    run.add_argument(
        "--metrics-bind-address",
        default=os.environ.get("CLEF_METRICS_BIND_ADDRESS"),
        metavar="HOST:PORT",
        help="serve Prometheus /metrics and /healthz here, e.g. 0.0.0.0:9090 (env CLEF_METRICS_BIND_ADDRESS)",
    )
    run.set_defaults(func=_run)
    crd = sub.add_parser("crd", help="print the ClefModel CustomResourceDefinition")
    crd.set_defaults(func=_crd)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if argv is None and args.func is _run:
        # The operator's own process (a caller passing its argv, e.g. a test, is not re-executed).
        from clef_operator.manager import memory

        memory.without_thread_caches()
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
