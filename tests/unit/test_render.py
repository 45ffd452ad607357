"""Manifest rendering: engine presets, the verification Job, the Service, revisions."""

from __future__ import annotations

import pytest
from clef_builders import GOOD, GOOD2, make_spec, verification_job

from clef_operator import labels
from clef_operator.render import (
    Owner,
    engine_argv,
    render_deployment,
    render_service,
    render_serving_pod_spec,
    render_verification_pod_spec,
    serving_revision,
    verify_argv,
)
from clef_operator.renderings import verification_key
from clef_operator.revision import digest_of, job_name, pinned_reference, repository

OWNER = Owner("clef-flash", "homelab", "uid-1")
PINNED = "registry.clef.test/clef-runtime@sha256:" + "a" * 64


def test_candle_vllm_preset():
    argv = engine_argv(make_spec(args=["--max-num-seqs", "8"]))
    assert argv == [
        "candle-vllm",
        "--w",
        "/models/clef-flash/",
        "--dtype",
        "f16",
        "--d",
        "0",
        "--gpu-memory-fraction",
        "0.3",
        "--h",
        "0.0.0.0",
        "--p",
        "8000",
        "--max-num-seqs",
        "8",
    ]


def test_candle_vllm_tensor_parallel_lists_device_ordinals():
    argv = engine_argv(make_spec(gpus=2))
    assert argv[argv.index("--d") + 1] == "0,1"


