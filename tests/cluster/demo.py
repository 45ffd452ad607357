"""`make demo`: DESIGN's homelab story, end to end, on the local control plane.

    python -m tests.cluster.demo [--state-dir DIR]        run it (what `make demo` does)
    python -m tests.cluster.demo [--state-dir DIR] down   stop its operator and cluster (`make demo-down`)

It starts its own local cluster from `.demo/cluster` (separate from `.cluster`, which the test
tier uses, so `make test` is unaffected by a demo left running), applies
`kustomize/overlays/demo` (the homelab overlay with images the local cluster knows, minus the
in-cluster operator), runs the operator on this host as the ServiceAccount
clef-system/clef-operator with the RBAC the overlay installed, and then plays three steps:

1. clef-flash is verified (a real `clef-runtime verify` run) and serves behind clef-serve;
2. an upgrade to an image carrying the key-band fault is rejected with the failing check, the
   old revision still serving and the Service's ClusterIP unchanged;
3. an upgrade to a fixed image is verified and swapped in.

Every step checks what it claims; any deviation ends the demo with exit status 1 and the
ClefModel's conditions and the operator's log.  The cluster and the operator are left running
for a look around, until `make demo-down`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .harness.cluster import ClusterError, LocalCluster, build
from .harness.config import REPO_ROOT, default_binaries, missing_prerequisites
from .harness.images import fault_image
from .harness.procs import ProcessRecord, is_alive, record, stop
from .shipping import DEMO, HOMELAB, OPERATOR_NAMESPACE, OPERATOR_SA, find, kustomize_build, spawn_operator

DEFAULT_STATE_DIR = REPO_ROOT / ".demo" / "cluster"
NAMESPACE = "homelab"
MODEL = "clef-flash"
SERVICE = "clef-serve"
CODER = "coder"
CODER_SERVICE = "coder-predictor"
KEY_BAND_FAULT = "conv_key_band_zero"
FIXED_IMAGE = "registry.clef.test/clef-runtime:1.1"
OPERATOR = "clef-operator"
GROUP, VERSION, PLURAL = "clef.riotpiao.com", "v1alpha1", "clefmodels"
# A real verify on this host's CPU takes seconds to a minute; a step also waits for the rollout.
STEP_TIMEOUT = float(os.environ.get("CLEF_DEMO_STEP_TIMEOUT", "420"))
HEARTBEAT_SECONDS = 15.0


class DemoFailed(Exception):
    """A step did not happen as described."""


def _now() -> str:
    return time.strftime("%H:%M:%S")


def say(message: str) -> None:
    print(f"[{_now()}] {message}", flush=True)


def detail(message: str) -> None:
    print(f"           {message}", flush=True)


def heading(title: str) -> None:
    print(f"\n── {title} " + "─" * max(4, 78 - len(title)), flush=True)


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


_DIGEST = re.compile(r"@sha256:([0-9a-f]{12})[0-9a-f]{52}")


def _short(text: str, limit: int = 200) -> str:
    """One line, digests abbreviated (`@sha256:82003baffba5…`), at most `limit` characters."""
    text = _DIGEST.sub(r"@sha256:\1…", " ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ------------------------------------------------------------------------------------ state


@dataclass
class Snapshot:
    """What one poll saw of one ClefModel and its children."""

    model: dict[str, Any]
    jobs: dict[str, str]  # name -> Pending | Running | Complete | Failed
    job_images: dict[str, str]
    pods: dict[str, tuple[str, str, str]]  # verification pod -> (job, phase, node)
    deployments: dict[str, tuple[int, int]]  # name -> (replicas, available)
    service: tuple[str, str] | None  # (selected revision, ClusterIP)

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.model.get("status") or {})

    def condition(self, type_: str) -> dict[str, Any]:
        for c in self.status.get("conditions") or []:
            if c.get("type") == type_:
                return dict(c)
        return {}

    def current(self) -> bool:
        """The status was computed for the spec as it is now (not for the one before a patch)."""
        return self.status.get("observedGeneration") == self.model["metadata"].get("generation")


# Condition changes that the Job and pod lines already tell, or that say nothing new.
_TOLD_ELSEWHERE: dict[str, set[tuple[str, str]]] = {
    "Verified": {("Unknown", "VerificationPending"), ("Unknown", "VerificationRunning")},
    "Progressing": {
        ("True", "VerificationPending"),
        ("True", "VerificationRunning"),
        ("False", "VerificationFailed"),
    },
    "Degraded": {("False", "AsExpected")},
}


@dataclass
class Narrator:
    """Prints what changed between two snapshots of a model, one line per change."""

    node_gpus: dict[str, str]
    last: dict[str, Snapshot] = field(default_factory=dict)

    def tell(self, name: str, snap: Snapshot) -> None:
        before = self.last.get(name)
        self.last[name] = snap
        who = f"{name}:"
        old_jobs = before.jobs if before else {}
        for job, state in snap.jobs.items():
            if job not in old_jobs:
                say(f"{who} verification Job {job} created for {snap.job_images.get(job, '?')}")
            elif old_jobs[job] != state and state in ("Complete", "Failed"):
                say(f"{who} verification Job {job} finished: {state}")
        old_pods = before.pods if before else {}
        for pod, (job, phase, node) in snap.pods.items():
            if old_pods.get(pod, ("", "", ""))[1:] == (phase, node):
                continue
            if phase == "Running":
                gpu = self.node_gpus.get(node, "")
                say(
                    f"{who} waiting for verification Job {job} "
                    f"(running clef-runtime verify on {node}{', ' + gpu if gpu else ''})…"
                )
            elif phase == "Pending" and node:
                say(f"{who} verification pod {pod} scheduled on {node}, starting")
        old_deps = before.deployments if before else {}
        for dep, (replicas, available) in snap.deployments.items():
            if dep not in old_deps:
                ready = f", {available}/{replicas} available" if available else ""
                say(
                    f"{who} Deployment {dep} created ({replicas} replica{'s' if replicas != 1 else ''}{ready})"
                )
            elif old_deps[dep] != (replicas, available):
                say(f"{who} Deployment {dep}: {available}/{replicas} available")
        old_svc = before.service if before else None
        if snap.service and (old_svc is None or old_svc[0] != snap.service[0]):
            rev, ip = snap.service
            say(f"{who} Service now selects revision {rev or '(none)'} (ClusterIP {ip})")
        for type_ in ("Verified", "Progressing", "Ready", "Degraded"):
            new = snap.condition(type_)
            old = before.condition(type_) if before else {}
            key = (new.get("status"), new.get("reason"))
            if not new or key == (old.get("status"), old.get("reason")):
                continue
            # Degraded going back to False is news; its steady False is not.
            cleared = type_ == "Degraded" and old.get("status") == "True"
            if key in _TOLD_ELSEWHERE.get(type_, ()) and not cleared:
                continue
            message = _short(new.get("message", ""))
            say(f"{who} {type_}={new['status']} ({new['reason']})" + (f": {message}" if message else ""))


# ------------------------------------------------------------------------------------ demo


class Demo:
    def __init__(self, state_dir: Path, step_timeout: float = STEP_TIMEOUT) -> None:
        self.state_dir = state_dir.resolve()
        self.step_timeout = step_timeout
        self.cluster = LocalCluster(self.state_dir, log=say)
        self.kubectl = str(self.cluster.bin.kubectl)
        self.operator_log = self.cluster.logs / f"{OPERATOR}.log"
        self.operator_pid: int | None = None
        self.api: Any = None
        self.node_gpus: dict[str, str] = {}
        # coder-predictor's (ClusterIP, ports) as applied, before clef adopts it.
        self.coder_service: tuple[str, list[int]] = ("", [])

    # -- plumbing ------------------------------------------------------------------------------
    def run_kubectl(self, *args: str) -> str:
        """Run kubectl as the user would paste it (paths relative to where they are), showing it."""
        print(f"\n$ kubectl {' '.join(shlex.quote(a) for a in args)}", flush=True)
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}
        proc = subprocess.run([self.kubectl, *args], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise DemoFailed(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        print(proc.stdout.rstrip(), flush=True)
        return proc.stdout

    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api)

    def snapshot(self, name: str, service: str) -> Snapshot:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        model: Any = self.custom().get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
        selector = f"clef.riotpiao.com/model={name}"
        jobs: dict[str, str] = {}
        job_images: dict[str, str] = {}
        for j in client.BatchV1Api(self.api).list_namespaced_job(NAMESPACE, label_selector=selector).items:
            conds = {c.type: c.status for c in (j.status.conditions or [])} if j.status else {}
            state = (
                "Complete"
                if conds.get("Complete") == "True"
                else "Failed"
                if conds.get("Failed") == "True"
                else "Running"
                if j.status and j.status.active
                else "Pending"
            )
            jobs[j.metadata.name] = state
            job_images[j.metadata.name] = j.spec.template.spec.containers[0].image
        pods: dict[str, tuple[str, str, str]] = {}
        core = client.CoreV1Api(self.api)
        for p in core.list_namespaced_pod(
            NAMESPACE, label_selector=f"{selector},clef.riotpiao.com/component=verification"
        ).items:
            labels = p.metadata.labels or {}
            job = labels.get("batch.kubernetes.io/job-name") or labels.get("job-name", "")
            pods[p.metadata.name] = (job, p.status.phase or "Pending", p.spec.node_name or "")
        deployments = {
            d.metadata.name: (d.spec.replicas or 0, (d.status.available_replicas or 0) if d.status else 0)
            for d in client.AppsV1Api(self.api)
            .list_namespaced_deployment(NAMESPACE, label_selector=selector)
            .items
        }
        svc: tuple[str, str] | None = None
        try:
            s = core.read_namespaced_service(service, NAMESPACE)
            if (s.spec.selector or {}).get("clef.riotpiao.com/model") == name:
                svc = ((s.spec.selector or {}).get("clef.riotpiao.com/revision", ""), s.spec.cluster_ip or "")
        except ApiException as e:
            if e.status != 404:
                raise
        return Snapshot(dict(model), jobs, job_images, pods, deployments, svc)

    def service(self, name: str) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api).read_namespaced_service(name, NAMESPACE)

    def wait(
        self,
        what: str,
        models: dict[str, str],
        done: Callable[[dict[str, Snapshot]], bool],
        narrator: Narrator,
    ) -> dict[str, Snapshot]:
        """Poll until `done`, narrating every change; fail after the step timeout."""
        started = time.monotonic()
        last_line = started
        while True:
            self.check_operator()
            snaps = {name: self.snapshot(name, svc) for name, svc in models.items()}
            for name, snap in snaps.items():
                narrator.tell(name, snap)
            if done(snaps):
                return snaps
            now = time.monotonic()
            if now - started > self.step_timeout:
                raise DemoFailed(f"timed out after {self.step_timeout:.0f}s waiting for {what}")
            if now - last_line >= HEARTBEAT_SECONDS:
                say(f"… still waiting for {what} ({now - started:.0f}s)")
                last_line = now
            time.sleep(0.5)

    # -- operator ------------------------------------------------------------------------------
    def operator_args(self) -> list[str]:
        """What the homelab overlay's Deployment runs, less the liveness endpoint (a pod's port)."""
        objects = kustomize_build(self.kubectl, HOMELAB)
        container = find(objects, "Deployment", OPERATOR)["spec"]["template"]["spec"]["containers"][0]
        argv = [*container.get("command", []), *container.get("args", [])]
        if argv[:1] != [OPERATOR]:
            raise DemoFailed(f"the homelab Deployment runs {argv}, not {OPERATOR}")
        return [a for a in argv[1:] if not a.startswith("--liveness")]

    def start_operator(self) -> None:
        from .shipping import service_account_kubeconfig

        kubeconfig = service_account_kubeconfig(
            self.cluster.kubeconfig,
            OPERATOR_NAMESPACE,
            OPERATOR_SA,
            self.state_dir / "operator.kubeconfig",
            7 * 86400,
        )
        args = self.operator_args()
        self.operator_log.parent.mkdir(parents=True, exist_ok=True)
        with self.operator_log.open("ab") as log:
            log.write(
                f"\n===== {time.strftime('%Y-%m-%dT%H:%M:%S')} clef-operator {' '.join(args)}\n".encode()
            )
            log.flush()
            proc = spawn_operator(args, kubeconfig, log)
        self.operator_pid = proc.pid
        # In the cluster's ledger, so that `down` ends it with the cluster.
        self.cluster.ledger.add(record(OPERATOR, proc.pid, group=True))
        say(f"operator: clef-operator {' '.join(args)}")
        detail(
            f"as system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SA} (the RBAC the overlay installed)"
        )
        detail(f"on this host (pid {proc.pid}); log: {_rel(self.operator_log)}")

    def check_operator(self) -> None:
        if self.operator_pid is None:
            return
        records = [r for r in self.cluster.ledger.load() if r.pid == self.operator_pid]
        if not records or not is_alive(records[0]):
            raise DemoFailed("the operator exited")

    def operator_tail(self, lines: int = 25) -> str:
        try:
            text = self.operator_log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return "(no operator log)"
        return "\n".join("  | " + line for line in text)

    # -- the story -----------------------------------------------------------------------------
    def run(self) -> int:
        print("clef demo: DESIGN's homelab story on a local Kubernetes control plane (docs/local-cluster.md)")
        missing = missing_prerequisites()
        if missing and default_binaries().missing():
            print(f"demo: cannot run here: {missing}", file=sys.stderr)
            return 3
        try:
            build(log=say)
            self.start_cluster()
            self.install()
            self.start_operator()
            step1 = self.step1()
            step2 = self.step2(step1)
            self.step3(step1, step2)
            self.finish()
        except DemoFailed as e:
            self.report_failure(str(e))
            return 1
        except ClusterError as e:
            print(f"\ndemo: the local cluster did not start: {e}", file=sys.stderr)
            return 1
        return 0

    def start_cluster(self) -> None:
        if self.cluster.ledger.load():
            say(f"cluster: a previous demo is running from {_rel(self.state_dir)}; stopping it first")
            stop_demo(self.cluster)
        say(f"cluster: starting the local control plane from {_rel(self.state_dir)} …")
        seconds = self.cluster.up()
        from kubernetes import config

        self.api = config.new_client_from_config(config_file=str(self.cluster.kubeconfig))
        from kubernetes import client

        nodes = client.CoreV1Api(self.api).list_node().items
        gpus = {
            n.metadata.name: f"{n.status.capacity.get('nvidia.com/gpu', '0')} × {n.metadata.labels.get('nvidia.com/gpu.product', '?')}"
            for n in nodes
        }
        self.node_gpus = {n.metadata.name: n.metadata.labels.get("nvidia.com/gpu.product", "") for n in nodes}
        say(
            f"cluster: up in {seconds:.0f}s; nodes: "
            + ", ".join(f"{k} ({v})" for k, v in sorted(gpus.items()))
        )

    def install(self) -> None:
        self.run_kubectl("apply", "--server-side", "-k", _rel(DEMO))
        # Before clef sees it: an adopted Service must keep its ClusterIP and ports.
        svc = self.service(CODER_SERVICE)
        self.coder_service = (svc.spec.cluster_ip, sorted(p.port for p in svc.spec.ports))

    def step1(self) -> Snapshot:
        heading("step 1: clef-flash verified and serving behind clef-serve")
        narrator = Narrator(self.node_gpus)

        def done(s: dict[str, Snapshot]) -> bool:
            flash, coder = s[MODEL], s[CODER]
            return (
                flash.current()
                and flash.condition("Ready").get("status") == "True"
                and flash.condition("Verified").get("status") == "True"
                and flash.service is not None
                and coder.current()
                and coder.condition("Ready").get("status") == "True"
            )

        snaps = self.wait(
            "clef-flash and coder to serve", {MODEL: SERVICE, CODER: CODER_SERVICE}, done, narrator
        )
        flash, coder = snaps[MODEL], snaps[CODER]
        status = flash.status
        active = str(status.get("activeRevision", ""))
        record_ = (status.get("verifications") or [{}])[0]
        self.expect(record_.get("verdict") == "Passed", f"clef-flash's verdict is {record_.get('verdict')}")
        self.expect(
            str(status.get("activeImage", "")).startswith("registry.clef.test/clef-runtime@sha256:"),
            f"serving is pinned to the verified digest, not {status.get('activeImage')}",
        )
        self.expect(
            flash.service is not None and flash.service[0] == active, "clef-serve selects the active revision"
        )
        self.expect(
            flash.deployments.get(f"{MODEL}-{active}") == (1, 1),
            f"Deployment {MODEL}-{active} has 1/1 available",
        )
        verified = coder.condition("Verified")
        self.expect(
            (verified.get("status"), verified.get("reason")) == ("Unknown", "VerificationNotRequired"),
            f"coder says it is not verified (Verified={verified.get('status')} {verified.get('reason')})",
        )
        svc = self.service(CODER_SERVICE)
        ports = sorted(p.port for p in svc.spec.ports)
        self.expect(
            (svc.spec.cluster_ip, ports) == self.coder_service,
            f"coder-predictor kept its ClusterIP and ports {self.coder_service} (now {svc.spec.cluster_ip}, {ports})",
        )
        print()
        detail(f"clef-flash: verified: {record_.get('summary', '')}")
        detail(f"            digest {record_.get('digest')} on {record_.get('gpuClass')}")
        detail(
            f"            KV cache ≈ {status.get('kvCacheTokens', 0):,} tokens (V100-16GB, f16, kvFraction 0.30)"
        )
        self.show_service(SERVICE)
        detail(
            f"coder:      Ready, Verified={verified['status']} ({verified['reason']}): not a GDN model; "
            "rolled out unverified, and says so"
        )
        self.show_service(CODER_SERVICE, note="adopted: ClusterIP and ports 80, 8080 kept")
        self.passed(1, f"clef-flash verified and serving revision {active} behind clef-serve")
        return flash

    def step2(self, step1: Snapshot) -> Snapshot:
        bad = fault_image(KEY_BAND_FAULT)
        heading("step 2: upgrade to an image carrying the key-band fault")
        active = str(step1.status["activeRevision"])
        ip = step1.service[1] if step1.service else ""
        self.patch_image(bad)
        narrator = Narrator(self.node_gpus, {MODEL: step1})

        def done(s: dict[str, Snapshot]) -> bool:
            snap = s[MODEL]
            verified = snap.condition("Verified")
            return snap.current() and verified.get("status") == "False"

        snap = self.wait("the verdict on the faulty image", {MODEL: SERVICE}, done, narrator)[MODEL]
        status = snap.status
        verified, degraded = snap.condition("Verified"), snap.condition("Degraded")
        record_ = (status.get("verifications") or [{}])[0]
        failing = record_.get("failing") or []
        self.expect(
            verified.get("reason") == "KernelMismatch",
            f"Verified=False for KernelMismatch, not {verified.get('reason')}",
        )
        self.expect(record_.get("image") == bad, f"the newest verdict is for {bad}")
        self.expect(
            any("key channel band" in str(f.get("detail", "")) for f in failing),
            f"a failing check names the zeroed key channel band: {failing}",
        )
        self.expect(degraded.get("status") == "True", "Degraded=True while the faulty image is held back")
        self.expect(
            snap.condition("Ready").get("status") == "True", "Ready stays True: the old revision serves"
        )
        self.expect(status.get("activeRevision") == active, f"revision {active} is still active")
        self.expect(
            set(snap.deployments) == {f"{MODEL}-{active}"},
            f"no Deployment exists for the faulty image: {snap.deployments}",
        )
        self.expect(
            snap.deployments[f"{MODEL}-{active}"] == (1, 1), "the old revision still has 1/1 available"
        )
        self.expect(
            snap.service == (active, ip), f"clef-serve still selects {active} at {ip}: {snap.service}"
        )
        first = next(f for f in failing if "key channel band" in str(f.get("detail", "")))
        print()
        detail(f"clef-flash: REJECTED {bad}")
        detail(f"            failing check: {first.get('name')}: {first.get('detail')}")
        detail(f"            summary: {_short(str(record_.get('summary', '')).split(' — ')[0], 120)}")
        detail(f"            still serving revision {active} ({status.get('activeImage')}), 1/1 available")
        self.show_service(SERVICE, note="unchanged")
        self.passed(2, "the key-band fault was caught; the old revision still serves; ClusterIP unchanged")
        return snap

    def step3(self, step1: Snapshot, step2: Snapshot) -> None:
        heading("step 3: upgrade to a fixed image")
        old = str(step1.status["activeRevision"])
        ip = step1.service[1] if step1.service else ""
        self.patch_image(FIXED_IMAGE)
        narrator = Narrator(self.node_gpus, {MODEL: step2})

        def done(s: dict[str, Snapshot]) -> bool:
            snap = s[MODEL]
            status = snap.status
            return (
                snap.current()
                and snap.condition("Verified").get("status") == "True"
                and snap.condition("Ready").get("status") == "True"
                and status.get("activeRevision") not in (None, old)
                and snap.service is not None
                and snap.service[0] == status.get("activeRevision")
            )

        snap = self.wait("the fixed image to be verified and swapped in", {MODEL: SERVICE}, done, narrator)[
            MODEL
        ]
        status = snap.status
        new = str(status["activeRevision"])
        record_ = (status.get("verifications") or [{}])[0]
        self.expect(
            record_.get("image") == FIXED_IMAGE and record_.get("verdict") == "Passed",
            f"{FIXED_IMAGE} passed",
        )
        self.expect(snap.condition("Degraded").get("status") == "False", "Degraded=False again")
        self.expect(
            snap.service == (new, ip), f"clef-serve selects {new} at the same ClusterIP {ip}: {snap.service}"
        )
        self.expect(snap.deployments.get(f"{MODEL}-{new}") == (1, 1), f"revision {new} has 1/1 available")
        print()
        detail(f"clef-flash: verified {FIXED_IMAGE}: {record_.get('summary', '')}")
        detail(f"            swapped: revision {old} → {new} ({status.get('activeImage')})")
        delay = self.custom().get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, MODEL)["spec"][
            "rollout"
        ]["scaleDownDelaySeconds"]
        detail(
            f"            revision {old} goes to 0 replicas {delay}s after the switch (rollout.scaleDownDelaySeconds)"
        )
        self.show_service(SERVICE, note="unchanged")
        self.passed(3, f"the fixed image was verified and swapped in; ClusterIP {ip} unchanged")

    def finish(self) -> None:
        self.run_kubectl("get", "clefmodels", "-n", NAMESPACE)
        self.run_kubectl("get", "services", "-n", NAMESPACE, "-o", "wide")
        kubeconfig = _rel(self.cluster.kubeconfig)
        print(
            f"""
