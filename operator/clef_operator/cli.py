"""`clef-operator` command line.

clef-operator run [--namespace NS ... | --all-namespaces] [--kubeconfig FILE] [--liveness URL]
                  [--resync-seconds S] [--workers N]
clef-operator crd            print the ClefModel CRD (the same as crds/clefmodel.yaml)
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from clef_operator import __version__


def _run(args: argparse.Namespace) -> int:
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
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
    from clef_operator.handlers import api_client
    from clef_operator.kube import serves

    # kopf discovers resources once, at start-up (handlers.configure): started before the CRD, it
    # would silently watch nothing.
    if not serves(api_client(), GROUP, VERSION, PLURAL):
        print(
            f"clef-operator: the API server does not serve {PLURAL}.{GROUP}/{VERSION}: install the CRD first"
            " (kubectl apply -f crds/clefmodel.yaml, or kubectl apply -k kustomize/base)",
            file=sys.stderr,
        )
        return 3
    from clef_operator.handlers import Tuning

    namespaces = args.namespace or None
    tuning = Tuning(tuple(namespaces or ()), args.resync_seconds, args.workers)
    kopf.run(
        standalone=True,
        clusterwide=namespaces is None,
        namespaces=namespaces or (),
        liveness_endpoint=args.liveness,
        memo=kopf.Memo(tuning=tuning),
    )
    return 0


def _crd(_: argparse.Namespace) -> int:
    from clef_operator.crdgen import render_crd_yaml

    sys.stdout.write(render_crd_yaml())
    return 0


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
        default=300.0,  # handlers.RESYNC_SECONDS (not imported here: it would load kopf)
        help="re-plan every model this often with no event, from the cache (default 300)",
    )
    run.add_argument(
        "--workers", type=_at_least_one, default=24, help="reconciles running at once (default 24)"
    )
    run.add_argument("--verbose", "-v", action="store_true")
    run.set_defaults(func=_run)
    crd = sub.add_parser("crd", help="print the ClefModel CustomResourceDefinition")
    crd.set_defaults(func=_crd)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
