# Variants for hack/device/probe_variants.py: name -> text edits of the module's source, or
# ("__REGION__", start text, end text, replacement) to replace [start, end).  Read by exec; a
# variant that leaves a stage out has wrong numbers by design (its err column says so).
# Earlier tables (2026-11-30) probed: leaving out the forward substitution, the block inverse,
# q kᵀ, w/u; the output fused vs a parallel launch; V blocks 16/32/64/128; warps; stages;
# K/V slices 32/64/128; a TF32 64x64 doubling solve; grid order (docs/performance.md).
VARIANTS = {
    "base": [],
    "fused": [("FUSE_OUTPUT = False", "FUSE_OUTPUT = True")],
    "prep_no_solve": [("    Tm = Tm.to(CHUNK_DT)", "    Tm = (eye + A).to(CHUNK_DT)")],
    "prep_row_substitution": [("solve_by_doubling=True", "solve_by_doubling=False")],
    "out_bv64": [("OUT_BV = 128", "OUT_BV = 64")],
    "rec_stages4": [("stages2=3,", "stages2=4,")],
}
