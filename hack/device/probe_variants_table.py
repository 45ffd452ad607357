# Variants for hack/device/probe_variants.py: name -> text edits of the module's source.
# Read by exec; each variant leaves out one stage (its numbers are wrong by design).
FSUB = ("for i in range(1, BC):", "for i in range(1, 1):")
VARIANTS = {
    "base": [],
    "prep_no_fsub": [FSUB],
    "prep_no_blockinv": [("Tm = Tm.to(CHUNK_DT)", "Tm = Dinv.to(CHUNK_DT)")],
    "prep_no_solve": [FSUB, ("Tm = Tm.to(CHUNK_DT)", "Tm = (eye + A).to(CHUNK_DT)")],
    "prep_no_qk": [
        ('QK = tl.dot(qs.to(CHUNK_DT), kst, QK, input_precision="ieee")', "pass"),
        ("tl.store(aqk + r[:, None] * (HV * BT) + r[None, :], a_qk.to(aqk.dtype.element_ty), mask=live[:, None])", "pass"),
    ],
    "prep_no_wu_solve": [
        ('ws = tl.dot(Tm, kb, input_precision="ieee")', "ws = kb.to(tl.float32)"),
        ('us = tl.dot(Tm, vb, input_precision="ieee")', "us = vb.to(tl.float32)"),
    ],
    "prep_warps8": [("warps1 = 4 if tc and max(K, V) <= 128 else 8", "warps1 = 8")],
    "rec_no_out": [
        ("    tl.store(o_p + r[:, None] * (HV * V) + rv[None, :], oc.to(o_p.dtype.element_ty), mask=vmask)\n", ""),
    ],
    "rec_bv64": [("KS, VS, BV = min(width, BK), min(width, BVF), min(width, BVF)", "KS, VS, BV = min(width, BK), min(width, BVF), min(64, BVF)")],
    "rec_stages1": [("stages2 = 3 if tc else 1", "stages2 = 1")],
    "rec_stages2": [("stages2 = 3 if tc else 1", "stages2 = 2")],
    "rec_warps8": [("warps2 = 4 if tc and q.dtype == torch.bfloat16 and max(K, V) <= 128 else 8", "warps2 = 8")],
}
