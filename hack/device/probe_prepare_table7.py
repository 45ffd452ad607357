# Launch-1 variants for hack/device/probe_prepare.py against the tree of the seventh pass (the
# fifth pass's table edits the module as it was before 3xTF32 and maxnreg were kept): the two
# schedule-only candidates that pass measured nothing for, and the register cap around 168.
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
# v loaded at the start, beside g and beta (valid while VS == BVF: one V slice)
_V_PRE = (
    "    v_pre = tl.load(v + r[:, None] * svt + tl.arange(0, BVF)[None, :],"
    " mask=live[:, None] & (tl.arange(0, BVF) < V)[None, :], other=0.0)\n"
)
_EARLY_V = [
    ("    G = tl.cumsum(gv, 0)", _V_PRE + "    G = tl.cumsum(gv, 0)"),
    ("tl.load(v + r[:, None] * svt + cols[None, :], mask=m, other=0.0)", "v_pre"),
]
_CAP = "maxnreg=cfg.regs1,"
VARIANTS = {
    "base": [],
    "solve3": [(_SOLVE_OLD, _SOLVE_3)],
    "early_v": _EARLY_V,
    "solve3_early_v": [(_SOLVE_OLD, _SOLVE_3), *_EARLY_V],
    "maxnreg152": [(_CAP, "maxnreg=152,")],
    "maxnreg184": [(_CAP, "maxnreg=184,")],
    "base2": [],
}
