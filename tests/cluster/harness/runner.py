"""The verification-pod runner: a stand-in kubelet for pods labelled
clef.riotpiao.com/component=verification that are bound to kwok nodes.

kwok fakes every other pod; these it leaves alone (manifests/kwok-stages.yaml).  For each one the
runner looks the container image up in the image table (images.py) and then

* unpullable (or unknown) image: reports ErrImagePull, then ImagePullBackOff, and never runs it;
* hang: reports the container running and waits until the pod is deleted;
* good / fault: reports it running, executes the container's command on this host (argv, no
  shell) in the project's environment, and writes the real exit code and termination message
  back, so the Job controller decides the Job's outcome for real reasons.

Deletion is the runner's job too, as it is a kubelet's: the process group gets SIGTERM, then
SIGKILL after the grace period, the final status is written, and the pod is removed with a
zero-grace delete.  Output of every run is kept in <state>/logs/verify/.

Run as `python -m tests.cluster.harness.runner --state-dir DIR --kubeconfig FILE`; `up` starts it.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import images
from .config import KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE, VENV_BIN, VERIFICATION_SELECTOR
from .rest import ApiError, Rest

log = logging.getLogger("clef.runner")

Obj = dict[str, Any]

# kubelet's limits: the message is cut at 4 KiB; the log fallback takes at most 80 lines / 2 KiB.
TERMINATION_MESSAGE_LIMIT = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048
# kubelet's crash-loop back-off (10s doubling to 5min), for restartPolicy OnFailure/Always.
BACKOFF_START, BACKOFF_MAX = 10.0, 300.0
# How often ErrImagePull is retried (and re-reported) while the pod lives.
PULL_RETRY_SECONDS = 20.0
API_TIMEOUT = 15

# Forced for every run: the host has no GPU for these pods, and the verify suite must fit a CPU.
HARNESS_ENV = {
    "CLEF_VERIFY_DEVICE": "cpu",
    "CLEF_VERIFY_SHAPES": "reduced",
    "TRITON_INTERPRET": "1",
}


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined names are replaced, $$ escapes, the rest is kept."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and (end := text.find(")", i + 2)) != -1:
            name = text[i + 2 : end]
            out.append(env[name] if name in env else text[i : end + 1])
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def read_termination_message(path: Path, log_path: Path, policy: str | None, exit_code: int) -> str:
    try:
        data = path.read_bytes()[:TERMINATION_MESSAGE_LIMIT]
    except OSError:
        data = b""
    if not data.strip() and policy == "FallbackToLogsOnError" and exit_code != 0:
        try:
            lines = log_path.read_bytes().splitlines(keepends=True)[-FALLBACK_LOG_LINES:]
        except OSError:
            lines = []
        data = b"".join(lines)[-FALLBACK_LOG_BYTES:]
    return data.decode("utf-8", errors="ignore")


@dataclass
class ContainerState:
    """One container's status as the runner reports it (the kubelet's ContainerStatus)."""

    name: str
    image: str
    image_id: str = ""
    container_id: str = ""
    restart_count: int = 0
    state: dict[str, Any] = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict[str, Any] = field(default_factory=dict)

    @property
    def running(self) -> bool:
        return "running" in self.state

    @property
    def terminated(self) -> dict[str, Any] | None:
        t = self.state.get("terminated")
        return t if isinstance(t, dict) else None

    def to_status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "image": self.image,
            "imageID": self.image_id,
            "containerID": self.container_id or None,
            "ready": self.running,
            "started": self.running,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }


class PodWorker:
    """Drives one pod from bound to terminal (and, once deleted, gone)."""

    def __init__(self, runner: Runner, pod: Obj) -> None:
        self.runner = runner
        self.rest = runner.rest
        self.path = f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"
        self.pod = pod
        meta = pod["metadata"]
        self.name: str = meta["name"]
        self.namespace: str = meta["namespace"]
        self.uid: str = meta["uid"]
        self.node: str = pod["spec"].get("nodeName") or ""
        self.specs: list[Obj] = pod["spec"]["containers"]
        self.stop = threading.Event()
        self.grace = 30.0
        self.lock = threading.Lock()
        # Held from building a status to the server's answer, so that containers finishing at
        # once cannot land their updates out of order (terminated, then an older "running").
        self.publishing = threading.Lock()
        self.containers = {c["name"]: ContainerState(c["name"], c["image"]) for c in self.specs}
        self.start_time: str | None = (pod.get("status") or {}).get("startTime")
        self.phase = "Pending"
        self.gone = False
        self.transitions: dict[str, tuple[str, str]] = {}

    # -- requests from the watch loop ------------------------------------------------------
    def request_stop(self, grace: float) -> None:
        self.grace = max(0.0, min(grace, 30.0))
        self.stop.set()

    # -- status ------------------------------------------------------------------------------
    def _publish(self) -> None:
        with self.publishing:
            self._publish_now()

    def _publish_now(self) -> None:
        if self.gone or self.runner.shutting_down.is_set():
            return
        with self.lock:
            statuses = [s.to_status() for s in self.containers.values()]
            all_running = all(s.running for s in self.containers.values())
            terminal = self.phase in ("Succeeded", "Failed")
            if terminal:
                ready_reason: dict[str, str] = {"reason": "PodCompleted"}
            elif all_running:
                ready_reason = {}
            else:
                waiting = [n for n, s in self.containers.items() if not s.running]
                ready_reason = {
                    "reason": "ContainersNotReady",
                    "message": f"containers with unready status: [{' '.join(waiting)}]",
                }
            ready = "True" if all_running and not terminal else "False"
            stamp = now()
            conditions = []
            for kind, value, extra in (
                ("PodReadyToStartContainers", "True", {}),
                ("Initialized", "True", {}),
                ("ContainersReady", ready, ready_reason),
                ("Ready", ready, ready_reason),
            ):
                # A condition's transition time moves only when its status does.
                if self.transitions.get(kind, ("", ""))[0] != value:
                    self.transitions[kind] = (value, stamp)
                since = self.transitions[kind][1]
                conditions.append({"type": kind, "status": value, "lastTransitionTime": since, **extra})
            status: Obj = {"phase": self.phase, "containerStatuses": statuses, "conditions": conditions}
            if self.start_time is None:
                self.start_time = stamp
            status["startTime"] = self.start_time
            host_ip = self.runner.node_ip(self.node)
            if host_ip:
                status["hostIP"] = host_ip
                status["hostIPs"] = [{"ip": host_ip}]
        try:
            self.rest.patch_status(self.path, status)
        except ApiError as e:
            if e.status == 404:
                self.gone = True
                self.stop.set()
                return
            log.error("%s/%s: status update rejected: %s", self.namespace, self.name, e)

    # -- lifecycle ---------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._run()
        except Exception:
            log.error("%s/%s: runner error\n%s", self.namespace, self.name, traceback.format_exc())
        finally:
            if self.stop.is_set() and not self.runner.shutting_down.is_set():
                self.runner.finalize(self.namespace, self.name, self.uid)
            self.runner.forget(self.uid)

    def _run(self) -> None:
        table = self.runner.image_table()
        entries = {c["name"]: table.lookup(c["image"]) for c in self.specs}
        log.info(
            "%s/%s: images %s",
            self.namespace,
            self.name,
            {n: (e.kind if e else "unknown") for n, e in entries.items()},
        )
        if any(e is None or e.kind == "unpullable" for e in entries.values()):
            self._pull_failure(entries)
            return
        threads = [
            threading.Thread(target=self._container_loop, args=(c, entries[c["name"]]), daemon=True)
            for c in self.specs
        ]
        with self.lock:
            self.phase = "Running"
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with self.lock:
            codes = [s.terminated["exitCode"] if s.terminated else 1 for s in self.containers.values()]
            self.phase = "Succeeded" if all(c == 0 for c in codes) else "Failed"
        self._publish()
        log.info("%s/%s: %s (exit codes %s)", self.namespace, self.name, self.phase, codes)

    def _pull_failure(self, entries: dict[str, images.ImageEntry | None]) -> None:
        def waiting(reason: str) -> None:
            with self.lock:
                for name, entry in entries.items():
                    if entry is None or entry.kind == "unpullable":
                        s = self.containers[name]
                        why = "not found" if entry is None else "unauthorized or not found"
                        message = (
                            f'failed to pull and unpack image "{s.image}": {why} (clef local cluster: '
                            + (
                                "the image is in no entry of the image table)"
                                if entry is None
                                else "unpullable)"
                            )
                            if reason == "ErrImagePull"
                            else f'Back-off pulling image "{s.image}"'
                        )
                        s.state = {"waiting": {"reason": reason, "message": message}}
            self._publish()

        while not self.stop.is_set():
            waiting("ErrImagePull")
            if self.stop.wait(5.0):
                break
            waiting("ImagePullBackOff")
            if self.stop.wait(PULL_RETRY_SECONDS):
                break
        # A pod deleted before its image arrived: the kubelet reports the container as unknown.
        with self.lock:
            for s in self.containers.values():
                if not s.terminated:
                    s.state = {
                        "terminated": {
                            "exitCode": 137,
                            "reason": "ContainerStatusUnknown",
                            "message": "The container could not be located when the pod was terminated",
                            "startedAt": None,
                            "finishedAt": now(),
                        }
                    }
            self.phase = "Failed"
        self._publish()

    def _container_loop(self, spec: Obj, entry: images.ImageEntry | None) -> None:
        assert entry is not None
        state = self.containers[spec["name"]]
        policy = self.pod["spec"].get("restartPolicy") or "Always"
        backoff = BACKOFF_START
        while True:
            exit_code = self._run_container(spec, entry, state)
            restart = not self.stop.is_set() and (
                policy == "Always" or (policy == "OnFailure" and exit_code != 0)
            )
            if not restart:
                return
            with self.lock:
                state.last_state = state.state
                state.restart_count += 1
                state.state = {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": f"back-off {int(backoff)}s restarting failed container={spec['name']}",
                    }
                }
            self._publish()
            if self.stop.wait(backoff):
                return
            backoff = min(backoff * 2, BACKOFF_MAX)

    def _run_container(self, spec: Obj, entry: images.ImageEntry, state: ContainerState) -> int:
        container_id = f"clef-harness://{uuid.uuid4().hex}"
        started = now()
        with self.lock:
            state.image_id = entry.image_id
            state.container_id = container_id

        def terminate(code: int, reason: str, message: str) -> int:
            with self.lock:
                state.state = {
                    "terminated": {
                        "exitCode": code,
                        "reason": reason,
                        "message": message,
                        "startedAt": started,
                        "finishedAt": now(),
                        "containerID": container_id,
                    }
                }
            self._publish()
            return code

        if entry.kind == "hang":
            with self.lock:
                state.state = {"running": {"startedAt": started}}
            self._publish()
            self.stop.wait()
            return terminate(137, "Error", "")

        try:
            env = self.runner.container_env(self.pod, spec)
        except LookupError as e:
            # kubelet: CreateContainerConfigError, the container never starts.
            with self.lock:
                state.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
            self._publish()
            self.stop.wait()
            return terminate(137, "ContainerStatusUnknown", str(e))

        command = list(spec.get("command") or entry.entrypoint)
        argv = [expand(str(a), env) for a in command + list(spec.get("args") or [])]
        run_dir = self.runner.run_dir(self.namespace, self.name, spec["name"], state.restart_count)
        termlog = run_dir / "termination-log"
        termlog.write_bytes(b"")
        out_path = self.runner.log_path(self.namespace, self.name, spec["name"], state.restart_count)
        proc_env = self.runner.base_env(self.name)
        proc_env.update(env)
        proc_env.update(HARNESS_ENV)
        proc_env["CLEF_TERMINATION_LOG"] = str(termlog)
        if entry.kind == "fault":
            proc_env["CLEF_RUNTIME_FAULT"] = str(entry.fault)
        if not argv:
            return terminate(128, "StartError", "no command specified")
        exe = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=proc_env["PATH"])
        if exe is None or not os.access(exe, os.X_OK):
            return terminate(
                128,
                "StartError",
                f'exec: "{argv[0]}": executable file not found in $PATH',
            )
        with out_path.open("wb") as out:
            out.write(f"# {json.dumps(argv)}\n# image {spec['image']} ({entry.kind}"
                      f"{' ' + str(entry.fault) if entry.fault else ''})\n".encode())  # fmt: skip
            out.flush()
            try:
                proc = subprocess.Popen(
                    [exe, *argv[1:]],
                    cwd=run_dir,
                    env=proc_env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as e:
                return terminate(128, "StartError", f"{argv[0]}: {e.strerror}")
            self.runner.track(proc.pid)
            with self.lock:
                state.state = {"running": {"startedAt": started}}
            self._publish()
            log.info("%s/%s/%s: started pid %d: %s", self.namespace, self.name, spec["name"], proc.pid, argv)
            try:
                code = self._wait(proc)
            finally:
                self.runner.untrack(proc.pid)
        message = read_termination_message(termlog, out_path, spec.get("terminationMessagePolicy"), code)
        return terminate(code, "Completed" if code == 0 else "Error", message)

    def _wait(self, proc: subprocess.Popen[bytes]) -> int:
        while proc.poll() is None:
            if self.stop.wait(0.2):
                kill_group(proc, self.grace)
                break
        rc = proc.wait()
        # A signal death is reported as the shell (and the kubelet) does: 128 + signal.
        return 128 - rc if rc < 0 else rc


def kill_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            # The leader is gone; helpers it left in the group go too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue


class Runner:
    def __init__(self, rest: Rest, state_dir: Path, workers: int = 64) -> None:
        self.rest = rest
        self.state_dir = state_dir
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pod")
        self.lock = threading.Lock()
        self.workers: dict[str, PodWorker] = {}
        self.finalizing: set[str] = set()
        self.done: set[str] = set()
        self.nodes: dict[str, str] = {}  # kwok node name -> InternalIP ("" if none)
        self.nodes_listed = 0.0
        self.shutting_down = threading.Event()
        self.procs_dir = state_dir / "run" / "verify-procs"
        self.procs_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / "logs" / "verify").mkdir(parents=True, exist_ok=True)

    # -- paths and environment ---------------------------------------------------------------
    def run_dir(self, namespace: str, pod: str, container: str, restart: int) -> Path:
        d = self.state_dir / "runs" / f"{namespace}_{pod}_{container}_{restart}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        return d

    def log_path(self, namespace: str, pod: str, container: str, restart: int) -> Path:
        suffix = f".{restart}" if restart else ""
        return self.state_dir / "logs" / "verify" / f"{namespace}_{pod}_{container}{suffix}.log"

    def base_env(self, pod_name: str) -> dict[str, str]:
        # What an image's ENV would provide: the project's venv first, the host's tools after.
        env = {
            "PATH": f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "HOSTNAME": pod_name,
            "VIRTUAL_ENV": str(VENV_BIN.parent),
        }
        for passthrough in ("TMPDIR", "TRITON_CACHE_DIR", "HF_HOME", "TORCHINDUCTOR_CACHE_DIR"):
            if passthrough in os.environ:
                env[passthrough] = os.environ[passthrough]
        return env

    def container_env(self, pod: Obj, spec: Obj) -> dict[str, str]:
        """The container's env as a kubelet resolves it (literal values, refs, envFrom)."""
        ns = pod["metadata"]["namespace"]
        env: dict[str, str] = {}
        for src in spec.get("envFrom") or []:
            prefix = src.get("prefix") or ""
            if "configMapRef" in src:
                ref = src["configMapRef"]
                data = self._config_map(ns, ref["name"], bool(ref.get("optional")))
            elif "secretRef" in src:
                ref = src["secretRef"]
                data = self._secret(ns, ref["name"], bool(ref.get("optional")))
            else:
                continue
            env.update({prefix + k: v for k, v in data.items()})
        for var in spec.get("env") or []:
            if "valueFrom" not in var:
                env[var["name"]] = expand(var.get("value") or "", env)
                continue
            value = self._value_from(pod, var["name"], var["valueFrom"])
            if value is not None:
                env[var["name"]] = value
        return env

    def _value_from(self, pod: Obj, name: str, src: Obj) -> str | None:
        meta, ns = pod["metadata"], pod["metadata"]["namespace"]
        if "fieldRef" in src:
            path = src["fieldRef"]["fieldPath"]
            fields = {
                "metadata.name": meta.get("name"),
                "metadata.namespace": ns,
                "metadata.uid": meta.get("uid"),
                "spec.nodeName": pod["spec"].get("nodeName"),
                "spec.serviceAccountName": pod["spec"].get("serviceAccountName"),
                "status.hostIP": self.node_ip(pod["spec"].get("nodeName")),
            }
            if path in fields:
                return str(fields[path] or "")
            for prefix, key in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
                if path.startswith(prefix + "['") and path.endswith("']"):
                    return str((meta.get(key) or {}).get(path[len(prefix) + 2 : -2], ""))
            log.warning("env %s: fieldRef %s is not supported by the local runner; left unset", name, path)
            return None
        for key, kind, read in (
            ("configMapKeyRef", "ConfigMap", self._config_map),
            ("secretKeyRef", "Secret", self._secret),
        ):
            if key in src:
                ref = src[key]
                optional = bool(ref.get("optional"))
                data = read(ns, ref["name"], optional)
                if ref["key"] not in data and not optional:
                    raise LookupError(f"couldn't find key {ref['key']} in {kind} {ns}/{ref['name']}")
                return data.get(ref["key"])
        log.warning("env %s: this valueFrom is not supported by the local runner; left unset", name)
        return None

    def _config_map(self, ns: str, name: str, optional: bool) -> dict[str, str]:
        return self._data(f"/api/v1/namespaces/{ns}/configmaps/{name}", f'configmap "{name}"', optional)

    def _secret(self, ns: str, name: str, optional: bool) -> dict[str, str]:
        raw = self._data(f"/api/v1/namespaces/{ns}/secrets/{name}", f'secret "{name}"', optional)
        return {k: base64.b64decode(v).decode("utf-8", errors="replace") for k, v in raw.items()}

    def _data(self, path: str, what: str, optional: bool) -> dict[str, str]:
        try:
            return dict(self.rest.get(path).get("data") or {})
        except ApiError as e:
            if e.status == 404 and optional:
                return {}
            if e.status == 404:
                raise LookupError(f"{what} not found") from e
            raise

    def image_table(self) -> images.ImageTable:
        try:
            table = images.read_table(self.rest)
        except ApiError as e:
            log.warning("image table unreadable (%s); using the seed file", e)
            table = None
        return table if table is not None else images.seed_table()

    # -- nodes -------------------------------------------------------------------------------
    def _refresh_nodes(self) -> None:
        found: dict[str, str] = {}
        for n in self._list_nodes()["items"]:
            if (n["metadata"].get("annotations") or {}).get(KWOK_NODE_ANNOTATION) != KWOK_NODE_VALUE:
                continue
            addresses = (n.get("status") or {}).get("addresses") or []
            found[n["metadata"]["name"]] = next(
                (a["address"] for a in addresses if a["type"] == "InternalIP"), ""
            )
        with self.lock:
            self.nodes = found
            self.nodes_listed = time.monotonic()

    def _list_nodes(self) -> Obj:
        return self.rest.get("/api/v1/nodes")

    def _list_pods(self) -> Obj:
        return self.rest.get("/api/v1/pods", labelSelector=VERIFICATION_SELECTOR)

    def is_kwok_node(self, name: str | None) -> bool:
        if not name:
            return False
        if name not in self.nodes and time.monotonic() - self.nodes_listed > 2.0:
            self._refresh_nodes()
        return name in self.nodes

    def node_ip(self, name: str | None) -> str:
        return self.nodes.get(name or "", "")

    # -- process bookkeeping (so `down` can end verification commands even if we crash) -------
    def track(self, pid: int) -> None:
        from .procs import record

        try:
            rec = record("verify", pid, group=True)
        except RuntimeError:
            return
        (self.procs_dir / f"{pid}.json").write_text(json.dumps(rec.__dict__))

    def untrack(self, pid: int) -> None:
        (self.procs_dir / f"{pid}.json").unlink(missing_ok=True)

    # -- the watch loop ----------------------------------------------------------------------
    def observe(self, pod: Obj, deleted: bool = False) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        with self.lock:
            worker = self.workers.get(uid)
        if deleted:
            if worker:
                worker.gone = True
                worker.request_stop(0)
            with self.lock:
                self.done.discard(uid)
                self.finalizing.discard(uid)
            return
        if not self.is_kwok_node(pod["spec"].get("nodeName")):
            return
        if meta.get("deletionTimestamp"):
            if worker:
                worker.request_stop(float(meta.get("deletionGracePeriodSeconds") or 0))
            else:
                self.finalize(meta["namespace"], meta["name"], uid)
            return
        phase = (pod.get("status") or {}).get("phase")
        if worker or uid in self.done or phase in ("Succeeded", "Failed"):
            return
        worker = PodWorker(self, pod)
        with self.lock:
            if uid in self.workers:
                return
            self.workers[uid] = worker
        self.pool.submit(worker.run)

    def forget(self, uid: str) -> None:
        with self.lock:
            self.workers.pop(uid, None)
            # Events written before the final status may still be on their way; they must not
            # start the pod a second time.
            self.done.add(uid)

    def finalize(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet's last word on a deleted pod: remove it with a zero grace period."""
        with self.lock:
            if uid in self.finalizing:
                return
            self.finalizing.add(uid)

        # Inline, not on the pool: the pool may be full of pods waiting for exactly this.
        try:
            self.rest.delete(
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
            )
            log.info("%s/%s: deleted", namespace, name)
        except ApiError as e:
            if e.status not in (404, 409):
                log.error("%s/%s: final delete failed: %s", namespace, name, e)
                with self.lock:
                    self.finalizing.discard(uid)
        except OSError as e:
            # The next resync (at most 30 s away) tries again.
            log.warning("%s/%s: final delete did not reach the API server: %s", namespace, name, e)
            with self.lock:
                self.finalizing.discard(uid)

    def serve(self, ready_file: Path | None = None) -> None:
        self._refresh_nodes()
        while not self.shutting_down.is_set():
            try:
                listed = self._list_pods()
                for pod in listed["items"]:
                    self.observe(pod)
                if ready_file is not None:
                    ready_file.write_text(str(os.getpid()))
                    ready_file = None
                stream = self.rest.watch(
                    "/api/v1/pods",
                    labelSelector=VERIFICATION_SELECTOR,
                    resourceVersion=listed["metadata"]["resourceVersion"],
                    allowWatchBookmarks="true",
                    timeoutSeconds="30",
                )
                for event in stream:
                    kind = event["type"]
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self.observe(event["object"], deleted=kind == "DELETED")
                    elif kind == "ERROR":
                        # Typically 410 Gone: the resourceVersion is too old; list afresh.
                        break
                # The watch ended: the next list is a full resync.
            except ApiError as e:
                log.warning("pod watch failed (%s); listing again", e)
                time.sleep(1.0)
            except Exception as e:
                log.warning("pod watch failed (%s: %s); listing again", type(e).__name__, e)
                time.sleep(1.0)

    def shutdown(self) -> None:
        """Stop every command now; statuses are not written, since the cluster is going away."""
        self.shutting_down.set()
        with self.lock:
            workers = list(self.workers.values())
        for w in workers:
            w.request_stop(2.0)
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            with self.lock:
                if not self.workers:
                    break
            time.sleep(0.05)
        for p in self.procs_dir.glob("*.json"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int(p.stem), signal.SIGKILL)
            p.unlink(missing_ok=True)


class _Shutdown(BaseException):
    pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.harness.runner")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=64)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s", stream=sys.stderr
    )
    runner = Runner(Rest(args.kubeconfig), args.state_dir.resolve(), workers=args.workers)

    def on_signal(signum: int, _frame: object) -> None:
        raise _Shutdown(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("runner up (pid %d), watching pods with %s", os.getpid(), VERIFICATION_SELECTOR)
    try:
        runner.serve(ready_file=args.state_dir / "run" / "runner.ready")
    except _Shutdown:
        log.info("runner stopping")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        runner.shutdown()
    # Worker threads may sit in HTTP calls to a server that is already gone; do not wait for them.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
