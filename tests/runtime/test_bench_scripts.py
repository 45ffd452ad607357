"""bench/'s scripts run against today's code: each imports (every name it takes from clef_runtime
still exists), states its purpose on its docstring's first line, is listed in bench/README.md, and
parses its arguments; the CPU dry path of `probe_chunk.py` runs the chunked op under the
interpreter.  The GPU paths are not run here (bench/README.md lists them)."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py"))


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{Path(name).stem}", BENCH / name)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_readme_lists_exactly_the_scripts() -> None:
    readme = (BENCH / "README.md").read_text()
    listed = {line.split("`")[1] for line in readme.splitlines() if line.startswith("| `")}
    on_disk = {p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh")}
    assert listed == on_disk


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_imports_and_states_its_purpose(name: str) -> None:
    mod = load(name)
    doc = mod.__doc__ or ""
    first, _, rest = doc.partition("\n")
    assert first.endswith(".") and len(first) <= 100, f"{name}: first docstring line {first!r}"
    assert rest.startswith("\n"), f"{name}: the purpose line is followed by a blank line"
    assert callable(getattr(mod, "main", None) or getattr(mod, "sweep", None)), name


def test_gpu_check_is_valid_bash() -> None:
    p = subprocess.run(["bash", "-n", str(BENCH / "gpu_check.sh")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_argument_parsing() -> None:
    assert load("probe_chunk.py").parse(["16", "32", "bf16", "0", "1", "cpu"]) == (
        16,
        32,
        "bf16",
        0,
        1,
        "cpu",
    )
    with pytest.raises(SystemExit, match="dtype 'f8'"):
        load("probe_chunk.py").parse(["16", "16", "f8", "0", "0"])
    assert load("probe_conv_update.py").parse(["256,1"]) == [256, 1]
    assert load("probe_split_threshold.py").parse(["512,1024"]) == [512, 1024]
    assert load("probe_split_threshold.py").parse([]) == [512, 768, 1024, 1536]
    with pytest.raises(SystemExit, match="T list '512,x'"):
        load("probe_split_threshold.py").parse(["512,x"])
    a = load("profile_chunk.py").parse(["512", "f16"])
    assert (a.T, str(a.dtype), a.packed, a.norm) == (512, "torch.float16", 0, True)
    a = load("profile_chunk.py").parse(["--packed", "8", "--no-qk-l2norm"])
    assert (a.T, str(a.dtype), a.packed, a.norm) == (32768, "torch.bfloat16", 8, False)
    with pytest.raises(SystemExit, match="dtype 'f64'"):
        load("profile_chunk.py").parse(["512", "f64"])
    with pytest.raises(SystemExit, match="--packed 3: use a count ≥ 1 that divides T = 512"):
        load("profile_chunk.py").parse(["512", "--packed", "3"])
    assert load("profile_chunk.py").parse(["512", "--packed", "4"]).lens == [128] * 4
    a = load("profile_chunk.py").parse(["--lens", "4000,96,0,12000"])
    assert (a.T, a.lens, a.packed) == (16096, [4000, 96, 0, 12000], 0)
    with pytest.raises(SystemExit, match="--lens '4000,-1'"):
        load("profile_chunk.py").parse(["--lens", "4000,-1"])
    with pytest.raises(SystemExit, match="--lens '0,0'"):
        load("profile_chunk.py").parse(["--lens", "0,0"])


def test_ab_chunk_parses_its_cases_and_exports_a_revision(tmp_path: Path) -> None:
    """ab_chunk.py: two or more distinct trees, rounds ≥ 1, every case parsed as profile_chunk.py
    would before any tree is exported; a revision exports its runtime/ and contract/ (the
    working tree is used in place).  The timing itself needs a GPU."""
    ab = load("ab_chunk.py")
    a = ab.parse(["HEAD~1", ".", "--cases", "32768; 512 --no-qk-l2norm ;", "--rounds", "2"])
    assert (a.trees, a.cases, a.rounds) == (["HEAD~1", "."], [["32768"], ["512", "--no-qk-l2norm"]], 2)
    with pytest.raises(SystemExit, match="name two or more, each once"):
        ab.parse([".", "--cases", "512"])
    with pytest.raises(SystemExit, match="name two or more, each once"):
        ab.parse([".", ".", "--cases", "512"])
    with pytest.raises(SystemExit, match="--rounds 0"):
        ab.parse(["HEAD", ".", "--cases", "512", "--rounds", "0"])
    with pytest.raises(SystemExit, match="--packed 3: use a count"):
        ab.parse(["HEAD", ".", "--cases", "512 --packed 3"])
    with pytest.raises(SystemExit, match="--cases: name at least one case"):
        ab.parse(["HEAD", ".", "--cases", " ; "])
    assert ab.export(".", tmp_path) == BENCH.parent
    root = ab.export("HEAD", tmp_path)
    assert (root / "runtime" / "clef_runtime" / "ops" / "delta_rule_prepare.py").is_file()
    assert (root / "contract").is_dir()


@pytest.mark.parametrize("varlen", [0, 1])
def test_probe_chunk_cpu_dry_path(varlen: int) -> None:
    """The probe's one configuration on the CPU: the chunked op against the reference."""
    o_err, s_err = load("probe_chunk.py").one(16, 16, "f32", 0, varlen, "cpu")
    assert math.isfinite(o_err) and math.isfinite(s_err)
    assert o_err < 1e-3 and s_err < 1e-3, (o_err, s_err)  # f32: far below any dtype's rounding


def test_probe_chunk_runs_as_a_script() -> None:
    """The way gpu_check.sh runs a configuration: a process of its own (here on the CPU)."""
    p = subprocess.run(
        [sys.executable, str(BENCH / "probe_chunk.py"), "16", "16", "f16", "0", "0", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0 and p.stdout.startswith("ok o rel_rms="), p.stdout + p.stderr[-2000:]
