"""The cluster tier can never pass by skipping where it is required (CLEF_REQUIRE_CLUSTER=1, CI).

Every way a cluster test could be set aside (a skip, an xfail, a skip marker, deselection) has to
sit in a function that asks `_required()` first, and the tests themselves only skip through
conftest's `missing_prerequisite`, which fails instead when the tier is required.  The files are
read, not imported (the unit tier must not import the cluster tier)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "tests" / "cluster"

# Calls and markers that set a test aside, by their last dotted name.
SETS_ASIDE = {"skip", "skipif", "xfail", "importorskip", "pytest_deselected"}


def dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def asks_required_first(func: ast.FunctionDef | ast.AsyncFunctionDef, line: int) -> bool:
    """Whether `func` calls `_required()` above `line` (its decision comes first)."""
    return any(
        isinstance(n, ast.Call) and dotted(n.func) == "_required" and n.lineno < line for n in ast.walk(func)
    )


def unguarded(source: str) -> list[str]:
    """Each place in `source` that sets a test aside without asking `_required()` first."""
    tree = ast.parse(source)
    owner: dict[int, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for func in ast.walk(tree):  # breadth-first: an inner function overwrites its outer one
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            owner.update((id(n), func) for n in ast.walk(func))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("pytest", "unittest"):
            found += [f"line {node.lineno}: imports {a.name}" for a in node.names if a.name in SETS_ASIDE]
        name = dotted(node) if isinstance(node, ast.Attribute) else ""
        if name.rsplit(".", 1)[-1] in SETS_ASIDE:
            func = owner.get(id(node))
            if func is None or not asks_required_first(func, node.lineno):
                found.append(f"line {node.lineno}: {name}")
    return found


def test_the_scan_finds_every_way_to_set_a_test_aside() -> None:
    for source in (
        "import pytest\ndef test_x():\n    pytest.skip('no')\n",
        "import pytest\n@pytest.mark.skipif(True, reason='no')\ndef test_x(): pass\n",
        "import pytest\npytestmark = pytest.mark.skip\n",
        "import pytest\ndef test_x():\n    pytest.xfail('no')\n",
        "import pytest\nkubernetes = pytest.importorskip('kubernetes')\n",
        "from pytest import skip\n",
        "def hook(config, items):\n    config.hook.pytest_deselected(items=items)\n",
        # Asking after deciding is no guard.
        "import pytest\ndef f():\n    pytest.skip('no')\n    if _required(): pass\n",
    ):
        assert unguarded(source), source
    guarded = "import pytest\ndef f(reason):\n    if _required():\n        pytest.fail(reason)\n    pytest.skip(reason)\n"
    assert unguarded(guarded) == []


def test_no_cluster_test_skips_unless_the_tier_is_optional() -> None:
    files = sorted(CLUSTER.glob("*.py"))
    assert len(files) > 10, f"the scan found only {files} under {CLUSTER}"
    found = [f"{p.relative_to(REPO)} {where}" for p in files for where in unguarded(p.read_text())]
    assert not found, (
        "a cluster test can be set aside where CLEF_REQUIRE_CLUSTER=1; use missing_prerequisite:\n"
        + ("\n".join(found))
    )


def test_conftest_skips_and_deselects_only_behind_the_switch() -> None:
    source = (CLUSTER / "conftest.py").read_text()
    tree = ast.parse(source)
    places = [dotted(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in SETS_ASIDE]
    # The one skip (missing_prerequisite) and the one deselection (the collection hook) exist and
    # are guarded; the test above proves the guard.
    assert sorted(places) == ["config.hook.pytest_deselected", "pytest.skip"], places
    assert unguarded(source) == []
