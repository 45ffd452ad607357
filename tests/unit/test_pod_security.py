"""What the operator's pods may do: no service-account token, the runtime's default seccomp
profile, no privilege escalation, no capabilities, a read-only root for verification, and a
command that is an argv list, never a shell line.  (Non-root is left to the image: engines'
images run as root; clef's runtime image runs as 65532.)"""

from __future__ import annotations

from typing import Any

import pytest
from clef_builders import make_spec

from clef_operator.render import Owner, render_deployment, render_job

OWNER = Owner("clef-flash", "homelab", "uid-1")
PINNED = "registry.clef.test/clef-runtime@sha256:" + "a" * 64
SHELLS = {"sh", "bash", "dash", "zsh", "ash", "busybox", "env"}
# Arguments a shell would act on; as argv elements they must arrive verbatim.
HOSTILE = ["--chat-template", "$(cat /etc/shadow); rm -rf / `id` && echo '|'"]


def pods() -> dict[str, dict[str, Any]]:
    spec = make_spec(args=HOSTILE, verification={"command": ["/opt/clef/bin/clef-runtime", "verify"]})
    return {
        "serving": render_deployment(OWNER, spec, PINNED, 1, {})["spec"]["template"]["spec"],
        "verification": render_job(OWNER, spec, "")["spec"]["template"]["spec"],
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
    from clef_operator.goldens import render_goldens_job

    endpoint = make_spec(
        verification={"mode": "endpoint", "endpoint": {"runtimeImage": "registry.clef.test/clef-runtime:1.0"}}
    )
    serving = render_deployment(OWNER, make_spec(), PINNED, 1, {})["spec"]["template"]["metadata"]["labels"]
    assert labels.MODEL not in serving and labels.VERIFIES not in serving
    assert serving[labels.REVISION_OF] == "clef-flash"
    for job in (render_job(OWNER, make_spec(), ""), render_goldens_job(OWNER, endpoint)):
        pod_labels = job["spec"]["template"]["metadata"]["labels"]
        assert labels.MODEL not in pod_labels, pod_labels
        assert pod_labels[labels.VERIFIES] == "clef-flash"
        assert pod_labels[labels.COMPONENT] in (labels.COMPONENT_VERIFICATION, labels.COMPONENT_GOLDENS)
        # The Job itself keeps it: Services select pods, and clef's cache finds its Jobs by it.
        assert job["metadata"]["labels"][labels.MODEL] == "clef-flash"
