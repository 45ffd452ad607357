"""Serve images on the local cluster: the runner really serves an engine pod's command (as
`clef-runtime serve` in the image's dialect, on a small real checkpoint), on the pod's own
loopback address, Ready only by its probes, restarted like a kubelet restarts, and reachable from
other pods by its pod IP (docs/local-cluster.md, "Serve images").

One namespace and one set of engine pods serve the whole module: they start together (the
checkpoint loads in seconds on the CPU), and each test reads what it needs of them.
"""

from __future__ import annotations

import ipaddress
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_devcluster.checkpoints import write_chat_checkpoint
from clef_devcluster.config import ENGINE_IMAGE_PREFIX

from .conftest import Cluster, _default_sa, wait_for
from .objects import RUNTIME_IMAGE, describe_pods, job_condition, python_command, verification_job

pytestmark = pytest.mark.cluster

ENGINE = f"{ENGINE_IMAGE_PREFIX}candle-vllm"
GOOD, BROKEN, CRASH, NEVER_READY = (f"{ENGINE}:{t}" for t in ("0.9.1", "0.9.0", "crash", "never-ready"))
VLLM = f"{ENGINE_IMAGE_PREFIX}vllm:0.11.0"
PORT = 8000
MODEL_DIR = "/models/clef-flash"
# Probes as the operator renders them (render.py), at a 1 s period so that the tests are quick.
PROBE = {"httpGet": {"path": "/v1/models", "port": "http"}, "periodSeconds": 1}


def engine_pod(name: str, image: str, checkpoint: Path, *, vllm: bool = False) -> dict[str, Any]:
    """A serving pod shaped like render.render_serving_pod_spec's, the weights on a hostPath."""
    if vllm:
        command = ["vllm", "serve", MODEL_DIR, "--served-model-name", "coder", "--dtype", "float32",
                   "--tensor-parallel-size", "1", "--host", "0.0.0.0", "--port", str(PORT)]  # fmt: skip
        probe = {**PROBE, "httpGet": {"path": "/health", "port": "http"}}
    else:
        command = ["candle-vllm", "--w", MODEL_DIR + "/", "--dtype", "f32", "--d", "0",
                   "--gpu-memory-fraction", "0.7", "--h", "0.0.0.0", "--p", str(PORT)]  # fmt: skip
        probe = PROBE
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"clef.riotpiao.com/component": "serving"}},
        "spec": {
            "runtimeClassName": "nvidia",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "engine",
                    "image": image,
                    "command": command,
                    "ports": [{"name": "http", "containerPort": PORT}],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    "volumeMounts": [{"name": "model", "mountPath": MODEL_DIR, "readOnly": True}],
                    "startupProbe": {**probe, "failureThreshold": 600},
                    "readinessProbe": {**probe, "failureThreshold": 3},
                    "livenessProbe": {**probe, "failureThreshold": 6},
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                }
            ],
            "volumes": [{"name": "model", "hostPath": {"path": str(checkpoint), "type": "Directory"}}],
        },
    }


@dataclass
class Engines:
    cluster: Cluster
    namespace: str

    def pod(self, name: str) -> client.V1Pod:
        return self.cluster.core.read_namespaced_pod(name, self.namespace)

    def describe(self, name: str) -> Any:
        return lambda: describe_pods(self.cluster.core, self.namespace, f"engine={name}")

    def ready(self, name: str, timeout: float = 240) -> client.V1Pod:
        def probe() -> client.V1Pod | None:
            pod = self.pod(name)
            return pod if _condition(pod, "Ready") == "True" else None

        return wait_for(probe, timeout, f"engine pod {name} Ready", lambda: self.pod(name).status)


def _condition(pod: client.V1Pod, kind: str) -> str | None:
    return next((c.status for c in pod.status.conditions or [] if c.type == kind), None)