All three steps happened as described.

Look around (the cluster and the operator keep running):
  export KUBECONFIG={kubeconfig} PATH="{self.cluster.bin.kubectl.parent}:$PATH"
  kubectl get clefmodels -A
  kubectl -n {NAMESPACE} describe clefmodel {MODEL}          # conditions and events
  kubectl -n {NAMESPACE} get deployments,jobs,pods,services
  kubectl -n {NAMESPACE} annotate clefmodel {MODEL} clef.riotpiao.com/reverify="$(date +%s)" --overwrite
  less {_rel(self.operator_log)}     # what the operator did
  ls {_rel(self.cluster.logs / "verify")}/                   # one log per verification run

Tear down:
  make demo-down        # stops the operator and the demo cluster (make test never needs it)
""",
            flush=True,
        )

    # -- helpers -------------------------------------------------------------------------------
    def patch_image(self, image: str) -> None:
        patch = json.dumps({"spec": {"image": image}}, separators=(",", ":"))
        self.run_kubectl("-n", NAMESPACE, "patch", "clefmodel", MODEL, "--type=merge", "-p", patch)

    def show_service(self, name: str, note: str = "") -> None:
        svc = self.service(name)
        selector = ", ".join(f"{k}={v}" for k, v in sorted((svc.spec.selector or {}).items()))
        suffix = f" ({note})" if note else ""
        detail(f"Service {name}: selector {{{selector}}}, ClusterIP {svc.spec.cluster_ip}{suffix}")

    @staticmethod
    def expect(ok: bool, claim: str) -> None:
        if not ok:
            raise DemoFailed(f"expected: {claim}")

    @staticmethod
    def passed(step: int, what: str) -> None:
        print(f"\n✔ step {step}: {what}", flush=True)

    def report_failure(self, why: str) -> None:
        print(f"\n✘ the demo did not happen as described: {why}", flush=True)
        if self.api is not None:
            try:
                model: Any = self.custom().get_namespaced_custom_object(
                    GROUP, VERSION, NAMESPACE, PLURAL, MODEL
                )
                for c in (model.get("status") or {}).get("conditions") or []:
                    print(f"  {c['type']}={c['status']} ({c['reason']}): {_short(c.get('message', ''), 300)}")
            except Exception as e:  # the failure report must not hide the failure
                print(f"  (could not read {MODEL}: {e})")
        print(f"operator log ({_rel(self.operator_log)}):\n{self.operator_tail()}", flush=True)
        print("\nThe demo cluster is still running for a look; `make demo-down` stops it.", flush=True)


def stop_demo(cluster: LocalCluster) -> bool:
    """Stop the demo's operator, then its cluster.  Returns whether everything stopped."""
    records = cluster.ledger.load()
    operators = [r for r in records if r.name == OPERATOR]
    survivors: list[ProcessRecord] = stop(operators, grace=15.0)
    if operators and not survivors:
        cluster.ledger.save([r for r in records if r.name != OPERATOR])
    report = cluster.down()
    if survivors or not report.clean:
        print(
            f"demo: still running: {[f'{r.name} (pid {r.pid})' for r in survivors] + report.survivors}; "
            f"ports still listening: {report.ports_still_listening}",
            file=sys.stderr,
        )
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.cluster.demo", description="clef's demo (make demo)"
    )
    parser.add_argument(
        "--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="where the demo cluster lives"
    )
    parser.add_argument("command", nargs="?", choices=["run", "down"], default="run")
    args = parser.parse_args(argv)
    if args.command == "down":
        cluster = LocalCluster(args.state_dir)
        if not cluster.ledger.load():
            print(f"demo: nothing is running from {_rel(args.state_dir.resolve())}", file=sys.stderr)
            return 0
        ok = stop_demo(cluster)
        if ok:
            print(
                f"demo: stopped the operator and the cluster from {_rel(args.state_dir.resolve())}",
                file=sys.stderr,
            )
        return 0 if ok else 1
    try:
        return Demo(args.state_dir).run()
    except KeyboardInterrupt:
        print(
            "\ndemo: interrupted; whatever started is still running: `make demo-down` stops it",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
