# Variants for hack/device/probe_prepare.py (launch 1 alone): name -> text edits of
# delta_rule_chunk.py, as in probe_variants_table.py.  Variants marked "ablation" leave work out
# (numbers wrong by design; their time says what that work costs).
_LAUNCH = "            num_warps=cfg.warps1,\n"
_SOLVE_OLD = """    M = tl.dot(Dinv, tl.where(same_blk, 0.0, A), input_precision=SOLVE_PRECISION)
    M2 = tl.dot(M, M, input_precision=SOLVE_PRECISION)
    Tm = tl.dot(
        tl.dot(eye - M, eye + M2, input_precision=SOLVE_PRECISION), Dinv, input_precision=SOLVE_PRECISION
    )
"""
# T = Dinv (I - P)(I + P^2) with P = L Dinv: the same four dots, three dependent levels
_SOLVE_3 = """    P = tl.dot(tl.where(same_blk, 0.0, A), Dinv, input_precision=SOLVE_PRECISION)
    P2 = tl.dot(P, P, input_precision=SOLVE_PRECISION)
    DP = tl.dot(Dinv, P, input_precision=SOLVE_PRECISION)
    Tm = tl.dot(Dinv - DP, eye + P2, input_precision=SOLVE_PRECISION)
"""
_KB_OLD = "tl.load(k + r[:, None] * skt + cols[None, :], mask=m, other=0.0).to(tl.float32) * cw[:, None]"
VARIANTS = {
    "base": [],
    "maxnreg168": [(_LAUNCH, "            num_warps=cfg.warps1, maxnreg=168,\n")],
    "maxnreg128": [(_LAUNCH, "            num_warps=cfg.warps1, maxnreg=128,\n")],
    "warps8": [(_LAUNCH, "            num_warps=8,\n")],
    "solve3": [(_SOLVE_OLD, _SOLVE_3)],
    "reuse_k": [(_KB_OLD, "ks.to(tl.float32) * cw[:, None]")],
    "abl_nosolve": [
        (
            "__REGION__",
            "    NB: tl.constexpr = BT // BC",
            "    # the WY products run on tensor cores",
            "    Tm = tl.where(r[:, None] == r[None, :], 1.0, A)\n",
        )
    ],
    "abl_noaqk": [
        ('        QK = tl.dot(qs.to(CHUNK_DT), kst, QK, input_precision="ieee")\n', ""),
        (
            "    tl.store(aqk + r[:, None] * (HV * BT)",
            "    if False:\n        tl.store(aqk + r[:, None] * (HV * BT)",
        ),
    ],
    # w and u left out; T stored over Aqk so that the solve stays live
    "abl_nowu": [
        (
            "__REGION__",
            "    # the WY products run on tensor cores",
            "# ---------------------------------------------------------------------------------------------\n# launch 2",
            "    tl.store(aqk + r[:, None] * (HV * BT) + r[None, :], Tm.to(aqk.dtype.element_ty), mask=live[:, None])\n\n\n",
        )
    ],
}