def test_vllm_preset_sizes_kv_in_bytes():
    spec = make_spec(engine="vllm", gpus=4, tensorParallel=2, gpuMemoryMiB=32768, dtype="bf16")
    argv = engine_argv(spec)
    assert argv[:3] == ["vllm", "serve", "/models/clef-flash"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--served-model-name"] == "clef-flash"
    assert flags["--dtype"] == "bfloat16"
    assert flags["--tensor-parallel-size"] == "2"
    assert flags["--pipeline-parallel-size"] == "2"
    assert flags["--kv-cache-memory-bytes"] == str(int(0.30 * 32768 * 2**20))
    assert flags["--port"] == "8000"


def test_mistralrs_preset_sizes_kv_in_mib_and_turns_the_prefix_cache_off():
    spec = make_spec(engine="mistralrs", gpus=2, gpuMemoryMiB=32768, dtype="bf16", args=["--max-seqs", "8"])
    argv = engine_argv(spec)
    assert argv[:4] == ["mistralrs", "serve", "-m", "/models/clef-flash"]
    flags = dict(zip(argv[4::2], argv[5::2], strict=True))
    assert flags["--dtype"] == "bf16"
    # Per GPU, of the memory the weights leave (weightsMiB unset: all of it).
    assert flags["--pa-memory-mb"] == str(int(0.30 * 32768))
    # 0.8.1's prefix cache leaks GDN state between requests; the user's args come last.
    assert flags["--prefix-cache-n"] == "0"
    assert (flags["--host"], flags["--port"], flags["--max-seqs"]) == ("0.0.0.0", "8000", "8")
    assert argv[-2:] == ["--max-seqs", "8"]
    # No degree and no served name: mistral.rs takes every GPU of the pod and serves `default`.
    assert not any("parallel" in a or "served" in a or "device" in a for a in argv)


def test_mistralrs_kv_budget_leaves_each_gpu_its_share_of_the_weights():
    model = {"name": "clef-flash", "path": "/models/clef-flash", "weightsMiB": 8192}
    spec = make_spec(engine="mistralrs", gpus=2, gpuMemoryMiB=16384, kvFraction=0.5, model=model)
    argv = engine_argv(spec)
    assert argv[argv.index("--pa-memory-mb") + 1] == str((16384 - 8192 // 2) // 2)


@pytest.mark.parametrize(
    ("engine", "path", "extra"),
    [("candle-vllm", "/v1/models", {}), ("vllm", "/health", {"gpuMemoryMiB": 32768}),
     ("mistralrs", "/health", {"gpuMemoryMiB": 32768})],
)  # fmt: skip
def test_every_engine_is_probed_where_it_answers_once_loaded(engine: str, path: str, extra: dict) -> None:
    pod = render_serving_pod_spec(make_spec(engine=engine, **extra), PINNED)
    (container,) = pod["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == path


def test_deployment_has_runtime_class_gpus_volume_probes_and_pinned_image():
    spec = make_spec(
        nodeSelector={"nvidia.com/gpu.product": "Tesla-V100"}, env=[{"name": "RUST_LOG", "value": "info"}]
    )
    d = render_deployment(OWNER, spec, PINNED, 1, {labels.VERDICT: "Passed"})
    rev = serving_revision(spec, PINNED)
    assert d["metadata"]["name"] == f"clef-flash-{rev}"
    assert d["metadata"]["labels"][labels.REVISION] == rev
    # Every pod of the revision; the Service selects only those with the serving label.
    assert d["spec"]["selector"]["matchLabels"] == labels.pod_selector("clef-flash", rev)
    assert labels.MODEL not in d["spec"]["template"]["metadata"]["labels"]
    assert d["metadata"]["labels"][labels.MODEL] == "clef-flash"
    assert d["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    pod = d["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "Tesla-V100"}
    c = pod["containers"][0]
    assert c["image"] == PINNED
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"name": "RUST_LOG", "value": "info"} in c["env"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/v1/models"
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert {"name": "model", "hostPath": {"path": "/srv/models", "type": "Directory"}} in pod["volumes"]
    assert {"name": "model", "mountPath": "/models/clef-flash", "readOnly": True} in c["volumeMounts"]


@pytest.mark.parametrize(
    ("image", "override", "policy"),
    [
        ("registry.clef.test/clef-runtime:1.0", None, "Always"),
        ("registry.clef.test/clef-runtime@sha256:" + "a" * 64, None, "IfNotPresent"),
        ("registry.clef.test/clef-runtime:1.0@sha256:" + "a" * 64, None, "IfNotPresent"),
        ("registry.clef.test/engine@sha256:" + "a" * 64, "registry.clef.test/verifier:2.0", "Always"),
        (
            "registry.clef.test/engine@sha256:" + "a" * 64,
            "registry.clef.test/verifier@sha256:" + "b" * 64,
            "IfNotPresent",
        ),
    ],
)
def test_verifier_pulls_a_tag_every_time_and_a_digest_once(image: str, override: str | None, policy: str):
    """A tag moves (the verdict must be for what the registry serves now); a digest does not, and
    a node that has it needs no registry (the real-node tier has none)."""
    verification = {"image": override} if override else {}
    c = verification_job(OWNER, make_spec(image=image, verification=verification), "")["spec"]["template"][
        "spec"
    ]
    assert c["containers"][0]["imagePullPolicy"] == policy


def test_job_contract():
    spec = make_spec(verification={"suite": "model", "timeoutSeconds": 900, "toleranceScale": 2})
    j = verification_job(OWNER, spec, "")
    key = verification_key(spec)
    assert j["metadata"]["name"] == f"clef-flash-verify-{key}"
    assert j["metadata"]["labels"][labels.COMPONENT] == "verification"
    js = j["spec"]
    assert (js["backoffLimit"], js["activeDeadlineSeconds"]) == (0, 900)
    assert js["ttlSecondsAfterFinished"] > 0
    pod = js["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    assert pod["runtimeClassName"] == "nvidia"
    assert js["template"]["metadata"]["labels"][labels.COMPONENT] == "verification"
    c = pod["containers"][0]
    assert c["name"] == "verify"
    assert c["imagePullPolicy"] == "Always"
    assert c["terminationMessagePath"] == "/dev/termination-log"
    assert c["terminationMessagePolicy"] == "File"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["command"] == [
        "clef-runtime",
        "verify",
        "--suite",
        "model",
        "--dtype",
        "f16",
        "--preset",
        "qwen3_5",
        "--shape=layers=32",
        "--shape=full_attention_interval=4",
        "--shape=attention_heads=16",
        "--shape=kv_heads=4",
        "--shape=head_dim=256",
        "--shape=linear_key_heads=16",
        "--shape=linear_value_heads=32",
        "--shape=linear_key_dim=128",
        "--shape=linear_value_dim=128",
        "--checkpoint",
        "/clef/model",
        "--tolerance-scale",
        "2",
    ]


def test_verifiers_mount_the_checkpoint_at_clefs_path_not_the_specs():
    """spec.model.path may name any directory, the verifier's own site-packages too: a verifier
    pod mounts the weights at clef's path, so the volume can never cover code it runs."""
    path = "/opt/clef/lib/python3.11/site-packages/clef_runtime"
    spec = make_spec(
        model={"name": "clef-flash", "path": path, "volume": {"hostPath": {"path": "/srv/models"}}},
        verification={"suite": "full"},
    )
    container = render_verification_pod_spec(spec)["containers"][0]
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/tmp", "/clef/model"]
    assert path not in container["command"]
    serving = render_serving_pod_spec(spec, PINNED)["containers"][0]
    assert {"name": "model", "mountPath": path, "readOnly": True} in serving["volumeMounts"]


def test_reverify_job_gets_a_suffix_within_63_characters():
    name = job_name("a" * 38, "0123456789", "2026-03-01T12:00:00Z")
    assert name.startswith("a" * 38 + "-verify-0123456789-")
    assert len(name) == 63


def test_verification_command_override():
    assert (
        verify_argv(make_spec(verification={"command": ["/opt/clef/bin/clef-runtime", "verify"]}))[0]
        == "/opt/clef/bin/clef-runtime"
    )


def test_service_selects_one_revision_and_is_owned():
    s = render_service(OWNER, make_spec(service={"name": "clef-serve", "port": 80}), "abc")
    assert s["spec"]["selector"] == labels.selector("clef-flash", "abc")
    assert s["spec"]["ports"][0]["port"] == 80 and s["spec"]["ports"][0]["targetPort"] == 8000
    assert s["metadata"]["annotations"][labels.SERVICE_ACTIVE_REVISION] == "abc"
    assert s["metadata"]["ownerReferences"][0]["controller"] is True


def test_revision_changes_with_what_changes_the_pod_only():
    base = make_spec()
    rev = serving_revision(base, PINNED)
    assert serving_revision(make_spec(replicas=5), PINNED) == rev
    assert serving_revision(make_spec(service={"name": "other", "port": 81}), PINNED) == rev
    assert serving_revision(make_spec(rollout={"strategy": "Recreate"}), PINNED) == rev
    for changed in (
        make_spec(dtype="bf16"),
        make_spec(kvFraction=0.5),
        make_spec(gpus=2),
        make_spec(args=["--x"]),
        make_spec(runtimeClassName="nvidia-legacy"),
        make_spec(env=[{"name": "A", "value": "1"}]),
        make_spec(tolerations=[{"key": "gpu", "operator": "Exists"}]),
    ):
        assert serving_revision(changed, PINNED) != rev
    assert serving_revision(base, PINNED.replace("a" * 64, "b" * 64)) != rev, "a new digest is a new revision"


def test_verification_key_follows_image_suite_dtype_and_scheduling():
    key = verification_key(make_spec())
    assert verification_key(make_spec(replicas=3)) == key
    assert verification_key(make_spec(image=GOOD2)) != key
    assert verification_key(make_spec(verification={"suite": "full"})) != key
    assert verification_key(make_spec(dtype="f32")) != key
    assert verification_key(make_spec(nodeSelector={"nvidia.com/gpu.product": "H200"})) != key


def test_digest_parsing():
    d = "sha256:" + "c" * 64
    assert digest_of(f"docker-pullable://registry.clef.test/clef-runtime@{d}") == d
    assert digest_of(d) == d
    assert digest_of("registry.clef.test/clef-runtime:1.0") is None
    assert digest_of("") is None
    assert repository("localhost:5000/a/b:tag") == "localhost:5000/a/b"
    assert repository(f"reg/a@{d}") == "reg/a"
    assert (
        pinned_reference(GOOD, f"registry.clef.test/clef-runtime@{d}")
        == f"registry.clef.test/clef-runtime@{d}"
    )


def test_manifests_are_valid_kubernetes_objects():
    """The client validates what it sends (e.g. quantities are strings): check every rendering
    against its model here rather than meeting a ValidationError mid-rollout."""
    from kubernetes import client
    from pydantic import TypeAdapter

    for spec in (
        make_spec(),
        make_spec(engine="vllm", gpuMemoryMiB=32768, gpus=2, verification={"suite": "full"}),
    ):
        TypeAdapter(client.V1Job).validate_python(verification_job(OWNER, spec, "token"))
        TypeAdapter(client.V1Deployment).validate_python(
            render_deployment(OWNER, spec, PINNED, 2, {"a": "b"})
        )
        TypeAdapter(client.V1Service).validate_python(render_service(OWNER, spec, "abc"))
