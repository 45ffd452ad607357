# Variants for hack/device/probe_variants.py: name -> text edits of the module's source, or
# ("__REGION__", start text, end text, replacement) to replace [start, end), or
# ("__SOURCE__", path) to start from another file (e.g. `git show REV:path > .bench/old.py`).  Read by exec; a
# variant that leaves a stage out has wrong numbers by design (its err column says so).
# Earlier tables (2026-11-30) probed: leaving out the forward substitution, the block inverse,
# q kᵀ, w/u; the output fused vs a parallel launch; V blocks 16/32/64/128; warps; stages;
# K/V slices 32/64/128; a TF32 64x64 doubling solve; grid order (docs/performance.md).
VARIANTS = {
    "base": [],
    "prev_2d_grids": [("__SOURCE__", ".bench/old/delta_rule_chunk_prev.py")],
}