# w = T diag(β e^G / |k|) K and u = T diag(β) V with the per-token factors on T's columns (one
# rounding, of T's scaled entries) so the raw k and v tiles go from memory straight into the
# dots: no [64, 128] float32 copies of k and v (launch 1's register peak is the w/u pass:
# 245 registers, 174 without it, sm_90 ptxas).  bf16 only as written: in f16, T's columns
# times 1/|k| could overflow for a near-zero key.
_CW = "    cw = bv * tl.exp(G) * rk\n"
_TM_ROUND = "    Tm = Tm.to(CHUNK_DT)\n    if ROUND_BF16:\n        Tm = rne_bf16(Tm)\n"
_KB = "tl.load(k + r[:, None] * skt + cols[None, :], mask=m, other=0.0).to(tl.float32) * cw[:, None]"
_VB = "tl.load(v + r[:, None] * svt + cols[None, :], mask=m, other=0.0).to(tl.float32) * bv[:, None]"
VARIANTS["colscale"] = [
    (_TM_ROUND, ""),
    (
        _CW,
        _CW + "    Tw = (Tm * cw[None, :]).to(CHUNK_DT)\n    Tu = (Tm * bv[None, :]).to(CHUNK_DT)\n"
        "    if ROUND_BF16:\n        Tw = rne_bf16(Tw)\n        Tu = rne_bf16(Tu)\n",
    ),
    (_KB, _KB.replace(".to(tl.float32) * cw[:, None]", "")),
    (_VB, _VB.replace(".to(tl.float32) * bv[:, None]", "")),
    ("ws = tl.dot(Tm, kb,", "ws = tl.dot(Tw, kb,"),
    ("us = tl.dot(Tm, vb,", "us = tl.dot(Tu, vb,"),
]
VARIANTS["colscale_r168"] = VARIANTS["colscale"] + [
    (_LAUNCH, "            num_warps=cfg.warps1, maxnreg=168,\n")
]


# v loaded at the start, beside g and beta, so its DRAM round trip overlaps the Gram matrices and
# the solve instead of following them (valid while VS == BVF: one V slice)
_V_PRE = (
    "    v_pre = tl.load(v + r[:, None] * svt + tl.arange(0, BVF)[None, :],"
    " mask=live[:, None] & (tl.arange(0, BVF) < V)[None, :], other=0.0)\n"
)
VARIANTS["early_v"] = [
    ("    G = tl.cumsum(gv, 0)", _V_PRE + "    G = tl.cumsum(gv, 0)"),
    ("tl.load(v + r[:, None] * svt + cols[None, :], mask=m, other=0.0)", "v_pre"),
]


# the diagonal blocks' doubling on tensor cores: 3xTF32 (split-float32, close to IEEE float32)
# instead of IEEE FMA loops for the six batched [4, 16, 16] dots (768 of the 880 FFMA per thread)
_DOUBLING = 'X = X - tl.dot(tl.dot(X, Lb, input_precision="ieee"), X, input_precision="ieee")'
VARIANTS["doubling_tf32x3"] = [(_DOUBLING, _DOUBLING.replace('"ieee"', '"tf32x3"'))]
VARIANTS["doubling_tf32"] = [(_DOUBLING, _DOUBLING.replace('"ieee"', '"tf32"'))]


# the diagonal blocks' inverse by doubling on whole 64×64 tiles (block-masked, 3xTF32 on the
# warpgroup MMA): no [4, 16, 16] reshapes, 4× the multiply-adds of the batched form
_DOUBLING64 = """    X = (r[:, None] == r[None, :]).to(tl.float32) - tl.where((r // 2)[:, None] == (r // 2)[None, :], A, 0.0)
    for lvl in tl.static_range(1, LOG_BC):
        joins = ((r >> (lvl + 1))[:, None] == (r >> (lvl + 1))[None, :]) & (
            (r >> lvl)[:, None] != (r >> lvl)[None, :]
        )
        X = X - tl.dot(
            tl.dot(X, tl.where(joins, A, 0.0), input_precision="tf32x3"), X, input_precision="tf32x3"
        )
    Dinv = X
"""
VARIANTS["doubling64_tf32x3"] = [
    ("__REGION__", "    Nd = tl.sum(", "    eye = (r[:, None] == r[None, :]).to(tl.float32)", _DOUBLING64)
]


