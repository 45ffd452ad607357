"""`make demo` end to end: the README's first command, run as a user runs it (its own local
cluster, its own state directory), then `make demo-down`.  The demo checks each of its steps
itself and exits non-zero on any deviation; this test holds it to its exit status and to the lines
a reader of the README is promised."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from clef_devcluster.config import missing_prerequisites
from clef_devcluster.procs import ProcessLedger, is_alive

from .conftest import missing_prerequisite

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]


def test_make_demo_tells_the_story_and_exits_zero(tmp_path: Path) -> None:
    if os.environ.get("CLEF_KUBECONFIG"):
        missing_prerequisite(
            "the demo starts its own local cluster; CLEF_KUBECONFIG points this tier elsewhere (runs on the local cluster: unset CLEF_KUBECONFIG)"
        )
    missing = missing_prerequisites()
    assert missing is None, missing  # the tier is deselected with this reason before we get here
    state = tmp_path / "demo"
    demo = [sys.executable, "-m", "clef_devcluster.demo", "--state-dir", str(state)]
    try:
        run = subprocess.run(demo, cwd=REPO, capture_output=True, text=True, timeout=1080)
        out = run.stdout
        (tmp_path / "demo-output.txt").write_text(out)  # kept by pytest with tmp_path, for a look
        assert run.returncode == 0, f"make demo exited {run.returncode}\n{out[-6000:]}\n{run.stderr[-3000:]}"
        # Progress with timestamps: goldens made once, a preview Ready, a comparison verdict.
        for pattern in (
            r"^\[\d\d:\d\d:\d\d\] clef-flash: waiting for goldens Job \S+ \(running clef-runtime goldens "
            r"from the checkpoint on worker-1, Tesla-V100-SXM2-16GB\)…$",
            r"^\[\d\d:\d\d:\d\d\] clef-flash: preview clef-flash-\w+ Ready \(1/1; no Service selects it\)$",
            r"^\[\d\d:\d\d:\d\d\] clef-flash: comparison Job \S+ finished: Complete$",
            r"^\[\d\d:\d\d:\d\d\] coder: comparison Job \S+ finished: Complete$",
            r"^ +clef-flash: verified by endpoint: .*$",
            r"^ +coder: +verified by endpoint: .*$",
            r"^\[\d\d:\d\d:\d\d\] clef-flash: Verified=False \(EndpointMismatch\): ",
            r"^ +first divergence: prompt capital, token \d+: expected id \d+ ",
            r"^\[\d\d:\d\d:\d\d\] clef-flash: Serving=True \(Consistent\): ",
            r"^\[\d\d:\d\d:\d\d\] clef-flash: Serving=False \(PodCordoned\): ",
            r"^ +clef-flash: CORDONED clef-flash-\w+-\w+-\w+ on worker-\d: its probe's answer diverged$",
        ):
            assert re.search(pattern, out, re.M), f"no line matches {pattern!r}\n{out[-6000:]}"
        # the demo's own "created" lines (a condition it prints may quote the same words: e.g.
        # "Ready=False (NoActiveRevision): ...: goldens Job X created; waiting for its pod")
        created = re.findall(r"^\[\d\d:\d\d:\d\d\] (\S+): goldens Job \S+ created \(", out, re.M)
        assert sorted(created) == ["clef-flash", "coder"], f"goldens once per model, reused after: {created}"
        for line in (
            "✔ step 1: clef-flash verified by endpoint and serving revision",
            "clef-flash: REJECTED registry.clef.test/engines/candle-vllm:0.9.0 before any traffic",
            "goldens reused: 1 goldens Job in all",
            "✔ step 2: the key-band fault in the serving engine was caught; the old revision still serves; ClusterIP unchanged",
            "✔ step 3: candle-vllm 0.9.1 was verified against the same goldens and swapped in; ClusterIP",
            "✔ step 4: a GPU that went bad while serving was caught by a probe of its pod, which clef cordoned;"
            " the other pod still serves",
            "All four steps happened as described.",
            "make demo-down",
        ):
            assert line in out, f"missing {line!r}\n{out[-4000:]}"
        # The ClusterIP printed before the fault and after the swap is one and the same.
        ips = re.findall(r"Service clef-serve: selector \{[^}]*\}, ClusterIP (\S+)", out)
        assert len(ips) == 4 and len(set(ips)) == 1, ips
        # The final table: both models Ready and Verified.
        table = out[out.index("$ kubectl get clefmodels -n homelab") :].splitlines()[1:4]
        assert table[0].split() == ["NAME", "READY", "VERIFIED", "ACTIVE", "CANDIDATE", "AGE"]
        assert table[1].split()[:3] == ["clef-flash", "True", "True"]
        assert table[2].split()[:3] == ["coder", "True", "True"]
        # Left running for a look around, operator included, until `make demo-down`.
        records = ProcessLedger(state / "run" / "processes.json").load()
        assert {"clef-operator", "kube-apiserver", "runner"} <= {r.name for r in records if is_alive(r)}
    finally:
        down = subprocess.run([*demo, "down"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert not [r for r in ProcessLedger(state / "run" / "processes.json").load() if is_alive(r)]
    # As for the session's cluster (conftest): the runner's own mistakes must not pass unnoticed.
    errors = [line for line in (state / "logs" / "runner.log").read_text().splitlines() if " ERROR " in line]
    assert not errors, "\n".join(errors[:20])
