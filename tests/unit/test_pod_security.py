"""What the operator's pods may do: no service-account token, the runtime's default seccomp
profile, no privilege escalation, no capabilities, a read-only root for verification, and a
command that is an argv list, never a shell line.

Pod Security "restricted": every verifier pod (kernels verify, goldens, comparison) meets it, as
clef's runtime user 65532 whatever the image says; serving pods meet it when spec.runAsUser names
a non-root user, and otherwise break exactly one of its rules, runAsNonRoot (the engine's image
decides its user: vLLM's and candle-vllm's run as root).  `restricted_violations` is the profile's
pod-level rules as the API server's admission applies them (k8s.io/pod-security-admission,
policy "restricted" at "latest"); tests/realnode checks the same against a real API server.
"""

from __future__ import annotations

from typing import Any

import pytest
from clef_builders import base_spec_dict, make_spec, verification_job

from clef_contract.command import RUNTIME_UID
from clef_operator.endpoint import render_comparison_job
from clef_operator.goldens import Trusted, goldens_key, render_goldens_job
from clef_operator.observed import PodState
from clef_operator.render import Owner, render_deployment

OWNER = Owner("clef-flash", "homelab", "uid-1")
PINNED = "registry.clef.test/clef-runtime@sha256:" + "a" * 64
RUNTIME = "registry.clef.test/clef-runtime:1.0"
SHELLS = {"sh", "bash", "dash", "zsh", "ash", "busybox", "env"}
# Arguments a shell would act on; as argv elements they must arrive verbatim.
HOSTILE = ["--chat-template", "$(cat /etc/shadow); rm -rf / `id` && echo '|'"]
# The volume kinds "restricted" allows.
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}  # fmt: skip
# The weights on a PVC ("restricted" allows no hostPath).
PVC_MODEL = {**base_spec_dict()["model"], "volume": {"pvc": {"claimName": "weights"}}}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """The rules of Pod Security "restricted" (which includes "baseline") that `pod` breaks."""
    out: list[str] = []
    psc = pod.get("securityContext") or {}
    containers = [*pod.get("initContainers", []), *pod["containers"]]
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(host):
            out.append(f"host namespaces ({host})")
    for v in pod.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    if psc.get("runAsUser") == 0:
        out.append("runAsUser=0 (pod)")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    for c in containers:
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{name}: hostPort")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation != false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in caps.get("drop", []):
            out.append(f"{name}: unrestricted capabilities (drop ALL)")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: capabilities added {caps['add']}")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"{name}: runAsNonRoot != true")
        if sc.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser=0")
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile {seccomp}")
    return out


def verifier_pods() -> dict[str, dict[str, Any]]:
    """Every pod clef runs a verifier in: the kernels Job (suite kernels, and model with the
    checkpoint mounted), the goldens Job and the comparison Job of endpoint verification."""
    endpoint = make_spec(
        model=PVC_MODEL,
        verification={"mode": "endpoint", "endpoint": {"runtimeImage": RUNTIME}},
    )
    preview = PodState(
        name="p", component="serving", uid="pod-uid", ip="10.0.0.7", image_id="x@sha256:" + "b" * 64
    )
    goldens = Trusted("flash-goldens", {"sha256": "c" * 64})
    pod = lambda m: m["spec"]["template"]["spec"]  # noqa: E731
    return {
        "verify-kernels": pod(verification_job(OWNER, make_spec(), "")),
        "verify-model": pod(
            verification_job(OWNER, make_spec(model=PVC_MODEL, verification={"suite": "model"}), "")
        ),
        "goldens": pod(render_goldens_job(OWNER, endpoint, goldens_key(endpoint))),
        "comparison": pod(render_comparison_job(OWNER, endpoint, "k", "", preview, goldens)),
    }


@pytest.mark.parametrize("kind", ["verify-kernels", "verify-model", "goldens", "comparison"])
def test_every_verifier_pod_meets_restricted_as_the_runtime_user(kind: str) -> None:
    pod = verifier_pods()[kind]
    assert restricted_violations(pod) == []
    sc = pod["securityContext"]
    assert (sc["runAsNonRoot"], sc["runAsUser"], sc["runAsGroup"]) == (True, RUNTIME_UID, RUNTIME_UID)
    for c in pod["containers"]:
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        # The one writable path, an emptyDir: HOME and Triton's cache live there.
        assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {}} in pod["volumes"]


def test_the_runtime_uid_is_the_runtime_images_user() -> None:
    """runAsUser must be the user the image was made for: the Dockerfile's USER, numerically."""
    from test_dockerfiles import RUNTIME as DOCKERFILE
    from test_dockerfiles import parse

    user = parse(DOCKERFILE.read_text()).stages[-1].user
    assert user == f"{RUNTIME_UID}:{RUNTIME_UID}", user