# A persistent launch 1: a grid of at most PROGRAMS programs, each walking (chunk slot, value
# head) items in a `tl.range` loop with num_stages, so Triton's pipeliner can issue the next
# item's q/k/v loads while this one's solve runs (launch 1 has no loop today: each program's
# DRAM round trips and its ~60 barriers run back to back, two programs per SM at 245
# registers).  Generated from the module's own kernel body (indented into the loop, pointer
# arguments rebased into fresh names), so it stays in step with the module.
def _persistent(programs: int, stages: int, maxnreg: int | None = None, body_edits: tuple = ()) -> list:
    import pathlib
    import re

    src = pathlib.Path("runtime/clef_runtime/ops/delta_rule_chunk.py").read_text()
    start = "    pid = tl.program_id(0).to(tl.int64)\n    i_t = pid // HV\n"
    end = "# ---------------------------------------------------------------------------------------------\n# launch 2"
    a = src.index(start)
    body = src[a : src.index(end, a)].rstrip("\n") + "\n"
    for old, new in body_edits:  # edits of the kernel body, applied before it is indented
        if old not in body:  # the module moved on: load_variant reports the missing target
            return [(old, new)]
        body = body.replace(old, new)
    body = body.replace("    pid = tl.program_id(0).to(tl.int64)\n", "    pid = item.to(tl.int64)\n")
    for p in ("q", "k", "v", "g", "beta", "gc", "kf", "qf", "w", "u", "aqk"):
        body = body.replace(f"\n    {p} += ", f"\n    {p}_c = {p} + ")
        body = re.sub(rf"(?<![\w.]){p}(?= \+ r|\.dtype)", f"{p}_c", body)
    loop = (
        f"    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0), num_stages={stages}):\n"
        + "".join(("    " + ln if ln.strip() else ln) for ln in body.splitlines(keepends=True))
        + "\n\n"
    )
    launch_old = "        _chunk_prepare_kernel[(slots * HV,)](\n            q, k, v, g, beta, w, u, aqk, gc, kf, qf, lb if lb is not None else gc, cu,\n            scale, T, NT, N,\n"
    launch_new = (
        f"        _chunk_prepare_kernel[(min(slots * HV, {programs}),)](\n"
        "            q, k, v, g, beta, w, u, aqk, gc, kf, qf, lb if lb is not None else gc, cu,\n            scale, slots * HV, T, NT, N,\n"
    )
    edits = [
        ("__REGION__", start, end, loop),
        (
            "    cu_seqlens,\n    scale,\n    T,\n    NT,\n    N,\n    sqb,",
            "    cu_seqlens,\n    scale,\n    n_items,\n    T,\n    NT,\n    N,\n    sqb,",
        ),
        (launch_old, launch_new),
    ]
    if maxnreg:
        edits.append((_LAUNCH, f"            num_warps=cfg.warps1, maxnreg={maxnreg},\n"))
    return edits


VARIANTS.update(
    {
        "persist_264_s1": _persistent(264, 1),
        "persist_264_s2": _persistent(264, 2),
        "persist_132_s3": _persistent(132, 3),
        "persist_264_s2_solve3": _persistent(264, 2, body_edits=((_SOLVE_OLD, _SOLVE_3),)),
    }
)

# combinations of the single changes most likely to pay
_TF32X3 = [(_DOUBLING, _DOUBLING.replace('"ieee"', '"tf32x3"'))]
VARIANTS.update(
    {
        "tf32x3_r168": _TF32X3 + VARIANTS["maxnreg168"],
        "tf32x3_colscale": _TF32X3 + VARIANTS["colscale"],
        "tf32x3_solve3": _TF32X3 + VARIANTS["solve3"],
        "tf32x3_persist_264_s2": _persistent(264, 2, body_edits=tuple(_TF32X3)),
    }
)

# the most informative first: a call cut short by its time limit still answers the main question
_ORDER = [
    "base", "doubling_tf32x3", "maxnreg168", "persist_264_s2", "colscale", "solve3", "early_v",
    "tf32x3_r168", "tf32x3_colscale", "tf32x3_solve3", "tf32x3_persist_264_s2",
    "abl_nosolve", "abl_noaqk", "abl_nowu",
    "doubling64_tf32x3", "doubling_tf32", "maxnreg128", "warps8", "reuse_k", "colscale_r168",
    "persist_264_s1", "persist_132_s3", "persist_264_s2_solve3",
]  # fmt: skip
VARIANTS = {name: VARIANTS[name] for name in _ORDER + [n for n in VARIANTS if n not in _ORDER]}