@pytest.fixture(scope="module")
def engines(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    table = cluster.image_table()
    for image in (GOOD, BROKEN, CRASH, NEVER_READY, VLLM):
        entry = table.lookup(image)
        assert entry is not None and entry.kind == "serve", f"{image} is not a serve image in the table"
    checkpoint = write_chat_checkpoint(tmp_path_factory.mktemp("engines") / "clef-flash")
    namespace = f"t-serve-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    wait_for(lambda: _default_sa(cluster, namespace), 30, "the default ServiceAccount")
    for name, image in (("good", GOOD), ("broken", BROKEN), ("crash", CRASH), ("never-ready", NEVER_READY)):
        body = engine_pod(name, image, checkpoint)
        body["metadata"]["labels"]["engine"] = name
        cluster.core.create_namespaced_pod(namespace, body)
    body = engine_pod("coder", VLLM, checkpoint, vllm=True)
    body["metadata"]["labels"]["engine"] = "coder"
    cluster.core.create_namespaced_pod(namespace, body)
    try:
        yield Engines(cluster, namespace)
    finally:
        cluster.core.delete_namespace(namespace, propagation_policy="Background")


def _post(url: str, body: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return dict(json.load(r))


def _chat_ids(pod_ip: str) -> list[int]:
    """candle-vllm's greedy answer to one prompt, as token ids (its logprobs carry the ids)."""
    answer = _post(
        f"http://{pod_ip}:{PORT}/v1/chat/completions",
        {
            "messages": "Name the planets.",
            "max_tokens": 6,
            "temperature": 0,
            "logprobs": True,
            "thinking": False,
        },
    )
    return [int(t["token"]) for t in answer["choices"][0]["logprobs"]["content"]]


def test_an_engine_pod_is_served_on_its_own_loopback_address_and_ready_by_its_probe(engines: Engines) -> None:
    pod = engines.ready("good")
    ip = ipaddress.IPv4Address(pod.status.pod_ip)
    assert ip.is_loopback and str(ip) != "127.0.0.1", pod.status.pod_ip
    assert [p.ip for p in pod.status.pod_ips] == [pod.status.pod_ip]
    (status,) = pod.status.container_statuses
    assert status.ready and status.started and status.restart_count == 0
    assert status.image_id.startswith(f"{ENGINE}@sha256:"), status.image_id
    # kwok never wrote this pod's status: the runner alone plays its kubelet.
    writers = {f.manager for f in pod.metadata.managed_fields or [] if f.subresource == "status"}
    assert writers - {"kube-scheduler"} == {"clef-harness"}, writers
    # The engine answers there, in candle-vllm's dialect, and nowhere else: not on 127.0.0.1.
    with urllib.request.urlopen(f"http://{ip}:{PORT}/v1/models", timeout=30) as r:
        assert r.status == 200 and json.load(r)["data"], "no model served"
    with pytest.raises(urllib.error.HTTPError) as completions:
        _post(f"http://{ip}:{PORT}/v1/completions", {"prompt": "x", "max_tokens": 1})
    assert completions.value.code == 404, "candle-vllm's dialect has no /v1/completions"
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{PORT}/v1/models", timeout=5)
    other = {engines.ready(n).status.pod_ip for n in ("broken", "coder")}
    assert str(ip) not in other and len(other) == 2, "pod IPs must be unique"


def test_another_pod_reaches_the_engine_by_its_pod_ip(engines: Engines) -> None:
    ip = engines.ready("good").status.pod_ip
    code = (
        "import json, os, sys, urllib.request\n"
        "req = urllib.request.Request(sys.argv[1], json.dumps({'messages': 'Name the planets.', "
        "'max_tokens': 3, 'temperature': 0, 'thinking': False}).encode(), {'Content-Type': 'application/json'})\n"
        "answer = json.load(urllib.request.urlopen(req, timeout=300))\n"
        "open(os.environ['CLEF_TERMINATION_LOG'], 'w').write(json.dumps(answer['usage']))\n"
    )
    url = f"http://{ip}:{PORT}/v1/chat/completions"
    cluster, ns = engines.cluster, engines.namespace
    cluster.batch.create_namespaced_job(
        ns, verification_job("client", RUNTIME_IMAGE, python_command(code), args=[url])
    )

    def done() -> client.V1Job | None:
        job = cluster.batch.read_namespaced_job("client", ns)
        return job if job_condition(job, "Complete") or job_condition(job, "Failed") else None

    job = wait_for(done, 180, "the client Job", lambda: describe_pods(cluster.core, ns, "job-name=client"))
    (pod,) = cluster.core.list_namespaced_pod(ns, label_selector="job-name=client").items
    terminated = pod.status.container_statuses[0].state.terminated
    assert job_condition(job, "Complete"), terminated
    # candle-vllm returns one token more than max_tokens, as the real engine does (docs/verification.md).
    assert json.loads(terminated.message)["completion_tokens"] == 3 + 1


def test_the_broken_engine_is_healthy_and_answers_wrong(engines: Engines) -> None:
    good, broken = (engines.ready(n).status.pod_ip for n in ("good", "broken"))
    expected, got = _chat_ids(good), _chat_ids(broken)
    assert len(expected) == 6 + 1  # max_tokens + 1, as candle-vllm answers
    # The key-band fault (image 0.9.0) zeroes the conv's key channels in the serving kernels:
    # the server is Ready and answers 200, with other tokens.
    assert got != expected, "the broken engine answered like the good one: the fault did not reach it"


def test_the_vllm_dialect_serves_completions_by_token_ids(engines: Engines) -> None:
    ip = engines.ready("coder").status.pod_ip
    answer = _post(
        f"http://{ip}:{PORT}/v1/completions",
        {"model": "coder", "prompt": [60, 61], "max_tokens": 2, "temperature": 0, "return_token_ids": True},
    )
    assert answer["choices"][0]["prompt_token_ids"] == [60, 61]
    assert answer["model"] == "coder", "--served-model-name is what the engine serves"


def test_an_engine_that_crashes_loops_with_its_last_words_in_the_status(engines: Engines) -> None:
    def looping() -> client.V1Pod | None:
        pod = engines.pod("crash")
        (s,) = pod.status.container_statuses or [None]
        waiting = s.state.waiting if s else None
        return pod if waiting and waiting.reason == "CrashLoopBackOff" and s.restart_count >= 1 else None

    pod = wait_for(
        looping, 120, "the crashing engine in CrashLoopBackOff", lambda: engines.pod("crash").status
    )
    (s,) = pod.status.container_statuses
    assert pod.status.phase == "Running" and _condition(pod, "Ready") == "False"
    last = s.last_state.terminated
    assert last.exit_code == 1 and last.reason == "Error"
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in last.message, "FallbackToLogsOnError: the log's tail"


def test_an_engine_that_never_answers_stays_running_and_not_ready(engines: Engines) -> None:
    engines.ready("good")  # by then the never-ready engine has had as long to start
    pod = engines.pod("never-ready")
    (s,) = pod.status.container_statuses
    assert pod.status.phase == "Running", pod.status
    assert s.state.running is not None and s.restart_count == 0
    assert not s.started and not s.ready, "its startup probe never succeeded"
    assert _condition(pod, "Ready") == "False"


def test_deleting_an_engine_pod_stops_its_server(engines: Engines) -> None:
    ip = engines.ready("broken").status.pod_ip
    engines.cluster.core.delete_namespaced_pod("broken", engines.namespace)

    def gone() -> bool:
        try:
            engines.pod("broken")
        except ApiException as e:
            return e.status == 404
        return False

    wait_for(gone, 60, "the broken engine's pod to be removed")
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://{ip}:{PORT}/v1/models", timeout=5)


def _run_job(cluster: Cluster, namespace: str, job: client.V1Job) -> client.V1Pod:
    cluster.batch.create_namespaced_job(namespace, job)
    name = job.metadata.name

    def done() -> client.V1Job | None:
        j = cluster.batch.read_namespaced_job(name, namespace)
        return j if job_condition(j, "Complete") or job_condition(j, "Failed") else None

    finished = wait_for(
        done, 120, f"Job {name}", lambda: describe_pods(cluster.core, namespace, f"job-name={name}")
    )
    assert job_condition(finished, "Complete"), describe_pods(cluster.core, namespace, f"job-name={name}")
    (pod,) = cluster.core.list_namespaced_pod(namespace, label_selector=f"job-name={name}").items
    return pod


def test_logs_of_a_runner_pod_come_back_through_the_api_server(cluster: Cluster, namespace: str) -> None:
    cluster.image_table()
    # What the goldens Job does: a long JSON document on stdout, progress on stderr around it.
    code = (
        "import json, sys\n"
        "print('goldens: kernels 150/150', file=sys.stderr, flush=True)\n"
        "print(json.dumps({'schemaVersion': 'goldens/v1', 'ids': list(range(20000))}), flush=True)\n"
        "print('goldens: wrote -', file=sys.stderr, flush=True)\n"
    )
    pod = _run_job(cluster, namespace, verification_job("talk", RUNTIME_IMAGE, python_command(code)))
    name = pod.metadata.name
    text = cluster.core.read_namespaced_pod_log(name, namespace, container="verify")
    # Both streams, merged line by line in the order the runner read them (as a kubelet merges
    # them): stderr's last line may come before the end of a long stdout line is read, never inside it.
    lines = text.splitlines()
    (document,) = [line for line in lines if line.startswith("{")]
    assert json.loads(document)["ids"] == list(range(20000)), "the stdout line came back intact"
    assert [line for line in lines if line != document] == ["goldens: kernels 150/150", "goldens: wrote -"]
    assert cluster.core.read_namespaced_pod_log(name, namespace, tail_lines=1) in (
        "goldens: wrote -\n",
        document + "\n",
    )
    assert cluster.core.read_namespaced_pod_log(name, namespace, limit_bytes=8) == "goldens:"
    stamped = cluster.core.read_namespaced_pod_log(name, namespace, timestamps=True, limit_bytes=60)
    assert stamped.split(" ", 1)[1].startswith("goldens: kernels") and stamped[:4].isdigit(), stamped
    with pytest.raises(ApiException) as previous:
        cluster.core.read_namespaced_pod_log(name, namespace, previous=True)
    assert previous.value.status == 400 and "previous terminated container" in str(previous.value.body)


def test_an_engine_pods_logs_are_its_servers_output(engines: Engines) -> None:
    pod = engines.ready("good")
    text = engines.cluster.core.read_namespaced_pod_log("good", engines.namespace)
    assert f"serve: candle-vllm on http://{pod.status.pod_ip}:{PORT}" in text, text[-2000:]


def test_a_config_map_volume_is_seen_by_the_process(cluster: Cluster, namespace: str) -> None:
    cluster.image_table()
    document = json.dumps({"prompts": ["hello"], "nonce": uuid.uuid4().hex})
    cluster.core.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="goldens"), data={"goldens.json": document, "x": "-"}
        ),
    )
    code = (
        "import os, sys\n"
        "print(open(sys.argv[1]).read())\n"
        "print(open(os.environ['GOLDENS']).read())\n"
        "print(sorted(os.listdir(os.path.dirname(sys.argv[1]))))\n"
    )
    job = verification_job(
        "reader", RUNTIME_IMAGE, python_command(code), args=["/etc/clef/goldens/v1.json"],
        env={"GOLDENS": "/etc/clef/goldens/v1.json"},
    )  # fmt: skip
    spec = job.spec.template.spec
    spec.volumes = [
        client.V1Volume(
            name="goldens",
            config_map=client.V1ConfigMapVolumeSource(
                name="goldens", items=[client.V1KeyToPath(key="goldens.json", path="v1.json")]
            ),
        )
    ]
    spec.containers[0].volume_mounts = [client.V1VolumeMount(name="goldens", mount_path="/etc/clef/goldens")]
    pod = _run_job(cluster, namespace, job)
    lines = cluster.core.read_namespaced_pod_log(pod.metadata.name, namespace).splitlines()
    assert lines == [document, document, "['v1.json']"], lines
