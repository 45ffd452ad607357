"""clef's dev cluster: the local control plane behind the cluster tier and `make demo`.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok run as local processes on
loopback; a runner (runner/) executes verification pods on the host; demo/ tells DESIGN's homelab
story on it.  A tool, not a test: `python -m clef_devcluster` starts and stops it,
`python -m clef_devcluster.demo` is `make demo`.  See docs/local-cluster.md.
"""
