"""The stand-in kubelet's pure parts: engine argv translation, pod addresses, volume paths, probe
thresholds, serve entries of the image table, and kwok's stages agreeing with the runner on which
pods are whose (docs/local-cluster.md)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from clef_builders import make_spec

from clef_devcluster.config import ENGINE_IMAGE_PREFIX, MANIFESTS_DIR
from clef_devcluster.images import ImageEntry, default_digest, seed_table
from clef_devcluster.runner import engine, logs, volumes
from clef_devcluster.runner.network import BlockClaim, PodAddresses, PoolExhausted
from clef_devcluster.runner.probes import Probe, ProbeSet, resolve_port
from clef_devcluster.runner.watch import runs_here
from clef_operator.render import engine_argv


def serve_entry(tag: str = "1", dialect: str = "candle-vllm", **extra: Any) -> ImageEntry:
    repo = {"candle-vllm": "candle-vllm", "vllm": "vllm", "mistralrs": "mistralrs", "openai": "clef-runtime"}[
        dialect
    ]
    ref = f"{ENGINE_IMAGE_PREFIX}{repo}:{tag}"
    return ImageEntry(ref, "serve", default_digest(ref), dialect=dialect, **extra)


MOUNTS = [volumes.Mount("/models/flash", "/srv/weights/flash"), volumes.Mount("/tmp", "/run/pod/tmp")]


def host(path: str) -> str:
    return volumes.host_path(MOUNTS, path)


# -- engine argv ---------------------------------------------------------------------------------


def test_candle_vllm_argv_as_render_writes_it() -> None:
    argv = ["candle-vllm", "--w", "/models/flash/", "--dtype", "f16", "--d", "0,1",
            "--gpu-memory-fraction", "0.7", "--h", "0.0.0.0", "--p", "8000"]  # fmt: skip
    cmd = engine.translate(argv, serve_entry(), "127.16.0.9", host)
    assert cmd.argv == ["clef-runtime", "serve", "--dialect", "candle-vllm", "--checkpoint", "/srv/weights/flash",
                        "--host", "127.16.0.9", "--port", "8000", "--dtype", "f16", "--ops", "reference",
                        "--device", "cpu"]  # fmt: skip
    assert cmd.port == 8000
    assert cmd.ignored == ["--d=0,1", "--gpu-memory-fraction=0.7"]


def test_a_faulty_engine_runs_the_triton_kernels_where_the_faults_live() -> None:
    cmd = engine.translate(
        ["candle-vllm", "--w=/models/flash"], serve_entry(fault="conv_key_band_zero"), "127.16.0.2", host
    )
    assert cmd.argv[cmd.argv.index("--ops") + 1] == "triton"
    # candle-vllm's defaults: port 2000, bf16.
    assert cmd.port == 2000 and cmd.argv[cmd.argv.index("--dtype") + 1] == "bf16"


def test_candle_vllm_model_id_is_the_served_name() -> None:
    cmd = engine.translate(
        ["candle-vllm", "--m", "clef-flash", "--w", "/models/flash"], serve_entry(), "127.16.0.2", host
    )
    assert cmd.argv[-2:] == ["--model-name", "clef-flash"]


def test_vllm_argv_as_render_writes_it() -> None:
    argv = ["vllm", "serve", "/models/flash", "--served-model-name", "coder", "--dtype", "float16",
            "--tensor-parallel-size", "2", "--kv-cache-memory-bytes", "1000", "--enforce-eager",
            "--host", "0.0.0.0", "--port", "8001", "--chat-template", "/tmp/t.jinja"]  # fmt: skip
    cmd = engine.translate(argv, serve_entry(dialect="vllm"), "127.16.0.3", host)
    assert cmd.argv == ["clef-runtime", "serve", "--dialect", "vllm", "--checkpoint", "/srv/weights/flash",
                        "--host", "127.16.0.3", "--port", "8001", "--dtype", "f16", "--ops", "reference",
                        "--device", "cpu", "--model-name", "coder", "--chat-template", "/run/pod/tmp/t.jinja"]  # fmt: skip
    assert cmd.ignored == ["--tensor-parallel-size=2", "--kv-cache-memory-bytes=1000", "--enforce-eager"]


def test_vllm_serves_the_path_as_the_model_name_unless_told(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"torch_dtype": "float32"}')
    cmd = engine.translate(["vllm", "serve", str(tmp_path)], serve_entry(dialect="vllm"), "127.16.0.3", str)
    assert cmd.argv[-2:] == ["--model-name", str(tmp_path)]
    # --dtype auto (the default) is the checkpoint's own dtype.
    assert cmd.argv[cmd.argv.index("--dtype") + 1] == "f32" and cmd.port == 8000


def test_clef_engine_keeps_its_flags_and_moves_address_and_paths() -> None:
    argv = ["clef-runtime", "serve", "--checkpoint", "/models/flash", "--dtype", "f16", "--host", "0.0.0.0"]
    cmd = engine.translate(argv, serve_entry(dialect="openai"), "127.16.0.4", host)
    assert cmd.argv == ["clef-runtime", "serve", "--checkpoint", "/srv/weights/flash", "--host", "127.16.0.4",
                        "--port", "8000", "--dtype", "f16", "--dialect", "openai"]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "dialect", "error"),
    [
        (["candle-vllm", "--p", "8000"], "candle-vllm", "--w"),
        (["candle-vllm", "--w", "/m", "--p", "http"], "candle-vllm", "not a number"),
        (["candle-vllm", "--w", "/m", "--dtype", "f8"], "candle-vllm", "--dtype 'f8'"),
        (["vllm", "chat"], "vllm", "vllm serve"),
        (["vllm", "serve"], "vllm", "the model"),
        (["vllm", "serve", "/m"], "candle-vllm", "not the engine of this image"),
    ],
)
def test_engine_argv_that_cannot_be_served_is_an_error(argv: list[str], dialect: str, error: str) -> None:
    with pytest.raises(engine.EngineArgvError, match=error.replace("(", r"\(")):
        engine.translate(argv, serve_entry(dialect=dialect), "127.16.0.2", str)


def _image_text_config(directory: Path, **config: Any) -> Callable[[str], str]:
    """`directory` holding a config.json, mounted at /models/flash: the host path of a path."""
    (directory / "config.json").write_text(json.dumps(config))
    return lambda p: volumes.host_path([volumes.Mount("/models/flash", str(directory))], p)


IMAGE_TEXT = {"model_type": "qwen3_5", "text_config": {}, "vision_config": {}}


def test_mistralrs_argv_as_the_preset_renders_it(tmp_path: Path) -> None:
    spec = make_spec(
        engine="mistralrs", gpuMemoryMiB=32768, dtype="bf16", model={"name": "flash", "path": "/models/flash"}
    )
    argv = engine_argv(spec)
    cmd = engine.translate(
        argv, serve_entry(dialect="mistralrs"), "127.16.0.5", _image_text_config(tmp_path, **IMAGE_TEXT)
    )
    assert cmd.argv == ["clef-runtime", "serve", "--dialect", "mistralrs", "--checkpoint", str(tmp_path),
                        "--host", "127.16.0.5", "--port", "8000", "--dtype", "bf16", "--ops", "reference",
                        "--device", "cpu", "--model-name", "default"]  # fmt: skip
    assert cmd.port == 8000
    memory = argv[argv.index("--pa-memory-mb") + 1]
    assert sorted(cmd.ignored) == sorted([f"--pa-memory-mb={memory}", "--prefix-cache-n=0"])


def test_mistralrs_defaults_short_flags_and_model_type(tmp_path: Path) -> None:
    """Port 1234 and dtype auto (bf16 on a CPU) are mistral.rs's defaults; `-m`, `-p` and the
    `multimodal` model type are its own spellings."""
    host_of = _image_text_config(tmp_path, **IMAGE_TEXT)
    entry = serve_entry(dialect="mistralrs", fault="conv_key_band_zero")
    cmd = engine.translate(
        ["mistralrs", "serve", "--cpu", "-m", "/models/flash"], entry, "127.16.0.5", host_of
    )
    flags = dict(zip(cmd.argv[2::2], cmd.argv[3::2], strict=True))
    assert (cmd.port, flags["--port"], flags["--dtype"], flags["--ops"]) == (1234, "1234", "bf16", "triton")
    assert cmd.ignored == ["--cpu"]
    argv = ["mistralrs", "serve", "-p", "9000", "multimodal", "-m", "/models/flash", "--dtype", "F16"]
    cmd = engine.translate(argv, entry, "127.16.0.5", host_of)
    assert (cmd.port, cmd.argv[cmd.argv.index("--dtype") + 1]) == (9000, "f16")


@pytest.mark.parametrize(
    ("args", "config", "error"),
    [
        (["run", "-m", "/models/flash"], IMAGE_TEXT, "only `mistralrs serve"),
        (["serve", "--port", "8000"], IMAGE_TEXT, "-m/--model-id"),
        # The preset's flag given again in spec.args: clap refuses it, whatever the spelling.
        (["serve", "-m", "/models/flash", "--prefix-cache-n", "0", "--prefix-cache-n=16"], IMAGE_TEXT,
         "'--prefix-cache-n' cannot be used multiple times"),
        (["serve", "-m", "/models/flash", "-p", "1", "--port", "2"], IMAGE_TEXT, "'--port' cannot be used"),
        (["serve", "text", "-m", "/models/flash"], IMAGE_TEXT, "model type 'text'"),
        (["serve", "-m", "/models/flash", "--dtype", "f8"], IMAGE_TEXT, "Model DType `f8` is not supported"),
        (["serve", "-m", "/models/flash"], {"model_type": "qwen3_5_text"}, "image-and-text layout"),
        (["serve", "-m", "/models/flash", "-c", "/models/flash/t.json"], IMAGE_TEXT, "a Jinja file only"),
    ],
)  # fmt: skip
def test_mistralrs_argv_that_mistralrs_would_refuse_is_an_error(
    tmp_path: Path, args: list[str], config: dict[str, Any], error: str
) -> None:
    host_of = _image_text_config(tmp_path, **config)
    with pytest.raises(engine.EngineArgvError, match=re.escape(error)):
        engine.translate(["mistralrs", *args], serve_entry(dialect="mistralrs"), "127.16.0.5", host_of)


def test_only_the_images_engine_is_served_other_programs_run() -> None:
    candle, clef = serve_entry(), serve_entry(dialect="openai")
    assert engine.is_engine_command(["candle-vllm", "--w", "/m"], candle)
    assert engine.is_engine_command(["/usr/local/bin/candle-vllm"], candle)
    assert not engine.is_engine_command(["clef-runtime", "verify"], candle)
    assert engine.is_engine_command(["clef-runtime", "serve"], clef)
    assert not engine.is_engine_command(["clef-runtime", "goldens"], clef)
    good = ImageEntry("r.test/x:1", "good", default_digest("x"))
    assert not engine.is_engine_command(["candle-vllm"], good)


def test_a_failing_engine_is_a_stand_in_that_fails() -> None:
    cmd = engine.translate(["candle-vllm", "--w", "/models/flash"], serve_entry(), "127.16.0.2", host)
    crash = engine.failing_argv(serve_entry(failure="crash"), cmd)
    assert crash[:2] == ["python", "-c"] and "sys.exit" in crash[2] and "/srv/weights/flash" in crash[2]
    hang = engine.failing_argv(serve_entry(failure="never-ready"), cmd)
    assert "sleep" in hang[2] and "sys.exit" not in hang[2]


# -- pod addresses -------------------------------------------------------------------------------


def test_addresses_are_unique_loopback_and_never_127_0_0_1() -> None:
    pool = PodAddresses(16)
    ips = [pool.allocate(f"uid-{i}") for i in range(600)]
    assert len(set(ips)) == 600
    assert all(ip.startswith("127.16.") and not ip.endswith((".0", ".255")) for ip in ips)
    assert pool.allocate("uid-3") == ips[3], "a pod keeps its address"


def test_a_released_address_is_not_handed_out_again_at_once() -> None:
    pool = PodAddresses(20)
    first = pool.allocate("a")
    pool.release("a")
    assert pool.allocate("b") != first


def test_a_pod_keeps_the_address_in_its_status_after_a_runner_restart() -> None:
    pool = PodAddresses(16)
    assert pool.allocate("a", previous="127.16.3.7") == "127.16.3.7"
    assert pool.allocate("b", previous="127.16.3.7") != "127.16.3.7", "taken"
    assert pool.allocate("c", previous="127.17.0.1") != "127.17.0.1", "another runner's block"
    assert pool.allocate("d", previous="10.244.0.5").startswith("127.16.")


def test_blocks_outside_the_range_are_refused() -> None:
    for block in (0, 15, 255):
        with pytest.raises(ValueError):
            PodAddresses(block)


def test_two_runners_never_claim_one_block(tmp_path: Path) -> None:
    a = BlockClaim.claim(tmp_path, preferred=40)
    try:
        b = BlockClaim.claim(tmp_path, preferred=40)
        try:
            assert a.block == 40 and b.block != 40
        finally:
            b.release()
    finally:
        a.release()
    c = BlockClaim.claim(tmp_path, preferred=40)
    assert c.block == 40, "a released block is free again"
    c.release()


def test_an_exhausted_pool_says_so() -> None:
    pool = PodAddresses(16)
    pool.size = 3
    for i in range(3):
        pool.allocate(str(i))
    with pytest.raises(PoolExhausted):
        pool.allocate("x")


# -- volumes -------------------------------------------------------------------------------------


def test_paths_under_a_mount_move_to_the_host_by_the_deepest_mount() -> None:
    mounts = [*MOUNTS, volumes.Mount("/models/flash/tokenizer", "/elsewhere")]
    assert volumes.host_path(mounts, "/models/flash") == "/srv/weights/flash"
    assert volumes.host_path(mounts, "/models/flash/config.json") == "/srv/weights/flash/config.json"
    assert volumes.host_path(mounts, "/models/flash/tokenizer/x") == "/elsewhere/x"
    assert volumes.host_path(mounts, "/models/flashy") == "/models/flashy", "a prefix is not a parent"
    assert volumes.host_path(mounts, "/etc/hosts") == "/etc/hosts"


def test_arguments_and_flag_values_are_rewritten_but_not_other_text() -> None:
    assert volumes.rewrite("/tmp/triton", MOUNTS) == "/run/pod/tmp/triton"
    assert volumes.rewrite("--checkpoint=/models/flash", MOUNTS) == "--checkpoint=/srv/weights/flash"
    assert volumes.rewrite("see /tmp/x", MOUNTS) == "see /tmp/x"
    assert volumes.rewrite("KEY=/tmp/x", MOUNTS) == "KEY=/tmp/x", "only a flag's value"


def _pod(
    volume_list: list[dict[str, Any]], mounts: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    container = {"name": "c", "volumeMounts": mounts}
    return {
        "metadata": {"namespace": "ns"},
        "spec": {"volumes": volume_list, "containers": [container]},
    }, container


def test_config_map_keys_become_files_honouring_items(tmp_path: Path) -> None:
    objects = {
        ("ns", "configmaps", "goldens"): {
            "data": {"goldens.json": '{"a": 1}', "other": "x"},
            "binaryData": {"blob": base64.b64encode(b"\x00\x01").decode()},
        },
        ("ns", "secrets", "token"): {"data": {"t": base64.b64encode(b"s3cret").decode()}},
    }
    pod, container = _pod(
        [
            {"name": "all", "configMap": {"name": "goldens"}},
            {
                "name": "some",
                "configMap": {"name": "goldens", "items": [{"key": "goldens.json", "path": "g/v1.json"}]},
            },
            {"name": "tok", "secret": {"secretName": "token"}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "sa", "projected": {"sources": []}},
        ],
        [
            {"name": "all", "mountPath": "/etc/all"},
            {"name": "some", "mountPath": "/etc/goldens"},
            {"name": "tok", "mountPath": "/var/run/tok"},
            {"name": "scratch", "mountPath": "/tmp"},
            {"name": "sa", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
        ],
    )
    mounts = volumes.set_up(pod, container, tmp_path, lambda ns, kind, name: objects.get((ns, kind, name)))
    assert Path(volumes.host_path(mounts, "/etc/all/goldens.json")).read_text() == '{"a": 1}'
    assert Path(volumes.host_path(mounts, "/etc/all/blob")).read_bytes() == b"\x00\x01"
    assert Path(volumes.host_path(mounts, "/etc/goldens/g/v1.json")).read_text() == '{"a": 1}'
    assert not Path(volumes.host_path(mounts, "/etc/goldens/other")).exists(), "items: only those keys"
    assert Path(volumes.host_path(mounts, "/var/run/tok/t")).read_bytes() == b"s3cret"
    assert Path(volumes.host_path(mounts, "/tmp")).is_dir()
    sa = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert volumes.host_path(mounts, sa) == sa, "a projected volume is not mounted"


@pytest.mark.parametrize(
    ("volume", "error"),
    [
        ({"configMap": {"name": "missing"}}, 'configMap "missing" not found'),
        (
            {"configMap": {"name": "cm", "items": [{"key": "nope", "path": "x"}]}},
            "non-existent config key: nope",
        ),
        ({"configMap": {"name": "cm", "items": [{"key": "k", "path": "../x"}]}}, "must be relative"),
        ({"hostPath": {"path": "/no/such/dir", "type": "Directory"}}, "is not a directory"),
    ],
)
def test_a_volume_that_cannot_be_set_up_says_why(tmp_path: Path, volume: dict[str, Any], error: str) -> None:
    pod, container = _pod([{"name": "v", **volume}], [{"name": "v", "mountPath": "/v"}])
    cms = {("ns", "configmaps", "cm"): {"data": {"k": "v"}}}
    with pytest.raises(volumes.MountError, match=error.replace("(", r"\(")):
        volumes.set_up(pod, container, tmp_path, lambda ns, kind, name: cms.get((ns, kind, name)))


def test_an_optional_config_map_that_is_missing_is_an_empty_directory(tmp_path: Path) -> None:
    pod, container = _pod(
        [{"name": "v", "configMap": {"name": "gone", "optional": True}}], [{"name": "v", "mountPath": "/v"}]
    )
    mounts = volumes.set_up(pod, container, tmp_path, lambda *_: None)
    assert list(Path(volumes.host_path(mounts, "/v")).iterdir()) == []


def test_sub_path_and_host_path(tmp_path: Path) -> None:
    pod, container = _pod(
        [{"name": "m", "hostPath": {"path": str(tmp_path), "type": "Directory"}}],
        [{"name": "m", "mountPath": "/models/x", "subPath": "v1"}],
    )
    assert volumes.set_up(pod, container, tmp_path / "scratch", lambda *_: None) == [
        volumes.Mount("/models/x", str(tmp_path / "v1"))
    ]


# -- probes --------------------------------------------------------------------------------------

CONTAINER = {"name": "engine", "ports": [{"name": "http", "containerPort": 8000}]}


def test_probe_ports_by_name_or_number() -> None:
    assert resolve_port("http", CONTAINER) == 8000
    assert resolve_port(9000, CONTAINER) == 9000
    assert resolve_port("9001", CONTAINER) == 9001
    with pytest.raises(ValueError, match="not a named port"):
        resolve_port("metrics", CONTAINER)


def test_thresholds_count_consecutive_results() -> None:
    probe = Probe.from_spec(
        "readiness", {"httpGet": {"port": "http"}, "failureThreshold": 3, "successThreshold": 2}, CONTAINER
    )
    assert probe is not None and probe.port == 8000
    assert probe.record(True) is None, "one success of two"
    assert probe.record(True) is True
    assert probe.record(False) is None and probe.record(False) is None
    assert probe.record(True) is None, "a success in between starts the count again"
    assert [probe.record(False) for _ in range(3)] == [None, None, False]


def test_startup_gates_readiness_and_liveness() -> None:
    spec = {**CONTAINER}
    for kind in ("startup", "readiness", "liveness"):
        spec[f"{kind}Probe"] = {"httpGet": {"port": "http", "path": "/health"}, "periodSeconds": 10}
    probes = ProbeSet.for_container(spec)
    probes.reset(100.0)
    assert [p.kind for p in probes.due(100.0)] == ["startup"]
    assert not probes.started and not probes.ready
    assert probes.startup is not None
    probes.startup.record(True)
    assert probes.started and not probes.ready, "ready waits for the readiness probe"
    assert [p.kind for p in probes.due(100.0)] == ["readiness", "liveness"]


def test_no_probes_means_ready_when_running() -> None:
    probes = ProbeSet.for_container(CONTAINER)
    assert not probes.any and probes.started and probes.ready


def test_an_exec_probe_is_not_run_and_never_succeeds() -> None:
    probes = ProbeSet.for_container(
        {**CONTAINER, "readinessProbe": {"exec": {"command": ["true"]}, "failureThreshold": 1}}
    )
    probes.reset(0.0)
    _, kill = probes.tick("127.16.0.1", now=0.0)
    assert kill is None and not probes.ready
    assert probes.readiness is not None and "not supported" in probes.readiness.last_message


def test_a_failed_liveness_probe_kills_the_container() -> None:
    probes = ProbeSet.for_container(
        {**CONTAINER, "livenessProbe": {"tcpSocket": {"port": 1}, "failureThreshold": 1, "timeoutSeconds": 1}}
    )
    probes.reset(0.0)
    _, kill = probes.tick("127.0.0.1", now=0.0)
    assert kill is not None and kill.startswith("Container failed liveness probe")


# -- the image table and who runs which pod ------------------------------------------------------


def test_an_engine_that_goes_bad_after_n_requests_starts_on_the_reference_ops() -> None:
    entry = serve_entry(fault="conv_key_band_zero", fault_after=4)
    cmd = engine.translate(["candle-vllm", "--w=/models/flash"], entry, "127.16.0.2", host)
    assert cmd.argv[cmd.argv.index("--ops") + 1] == "reference", "right until the fault turns on"
    assert cmd.argv[-2:] == ["--fault-after", "4"]
    clef = engine.translate(["clef-runtime", "serve", "--checkpoint", "/models/flash"],
                            serve_entry(dialect="openai", fault="conv_key_band_zero", fault_after=0), "127.16.0.2",
                            host)  # fmt: skip
    assert clef.argv[clef.argv.index("--fault-after") + 1] == "0"
    assert ImageEntry.from_dict(entry.to_dict()) == entry and entry.to_dict()["faultAfter"] == 4
    for bad in ({"fault_after": 4}, {"fault_after": -1, "fault": "conv_key_band_zero"},
                {"fault_after": 1, "fault": "conv_key_band_zero", "ops": "triton"}):  # fmt: skip
        with pytest.raises(ValueError, match="faultAfter"):
            serve_entry(**bad)
    with pytest.raises(ValueError, match="for kind serve only"):
        ImageEntry("r.test/x:1", "fault", default_digest("x"), fault="conv_key_band_zero", fault_after=1)


def test_serve_entries_are_validated() -> None:
    ok = serve_entry(fault="conv_key_band_zero")
    assert ImageEntry.from_dict(ok.to_dict()) == ok
    ref = "registry.clef.test/candle-vllm:1"
    with pytest.raises(ValueError, match="must start with"):
        ImageEntry(ref, "serve", default_digest(ref), dialect="candle-vllm")
    with pytest.raises(ValueError, match="dialect"):
        serve_entry(dialect="candle-vllm").__class__(
            f"{ENGINE_IMAGE_PREFIX}x:1", "serve", default_digest("x"), dialect="tgi"
        )
    with pytest.raises(ValueError, match="failure"):
        serve_entry(failure="slow")
    with pytest.raises(ValueError, match="for kind serve only"):
        ImageEntry("r.test/x:1", "good", default_digest("x"), dialect="vllm")


def test_the_seed_has_the_homelab_engines() -> None:
    table = seed_table()
    broken = table.lookup(f"{ENGINE_IMAGE_PREFIX}candle-vllm:0.9.0")
    fixed = table.lookup(f"{ENGINE_IMAGE_PREFIX}candle-vllm:0.9.1")
    coder = table.lookup(f"{ENGINE_IMAGE_PREFIX}vllm:0.11.0")
    assert broken and broken.kind == "serve" and broken.fault == "conv_key_band_zero"
    assert fixed and fixed.kind == "serve" and fixed.fault is None and fixed.dialect == "candle-vllm"
    assert coder and coder.dialect == "vllm"
    mistralrs = table.lookup(f"{ENGINE_IMAGE_PREFIX}mistralrs:0.8.1")
    faulty = table.lookup(f"{ENGINE_IMAGE_PREFIX}mistralrs:0.8.1-conv_key_band_zero")
    assert mistralrs and mistralrs.dialect == "mistralrs" and mistralrs.fault is None
    assert faulty and faulty.dialect == "mistralrs" and faulty.fault == "conv_key_band_zero"
    assert mistralrs.engine_binary == faulty.engine_binary == "mistralrs"
    assert all(e.ref.startswith(ENGINE_IMAGE_PREFIX) for e in table.entries if e.kind == "serve")


def _pod_for(image: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"labels": labels or {}},
        "spec": {"containers": [{"name": "a", "image": "busybox"}, {"name": "b", "image": image}]},
    }


def test_the_runner_takes_verification_pods_and_engine_image_pods() -> None:
    assert runs_here(_pod_for("r.test/x:1", {"clef.riotpiao.com/component": "verification"}))
    assert runs_here(
        _pod_for(f"{ENGINE_IMAGE_PREFIX}vllm@sha256:" + "a" * 64, {"clef.riotpiao.com/component": "serving"})
    )
    assert not runs_here(
        _pod_for("registry.clef.test/clef-runtime:1.0", {"clef.riotpiao.com/component": "serving"})
    )


def test_kwok_stages_leave_alone_exactly_what_the_runner_takes() -> None:
    """Every pod stage excludes both kinds of runner pods, by the same label and prefix."""
    stages = [d for d in yaml.safe_load_all((MANIFESTS_DIR / "kwok-stages.yaml").read_text()) if d]
    pod_stages = [s for s in stages if s["spec"]["resourceRef"]["kind"] == "Pod"]
    assert pod_stages
    for stage in pod_stages:
        keys = {e["key"]: e for e in stage["spec"]["selector"]["matchExpressions"]}
        label = keys['.metadata.labels["clef.riotpiao.com/component"]']
        assert (label["operator"], label["values"]) == ("NotIn", ["verification"])
        image = keys[f'[.spec.containers[].image | startswith("{ENGINE_IMAGE_PREFIX}")] | any']
        assert (image["operator"], image["values"]) == ("NotIn", ["true"]), stage["metadata"]["name"]


# -- logs ----------------------------------------------------------------------------------------

RECORDS = [
    logs.Record("2026-12-01T10:00:00.000000Z", "stderr", b"loading\n"),
    logs.Record("2026-12-01T10:00:01.000000Z", "stdout", b'{"a": 1}\n'),
    logs.Record("2026-12-01T10:00:02.000000Z", "stderr", b"done"),
]


def test_records_round_trip_with_and_without_a_final_newline() -> None:
    data = b"".join(logs.record_line(r.stream, r.line, r.time) for r in RECORDS)
    assert data.count(b"\n") == 3, "one file line per record"
    assert logs.parse_records(data) == RECORDS


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", b'loading\n{"a": 1}\ndone'),
        ("tailLines=1", b"done"),
        ("tailLines=0", b""),
        ("limitBytes=4", b"load"),
        ("stream=Stdout", b'{"a": 1}\n'),
        ("stream=Stderr&tailLines=1", b"done"),
        ("sinceTime=2026-12-01T10:00:01Z", b'{"a": 1}\ndone'),
        ("timestamps=true&tailLines=1", b"2026-12-01T10:00:02.000000Z done"),
        ("timestamps=true&limitBytes=30", b"2026-12-01T10:00:00.000000Z lo"),
    ],
)
def test_what_the_log_endpoint_answers(query: str, expected: bytes) -> None:
    assert logs.select(RECORDS, logs.LogQuery.parse(query)) == expected


def test_bad_log_queries_are_refused() -> None:
    for query in ("tailLines=-1", "stream=Both", "limitBytes=x"):
        with pytest.raises(ValueError):
            logs.LogQuery.parse(query)
    since = logs.LogQuery.parse("sinceSeconds=60", now=datetime(2026, 12, 1, 10, 1, 1, tzinfo=UTC)).since
    assert since == datetime(2026, 12, 1, 10, 0, 1, tzinfo=UTC)


def test_which_run_a_log_request_means() -> None:
    index = logs.LogIndex()
    with pytest.raises(logs.LogError, match="has no container"):
        logs.choose_run(index.lookup("ns", "p", "c"), "ns", "p", "c", previous=False)
    index.waiting("ns", "p", "c", "ImagePullBackOff")
    with pytest.raises(logs.LogError, match="is waiting to start: ImagePullBackOff"):
        logs.choose_run(index.lookup("ns", "p", "c"), "ns", "p", "c", previous=False)
    index.started("ns", "p", "c", Path("/r0.cri"))
    with pytest.raises(logs.LogError, match="previous terminated container"):
        logs.choose_run(index.lookup("ns", "p", "c"), "ns", "p", "c", previous=True)
    index.started("ns", "p", "c", Path("/r1.cri"))
    assert logs.choose_run(index.lookup("ns", "p", "c"), "ns", "p", "c", previous=False) == Path("/r1.cri")
    assert logs.choose_run(index.lookup("ns", "p", "c"), "ns", "p", "c", previous=True) == Path("/r0.cri")
    index.forget("ns", "p")
    assert index.lookup("ns", "p", "c") is None


def test_output_capture_keeps_a_long_line_whole_and_both_streams(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "print('a' * 300000, flush=True)\n"
        "print('err', file=sys.stderr, flush=True)\n"
        "sys.stdout.write('tail')\n"
    )
    plain, records = tmp_path / "c.log", tmp_path / "c.cri"
    capture = logs.OutputCapture(plain, records)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    capture.start(proc.stdout, proc.stderr)
    assert proc.wait(timeout=60) == 0
    capture.close()
    parsed = logs.parse_records(records.read_bytes())
    assert sorted((r.stream, r.line) for r in parsed) == [
        ("stderr", b"err\n"), ("stdout", b"a" * 300000 + b"\n"), ("stdout", b"tail")
    ]  # fmt: skip
    assert sorted(plain.read_bytes().splitlines()) == sorted([b"a" * 300000, b"err", b"tail"])
