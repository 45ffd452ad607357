"""The runner's verify memo (clef_devcluster/runner/memo.py): which runs may be memoised, what
the key is made of (each component changes it; a pod's own paths do not), and that what is kept
replays as the pod's own output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clef_devcluster.runner import logs, memo

ARGV = ["clef-runtime", "verify", "--suite", "kernels", "--dtype", "f16", "--preset", "qwen3_5"]
POD = memo.PodPaths("/state/runs/ns_p1_verify_0", "/state/runs/ns_p1/volumes", "p1")
OTHER_POD = memo.PodPaths("/state/runs/ns2_p2_verify_0", "/state/runs/ns2_p2/volumes", "p2")


def env(pod: memo.PodPaths, **extra: str) -> dict[str, str]:
    return {
        "PATH": "/venv/bin:/usr/bin",
        "HOSTNAME": pod.pod_name,
        "CLEF_TERMINATION_LOG": f"{pod.run_dir}/termination-log",
        "TRITON_CACHE_DIR": f"{pod.volume_dir}/tmp/triton",
        "CLEF_VERIFY_DEVICE": "cpu",
        **extra,
    }


BASE: dict[str, Any] = {
    "argv": ARGV,
    "env": env(POD),
    "kind": "good",
    "fault": None,
    "pod": POD,
    "sources": "s" * 64,
    "inputs": "i" * 64,
}


def key(**change: Any) -> str:
    return memo.memo_key(**{**BASE, **change})


@pytest.mark.parametrize(
    "change",
    [
        {"argv": [*ARGV[:5], "bf16", *ARGV[6:]]},
        {"argv": [*ARGV, "--tolerance-scale", "2"]},
        {"env": env(POD, CLEF_RUNTIME_FAULT="beta_no_sigmoid")},
        {"env": env(POD, USER_SET="1")},
        {"env": {**env(POD), "PATH": "/other/bin"}},
        {"env": {**env(POD), "HOSTNAME": "someone-else"}},
        {"kind": "fault", "fault": "beta_no_sigmoid"},
        {"kind": "fault", "fault": "conv_key_band_zero"},
        {"sources": "t" * 64},
        {"inputs": "j" * 64},
    ],
    ids=[
        "dtype",
        "extra-flag",
        "fault-env",
        "user-env",
        "path",
        "hostname-not-the-pod",
        "fault-image",
        "another-fault",
        "sources",
        "inputs",
    ],
)
def test_every_component_changes_the_key(change: dict[str, Any]) -> None:
    assert key(**change) != key()


def test_a_pods_own_paths_and_name_do_not_change_the_key() -> None:
    assert key(env=env(OTHER_POD), pod=OTHER_POD) == key()
    # A path of the pod in the argv, too (a flag pointing into its /tmp).
    assert key(argv=[*ARGV, f"--config={POD.volume_dir}/tmp/c.json"]) == key(
        argv=[*ARGV, f"--config={OTHER_POD.volume_dir}/tmp/c.json"], env=env(OTHER_POD), pod=OTHER_POD
    )


@pytest.mark.parametrize(
    ("argv", "container", "ok"),
    [
        (ARGV, {}, True),
        (["/venv/bin/clef-runtime", *ARGV[1:]], {}, True),
        (["clef-runtime", "goldens", "--out", "-"], {}, False),
        (["python", "-c", "print(1)"], {}, False),
        ([*ARGV, "--report", "/tmp/r.json"], {}, False),
        ([*ARGV, "--report=/tmp/r.json"], {}, False),
        ([*ARGV, "--termination-log", "/tmp/t"], {}, False),
        (ARGV, {"readinessProbe": {"exec": {"command": ["true"]}}}, False),
        (["clef-runtime"], {}, False),
    ],
)
def test_only_verify_runs_whose_output_the_memo_keeps_are_eligible(
    argv: list[str], container: dict[str, Any], ok: bool
) -> None:
    assert memo.eligible(argv, container) is ok


def test_input_paths_are_read_from_both_flag_spellings() -> None:
    argv = [*ARGV, "--checkpoint", "/w/a", "--config=/w/c.json", "--seed", "3"]
    assert memo.input_paths(argv) == ["/w/a", "/w/c.json"]


def test_tree_digest_follows_names_and_bytes(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"\x00" * 16)
    first = memo.tree_digest([ckpt])
    assert memo.tree_digest([ckpt]) == first
    (ckpt / "model.safetensors").write_bytes(b"\x00" * 15 + b"\x01")
    changed = memo.tree_digest([ckpt])
    assert changed != first
    (ckpt / "model.safetensors").rename(ckpt / "other.safetensors")
    assert memo.tree_digest([ckpt]) not in (first, changed)
    assert memo.tree_digest([tmp_path / "missing"]) != memo.tree_digest([tmp_path / "missing2"])


def test_source_digest_covers_the_runtime_and_the_contract() -> None:
    names = {d.name for d in memo.source_dirs()}
    assert names == {"clef_runtime", "clef_contract"}


def test_a_kept_run_replays_as_the_new_pods_own(tmp_path: Path) -> None:
    """What a finished run wrote (records of both streams, a termination log naming the pod's
    paths) comes back in another pod with that pod's paths, in OutputCapture's formats."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    records = first / "run.cri"
    records.write_bytes(
        logs.record_line("stdout", f'{{"cache": "{POD.volume_dir}/tmp/triton"}}\n'.encode())
        + logs.record_line("stderr", b"verify: fail: 1 of 9 checks\n")
        + logs.record_line("stdout", b"no newline at the end")
    )
    (first / "termination-log").write_text(f"fail {POD.run_dir}")
    kept = memo.recorded_from(1, first / "termination-log", records, 12.5, POD)
    assert POD.volume_dir not in str(kept.records) and POD.run_dir not in kept.termination

    store = memo.Memo(tmp_path / "memo")
    store.root.mkdir()
    store.store("k", kept)
    back = store.lookup("k")
    assert back == kept
    assert store.lookup("absent") is None

    plain, cri = second / "run.log", second / "run.cri"
    memo.write_replay(back, OTHER_POD, second / "termination-log", plain, cri)
    assert (second / "termination-log").read_text() == f"fail {OTHER_POD.run_dir}"
    assert plain.read_text() == (
        f'{{"cache": "{OTHER_POD.volume_dir}/tmp/triton"}}\nverify: fail: 1 of 9 checks\nno newline at the end\n'
    )
    replayed = logs.parse_records(cri.read_bytes())
    assert [(r.stream, r.line) for r in replayed] == [
        ("stdout", f'{{"cache": "{OTHER_POD.volume_dir}/tmp/triton"}}\n'.encode()),
        ("stderr", b"verify: fail: 1 of 9 checks\n"),
        ("stdout", b"no newline at the end"),
    ]


