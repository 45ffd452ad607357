"""The demo's three steps, each checking what it claims, and the cluster and operator they run on."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..cluster import ClusterError, LocalCluster, build
from ..config import REPO_ROOT, default_binaries, missing_prerequisites
from ..host_operator import OPERATOR_NAMESPACE, OPERATOR_SA, service_account_kubeconfig, spawn_operator
from ..images import fault_image
from ..kustomize import DEMO, HOMELAB, find, kustomize_build
from ..procs import ProcessRecord, is_alive, record, stop
from .narration import Narrator, detail, heading, rel, say, short
from .snapshot import GROUP, PLURAL, VERSION, Snapshot, read_snapshot

DEFAULT_STATE_DIR = REPO_ROOT / ".demo" / "cluster"
NAMESPACE = "homelab"
MODEL = "clef-flash"
SERVICE = "clef-serve"
CODER = "coder"
CODER_SERVICE = "coder-predictor"
KEY_BAND_FAULT = "conv_key_band_zero"
FIXED_IMAGE = "registry.clef.test/clef-runtime:1.1"
OPERATOR = "clef-operator"
# A real verify on this host's CPU takes seconds to a minute; a step also waits for the rollout.
STEP_TIMEOUT = float(os.environ.get("CLEF_DEMO_STEP_TIMEOUT", "420"))
HEARTBEAT_SECONDS = 15.0


class DemoFailed(Exception):
    """A step did not happen as described."""


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
            snaps = {name: read_snapshot(self.api, NAMESPACE, name, svc) for name, svc in models.items()}
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
        """What the homelab overlay's Deployment runs, less its endpoints (a pod's ports): the
        liveness and the metrics endpoint.  Leader election stays on: the one operator takes the
        Lease at once, or after its duration when an earlier run's operator left it held."""
        objects = kustomize_build(self.kubectl, HOMELAB)
        container = find(objects, "Deployment", OPERATOR)["spec"]["template"]["spec"]["containers"][0]
        argv = [*container.get("command", []), *container.get("args", [])]
        if argv[:1] != [OPERATOR]:
            raise DemoFailed(f"the homelab Deployment runs {argv}, not {OPERATOR}")
        return [a for a in argv[1:] if not a.startswith(("--liveness", "--metrics-bind-address"))]

    def start_operator(self) -> None:
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
        detail(f"on this host (pid {proc.pid}); log: {rel(self.operator_log)}")

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
            say(f"cluster: a previous demo is running from {rel(self.state_dir)}; stopping it first")
            stop_demo(self.cluster)
        say(f"cluster: starting the local control plane from {rel(self.state_dir)} …")
        seconds = self.cluster.up()
        from kubernetes import config

        self.api = config.new_client_from_config(config_file=str(self.cluster.kubeconfig))
        from kubernetes import client

        nodes: list[Any] = client.CoreV1Api(self.api).list_node().items
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
        self.run_kubectl("apply", "--server-side", "-k", rel(DEMO))
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
        detail(f"            summary: {short(str(record_.get('summary', '')).split(' — ')[0], 120)}")
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
        kubeconfig = rel(self.cluster.kubeconfig)
        print(
            f"""
All three steps happened as described.

Look around (the cluster and the operator keep running):
  export KUBECONFIG={kubeconfig} PATH="{self.cluster.bin.kubectl.parent}:$PATH"
  kubectl get clefmodels -A
  kubectl -n {NAMESPACE} describe clefmodel {MODEL}          # conditions and events
  kubectl -n {NAMESPACE} get deployments,jobs,pods,services
  kubectl -n {NAMESPACE} annotate clefmodel {MODEL} clef.riotpiao.com/reverify="$(date +%s)" --overwrite
  less {rel(self.operator_log)}     # what the operator did
  ls {rel(self.cluster.logs / "verify")}/                   # one log per verification run

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
                    print(f"  {c['type']}={c['status']} ({c['reason']}): {short(c.get('message', ''), 300)}")
            except Exception as e:  # the failure report must not hide the failure
                print(f"  (could not read {MODEL}: {e})")
        print(f"operator log ({rel(self.operator_log)}):\n{self.operator_tail()}", flush=True)
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
