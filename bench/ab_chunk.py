"""Per-kernel GPU time of clef's chunked prefill in two or more source trees, trees alternating.

How a kernel change is judged before it lands: each tree (a git revision, exported with ``git
archive``, or ``.``, the working tree) runs every case in a process of its own with
``PYTHONPATH=<tree>/runtime:<tree>/contract``, the trees taking turns for ``--rounds`` rounds, so
that a machine's drift (clocks, temperature, another tenant) falls on every tree alike.  A case
is `profile_chunk.py`'s arguments (``T [dtype] [--batch B] [--packed N] [--lens ...]
[--no-qk-l2norm]``); each is timed as clef's default path, `chunk_gated_delta_rule`, by
`profile_chunk.per_kernel` (three warm-up calls, twenty under torch.profiler), then the whole call
by graph replay (`profile_chunk.graph_call_us`: kernels that overlap count once).  Prints, per
case, kernel (and the kernels summed, and the call's span) and tree, the median over rounds and
every round's value (the order of the trees rotates each round); ``--json`` writes them.  GPU
only; the inputs are the same seeded tensors in every tree.

    PYTHONPATH=runtime:contract python3 bench/ab_chunk.py main . \\
        --cases '32768;8192 --batch 4;32768 --packed 8 --no-qk-l2norm;512' [--rounds 3] [--json F]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CHILD = "--child"
# two figures a call beside each kernel's: the kernels' self times summed, and the call's span by
# graph replay (`profile_chunk.graph_call_us`), which counts overlapping kernels once: the figure
# that judges a change in how the launches overlap (a dependent launch starts early and waits,
# and its wait is inside its own kernel time)
KERNELS_SUMMED = "kernels summed"
CALL_SPAN = "call, graph replay"


def parse(argv: list[str]) -> argparse.Namespace:
    """``TREE TREE... --cases 'C1;C2;...' [--rounds R] [--json F]``: two or more trees, distinct;
    every case parses as `profile_chunk.py`'s arguments; rounds ≥ 1."""
    p = argparse.ArgumentParser(prog="ab_chunk.py")
    p.add_argument("trees", nargs="+", metavar="TREE", help="git revisions, or . for the working tree")
    p.add_argument("--cases", required=True, help="';'-separated profile_chunk.py argument lists")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None, metavar="PATH")
    a = p.parse_args(argv)
    if len(a.trees) < 2 or len(set(a.trees)) != len(a.trees):
        raise SystemExit(f"trees {a.trees}: name two or more, each once")
    if a.rounds < 1:
        raise SystemExit(f"--rounds {a.rounds}: use a count ≥ 1")
    a.cases = [c.split() for c in a.cases.split(";") if c.strip()]
    if not a.cases:
        raise SystemExit("--cases: name at least one case")
    pc = _profile_chunk()
    for c in a.cases:
        pc.parse(c)  # a bad case fails here, before any tree is exported
    return a


def _profile_chunk() -> ModuleType:
    """bench/profile_chunk.py of this checkout (its case parsing, inputs and timing)."""
    if str(REPO / "bench") not in sys.path:
        sys.path.insert(0, str(REPO / "bench"))
    return importlib.import_module("profile_chunk")


def child(cases: list[list[str]]) -> None:
    """In a tree's process: each case's kernel times, one JSON line each."""
    from clef_runtime.ops import chunk_gated_delta_rule

    pc = _profile_chunk()
    for argv in cases:
        a = pc.parse(argv)
        (q, k, v, g, beta), cu, case = pc.inputs(a)
        call = functools.partial(
            chunk_gated_delta_rule,
            q,
            k,
            v,
            g,
            beta,
            cu_seqlens=cu,
            output_final_state=True,
            use_qk_l2norm=a.norm,
        )
        times = pc.per_kernel(call)
        name = f"{case}{'' if a.norm else ', no norm'}"
        print(json.dumps({"case": name, "times": times, "call": pc.graph_call_us(call)}), flush=True)


def export(tree: str, into: Path) -> Path:
    """The tree's root holding its runtime/ and contract/: the repository for ``.``, else the
    revision's copy under ``into``."""
    if tree == ".":
        return REPO
    root = into / tree.replace("/", "_")
    root.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", tree, "runtime", "contract"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root


def run_tree(root: Path, cases: list[list[str]]) -> list[dict[str, Any]]:
    """One process of the tree: every case's kernel times."""
    env = dict(os.environ, PYTHONPATH=f"{root / 'runtime'}{os.pathsep}{root / 'contract'}")
    p = subprocess.run(
        [sys.executable, __file__, CHILD, json.dumps(cases)], env=env, capture_output=True, text=True
    )
    if p.returncode != 0:
        raise SystemExit(f"{root}: the tree's process failed:\n{p.stderr[-3000:]}")
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def main(argv: list[str]) -> None:
    if argv[:1] == [CHILD]:
        child(json.loads(argv[1]))
        return
    a = parse(argv)
    rows: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        roots = {t: export(t, Path(tmp)) for t in a.trees}
        for r in range(a.rounds):
            # the order rotates each round: no tree always runs first on a cooled GPU
            for tree in a.trees[r % len(a.trees) :] + a.trees[: r % len(a.trees)]:
                for res in run_tree(roots[tree], a.cases):
                    times: dict[str, float] = res["times"]
                    spans = [(KERNELS_SUMMED, sum(times.values())), (CALL_SPAN, res["call"])]
                    for kernel, t_us in [*times.items(), *spans]:
                        rows[(res["case"], kernel, tree)].append(float(t_us))
                print(f"round {r + 1}/{a.rounds}: {tree} done", file=sys.stderr, flush=True)
    for (case, kernel, tree), us in sorted(rows.items()):
        runs = ", ".join(f"{x:.1f}" for x in us)
        print(f"{case:28s} {kernel[:40]:40s} {tree:12s} {statistics.median(us):9.1f} µs  [{runs}]")
    if a.json:
        out = [{"case": c, "kernel": k, "tree": t, "us": us} for (c, k, t), us in sorted(rows.items())]
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
