"""The runner's watch loop: verification pods on kwok nodes are listed and watched, each new one is
handed to a PodWorker, and deleted ones get the kubelet's final zero-grace delete.  It also keeps
what the workers share: the kwok nodes' addresses, the image table, and the record of running
commands that `down` uses to end them even if the runner crashed."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .. import images
from ..config import (
    COMPONENT_LABEL,
    ENGINE_IMAGE_PREFIX,
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_VALUE,
    VERIFICATION,
    cache_root,
)
from ..pki import KUBELET_SERVING
from ..procs import record
from ..rest import ApiError, Rest
from .logs import KubeletEndpoint, LogIndex
from .network import BlockClaim, PodAddresses
from .worker import PodWorker

log = logging.getLogger("clef.runner")

Obj = dict[str, Any]
# Where the API server finds the runner's kubelet endpoint on every kwok node.
KUBELET_ADDRESS_TYPE, KUBELET_ADDRESS = "InternalDNS", "127.0.0.1"


def runs_here(pod: Obj) -> bool:
    """The pods the runner runs and kwok leaves alone (manifests/kwok-stages.yaml says the same):
    verification pods, and pods with a container of an engine image (ENGINE_IMAGE_PREFIX)."""
    labels = pod["metadata"].get("labels") or {}
    if labels.get(COMPONENT_LABEL) == VERIFICATION:
        return True
    return any(
        str(c.get("image", "")).startswith(ENGINE_IMAGE_PREFIX) for c in pod["spec"].get("containers") or []
    )


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
        self.claim = self._claim_block()
        self.addresses = PodAddresses(self.claim.block)
        self.log_index = LogIndex()
        self.endpoint = self._kubelet_endpoint()

    def _kubelet_endpoint(self) -> KubeletEndpoint | None:
        """`kubectl logs` (logs.py), with the cluster's certificates; none where this state
        directory has no PKI (`up --attach`: that API server cannot reach this host's loopback)."""
        pki = self.state_dir / "pki"
        cert, key, ca = pki / f"{KUBELET_SERVING}.crt", pki / f"{KUBELET_SERVING}.key", pki / "ca.crt"
        if not (cert.is_file() and key.is_file() and ca.is_file()):
            log.warning(
                "no kubelet endpoint: %s has no serving certificate (kubectl logs will not reach runner pods)",
                pki,
            )
            return None
        endpoint = KubeletEndpoint(self.log_index, cert, key, ca)
        log.info("kubelet endpoint (kubectl logs) on https://127.0.0.1:%d", endpoint.port)
        return endpoint

    def _claim_block(self) -> BlockClaim:
        """This runner's 127.<b>.0.0/16 (network.py); the same one again after a restart if free."""
        remembered = self.state_dir / "run" / "pod-network"
        try:
            preferred: int | None = int(remembered.read_text().strip())
        except (OSError, ValueError):
            preferred = None
        claim = BlockClaim.claim(cache_root() / "pod-networks", preferred)
        remembered.write_text(f"{claim.block}\n")
        log.info("pod network 127.%d.0.0/16", claim.block)
        return claim

    # -- paths -------------------------------------------------------------------------------
    def run_dir(self, namespace: str, pod: str, container: str, restart: int) -> Path:
        d = self.state_dir / "runs" / f"{namespace}_{pod}_{container}_{restart}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        return d

    def volume_dir(self, namespace: str, pod: str) -> Path:
        """Where a pod's emptyDir, configMap and secret volumes live (volumes.py)."""
        return self.state_dir / "runs" / f"{namespace}_{pod}" / "volumes"

    def read_object(self, namespace: str, kind: str, name: str) -> Obj | None:
        try:
            return self.rest.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def log_path(self, namespace: str, pod: str, container: str, restart: int) -> Path:
        suffix = f".{restart}" if restart else ""
        return self.state_dir / "logs" / "verify" / f"{namespace}_{pod}_{container}{suffix}.log"

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
            self._claim_kubelet_endpoint(n)
        with self.lock:
            self.nodes = found
            self.nodes_listed = time.monotonic()

    def _claim_kubelet_endpoint(self, node: Obj) -> None:
        """Point the node's kubelet endpoint at this runner, as a kubelet writes its own: the port
        in status.daemonEndpoints, and an InternalDNS address 127.0.0.1, which the API server tries
        first (components.kube_apiserver).  Written again whenever found missing (kwok's node
        stage rewrites the status once, at start)."""
        if self.endpoint is None:
            return
        status = node.get("status") or {}
        port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
        has_address = any(
            a.get("type") == KUBELET_ADDRESS_TYPE and a.get("address") == KUBELET_ADDRESS
            for a in status.get("addresses") or []
        )
        if port == self.endpoint.port and has_address:
            return
        patch = {
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.endpoint.port}},
            # A strategic merge by address type: the node's other addresses stay as they are.
            "addresses": [{"type": KUBELET_ADDRESS_TYPE, "address": KUBELET_ADDRESS}],
        }
        try:
            self.rest.patch_status(f"/api/v1/nodes/{node['metadata']['name']}", patch)
        except ApiError as e:
            log.warning("node %s: kubelet endpoint not written: %s", node["metadata"]["name"], e)

    def _list_nodes(self) -> Obj:
        return self.rest.get("/api/v1/nodes")

    def _list_pods(self) -> Obj:
        # Every pod: engine-image pods carry no label of ours (they are the operator's serving pods).
        return self.rest.get("/api/v1/pods")

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
        if not runs_here(pod):
            return
        with self.lock:
            worker = self.workers.get(uid)
        if deleted:
            if worker:
                worker.gone = True
                worker.request_stop(0)
            with self.lock:
                self.done.discard(uid)
                self.finalizing.discard(uid)
            self.log_index.forget(meta["namespace"], meta["name"])
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
        if self.endpoint is not None:
            self.endpoint.start()
        self._refresh_nodes()
        while not self.shutting_down.is_set():
            try:
                # At every resync (30 s at most): new nodes, and kubelet endpoints kept written.
                self._refresh_nodes()
                listed = self._list_pods()
                for pod in listed["items"]:
                    self.observe(pod)
                if ready_file is not None:
                    ready_file.write_text(str(os.getpid()))
                    ready_file = None
                stream = self.rest.watch(
                    "/api/v1/pods",
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
