"""`make demo`: DESIGN's homelab story, end to end, on the local control plane.

    python -m clef_devcluster.demo [--state-dir DIR]        run it (what `make demo` does)
    python -m clef_devcluster.demo [--state-dir DIR] down   stop its operator and cluster (`make demo-down`)

It starts its own local cluster from `.demo/cluster` (separate from `.cluster`, which the test
tier uses, so `make test` is unaffected by a demo left running), applies
`kustomize/overlays/demo` (the homelab overlay with engine images the local cluster serves and
endpoint verification, minus the in-cluster operator; the checkpoints' hostPaths set by a small
overlay it writes on top), runs the operator on this host as the ServiceAccount
clef-system/clef-operator with the RBAC the overlay installed, and then plays four steps:

1. clef-flash (candle-vllm 0.8.4) and the coder (vLLM 0.11.0) are verified by endpoint (goldens
   made once from a small real checkpoint the demo writes into its state directory, a preview
   replica that no Service selects, a comparison Job) and serve behind clef-serve and
   coder-predictor;
2. an upgrade to candle-vllm 0.9.0, whose engine carries the key-band fault, is rejected with
   EndpointMismatch naming prompt and position, before any traffic: the old revision still
   serving, the Service's ClusterIP unchanged;
3. an upgrade to the fixed candle-vllm 0.9.1 is verified against the same goldens (one goldens
   Job in all) and swapped in;
4. a GPU goes bad while serving: clef-flash gets a second replica and probes of its serving pods
   (verification.watch, every 60 s, policy cordon-pod); the new replica's engine starts answering
   with the key-band fault after one request (the local cluster's stand-in for a GPU gone bad),
   its second probe catches it, and clef takes the serving label off that pod while the first
   keeps serving.

Every step checks what it claims; any deviation ends the demo with exit status 1 and the
ClefModel's conditions and the operator's log.  The cluster and the operator are left running
for a look around, until `make demo-down`.
"""
