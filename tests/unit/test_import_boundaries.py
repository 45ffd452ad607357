"""Who may import whom.  The unit tier runs without a cluster, so it must not import the cluster
tier's modules (what both need lives in clef_devcluster); the operator and the runtime ship in
images that do not carry the dev cluster, so they must not import it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def imported_modules(source: str) -> Iterator[str]:
    """Every module an `import` or `from ... import` names, the imported names included (so that
    `from tests import cluster` reads as `tests.cluster`)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def offending(files: list[Path], forbidden: str) -> list[str]:
    return [
        f"{path.relative_to(REPO)}: imports {module}"
        for path in files
        for module in imported_modules(path.read_text())
        if within(module, forbidden)
    ]


def test_the_scan_sees_every_import_form() -> None:
    for source in (
        "import tests.cluster.objects",
        "from tests.cluster.conftest import wait_for",
        "from tests import cluster",
        "def f():\n    from tests.cluster import objects\n",
    ):
        assert any(within(m, "tests.cluster") for m in imported_modules(source)), source
    assert not any(within(m, "tests.cluster") for m in imported_modules("import tests.clusters"))


def test_the_unit_tier_imports_nothing_of_the_cluster_tier() -> None:
    files = sorted((REPO / "tests" / "unit").rglob("*.py"))
    assert files
    assert not offending(files, "tests.cluster")


def test_the_operator_and_the_runtime_do_not_import_the_dev_cluster() -> None:
    files = sorted((REPO / "operator").rglob("*.py")) + sorted((REPO / "runtime").rglob("*.py"))
    assert files
    assert not offending(files, "clef_devcluster")


def test_each_image_carries_only_what_it_imports() -> None:
    """The operator image has no torch and no runtime; the runtime image has no kopf, kubernetes
    client or operator; the contract, in both, has neither."""
    tree = {name: sorted((REPO / name).rglob("*.py")) for name in ("operator", "runtime", "contract")}
    assert all(tree.values())
    forbidden = {
        "operator": ("clef_runtime", "torch", "triton"),
        "runtime": ("clef_operator", "kopf", "kubernetes"),
        "contract": ("clef_operator", "clef_runtime", "clef_devcluster", "torch", "kubernetes", "pydantic"),
    }
    problems = [
        line for home, names in forbidden.items() for name in names for line in offending(tree[home], name)
    ]
    assert problems == []
