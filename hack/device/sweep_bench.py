"""Time text-edit variants of one module with `clef-runtime bench`, one bench process per
variant, and print each row's median and share of copy bandwidth.

    python3 hack/device/sweep_bench.py hack/device/sweep_recurrent_table.py

The table defines FILE (the module's path), ROWS (`bench --rows`), ARGS (more bench options)
and VARIANTS {name: [(old, new), ...]} (an empty list: the module as it is).  The script edits
FILE in place and restores it after every variant (also on errors): run it on a scratch copy,
such as the device tool's copy of the tree, not on uncommitted work.  Copy bandwidth is measured
by each bench run, so every share is against the same run's copy.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile


def main() -> int:
    ns: dict = {}
    exec(pathlib.Path(sys.argv[1]).read_text(), ns)
    path = pathlib.Path(ns["FILE"])
    original = path.read_text()
    env = dict(os.environ, PYTHONPATH="runtime" + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        for name, edits in ns["VARIANTS"].items():
            src = original
            missing = [old for old, _ in edits if old not in src]
            if missing:
                print(f"{name:24s} edit target missing: {missing[0][:60]!r}", flush=True)
                continue
            for old, new in edits:
                src = src.replace(old, new)
            path.write_text(src)
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                cmd = [sys.executable, "-m", "clef_runtime", "bench", "--rows", ns["ROWS"], "--json", out.name]
                proc = subprocess.run(cmd + list(ns.get("ARGS", [])), capture_output=True, text=True, env=env)
                try:
                    rows = json.loads(pathlib.Path(out.name).read_text())["rows"]
                except (OSError, ValueError, KeyError):
                    print(f"{name:24s} bench exit {proc.returncode}: {proc.stderr[-300:]!r}", flush=True)
                    continue
            cells = []
            for r in rows:
                c = r.get("clef") or {}
                if r.get("status") != "ok" or "median_s" not in c:
                    cells.append(f"{r['name']}: {r.get('status')}")
                    continue
                cells.append(f"{r['name']}={c['median_s'] * 1e6:8.2f} µs ({c['bw_share'] * 100:5.1f}%, ±{c['spread'] * 100:.1f}%)")
            print(f"{name:24s} " + "  ".join(cells), flush=True)
    finally:
        path.write_text(original)
    return 0


if __name__ == "__main__":
    sys.exit(main())
