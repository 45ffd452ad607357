# Launch-1 variants for hack/device/probe_prepare.py (T_OUT=1 REF=1) against the tree of the
# tenth pass: the triangular solve's dots with f16 operands (float32 accumulation) instead of
# TF32, for bf16 inputs.  f16 keeps TF32's 11-bit significand (rounded to nearest) in a narrower
# range, runs at twice TF32's rate on the tensor cores (m16n8k16 / wgmma k16), and its operands
# take half the registers and shared memory.  Emulated on the CPU (hack/solve_precision_
# emulation.py) its errors equal TF32's on every input kind there.  sm_90 compile (local
# ptxas): base 168 registers (capped), 2904 SASS instructions; solve_f16 164 without the cap,
# 2368 instructions (-18%), HGMMA 48 -> 32, HMMA 24 -> 12.  The register peak is where q kᵀ,
# k kᵀ and the decays are live together (133 registers without Aqk); forming q kᵀ or k kᵀ later
# (reading the tile again) compiled to more registers, not fewer (234 / 178 uncapped).
_DBL = """            X = X - tl.dot(
                tl.dot(X, Lb, input_precision=DOUBLING_PRECISION), X, input_precision=DOUBLING_PRECISION
            )
"""
_DBL16 = """            Xh = X.to(tl.float16)
            X = X - tl.dot(tl.dot(Xh, Lb.to(tl.float16)).to(tl.float16), Xh)
"""
_CHAIN = """    M = tl.dot(Dinv, tl.where(same_blk, 0.0, A), input_precision=SOLVE_PRECISION)
    W = tl.dot(M, Dinv, input_precision=SOLVE_PRECISION)
    M2 = tl.dot(M, M, input_precision=SOLVE_PRECISION)
    Tm = Dinv - W + tl.dot(M2, Dinv - W, input_precision=SOLVE_PRECISION)
"""
_CHAIN16 = """    Dh = Dinv.to(tl.float16)
    Mh = tl.dot(Dh, tl.where(same_blk, 0.0, A).to(tl.float16)).to(tl.float16)
    W = tl.dot(Mh, Dh)
    M2 = tl.dot(Mh, Mh).to(tl.float16)
    Tm = Dinv - W + tl.dot(M2, (Dinv - W).to(tl.float16))
"""
_CAP = "regs1=168 if small and dtype == torch.bfloat16 else None,"
_F16 = [(_DBL, _DBL16), (_CHAIN, _CHAIN16)]
_AQK_STORE = (
    "tl.store(aqk + r[:, None] * (HV * BT) + r[None, :], a_qk.to(aqk.dtype.element_ty), mask=live[:, None])"
)
VARIANTS = {
    "base": [],
    "solve_f16": _F16,
    "doubling_f16": [(_DBL, _DBL16)],
    "chain_f16": [(_CHAIN, _CHAIN16)],
    "solve_f16_nocap": [*_F16, (_CAP, "regs1=None,")],
    "solve_f16_r144": [*_F16, (_CAP, _CAP.replace("168", "144"))],  # 64 B of spill
    "solve_f16_r128": [*_F16, (_CAP, _CAP.replace("168", "128"))],  # four programs per SM, 192 B of spill
    # ablation (wrong numbers by design): what Aqk's product and store cost now
    "abl_f16_noaqk": [*_F16, (_CAP, "regs1=None,"), (_AQK_STORE, "")],
    "base2": [],
}
