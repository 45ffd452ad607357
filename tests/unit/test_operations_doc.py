"""docs/operations.md and the README stay true: every reason the operator can set is explained,
the RBAC table is the shipped RBAC, and every relative link leads somewhere."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import yaml

from clef_devcluster.rbac_audit import rule_permissions
from clef_operator.conditions import CONDITION_TYPES, Reason, Why

REPO = Path(__file__).resolve().parents[2]
OPERATIONS = REPO / "docs" / "operations.md"
README = REPO / "README.md"
RBAC = REPO / "kustomize" / "base" / "rbac.yaml"


def test_every_reason_is_explained() -> None:
    text = OPERATIONS.read_text()
    reasons = {v for k, v in vars(Reason).items() if k.isupper()} | {
        v for k, v in vars(Why).items() if k.isupper()
    }
    reasons.add("InvalidSpec")  # set by the pass (reconcile) when the stored spec does not validate
    rows = {m.group(1) for m in re.finditer(r"^\| `(\w+)` \|", text, re.M)}
    assert not sorted(reasons - rows), f"docs/operations.md has no row for {sorted(reasons - rows)}"
    # Each condition type is set by some row of the reasons table (its second column, `Type=…`).
    set_by = {m.group(1) for m in re.finditer(r"^\| `\w+` \| ([A-Z][a-z]+)=", text, re.M)}
    assert not sorted(set(CONDITION_TYPES) - set_by), f"no row sets {sorted(set(CONDITION_TYPES) - set_by)}"


def test_rbac_table_is_the_shipped_rbac() -> None:
    documented: set[tuple[str, str, str]] = set()
    row = re.compile(r"^\| (`[^`]*`|\(core\)) \| `([^`]+)` \| ((?:`[a-z]+` ?)+) \|", re.M)
    for m in row.finditer(OPERATIONS.read_text()):
        group = "" if m.group(1) == "(core)" else m.group(1).strip("`")
        for verb in re.findall(r"`([a-z]+)`", m.group(3)):
            documented.add((group, m.group(2), verb))
    rules = [
        rule
        for doc in yaml.safe_load_all(RBAC.read_text())
        if doc and doc["kind"] in ("ClusterRole", "Role")
        for rule in doc["rules"]
    ]
    assert documented == rule_permissions(rules)


def test_relative_links_resolve() -> None:
    for doc in (README, OPERATIONS, REPO / "docs" / "local-cluster.md"):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.name}: broken link {target}"


def test_readme_names_the_two_commands_and_links_every_doc() -> None:
    text = README.read_text()
    block = re.search(r"```\n(.*?)```", text, re.S)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    for doc in sorted((REPO / "docs").glob("*.md")):
        assert f"docs/{doc.name}" in text, f"README does not link docs/{doc.name}"


def test_every_metric_and_election_flag_is_documented() -> None:
    """docs/operations.md ("Monitoring", "Running two replicas") names each metric the operator
    exports and each election flag it takes."""
    from prometheus_client import REGISTRY

    import clef_operator.manager.metrics  # noqa: F401  (registers the metrics, the probes' too)
    from clef_operator.cli import build_parser

    text = OPERATIONS.read_text()
    # By family, so that a labelled metric with no series yet is named too; a counter is
    # exposed with `_total`.
    names = {
        f"{family.name}_total" if family.type == "counter" else family.name
        for family in REGISTRY.collect()
        if family.name.startswith("clef_")
    }
    assert names >= {
        "clef_operator_leader",
        "clef_rollouts_started_total",
        "clef_verification_duration_seconds",
        "clef_probe_last_pass_timestamp_seconds",
    }
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert not missing, f"docs/operations.md lacks {missing}"
    run = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    flags = [
        o
        for action in run._actions
        for o in action.option_strings
        if o.startswith("--leader-elect") or o == "--metrics-bind-address"
    ]
    assert len(flags) == 7
    missing = sorted(f for f in flags if f"`{f}" not in text)
    assert not missing, f"docs/operations.md lacks {missing}"
