"""A test session's memo of finished `clef-runtime verify` runs, so that a run the session has
already seen to the end is replayed instead of computed again on the CPU.

The cluster tier starts the same few verifications dozens of times (the same command line, the
same environment, the same sources); on two cores each takes most of a minute in Triton's
interpreter.  A run is replayed only when everything it computes from is the same as a run that
ended by itself (an exit code, not a signal, not killed by the runner):

    argv        the command line as the process got it
    env         the environment as the process got it (the fault an image carries is in it)
    image       what the image table says the runner does with it: its kind and fault.  Not its
                digest: every `good` image runs the same program of this host, whatever its tag
                or digest (the container status still reports the pod's own digest)
    sources     every file of clef_runtime and clef_contract (the program that runs)
    inputs      the bytes of the files its --config and --checkpoint name

A pod's own paths (its run directory, where the termination log is, and its volume directory,
where its /tmp is) are written as placeholders in the key and in what is kept, and put back as the
new pod's on replay, so a replay prints what a real run in that pod would have printed.  The
installed packages (torch, Triton) are not in the key: they do not change within a session.

Only `clef-runtime verify` without --report and --termination-log (whose output would go to a
file the memo does not keep), in a container without probes, is memoised.

**Load mode** (a file `load` in the memo directory; only the load test's probe phase,
`python -m clef_devcluster.load --probes N`, makes it): `clef-runtime goldens` and
`clef-runtime endpoint-check` are memoised too, and an endpoint check's key leaves out the
engine's address and the probe's round (`load_normalise`).  That is the load test's model of
the data plane: one real model's goldens, comparison and probe run for real, and every other
model's (whose engines are kwok pods that answer nothing) replay them, so that the operator and
the control plane carry 1,000 models' verification and probe traffic on two cores.  Never in a
test that judges an engine: a replayed check says nothing about the engine it names.  The memo lives only
while a test session wants it: the directory `<state>/run/verify-memo` (MEMO_DIR), which the
session creates at its start and removes at its end.  Each lookup is noted in its ledger (`hit
KEY` / `miss KEY`), which the session sums up.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .logs import parse_records, record_line

log = logging.getLogger("clef.runner")

# Under the runner's state directory; the test session creates and removes it.
MEMO_DIR = Path("run") / "verify-memo"
LEDGER = "ledger"
# Its presence in MEMO_DIR switches load mode on (see above).
LOAD_MARKER = "load"
# The runs memoised in load mode besides `verify`.
LOAD_SUBCOMMANDS = ("goldens", "endpoint-check")
# What an endpoint check's engine address and probe round become in a load-mode key.
ENGINE_TOKEN, ROUND_TOKEN = "@clef-memo:engine@", "@clef-memo:round@"
_ENGINE_URL = re.compile(r"^https?://[^/]+")
# The packages whose code a verify run executes.
SOURCE_PACKAGES = ("clef_runtime", "clef_contract")
# Flags whose value is a path the run reads.
INPUT_FLAGS = ("--config", "--checkpoint")
# Flags whose value is a path the run writes (a replay could not reproduce the file).
OUTPUT_FLAGS = ("--report", "--termination-log")
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
# What a pod's own paths become in the key and in what is kept.
RUN_TOKEN, VOLUMES_TOKEN, POD_TOKEN = "@clef-memo:run@", "@clef-memo:volumes@", "@clef-memo:pod@"


@dataclass(frozen=True)
class PodPaths:
    """The strings of a run that belong to its pod, not to what it computes."""

    run_dir: str
    volume_dir: str
    pod_name: str

    def pairs(self) -> list[tuple[str, str]]:
        """(pod's string, its placeholder), the longer paths first (one may hold the other)."""
        paths = [(self.run_dir, RUN_TOKEN), (self.volume_dir, VOLUMES_TOKEN)]
        return sorted(paths, key=lambda p: len(p[0]), reverse=True)


def normalise(text: str, pod: PodPaths) -> str:
    for value, token in pod.pairs():
        text = text.replace(value, token)
    return text


def localise(text: str, pod: PodPaths) -> str:
    for value, token in pod.pairs():
        text = text.replace(token, value)
    return text


def _flag_values(argv: Sequence[str], flags: Iterable[str]) -> list[str]:
    """The values of `flags` in argv, as `--flag value` or `--flag=value`."""
    wanted = tuple(flags)
    out = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in wanted:
            if eq:
                out.append(value)
            elif i + 1 < len(argv):
                out.append(argv[i + 1])
    return out


def _has_flag(argv: Sequence[str], flags: Iterable[str]) -> bool:
    wanted = tuple(flags)
    return any(arg.partition("=")[0] in wanted for arg in argv)


def eligible(argv: Sequence[str], container: Mapping[str, object], load: bool = False) -> bool:
    """Whether this run may be memoised: `clef-runtime verify` (in load mode also `goldens` and
    `endpoint-check`) writing only its termination log and stdout/stderr, in a container
    without probes."""
    subcommands = ("verify", *LOAD_SUBCOMMANDS) if load else ("verify",)
    return (
        len(argv) >= 2
        and Path(argv[0]).name == "clef-runtime"
        and argv[1] in subcommands
        and not _has_flag(argv, OUTPUT_FLAGS)
        and not any(container.get(p) for p in PROBES)
    )


def load_normalise(argv: Sequence[str]) -> list[str]:
    """An endpoint check's argv as a load-mode key sees it: `--url`'s scheme and address and
    `--sample-round`'s value as placeholders (every engine of the load test is taken to answer as
    the one that really ran, in every round); anything else as it is."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--url":
            out[i + 1] = _ENGINE_URL.sub(ENGINE_TOKEN, out[i + 1])
        elif arg == "--sample-round":
            out[i + 1] = ROUND_TOKEN
    return out


def input_paths(argv: Sequence[str]) -> list[str]:
    return _flag_values(argv, INPUT_FLAGS)


def tree_digest(paths: Iterable[Path]) -> str:
    """sha256 over every file under each path (or the file itself): relative names and bytes,
    in a fixed order; a path that does not exist counts as such (the run fails on it alike)."""
    h = hashlib.sha256()
    for root in paths:
        h.update(f"root {root}\n".encode())
        if root.is_file():
            h.update(b"file\n" + root.read_bytes())
            continue
        if not root.is_dir():
            h.update(b"missing\n")
            continue
        for f in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            data = f.read_bytes()
            h.update(f"{f.relative_to(root)} {len(data)}\n".encode())
            h.update(data)
    return h.hexdigest()


def source_dirs() -> list[Path]:
    """Where the packages a verify run executes live (without importing them)."""
    dirs: list[Path] = []
    for name in SOURCE_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"{name} is not installed in the runner's environment")
        dirs.extend(Path(p) for p in spec.submodule_search_locations)
    return dirs


def source_digest() -> str:
    return tree_digest(source_dirs())


def memo_key(
    argv: Sequence[str],
    env: Mapping[str, str],
    kind: str,
    fault: str | None,
    pod: PodPaths,
    sources: str,
    inputs: str,
    load: bool = False,
) -> str:
    """The run's key (pure): a change to any component is a different key (in load mode, an
    endpoint check's engine address and probe round aside: `load_normalise`)."""
    if load:
        argv = load_normalise(argv)
    norm_env = {
        k: POD_TOKEN if k == "HOSTNAME" and v == pod.pod_name else normalise(v, pod) for k, v in env.items()
    }
    doc = {
        "argv": [normalise(a, pod) for a in argv],
        "env": sorted(norm_env.items()),
        "image": {"kind": kind, "fault": fault},
        "sources": sources,
        "inputs": inputs,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Recorded:
    """A finished run as kept: its exit code, its termination log file, its output records
    ((stream, line) in the order read), all with the pod's paths as placeholders."""

    exit_code: int
    termination: str
    records: list[tuple[str, str]]
    seconds: float


class Memo:
    """The memo directory of one test session: KEY/run.json per finished run, and the ledger."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.load = (root / LOAD_MARKER).exists()

    @classmethod
    def of(cls, state_dir: Path) -> Memo | None:
        root = state_dir / MEMO_DIR
        return cls(root) if root.is_dir() else None

    def lookup(self, key: str) -> Recorded | None:
        try:
            doc = json.loads((self.root / key / "run.json").read_text())
        except (OSError, ValueError):
            return None
        return Recorded(
            int(doc["exit_code"]),
            str(doc["termination"]),
            [(str(s), str(line)) for s, line in doc["records"]],
            float(doc["seconds"]),
        )

    def store(self, key: str, run: Recorded) -> None:
        """Kept whole or not at all (a rename), so a concurrent lookup never reads half a run."""
        if not self.root.is_dir():
            return  # the session ended meanwhile
        doc = {
            "exit_code": run.exit_code,
            "termination": run.termination,
            "records": run.records,
            "seconds": run.seconds,
        }
        tmp: Path | None = None
        try:
            tmp = Path(tempfile.mkdtemp(prefix=".store-", dir=self.root))
            (tmp / "run.json").write_text(json.dumps(doc))
            os.rename(tmp, self.root / key)
        except OSError as e:
            # Another pod of the same key was first, or the session removed the memo meanwhile:
            # this run is simply not kept.
            log.info("verify memo: run %s not kept (%s)", key, e)
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    def note(self, outcome: str, key: str) -> None:
        with contextlib.suppress(OSError), (self.root / LEDGER).open("a") as f:
            f.write(f"{outcome} {key}\n")


@dataclass(frozen=True)
class MemoRun:
    """One run's place in the memo: its key, and its pod's paths."""

    memo: Memo
    key: str
    pod: PodPaths

    def lookup(self) -> Recorded | None:
        found = self.memo.lookup(self.key)
        self.memo.note("hit" if found else "miss", self.key)
        return found

    def store(self, code: int, termination_log: Path, records_file: Path, seconds: float) -> None:
        self.memo.store(self.key, recorded_from(code, termination_log, records_file, seconds, self.pod))


def read_ledger(root: Path) -> dict[str, int]:
    """{"hit": n, "miss": m} from a memo directory's ledger."""
    counts = {"hit": 0, "miss": 0}
    with contextlib.suppress(OSError):
        for line in (root / LEDGER).read_text().splitlines():
            outcome = line.split(" ", 1)[0]
            if outcome in counts:
                counts[outcome] += 1
    return counts


def recorded_from(
    code: int, termination_log: Path, records_file: Path, seconds: float, pod: PodPaths
) -> Recorded:
    """A finished run's files -> what the memo keeps (the pod's paths as placeholders)."""
    try:
        termination = termination_log.read_bytes().decode("utf-8", errors="surrogateescape")
    except OSError:
        termination = ""
    records = [
        (r.stream, normalise(r.line.decode("utf-8", errors="surrogateescape"), pod))
        for r in parse_records(records_file.read_bytes())
    ]
    return Recorded(code, normalise(termination, pod), records, seconds)


def write_replay(
    run: Recorded, pod: PodPaths, termination_log: Path, plain: Path, records_file: Path
) -> None:
    """A recorded run's termination log and output, written as the pod's own (its paths put
    back), in the formats OutputCapture writes (logs.py), stamped now."""
    termination_log.write_bytes(localise(run.termination, pod).encode("utf-8", errors="surrogateescape"))
    with plain.open("ab") as out, records_file.open("ab") as rec:
        for stream, text in run.records:
            line = localise(text, pod).encode("utf-8", errors="surrogateescape")
            out.write(line if line.endswith(b"\n") else line + b"\n")
            rec.write(record_line(stream, line))
