# Launch-1 variants for hack/device/probe_prepare.py (T_OUT=1 REF=1) against the tree of the
# eighth pass: where the triangular solve's time goes (ablations: no doubling inside the 16×16
# blocks, no block-lower chain), and two candidates: the block-lower chain at depth 3 instead of 4
# (T = (I - M + M² - M³) Dinv = Dinv - W + M² (Dinv - W) with W = M Dinv: W and M² side by side),
# and the doubling at TF32 instead of 3xTF32 (accuracy from REF=1's float64 reference).
_CHAIN = """    M2 = tl.dot(M, M, input_precision=SOLVE_PRECISION)
    Tm = tl.dot(
        tl.dot(eye - M, eye + M2, input_precision=SOLVE_PRECISION), Dinv, input_precision=SOLVE_PRECISION
    )
"""
_CHAIN3 = """    W = tl.dot(M, Dinv, input_precision=SOLVE_PRECISION)
    M2 = tl.dot(M, M, input_precision=SOLVE_PRECISION)
    Tm = Dinv - W + tl.dot(M2, Dinv - W, input_precision=SOLVE_PRECISION)
"""
_DBL = 'X = X - tl.dot(tl.dot(X, Lb, input_precision="tf32x3"), X, input_precision="tf32x3")'
VARIANTS = {
    "base": [],
    "mchain3": [(_CHAIN, _CHAIN3)],
    "doubling_tf32": [(_DBL, _DBL.replace("tf32x3", "tf32"))],
    "ablate_doubling": [("for lvl in tl.static_range(1, LOG_BC):", "for lvl in tl.static_range(1, 1):")],
    "ablate_mchain": [(_CHAIN, "    Tm = Dinv + 0.0 * M\n")],
    "base2": [],
}
