"""Verification pods are really run by the harness runner, and the Job controller judges them."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_devcluster import images
from clef_devcluster.images import fault_image, fault_names, put_image

from .conftest import Cluster, missing_prerequisite, wait_for
from .objects import RUNTIME_IMAGE, describe_pods, job_condition, python_command, verification_job

pytestmark = pytest.mark.cluster

# A report that only a real run of this code can produce: it includes the interpreter and the
# environment the runner gave the process.
REPORT_CODE = """
import json, os, sys
keys = ["CLEF_RUNTIME_FAULT", "CLEF_VERIFY_DEVICE", "CLEF_VERIFY_SHAPES", "TRITON_INTERPRET", "GREETING", "POD"]
report = {"python": sys.executable, "argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in keys}}
open(os.environ["CLEF_TERMINATION_LOG"], "w").write(json.dumps(report))
"""


def job_pod(cluster: Cluster, namespace: str, job: str) -> client.V1Pod:
    pods = cluster.core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return pods[0]


def finished(cluster: Cluster, namespace: str, job: str, timeout: float = 120) -> client.V1Job:
    def done() -> client.V1Job | None:
        j = cluster.batch.read_namespaced_job(job, namespace)
        return j if job_condition(j, "Complete") or job_condition(j, "Failed") else None

    return wait_for(done, timeout, f"Job {job} to finish",
                    lambda: describe_pods(cluster.core, namespace, f"job-name={job}"))  # fmt: skip


def terminated(pod: client.V1Pod) -> client.V1ContainerStateTerminated:
    (status,) = pod.status.container_statuses
    assert status.state.terminated is not None, status.state
    return status.state.terminated


def test_exit_3_with_a_termination_message_fails_the_job_with_both_visible(
    cluster: Cluster, namespace: str
) -> None:
    cluster.image_table()
    message = f"kernel mismatch: causal_conv1d key channel band [2048, 4096) is zero ({uuid.uuid4().hex[:6]})"
    code = f"import os, sys; open(os.environ['CLEF_TERMINATION_LOG'], 'w').write({message!r}); sys.exit(3)"
    cluster.batch.create_namespaced_job(
        namespace, verification_job("exit3", RUNTIME_IMAGE, python_command(code))
    )
    job = finished(cluster, namespace, "exit3")
    failed = job_condition(job, "Failed")
    assert failed is not None and failed.reason == "BackoffLimitExceeded", job.status.conditions
    assert job_condition(job, "Complete") is None
    pod = job_pod(cluster, namespace, "exit3")
    assert pod.status.phase == "Failed"
    t = terminated(pod)
    assert t.exit_code == 3
    assert t.reason == "Error"
    assert t.message == message


def test_exit_0_completes_the_job_and_reports_the_images_digest(cluster: Cluster, namespace: str) -> None:
    table = cluster.image_table()
    cluster.batch.create_namespaced_job(
        namespace,
        verification_job(
            "pass",
            RUNTIME_IMAGE,
            python_command(REPORT_CODE),
            args=["--greeting", "$(GREETING)"],
            env={"GREETING": "hello", "CLEF_VERIFY_DEVICE": "cuda"},
            extra_env=[
                client.V1EnvVar(
                    name="POD",
                    value_from=client.V1EnvVarSource(
                        field_ref=client.V1ObjectFieldSelector(field_path="metadata.name")
                    ),
                )
            ],
        ),
    )
    job = finished(cluster, namespace, "pass")
    assert job_condition(job, "Complete") is not None, job.status.conditions
    assert job.status.succeeded == 1
    pod = job_pod(cluster, namespace, "pass")
    assert pod.status.phase == "Succeeded"
    t = terminated(pod)
    assert (t.exit_code, t.reason) == (0, "Completed")
    report: dict[str, Any] = json.loads(t.message)
    assert Path(report["python"]).parent.parent.name == ".venv"
    assert report["argv"] == ["--greeting", "hello"]
    env = report["env"]
    assert env["GREETING"] == "hello"
    assert env["POD"] == pod.metadata.name
    # The host has no GPU for this pod: the harness overrides what the pod asked for.
    assert (env["CLEF_VERIFY_DEVICE"], env["CLEF_VERIFY_SHAPES"], env["TRITON_INTERPRET"]) == (
        "cpu",
        "reduced",
        "1",
    )
    assert env["CLEF_RUNTIME_FAULT"] is None
    entry = table.lookup(RUNTIME_IMAGE)
    assert entry is not None
    (status,) = pod.status.container_statuses
    assert status.image_id == entry.image_id
    assert status.image_id.startswith("registry.clef.test/clef-runtime@sha256:")
    assert status.container_id.startswith("clef-harness://")


def test_every_fault_image_runs_with_its_fault_named(cluster: Cluster, namespace: str) -> None:
    cluster.image_table()
    faults = fault_names()
    assert faults, "the runtime's fault catalogue is empty"
    for i, fault in enumerate(faults):
        job = verification_job(f"fault-{i}", fault_image(fault), python_command(REPORT_CODE), gpus=0)
        cluster.batch.create_namespaced_job(namespace, job)
    for i, fault in enumerate(faults):
        job = finished(cluster, namespace, f"fault-{i}")
        assert job_condition(job, "Complete") is not None
        report = json.loads(terminated(job_pod(cluster, namespace, f"fault-{i}")).message)
        assert report["env"]["CLEF_RUNTIME_FAULT"] == fault


def test_fallback_to_logs_on_error_uses_the_output_tail(cluster: Cluster, namespace: str) -> None:
    cluster.image_table()
    code = "import sys; print('loading kernels'); print('boom: no CUDA device', file=sys.stderr); sys.exit(2)"
    cluster.batch.create_namespaced_job(
        namespace,
        verification_job(
            "fallback", RUNTIME_IMAGE, python_command(code), message_policy="FallbackToLogsOnError"
        ),
    )
    job = finished(cluster, namespace, "fallback")
    assert job_condition(job, "Failed") is not None
    t = terminated(job_pod(cluster, namespace, "fallback"))
    assert t.exit_code == 2
    assert "boom: no CUDA device" in t.message


def test_a_missing_executable_is_a_start_error(cluster: Cluster, namespace: str) -> None:
    cluster.image_table()
    cluster.batch.create_namespaced_job(
        namespace, verification_job("noexec", RUNTIME_IMAGE, ["clef-no-such-binary", "verify"])
    )
    job = finished(cluster, namespace, "noexec")
    assert job_condition(job, "Failed") is not None
    t = terminated(job_pod(cluster, namespace, "noexec"))
    assert (t.exit_code, t.reason) == (128, "StartError")
    assert "clef-no-such-binary" in t.message


@pytest.mark.parametrize(
    "image", ["registry.clef.test/clef-runtime:unpullable", "registry.clef.test/not-in-table:1"]
)
def test_an_unpullable_image_shows_err_image_pull_and_never_runs(
    cluster: Cluster, namespace: str, image: str, tmp_path: Path
) -> None:
    cluster.image_table()
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('ran')"
    cluster.batch.create_namespaced_job(namespace, verification_job("pull", image, python_command(code)))
    watcher = cluster.core.list_namespaced_pod
    seen: list[str] = []

    def pull_error() -> str | None:
        for p in watcher(namespace, label_selector="job-name=pull").items:
            for s in p.status.container_statuses or []:
                if s.state.waiting is not None:
                    seen.append(s.state.waiting.reason)
                    if s.state.waiting.reason in ("ErrImagePull", "ImagePullBackOff"):
                        return f"{s.state.waiting.reason}: {s.state.waiting.message}"
        return None

    wait_for(
        pull_error, 60, "an image pull error", lambda: describe_pods(cluster.core, namespace, "job-name=pull")
    )
    # The runner reports ErrImagePull first and holds it for seconds, so polling sees it.
    assert "ErrImagePull" in seen, seen
    pod = job_pod(cluster, namespace, "pull")
    assert pod.status.phase == "Pending"
    assert not marker.exists(), "the command of an unpullable image ran"
    job = cluster.batch.read_namespaced_job("pull", namespace)
    assert job_condition(job, "Complete") is None and job_condition(job, "Failed") is None


def _pod_gone(cluster: Cluster, namespace: str, selector: str) -> bool:
    return not cluster.core.list_namespaced_pod(namespace, label_selector=selector).items


def _processes_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def test_active_deadline_kills_the_running_command_and_the_pod_goes_away(
    cluster: Cluster, namespace: str
) -> None:
    cluster.image_table()
    if cluster.local is None:
        missing_prerequisite(
            "needs the local runner's processes on this host (runs on the local cluster: unset CLEF_KUBECONFIG)"
        )
    marker = f"clef-sleeper-{uuid.uuid4().hex}"
    code = f"import time; tag = {marker!r}; time.sleep(600)"
    job = verification_job("slow", RUNTIME_IMAGE, python_command(code), deadline_seconds=4, grace_seconds=2)
    cluster.batch.create_namespaced_job(namespace, job)
    wait_for(lambda: _processes_with(marker), 60, "the command to run on the host")
    done = finished(cluster, namespace, "slow", timeout=60)
    failed = job_condition(done, "Failed")
    assert failed is not None and failed.reason == "DeadlineExceeded", done.status.conditions
    wait_for(lambda: _pod_gone(cluster, namespace, "job-name=slow"), 60, "the pod to be deleted",
             lambda: describe_pods(cluster.core, namespace, "job-name=slow"))  # fmt: skip
    wait_for(lambda: not _processes_with(marker), 30, "the command to be killed")


def test_a_hanging_image_runs_until_its_deadline(cluster: Cluster, namespace: str) -> None:
    cluster.image_table()
    job = verification_job(
        "hang", "registry.clef.test/clef-runtime:hang", None, args=["verify"], deadline_seconds=3
    )
    cluster.batch.create_namespaced_job(namespace, job)

    def running() -> bool:
        pods = cluster.core.list_namespaced_pod(namespace, label_selector="job-name=hang").items
        return bool(pods) and pods[0].status.phase == "Running"

    wait_for(running, 60, "the hanging pod to run")
    done = finished(cluster, namespace, "hang", timeout=60)
    assert job_condition(done, "Failed").reason == "DeadlineExceeded"  # type: ignore[union-attr]
    wait_for(lambda: _pod_gone(cluster, namespace, "job-name=hang"), 60, "the pod to be deleted")


def test_moving_a_tag_changes_what_it_runs_but_not_what_the_old_digest_runs(
    cluster: Cluster, namespace: str
) -> None:
    cluster.image_table()
    ref = f"registry.clef.test/clef-runtime:moving-{uuid.uuid4().hex[:6]}"
    first = put_image(cluster.core, ref, "good")
    second = put_image(cluster.core, ref, "fault", fault="beta_no_sigmoid")
    assert first.digest != second.digest
    pinned = f"{first.repo}@sha256:{first.digest}"
    for name, image in (("by-tag", ref), ("by-digest", pinned)):
        cluster.batch.create_namespaced_job(
            namespace, verification_job(name, image, python_command(REPORT_CODE), gpus=0)
        )
    results = {}
    for name in ("by-tag", "by-digest"):
        assert job_condition(finished(cluster, namespace, name), "Complete") is not None
        pod = job_pod(cluster, namespace, name)
        (status,) = pod.status.container_statuses
        results[name] = (
            status.image_id,
            json.loads(status.state.terminated.message)["env"]["CLEF_RUNTIME_FAULT"],
        )
    assert results["by-tag"] == (second.image_id, "beta_no_sigmoid")
    assert results["by-digest"] == (first.image_id, None)


def test_deleting_the_namespace_of_a_running_verification_pod_completes(cluster: Cluster) -> None:
    cluster.image_table()
    ns = f"t-{uuid.uuid4().hex[:8]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))

    def sa() -> bool:
        try:
            cluster.core.read_namespaced_service_account("default", ns)
        except ApiException:
            return False
        return True

    wait_for(sa, 30, "the default ServiceAccount")
    job = verification_job(
        "busy", RUNTIME_IMAGE, python_command("import time; time.sleep(600)"), grace_seconds=1
    )
    cluster.batch.create_namespaced_job(ns, job)

    def running() -> bool:
        pods = cluster.core.list_namespaced_pod(ns, label_selector="job-name=busy").items
        return bool(pods) and pods[0].status.phase == "Running"

    wait_for(running, 60, "the verification pod to run")
    cluster.core.delete_namespace(ns)

    def namespace_gone() -> bool:
        try:
            cluster.core.read_namespace(ns)
        except ApiException as e:
            return e.status == 404
        return False

    # A running pod bound to a node is only marked for deletion; its "kubelet" (the runner) must
    # stop the command and finish the deletion, or the namespace never goes away.
    wait_for(namespace_gone, 120, f"namespace {ns} to be deleted",
             lambda: describe_pods(cluster.core, ns, ""))  # fmt: skip


def test_the_seeded_table_has_an_image_for_every_catalogued_fault(cluster: Cluster) -> None:
    table = cluster.image_table()
    for fault in fault_names():
        entry = table.lookup(fault_image(fault))
        assert entry is not None and entry.kind == "fault" and entry.fault == fault
    assert images.seed_table().entries == table.entries[: len(images.seed_table().entries)]


def test_on_failure_restarts_the_container_in_place(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    cluster.image_table()
    if cluster.local is None:
        missing_prerequisite(
            "the command leaves a marker on this host's filesystem (runs on the local cluster: unset CLEF_KUBECONFIG)"
        )
    marker = tmp_path / "first-run-done"
    # Fails the first time, succeeds the second: only a restart in place can complete the Job.
    code = (
        "import pathlib, sys; m = pathlib.Path(sys.argv[1])\n"
        "if not m.exists():\n    m.write_text('x'); sys.exit(1)\n"
    )
    job = verification_job("flaky", RUNTIME_IMAGE, python_command(code), args=[str(marker)])
    # For OnFailure pods the Job controller fails the Job once restarts reach backoffLimit.
    job.spec.backoff_limit = 2  # type: ignore[union-attr]
    job.spec.template.spec.restart_policy = "OnFailure"  # type: ignore[union-attr]
    cluster.batch.create_namespaced_job(namespace, job)
    done = finished(cluster, namespace, "flaky", timeout=90)
    assert job_condition(done, "Complete") is not None, done.status
    pod = job_pod(cluster, namespace, "flaky")
    (status,) = pod.status.container_statuses  # type: ignore[union-attr]
    assert status.restart_count == 1
    assert status.last_state.terminated.exit_code == 1  # type: ignore[union-attr]
    assert status.state.terminated.exit_code == 0  # type: ignore[union-attr]


def test_env_from_config_maps_and_secrets_is_resolved(cluster: Cluster, namespace: str) -> None:
    cluster.image_table()
    cluster.core.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name="settings"), data={"GREETING": "from-cm"}),
    )
    cluster.core.create_namespaced_secret(
        namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name="token"), string_data={"value": "s3cret"}),
    )
    job = verification_job(
        "envs",
        RUNTIME_IMAGE,
        python_command(
            "import os; open(os.environ['CLEF_TERMINATION_LOG'], 'w').write(os.environ['GREETING'] + '/' + os.environ['POD'])"
        ),
        extra_env=[
            client.V1EnvVar(
                name="POD",
                value_from=client.V1EnvVarSource(
                    secret_key_ref=client.V1SecretKeySelector(name="token", key="value")
                ),
            )
        ],
    )
    job.spec.template.spec.containers[0].env_from = [  # type: ignore[union-attr]
        client.V1EnvFromSource(config_map_ref=client.V1ConfigMapEnvSource(name="settings"))
    ]
    cluster.batch.create_namespaced_job(namespace, job)
    done = finished(cluster, namespace, "envs")
    assert job_condition(done, "Complete") is not None
    assert terminated(job_pod(cluster, namespace, "envs")).message == "from-cm/s3cret"
