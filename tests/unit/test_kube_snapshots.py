"""kube turns API objects into the planner's snapshots; these are the fields rollouts hinge on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kubernetes import client

from clef_operator import labels
from clef_operator.drift import template_drift
from clef_operator.observed import Packed
from clef_operator.snapshots import _config_map, _deployment, _job, _pod

T = datetime(2026, 3, 1, tzinfo=UTC)


def meta(name: str, **kw: object) -> client.V1ObjectMeta:
    return client.V1ObjectMeta(name=name, creation_timestamp=T, **kw)


def test_unschedulable_verification_pod_carries_the_schedulers_message_and_node_gpu():
    pod = client.V1Pod(
        metadata=meta(
            "m-verify-abc-x",
            labels={
                labels.COMPONENT: "verification",
                labels.MODEL: "m",
                "batch.kubernetes.io/job-name": "m-verify-abc",
            },
        ),
        spec=client.V1PodSpec(containers=[client.V1Container(name="verify")], node_name=None),
        status=client.V1PodStatus(
            phase="Pending",
            conditions=[
                client.V1PodCondition(
                    type="PodScheduled",
                    status="False",
                    reason="Unschedulable",
                    message="0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
                )
            ],
        ),
    )
    state = _pod(pod, {})
    assert state.job_name == "m-verify-abc"
    assert state.component == "verification"
    assert "Insufficient nvidia.com/gpu" in state.unschedulable_message


def test_terminated_verify_container_report_digest_and_gpu_class():
    pod = client.V1Pod(
        metadata=meta("p", labels={labels.COMPONENT: "verification", "job-name": "j"}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="verify")], node_name="worker-1"),
        status=client.V1PodStatus(
            phase="Succeeded",
            container_statuses=[
                client.V1ContainerStatus(
                    name="verify",
                    image="img",
                    image_id="img@sha256:" + "a" * 64,
                    ready=False,
                    restart_count=0,
                    state=client.V1ContainerState(
                        terminated=client.V1ContainerStateTerminated(
                            exit_code=0, reason="Completed", message="{}"
                        )
                    ),
                )
            ],
        ),
    )
    nodes = {"worker-1": {labels.NODE_GPU_PRODUCT: "Tesla-V100-SXM2-16GB", labels.NODE_GPU_MEMORY: "16384"}}
    state = _pod(pod, nodes)
    assert state.terminated and state.exit_code == 0 and state.termination_message == "{}"
    assert state.image_id.endswith("a" * 64)
    assert (state.node_gpu_product, state.node_gpu_memory_mib) == ("Tesla-V100-SXM2-16GB", 16384)


def test_crash_looping_engine_keeps_its_last_words():
    pod = client.V1Pod(
        metadata=meta("e", labels={labels.COMPONENT: "serving", labels.REVISION: "r1"}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="engine")]),
        status=client.V1PodStatus(
            phase="Running",
            container_statuses=[
                client.V1ContainerStatus(
                    name="engine",
                    image="i",
                    image_id="",
                    ready=False,
                    restart_count=4,
                    state=client.V1ContainerState(
                        waiting=client.V1ContainerStateWaiting(reason="CrashLoopBackOff")
                    ),
                    last_state=client.V1ContainerState(
                        terminated=client.V1ContainerStateTerminated(
                            exit_code=101,
                            reason="Error",
                            message="panicked: libcuda.so.1: cannot open shared object",
                        )
                    ),
                )
            ],
        ),
    )
    state = _pod(pod, {})
    assert (state.revision, state.waiting_reason, state.restart_count) == ("r1", "CrashLoopBackOff", 4)
    assert "libcuda" in state.last_termination_message


def test_job_conditions():
    job = client.V1Job(
        metadata=meta("j", labels={labels.VERIFICATION_KEY: "k"}),
        status=client.V1JobStatus(
            conditions=[
                client.V1JobCondition(type="FailureTarget", status="True", reason="DeadlineExceeded"),
                client.V1JobCondition(
                    type="Failed", status="True", reason="DeadlineExceeded", message="too long"
                ),
            ]
        ),
    )
    state = _job(job)
    assert (
        state.failed and not state.complete and state.failed_reason == "DeadlineExceeded" and state.key == "k"
    )


def test_a_jobs_finish_time_is_its_completion_or_its_failed_condition():
    t0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    done = client.V1Job(
        metadata=meta("ok"),
        status=client.V1JobStatus(
            completion_time=t0 + timedelta(seconds=9),
            conditions=[client.V1JobCondition(type="Complete", status="True")],
        ),
    )
    assert _job(done).finished_at == t0 + timedelta(seconds=9)
    failed = client.V1Job(
        metadata=meta("bad"),
        status=client.V1JobStatus(
            conditions=[
                client.V1JobCondition(
                    type="Failed", status="True", reason="BackoffLimitExceeded", last_transition_time=t0
                )
            ]
        ),
    )
    assert _job(failed).finished_at == t0
    running = client.V1Job(metadata=meta("run"), status=client.V1JobStatus(active=1))
    assert _job(running).finished_at is None


def test_deployment_availability_needs_the_current_generation():
    d = client.V1Deployment(
        metadata=meta("m-r1", labels={labels.REVISION: "r1"}, generation=3, annotations={"a": "b"}),
        spec=client.V1DeploymentSpec(
            replicas=2, selector=client.V1LabelSelector(), template=client.V1PodTemplateSpec()
        ),
        status=client.V1DeploymentStatus(
            observed_generation=2, replicas=2, available_replicas=2, updated_replicas=2
        ),
    )
    state = _deployment(d)
    assert state.revision == "r1" and state.replicas == 2 and state.annotations == {"a": "b"}
    assert not state.is_available(), "the controller has not seen the latest spec yet"
    d.status.observed_generation = 3
    assert _deployment(d).is_available()


def test_a_goldens_pod_speaks_through_its_goldens_container_and_has_an_address():
    """Endpoint mode: the step label picks the container; the preview's IP and UID are kept."""
    terminated = client.V1ContainerState(
        terminated=client.V1ContainerStateTerminated(exit_code=0, message="{}")
    )
    pod = client.V1Pod(
        metadata=meta(
            "g",
            uid="uid-g",
            labels={labels.COMPONENT: "verification", labels.STEP: "goldens"},
        ),
        spec=client.V1PodSpec(containers=[client.V1Container(name="goldens")], node_name="worker-1"),
        status=client.V1PodStatus(
            phase="Succeeded",
            pod_ip="10.0.0.7",
            container_statuses=[
                client.V1ContainerStatus(
                    name="sidecar", image="x", image_id="", ready=False, restart_count=0
                ),
                client.V1ContainerStatus(
                    name="goldens",
                    image="r",
                    image_id="r@sha256:" + "b" * 64,
                    ready=False,
                    restart_count=0,
                    state=terminated,
                ),
            ],
        ),
    )
    state = _pod(pod, {})
    assert (state.uid, state.ip, state.terminated, state.exit_code) == ("uid-g", "10.0.0.7", True, 0)


