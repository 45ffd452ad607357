"""`clef-runtime` command line."""

import sys


def main(argv: list[str] | None = None) -> int:
    print("clef-runtime: no commands yet", file=sys.stderr)
    return 2
