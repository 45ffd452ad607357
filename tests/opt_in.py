"""The gate of the opt-in tiers (tests/realnode, tests/engines): unless their variable is 1,
every test under the tier's directory is skipped with the tier's reason, which says how to run it.
Asked for (the variable set, as their make targets do), a missing prerequisite is a failure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def enabled(variable: str) -> bool:
    return os.environ.get(variable, "") == "1"


def gate(items: list[pytest.Item], here: Path, variable: str, reason: str) -> None:
    """Skip, with `reason`, every collected test under `here` unless `variable` is 1."""
    if enabled(variable):
        return
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.skip(reason=reason))
