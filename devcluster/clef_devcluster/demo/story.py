"""The demo's four steps, each checking what it claims, and the cluster and operator they run on."""

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
from ..kustomize import DEMO, HOMELAB, find, kustomize_build
from ..procs import ProcessRecord, is_alive, record, stop
from ..runner import real_engine
from . import real_vllm as real_vllm_variant
from .narration import Narrator, detail, heading, rel, say, short
from .snapshot import GROUP, PLURAL, VERSION, Snapshot, read_snapshot

DEFAULT_STATE_DIR = REPO_ROOT / ".demo" / "cluster"
NAMESPACE = "homelab"
MODEL = "clef-flash"
SERVICE = "clef-serve"
CODER = "coder"
CODER_SERVICE = "coder-predictor"
ENGINES = "registry.clef.test/engines"
# candle-vllm 0.9.0 carries the key-band fault (conv_key_band_zero) in the serving engine; 0.9.1 fixed it.
BROKEN_IMAGE = f"{ENGINES}/candle-vllm:0.9.0"
FIXED_IMAGE = f"{ENGINES}/candle-vllm:0.9.1"
# Step 4: a GPU goes bad under a serving pod.  The local cluster's stand-in: engines started from
# now on answer this many generation requests right, then with the key-band fault (the runner's
# `clef-runtime serve --fault-after`): the second replica's first probe passes, its second does not.
GOES_BAD_AFTER = 1
PROBE_INTERVAL = 60
STEP_LABEL = "clef.riotpiao.com/verification-step"
OPERATOR = "clef-operator"
# Goldens, a preview engine and a comparison on this host's CPU take a minute or two; a step also
# waits for the rollout.
STEP_TIMEOUT = float(os.environ.get("CLEF_DEMO_STEP_TIMEOUT", "420"))
HEARTBEAT_SECONDS = 15.0


class DemoFailed(Exception):
    """A step did not happen as described."""


# ------------------------------------------------------------------------------------ demo


