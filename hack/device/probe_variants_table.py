# Variants for hack/device/probe_variants.py: name -> text edits of the module's source, or
# ("__REGION__", start text, end text, replacement) to replace [start, end), or
# ("__SOURCE__", path) to start from another file (e.g. `git show REV:path > .bench/old.py`).  Read by exec; a
# variant that leaves a stage out has wrong numbers by design (its err column says so).
# Earlier tables (2026-11-30) probed: leaving out the forward substitution, the block inverse,
# q kᵀ, w/u; the output fused vs a parallel launch; V blocks 16/32/64/128; warps; stages;
# K/V slices 32/64/128; a TF32 64x64 doubling solve; grid order (docs/performance.md).
VARIANTS = {
    "base": [],
    "old_c86b26f": [("__SOURCE__", ".bench/old/delta_rule_chunk_c86b26f.py")],
    "prep_no_factors": [
        ("    tl.store(kf + r, rk * tl.exp(gl - G), mask=live)\n", ""),
        ("    tl.store(qf + r, (scale * rq) * tl.exp(G), mask=live)\n", ""),
    ],
    "rec_no_hs_store": [
        ("        tl.store(hs_p + rk[:, None] * V + rv[None, :], Sd.to(hs_p.dtype.element_ty), mask=s_mask)\n", ""),
    ],
    "rec_no_vn_store": [
        ("        tl.store(vn_p + r[:, None] * (HV * V) + rv[None, :], vd.to(vn_p.dtype.element_ty), mask=vmask)\n", ""),
    ],
    "rec_stages4": [("stages2=3,", "stages2=4,")],
}
