"""`make demo`: DESIGN's homelab story, end to end, on the local control plane.

    python -m clef_devcluster.demo [--state-dir DIR]        run it (what `make demo` does)
    python -m clef_devcluster.demo [--state-dir DIR] down   stop its operator and cluster (`make demo-down`)

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