def test_serving_pods_run_as_the_images_user_and_break_only_run_as_non_root() -> None:
    """Unset spec.runAsUser: the engine's image decides (root, for vLLM's and candle-vllm's), so
    "restricted" refuses the pod for runAsNonRoot alone; "baseline" admits it (with a PVC)."""
    spec = make_spec(model=PVC_MODEL)
    pod = render_deployment(OWNER, spec, PINNED, 1, {})["spec"]["template"]["spec"]
    assert "runAsUser" not in pod["securityContext"] and "runAsNonRoot" not in pod["securityContext"]
    assert restricted_violations(pod) == ["engine: runAsNonRoot != true"]


def test_serving_pods_meet_restricted_with_run_as_user() -> None:
    spec = make_spec(model=PVC_MODEL, runAsUser=1000)
    pod = render_deployment(OWNER, spec, PINNED, 1, {})["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    assert pod["securityContext"]["runAsUser"] == 1000 and pod["securityContext"]["runAsNonRoot"] is True


def test_run_as_user_changes_the_serving_revision_only_when_set() -> None:
    """Existing models keep their revisions (no field, no change to the pod); setting it is a new
    revision, as any change to the serving pod is."""
    from clef_operator.render import serving_revision

    plain = serving_revision(make_spec(), PINNED)
    assert serving_revision(make_spec(runAsUser=1000), PINNED) != plain
    assert serving_revision(make_spec(runAsUser=1000), PINNED) != serving_revision(
        make_spec(runAsUser=1001), PINNED
    )


@pytest.mark.parametrize("value", [0, -1, 2147483648])
def test_run_as_user_out_of_range_names_the_field(value: int) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"spec\.runAsUser: must be between 1 and 2147483647"):
        make_spec(runAsUser=value)


def test_hostpath_weights_are_beyond_baseline() -> None:
    """The homelab's hostPath weights: no Pod Security level admits them (docs/operations.md)."""
    spec = make_spec(runAsUser=1000)  # clef_builders' model: hostPath /srv/models
    pod = render_deployment(OWNER, spec, PINNED, 1, {})["spec"]["template"]["spec"]
    assert restricted_violations(pod) == ["volume model: ['hostPath']"]


def pods() -> dict[str, dict[str, Any]]:
    spec = make_spec(args=HOSTILE, verification={"command": ["/opt/clef/bin/clef-runtime", "verify"]})
    return {
        "serving": render_deployment(OWNER, spec, PINNED, 1, {})["spec"]["template"]["spec"],
        "verification": verification_job(OWNER, spec, "")["spec"]["template"]["spec"],
    }


@pytest.mark.parametrize("kind", ["serving", "verification"])
def test_pod_is_restricted(kind: str) -> None:
    pod = pods()[kind]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostNetwork" not in pod and "hostPID" not in pod and "hostIPC" not in pod
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert "privileged" not in sc


def test_verification_root_filesystem_is_read_only() -> None:
    (c,) = pods()["verification"]["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]


@pytest.mark.parametrize("kind", ["serving", "verification"])
def test_command_is_argv_never_a_shell(kind: str) -> None:
    (c,) = pods()[kind]["containers"]
    argv = c["command"]
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
    assert argv[0].rsplit("/", 1)[-1] not in SHELLS
    assert "-c" not in argv[:2]
    assert "args" not in c, "everything is in command, so the image's ENTRYPOINT cannot wrap it in a shell"
    if kind == "serving":
        # spec.args are appended element by element, untouched.
        assert argv[-2:] == HOSTILE


def test_no_pod_is_created_with_the_serving_label() -> None:
    """Issue 33, finding 5: a user's Service selecting `clef.riotpiao.com/model=<name>` took the
    preview, goldens and comparison pods as endpoints.  Verification pods (kernels verify, goldens
    and the comparison, all rendered by `job_manifest`) carry the model's name under `verifies`;
    serving pods (a preview is one) under `revision-of`: the operator adds the serving label only
    to pods of a verified revision (`children.label_verified_pods`)."""
    from clef_operator import labels

    endpoint = make_spec(
        verification={"mode": "endpoint", "endpoint": {"runtimeImage": "registry.clef.test/clef-runtime:1.0"}}
    )
    serving = render_deployment(OWNER, make_spec(), PINNED, 1, {})["spec"]["template"]["metadata"]["labels"]
    assert labels.MODEL not in serving and labels.VERIFIES not in serving
    assert serving[labels.REVISION_OF] == "clef-flash"
    for job in (
        verification_job(OWNER, make_spec(), ""),
        render_goldens_job(OWNER, endpoint, goldens_key(endpoint)),
    ):
        pod_labels = job["spec"]["template"]["metadata"]["labels"]
        assert labels.MODEL not in pod_labels, pod_labels
        assert pod_labels[labels.VERIFIES] == "clef-flash"
        assert pod_labels[labels.COMPONENT] in (labels.COMPONENT_VERIFICATION, labels.COMPONENT_GOLDENS)
        # The Job itself keeps it: Services select pods, and clef's cache finds its Jobs by it.
        assert job["metadata"]["labels"][labels.MODEL] == "clef-flash"
