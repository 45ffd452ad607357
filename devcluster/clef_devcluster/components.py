"""The command line of each process of the local cluster, with the reason for every flag that is
not a plain default.  Pure: `LocalCluster` starts them."""

from __future__ import annotations

import sys
from pathlib import Path

from .config import KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE, MANIFESTS_DIR, Binaries
from .pki import PKI, SERVICE_CIDR

# No delegated authentication/authorization kubeconfigs for the controller-manager and the
# scheduler: their secure ports then serve only the always-allowed /healthz, /readyz, /livez,
# which is all the harness asks, and they start faster.  One instance each, so no leader election
# to wait for.
_DELEGATED = ["--bind-address=127.0.0.1", "--leader-elect=false"]


def etcd(binaries: Binaries, data_dir: Path, client_url: str, peer_url: str) -> list[str]:
    # Plain HTTP: it listens on loopback only and holds a throwaway cluster; fsync is off for the
    # same reason (it is most of etcd's latency on a CI disk).
    return [
        str(binaries.etcd),
        "--name=clef",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=clef={peer_url}",
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def kube_apiserver(
    binaries: Binaries, pki: PKI, *, etcd_url: str, port: int, cert_dir: Path, audit_log: Path
) -> list[str]:
    return [
        str(binaries.kube_apiserver),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        # The `kubernetes` Service's endpoints may not be a loopback address, and nothing here
        # runs in-cluster to need them: no endpoint reconciler.
        "--endpoint-reconciler-type=none",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        f"--tls-cert-file={pki.cert('apiserver')}",
        f"--tls-private-key-file={pki.key('apiserver')}",
        f"--client-ca-file={pki.ca_cert}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        # Creating an object whose ownerReference sets blockOwnerDeletion needs `update` on the
        # owner's finalizers: off by default upstream, on in many production clusters, so the
        # operator's RBAC is proven with it on.
        "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
        # What the operator's ServiceAccount asked for (manifests/audit-policy.yaml).
        f"--audit-policy-file={MANIFESTS_DIR / 'audit-policy.yaml'}",
        f"--audit-log-path={audit_log}",
        "--audit-log-format=json",
        "--allow-privileged=true",
        "--profiling=false",
        # `kubectl logs` of runner pods: the API server calls the node's kubelet endpoint, which
        # the runner serves on loopback and writes into each kwok node's status (an InternalDNS
        # address 127.0.0.1, tried first; InternalIP stays the homelab-shaped 10.10.0.x) over
        # TLS checked against the cluster CA, presenting a client certificate of that CA.
        "--kubelet-preferred-address-types=InternalDNS,Hostname,InternalIP,ExternalDNS,ExternalIP",
        f"--kubelet-certificate-authority={pki.ca_cert}",
        f"--kubelet-client-certificate={pki.cert('apiserver-kubelet-client')}",
        f"--kubelet-client-key={pki.key('apiserver-kubelet-client')}",
    ]


def kube_controller_manager(
    binaries: Binaries, pki: PKI, *, kubeconfig: Path, port: int, cert_dir: Path
) -> list[str]:
    return [
        str(binaries.kube_controller_manager),
        f"--kubeconfig={kubeconfig}",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        f"--root-ca-file={pki.ca_cert}",
        f"--service-account-private-key-file={pki.sa_key}",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--use-service-account-credentials=true",
        *_DELEGATED,
    ]


def kube_scheduler(binaries: Binaries, *, kubeconfig: Path, port: int, cert_dir: Path) -> list[str]:
    return [
        str(binaries.kube_scheduler),
        f"--kubeconfig={kubeconfig}",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        *_DELEGATED,
    ]


def kwok(binaries: Binaries, kubeconfig: Path) -> list[str]:
    return [
        str(binaries.kwok),
        f"--kubeconfig={kubeconfig}",
        f"--config={MANIFESTS_DIR / 'kwok-stages.yaml'}",
        # Only the nodes it was given: a real node (kind) is never taken over.
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={KWOK_NODE_VALUE}",
        "--node-lease-duration-seconds=40",
        "--cidr=10.244.0.0/16",
    ]


def runner(state_dir: Path, kubeconfig: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "clef_devcluster.runner",
        f"--state-dir={state_dir}",
        f"--kubeconfig={kubeconfig}",
    ]