def test_a_comparison_job_keeps_its_step_annotations_and_argv():
    job = client.V1Job(
        metadata=meta(
            "m-check-k",
            uid="uid-j",
            labels={labels.STEP: "endpoint", labels.VERIFICATION_KEY: "k"},
            annotations={labels.PREVIEW_POD_UID: "uid-p"},
        ),
        spec=client.V1JobSpec(
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(
                    containers=[client.V1Container(name="check", command=["clef-runtime", "endpoint-check"])]
                )
            )
        ),
        status=client.V1JobStatus(),
    )
    state = _job(job)
    assert state.step == "endpoint" and state.annotations[labels.PREVIEW_POD_UID] == "uid-p"
    assert state.command == ("clef-runtime", "endpoint-check")


def test_goldens_configmap_binary_data_is_decoded_and_bad_base64_dropped():
    cm = client.V1ConfigMap(
        metadata=meta("m-goldens-k", annotations={"a": "b"}, labels={labels.GOLDENS_KEY: "k"}),
        binary_data={"goldens.json.gz": "aGVsbG8=", "bad": "!!not base64"},
        data={"x": "y"},
    )
    state = _config_map(cm)
    assert state.binary_data == {"goldens.json.gz": b"hello"}
    assert state.data_keys == ("x",)


def test_a_deployments_pod_template_is_kept_packed_and_reads_as_the_wire_dict():
    """The cache keeps the template as compact JSON (memory); drift reads the same wire dict."""
    template = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels={"a": "b"}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="engine", image="img:1", args=["--x"])]),
    )
    d = client.V1Deployment(
        metadata=meta("m-r1", labels={labels.REVISION: "r1"}),
        spec=client.V1DeploymentSpec(replicas=1, selector=client.V1LabelSelector(), template=template),
    )
    state = _deployment(d)
    wire = {
        "metadata": {"labels": {"a": "b"}},
        "spec": {"containers": [{"name": "engine", "image": "img:1", "args": ["--x"]}]},
    }
    assert isinstance(state.template, Packed)
    assert state.template == wire and dict(state.template) == wire
    assert state.template.get("spec") == wire["spec"] and state.template.get("status") is None
    assert template_drift(wire, state.template) == []
    changed = {**wire, "spec": {"containers": [{"name": "engine", "image": "img:2", "args": ["--x"]}]}}
    assert template_drift(changed, state.template) == ["spec.containers[0].image"]
    assert state.template != changed