class Demo:
    def __init__(self, state_dir: Path, step_timeout: float = STEP_TIMEOUT, real_vllm: bool = False) -> None:
        self.state_dir = state_dir.resolve()
        # `make demo-vllm`: the coder on real vLLM (demo/real_vllm.py), which takes minutes to start.
        self.real_vllm = real_vllm
        self.step_timeout = max(step_timeout, real_vllm_variant.STEP1_TIMEOUT) if real_vllm else step_timeout
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
        if self.real_vllm:
            print(
                f"variant: the coder on real vLLM ({real_vllm_variant.IMAGE}: vLLM's CPU build), not the stand-in"
            )
            no_vllm = real_vllm_variant.missing()
            if no_vllm:
                print(f"demo: cannot run the real-vLLM variant here: {no_vllm}", file=sys.stderr)
                return 3
        try:
            build(log=say)
            self.start_cluster()
            self.install()
            self.start_operator()
            step1 = self.step1()
            step2 = self.step2(step1)
            step3 = self.step3(step1, step2)
            self.step4(step3)
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
        overlay = self.write_overlay()
        self.run_kubectl("apply", "--server-side", "-k", rel(overlay))
        # Before clef sees it: an adopted Service must keep its ClusterIP and ports.
        svc = self.service(CODER_SERVICE)
        self.coder_service = (svc.spec.cluster_ip, sorted(p.port for p in svc.spec.ports))

    def write_overlay(self) -> Path:
        """A small real checkpoint per model (a real tokenizer and chat template, tiny hybrid
        weights) in the state directory, and an overlay over `kustomize/overlays/demo` that points
        the models' hostPaths at them: the goldens Job and the engines read what a node would mount."""
        from ..checkpoints import write_chat_checkpoint

        models = self.state_dir / "models"
        paths: dict[str, Path] = {}
        for name, seed in ((MODEL, 0), (CODER, 1)):
            paths[name] = models / name
            if not (paths[name] / "model.safetensors").exists():
                write_chat_checkpoint(paths[name], seed=seed)
        say(f"checkpoints: {', '.join(rel(p) for p in paths.values())} (a real tokenizer, tiny weights)")
        if self.real_vllm:
            paths[CODER] = real_vllm_variant.write_checkpoint(models / f"{CODER}-decisive")
            say(f"checkpoint for real vLLM: {rel(paths[CODER])} (the decisive checkpoint, bf16)")
        overlay = self.state_dir / "overlay"
        overlay.mkdir(parents=True, exist_ok=True)
        patches = [
            {
                "target": {"kind": "ClefModel", "name": name},
                "patch": json.dumps(
                    [{"op": "replace", "path": "/spec/model/volume/hostPath/path", "value": str(path)}]
                ),
            }
            for name, path in paths.items()
        ]
        # The one node directory the operator may mount: where these checkpoints are.
        allowed = [
            {"op": "replace", "path": "/spec/variables/0/expression", "value": json.dumps([str(models)])}
        ]
        patches.append(
            {
                "target": {"kind": "ValidatingAdmissionPolicy", "name": "clef-operator-host-paths"},
                "patch": json.dumps(allowed),
            }
        )
        if self.real_vllm:
            patches += real_vllm_variant.coder_patches(paths[CODER])
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(DEMO, overlay)],
            "patches": patches,
        }
        (overlay / "kustomization.yaml").write_text(
            "# Written by `make demo`: kustomize/overlays/demo with the checkpoints of this state directory.\n"
            + json.dumps(kustomization, indent=2)
            + "\n"
        )
        return overlay

    def goldens_jobs(self, model: str) -> list[str]:
        from kubernetes import client

        jobs: list[Any] = (
            client.BatchV1Api(self.api)
            .list_namespaced_job(
                NAMESPACE, label_selector=f"clef.riotpiao.com/model={model},{STEP_LABEL}=goldens"
            )
            .items
        )
        return [j.metadata.name for j in jobs]

    def step1(self) -> Snapshot:
        heading("step 1: clef-flash (candle-vllm) verified by endpoint and serving behind clef-serve")
        narrator = Narrator(self.node_gpus)

        def serving(snap: Snapshot) -> bool:
            return (
                snap.current()
                and snap.condition("Ready").get("status") == "True"
                and snap.condition("Verified").get("status") == "True"
                and snap.service is not None
            )

        snaps = self.wait(
            "clef-flash and coder to be verified and serve",
            {MODEL: SERVICE, CODER: CODER_SERVICE},
            lambda s: serving(s[MODEL]) and serving(s[CODER]),
            narrator,
        )
        flash, coder = snaps[MODEL], snaps[CODER]
        active = self.check_serving(flash, f"{ENGINES}/candle-vllm@sha256:")
        self.check_serving(coder, f"{ENGINES}/vllm@sha256:")
        self.expect(
            len(self.goldens_jobs(MODEL)) == 1, f"one goldens Job for clef-flash: {self.goldens_jobs(MODEL)}"
        )
        svc = self.service(CODER_SERVICE)
        ports = sorted(p.port for p in svc.spec.ports)
        self.expect(
            (svc.spec.cluster_ip, ports) == self.coder_service,
            f"coder-predictor kept its ClusterIP and ports {self.coder_service} (now {svc.spec.cluster_ip}, {ports})",
        )
        print()
        self.tell_verdict(flash)
        detail(
            f"            KV cache ≈ {flash.status.get('kvCacheTokens', 0):,} tokens (V100-16GB, f16, kvFraction 0.30)"
        )
        self.show_service(SERVICE)
        self.tell_verdict(coder)
        if self.real_vllm:
            self.tell_real_vllm(coder)
        self.show_service(CODER_SERVICE, note="adopted: ClusterIP and ports 80, 8080 kept")
        self.passed(1, f"clef-flash verified by endpoint and serving revision {active} behind clef-serve")
        return flash

    def check_serving(self, snap: Snapshot, pinned: str, goldens_made: bool = True) -> str:
        """`snap`'s model passed endpoint verification (goldens made for it, or reused) and serves
        the verified digest; its active revision."""
        name = snap.model["metadata"]["name"]
        status = snap.status
        active = str(status.get("activeRevision", ""))
        records = status.get("verifications") or []
        steps = [r.get("step") for r in records[:3]]
        expected = ["endpoint", "preview", "goldens"] if goldens_made else ["endpoint", "preview"]
        self.expect(
            steps[: len(expected)] == expected and (goldens_made or "goldens" not in steps),
            f"{name}: {'goldens, ' if goldens_made else '(goldens reused) '}preview, comparison: {steps}",
        )
        final = records[0]
        self.expect(final.get("verdict") == "Passed", f"{name}'s verdict is {final.get('verdict')}")
        self.expect(
            str(status.get("activeImage", "")).startswith(pinned),
            f"{name} serves the verified digest ({pinned}…), not {status.get('activeImage')}",
        )
        self.expect(
            snap.service is not None and snap.service[0] == active, f"{name}'s Service selects {active}"
        )
        self.expect(snap.deployments.get(f"{name}-{active}") == (1, 1), f"{name}-{active} has 1/1 available")
        return active

    def tell_verdict(self, snap: Snapshot) -> None:
        name = snap.model["metadata"]["name"]
        status = snap.status
        final = (status.get("verifications") or [{}])[0]
        detail(f"{name + ':':<11} verified by endpoint: {short(str(final.get('summary', '')), 160)}")
        detail(f"            digest {final.get('digest')} on {final.get('gpuClass')}")

    def tell_real_vllm(self, coder: Snapshot) -> None:
        """The coder's serving pod (its preview, promoted in place) runs real vLLM: the runner
        says so in its log for that pod."""
        active = str(coder.status.get("activeRevision", ""))
        self.expect(
            str(coder.status.get("activeImage")) == real_vllm_variant.pinned_image(),
            f"coder serves the real-vLLM image {real_vllm_variant.pinned_image()}: {coder.status.get('activeImage')}",
        )
        pods = self.serving_pods(active)
        self.expect(len(pods) == 1, f"one serving pod of coder: {[p.metadata.name for p in pods]}")
        name = pods[0].metadata.name
        runner_log = (self.cluster.logs / "runner.log").read_text(errors="replace").splitlines()
        ran = [line for line in runner_log if name in line and "run by the real engine" in line]
        self.expect(
            bool(ran) and real_engine.API_SERVER in ran[-1],
            f"the runner started real vLLM for {name} (runner.log)",
        )
        detail(f"            {name} runs real vLLM: {short(ran[-1].split(' as ', 1)[-1], 200)}")

    def step2(self, step1: Snapshot) -> Snapshot:
        heading("step 2: upgrade to candle-vllm 0.9.0, whose engine zeroes the key channel band")
        active = str(step1.status["activeRevision"])
        ip = step1.service[1] if step1.service else ""
        self.patch_image(BROKEN_IMAGE)
        narrator = Narrator(self.node_gpus, {MODEL: step1})

        def done(s: dict[str, Snapshot]) -> bool:
            snap = s[MODEL]
            return (
                snap.current()
                and snap.condition("Verified").get("status") == "False"
                # The preview goes back to 0 once the verdict is in.
                and all(r == 0 for d, (r, _) in snap.deployments.items() if d != f"{MODEL}-{active}")
            )

        snap = self.wait("the verdict on candle-vllm 0.9.0", {MODEL: SERVICE}, done, narrator)[MODEL]
        status = snap.status
        verified, degraded = snap.condition("Verified"), snap.condition("Degraded")
        record_ = (status.get("verifications") or [{}])[0]
        message = str(verified.get("message", ""))
        self.expect(
            verified.get("reason") == "EndpointMismatch",
            f"Verified=False for EndpointMismatch, not {verified.get('reason')}: {message}",
        )
        self.expect(
            str(record_.get("summary", "")).startswith("prompt capital, token "),
            f"the mismatch names prompt and position: {record_.get('summary')}",
        )
        self.expect(
            str(record_.get("image", "")).startswith(f"{ENGINES}/candle-vllm"),
            f"the newest verdict is for 0.9.0: {record_}",
        )
        self.expect(degraded.get("status") == "True", "Degraded=True while 0.9.0 is held back")
        self.expect(
            snap.condition("Ready").get("status") == "True", "Ready stays True: the old revision serves"
        )
        self.expect(status.get("activeRevision") == active, f"revision {active} is still active")
        self.expect(
            snap.deployments[f"{MODEL}-{active}"] == (1, 1), "the old revision still has 1/1 available"
        )
        self.expect(
            snap.service == (active, ip), f"clef-serve still selects {active} at {ip}: {snap.service}"
        )
        goldens = self.goldens_jobs(MODEL)
        self.expect(len(goldens) == 1, f"the same goldens answered (one goldens Job): {goldens}")
        print()
        detail(f"clef-flash: REJECTED {BROKEN_IMAGE} before any traffic")
        detail(f"            first divergence: {short(str(record_.get('summary', '')), 240)}")
        detail(f"            goldens reused: {len(goldens)} goldens Job in all ({goldens[0]})")
        detail(f"            still serving revision {active} ({status.get('activeImage')}), 1/1 available")
        self.show_service(SERVICE, note="unchanged")
        self.passed(
            2,
            "the key-band fault in the serving engine was caught; the old revision still serves; ClusterIP unchanged",
        )
        return snap

    def step3(self, step1: Snapshot, step2: Snapshot) -> Snapshot:
        heading("step 3: upgrade to candle-vllm 0.9.1, the fix")
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

        snap = self.wait("candle-vllm 0.9.1 to be verified and swapped in", {MODEL: SERVICE}, done, narrator)[
            MODEL
        ]
        status = snap.status
        new = self.check_serving(snap, f"{ENGINES}/candle-vllm@sha256:", goldens_made=False)
        goldens = self.goldens_jobs(MODEL)
        self.expect(len(goldens) == 1, f"the goldens were reused (one goldens Job in all): {goldens}")
        self.expect(snap.condition("Degraded").get("status") == "False", "Degraded=False again")
        self.expect(
            snap.service == (new, ip), f"clef-serve selects {new} at the same ClusterIP {ip}: {snap.service}"
        )
        print()
        self.tell_verdict(snap)
        detail(f"            goldens reused: {len(goldens)} goldens Job in all, made once in step 1")
        detail(f"            swapped: revision {old} → {new} ({status.get('activeImage')})")
        delay = self.custom().get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, MODEL)["spec"][
            "rollout"
        ]["scaleDownDelaySeconds"]
        detail(
            f"            revision {old} goes to 0 replicas {delay}s after the switch (rollout.scaleDownDelaySeconds)"
        )
        self.show_service(SERVICE, note="unchanged")
        self.passed(
            3,
            f"candle-vllm 0.9.1 was verified against the same goldens and swapped in; ClusterIP {ip} unchanged",
        )
        return snap

    def step4(self, step3: Snapshot) -> None:
        heading("step 4: a GPU goes bad while serving; a probe of its pod catches it, and clef cordons it")
        from kubernetes import client

        from ..images import put_image

        core = client.CoreV1Api(self.api)
        active = str(step3.status["activeRevision"])
        ip = step3.service[1] if step3.service else ""
        digest = str(step3.status["activeImage"]).split("@sha256:")[1]
        # The same digest: the pod that serves keeps its healthy engine; the next one goes bad.
        put_image(core, FIXED_IMAGE, "serve", digest=digest, dialect="candle-vllm",
                  fault="conv_key_band_zero", fault_after=GOES_BAD_AFTER)  # fmt: skip
        detail(
            f"the local cluster's stand-in: engines started from now on answer {GOES_BAD_AFTER} request(s)"
        )
        detail("right, then as if their GPU zeroed the key channel band (clef-runtime serve --fault-after)")
        # The second replica needs the spare V100, which the revision step 3 replaced holds until
        # its scale-down (rollout.scaleDownDelaySeconds).
        narrator = Narrator(self.node_gpus, {MODEL: step3})
        self.wait(
            "the replaced revision to give its GPU back",
            {MODEL: SERVICE},
            lambda s: all(r == 0 for d, (r, _) in s[MODEL].deployments.items() if d != f"{MODEL}-{active}"),
            narrator,
        )
        first = {p.metadata.name for p in self.serving_pods(active)}
        watch = {"intervalSeconds": PROBE_INTERVAL, "prompts": 1, "policy": "cordon-pod"}
        self.custom().patch_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, MODEL,
            {"spec": {"replicas": 2, "verification": {"watch": watch}}},
        )  # fmt: skip
        say(f"clef-flash: 2 replicas; every serving pod probed every {PROBE_INTERVAL}s, policy cordon-pod")

        def done(s: dict[str, Snapshot]) -> bool:
            return s[MODEL].current() and s[MODEL].condition("Serving").get("reason") == "PodCordoned"

        snap = self.wait("a probe to catch the bad GPU", {MODEL: SERVICE}, done, narrator)[MODEL]
        message = str(snap.condition("Serving").get("message", ""))
        pods = {p.metadata.name: p for p in self.serving_pods(active)}
        bad = [n for n in pods if f"pod {n} on node" in message]
        self.expect(len(bad) == 1 and bad[0] not in first, f"the new replica was cordoned: {bad}, {message}")
        kept = [
            n for n, p in pods.items() if (p.metadata.labels or {}).get("clef.riotpiao.com/model") == MODEL
        ]
        self.expect(sorted(kept) == sorted(first), f"the first pod keeps the serving label: {kept}")
        cordoned = pods[bad[0]]
        self.expect(
            cordoned.status.phase == "Running"
            and "clef.riotpiao.com/model" not in (cordoned.metadata.labels or {}),
            f"{bad[0]} runs on without the serving label",
        )
        self.expect(
            "prompt capital, token" in message, f"the probe names the prompt and the token: {message}"
        )
        self.expect(
            snap.service == (active, ip), f"clef-serve still selects {active} at {ip}: {snap.service}"
        )
        print()
        detail(f"clef-flash: CORDONED {bad[0]} on {cordoned.spec.node_name}: its probe's answer diverged")
        detail(f"            {short(message.split('): ', 1)[-1], 240)}")
        detail(f"            still serving: {', '.join(kept)} (revision {active})")
        self.show_service(SERVICE, note="unchanged; it selects the serving label, which the bad pod lost")
        self.passed(
            4,
            "a GPU that went bad while serving was caught by a probe of its pod, which clef cordoned;"
            " the other pod still serves",
        )

    def serving_pods(self, revision: str) -> list[Any]:
        from kubernetes import client

        found: list[Any] = (
            client.CoreV1Api(self.api)
            .list_namespaced_pod(
                NAMESPACE,
                label_selector=f"clef.riotpiao.com/revision={revision},clef.riotpiao.com/component=serving",
            )
            .items
        )
        return [p for p in found if p.metadata.deletion_timestamp is None]

    def finish(self) -> None:
        self.run_kubectl("get", "clefmodels", "-n", NAMESPACE)
        self.run_kubectl("get", "services", "-n", NAMESPACE, "-o", "wide")
        kubeconfig = rel(self.cluster.kubeconfig)
        print(
            f"""
All four steps happened as described.

Look around (the cluster and the operator keep running):
  export KUBECONFIG={kubeconfig} PATH="{self.cluster.bin.kubectl.parent}:$PATH"
  kubectl get clefmodels -A
  kubectl -n {NAMESPACE} describe clefmodel {MODEL}          # conditions and events
  kubectl -n {NAMESPACE} get deployments,jobs,pods,services
  kubectl -n {NAMESPACE} annotate clefmodel {MODEL} clef.riotpiao.com/reverify="$(date +%s)" --overwrite
  less {rel(self.operator_log)}     # what the operator did
  ls {rel(self.cluster.logs)}/                   # the runner's logs: engines, goldens, comparisons

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
