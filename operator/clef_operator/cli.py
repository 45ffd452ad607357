"""`clef-operator` command line."""

import sys


def main(argv: list[str] | None = None) -> int:
    print("clef-operator: no commands yet", file=sys.stderr)
    return 2