def test_the_ledger_counts_hits_and_misses(tmp_path: Path) -> None:
    store = memo.Memo(tmp_path)
    run = memo.MemoRun(store, "k1", POD)
    assert run.lookup() is None
    store.store("k1", memo.Recorded(0, "pass", [], 1.0))
    assert run.lookup() is not None
    assert memo.MemoRun(store, "k2", POD).lookup() is None
    assert memo.read_ledger(tmp_path) == {"hit": 1, "miss": 2}


def test_no_memo_without_the_sessions_directory(tmp_path: Path) -> None:
    assert memo.Memo.of(tmp_path) is None
    (tmp_path / memo.MEMO_DIR).mkdir(parents=True)
    found = memo.Memo.of(tmp_path)
    assert found is not None and found.root == tmp_path / memo.MEMO_DIR


def test_a_second_store_of_one_key_keeps_the_first_and_a_gone_memo_keeps_nothing(tmp_path: Path) -> None:
    store = memo.Memo(tmp_path / "memo")
    store.root.mkdir()
    first, second = memo.Recorded(0, "first", [], 1.0), memo.Recorded(0, "second", [], 2.0)
    store.store("k", first)
    store.store("k", second)  # two pods of one key ran at once: the later one is not kept
    assert store.lookup("k") == first
    assert [p.name for p in store.root.iterdir()] == ["k"], "no half-written entry is left behind"
    store.root.joinpath("k", "run.json").unlink()
    store.root.joinpath("k").rmdir()
    store.root.rmdir()  # the session ended while a run was finishing
    store.store("k", first)
    assert not store.root.exists()


CHECK = ["clef-runtime", "endpoint-check", "--url", "http://127.16.0.4:2000", "--goldens", "/g/goldens.json.gz",
         "--goldens-sha256", "sha256:" + "a" * 64, "--dialect", "candle-vllm", "--timeout", "120"]  # fmt: skip
PROBE = [*CHECK, "--sample", "1", "--sample-round", "0"]
GOLDENS = ["clef-runtime", "goldens", "--checkpoint", "/models/clef-flash", "--dtype", "f16", "--out", "-"]


@pytest.mark.parametrize("argv", [CHECK, PROBE, GOLDENS], ids=["comparison", "probe", "goldens"])
def test_goldens_and_endpoint_checks_are_memoised_in_load_mode_only(argv: list[str]) -> None:
    assert not memo.eligible(argv, {})
    assert memo.eligible(argv, {}, load=True)
    assert not memo.eligible([*argv, "--report", "/r.json"], {}, load=True)
    assert not memo.eligible(argv, {"readinessProbe": {"exec": {}}}, load=True)


def with_value(argv: list[str], flag: str, value: str) -> list[str]:
    i = argv.index(flag)
    return [*argv[: i + 1], value, *argv[i + 2 :]]


def test_a_load_mode_key_leaves_out_the_engines_address_and_the_probes_round_only() -> None:
    other = with_value(with_value(PROBE, "--url", "http://10.244.3.9:2000"), "--sample-round", "7")
    assert key(argv=PROBE, load=True) == key(argv=other, load=True)
    assert key(argv=PROBE) != key(argv=other), "outside load mode both count"
    for flag, value in (("--dialect", "vllm"), ("--goldens-sha256", "sha256:" + "b" * 64), ("--sample", "2"),
                        ("--url", "http://127.16.0.4:2001/v1")):  # fmt: skip
        assert key(argv=PROBE, load=True) != key(argv=with_value(PROBE, flag, value), load=True), flag
    assert key(argv=CHECK, load=True) != key(argv=PROBE, load=True), "a probe is not the comparison"
    assert memo.load_normalise(PROBE[:3]) == PROBE[:3]


def test_load_mode_is_a_file_in_the_memo_directory(tmp_path: Path) -> None:
    (tmp_path / memo.MEMO_DIR).mkdir(parents=True)
    found = memo.Memo.of(tmp_path)
    assert found is not None and not found.load
    (tmp_path / memo.MEMO_DIR / memo.LOAD_MARKER).touch()
    found = memo.Memo.of(tmp_path)
    assert found is not None and found.load
