"""`clef-operator` from this checkout, run on this host against a cluster: as the admin, or with
exactly the rights its in-cluster ServiceAccount would have."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import yaml

from .config import REPO_ROOT

OPERATOR_NAMESPACE = "clef-system"
OPERATOR_SA = "clef-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SA}"


# The operator image's user (images/operator/Dockerfile): a UID with no passwd entry.
IMAGE_UID = 65532


def spawn_operator(
    args: Sequence[str], kubeconfig: Path, log: IO[bytes], uid: int | None = None
) -> subprocess.Popen[bytes]:
    """`clef-operator ARGS` from this checkout, talking to the API server of `kubeconfig`, its
    output appended to `log`, in a process group of its own (so a stop ends its children too).

    With `uid`, as its container starts it: that UID and GID (one that no passwd entry names,
    such as IMAGE_UID, is what a pod gets), only the image's environment (none of this host's USER,
    LOGNAME, ...), HOME=/tmp and `/` as working directory.  The IDs are mapped in a user namespace
    of its own onto this host's user, so the checkout and `kubeconfig` stay readable wherever they
    lie: what changes is only what the process sees of itself."""
    argv = [sys.executable, "-m", "clef_operator.cli", *args]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"}
    cwd: Path | str = REPO_ROOT
    if uid is not None:
        argv = ["unshare", "--user", f"--map-user={uid}", f"--map-group={uid}", *argv]
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "KUBECONFIG": str(kubeconfig),
        }
        cwd = "/"
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_operator(proc: subprocess.Popen[bytes], grace: float = 30) -> None:
    """SIGTERM to its process group, SIGKILL after `grace` seconds."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def clef_flash(image: str) -> dict[str, Any]:
    """clef-flash as in DESIGN: 1 GPU, f16, kvFraction 0.30 (a ClefModel spec's core)."""
    return {
        "engine": "candle-vllm",
        "image": image,
        "model": {"name": "clef-flash", "path": "/models/clef-flash", "weightsMiB": 9426},
        "dtype": "f16",
        "kvFraction": 0.30,
        "gpus": 1,
    }


def service_account_kubeconfig(
    admin_kubeconfig: Path,
    namespace: str,
    name: str,
    out: Path,
    seconds: int = 86400,
    pod: tuple[str, str] | None = None,
) -> Path:
    """A kubeconfig that authenticates as ServiceAccount namespace/name with a token from the
    TokenRequest API, for the same server and CA as `admin_kubeconfig`: how to run the operator on
    a host with exactly the rights its in-cluster pod would have.  With `pod` (name, uid) the token
    is bound to that pod, as a projected token is, and names it to the API server."""
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(admin_kubeconfig))
    bound = (
        client.V1BoundObjectReference(api_version="v1", kind="Pod", name=pod[0], uid=pod[1]) if pod else None
    )
    try:
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds, bound_object_ref=bound)
        )
        response: Any = client.CoreV1Api(api).create_namespaced_service_account_token(
            name, namespace, request
        )
    finally:
        api.close()
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    user = f"{namespace}-{name}"
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": user, "user": {"token": response.status.token}}],
        # The ServiceAccount's namespace, as in its pod: where the operator keeps its verdict key.
        "contexts": [
            {"name": user, "context": {"cluster": cluster["name"], "user": user, "namespace": namespace}}
        ],
        "current-context": user,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.touch(mode=0o600)
    out.write_text(yaml.safe_dump(kubeconfig))
    return out
