"""The local control plane for the cluster tier and `make demo`.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok run as local processes on
loopback; a runner executes verification pods on the host.  See docs/local-cluster.md.
"""
