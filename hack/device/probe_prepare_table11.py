# Launch-1 variants for hack/device/probe_prepare.py (T_OUT=1 REF=1) against the tree of the
# tenth pass (the module's SOLVE_F16 switch and halves of it): the triangular solve's dots with f16 operands (float32 accumulation) instead of
# TF32, for bf16 inputs.  f16 keeps TF32's 11-bit significand (rounded to nearest) in a narrower
# range, runs at twice TF32's rate on the tensor cores (m16n8k16 / wgmma k16), and its operands
# take half the registers and shared memory.  Emulated on the CPU (hack/solve_precision_
# emulation.py) its errors equal TF32's on every input kind there.  sm_90 compile (local
# ptxas): base 168 registers (capped), 2904 SASS instructions; solve_f16 164 without the cap,
# 2368 instructions (-18%), HGMMA 48 -> 32, HMMA 24 -> 12.  The register peak is where q kᵀ,
# k kᵀ and the decays are live together (133 registers without Aqk); forming q kᵀ or k kᵀ later
# (reading the tile again) compiled to more registers, not fewer (234 / 178 uncapped).
# Written for the module with the switch off (as it was until the eleventh pass measured this
# table and turned it on): to run it again, start from that commit's module, e.g.
#   git show 0688c37:runtime/clef_runtime/ops/delta_rule_chunk.py > .bench/old/delta_rule_chunk_0688c37.py
# (probe_prepare.py's module argument; docs/performance.md, "How to reproduce").
_ON = ("SOLVE_F16 = False", "SOLVE_F16 = True")  # the module's switch (`solve_dtype`)
# with the switch on, one half of the solve back at float32 operands
_DBL_F32 = (
    "            Xs = X.to(SOLVE_DT)\n"
    "            Xl = tl.dot(Xs, Lb.to(SOLVE_DT), input_precision=DOUBLING_PRECISION).to(SOLVE_DT)\n",
    "            Xs = X\n            Xl = tl.dot(Xs, Lb, input_precision=DOUBLING_PRECISION)\n",
)
_CHAIN_F32 = (
    """    Ds = Dinv.to(SOLVE_DT)
    M = tl.dot(Ds, tl.where(same_blk, 0.0, A).to(SOLVE_DT), input_precision=SOLVE_PRECISION).to(SOLVE_DT)
    W = tl.dot(M, Ds, input_precision=SOLVE_PRECISION)
    M2 = tl.dot(M, M, input_precision=SOLVE_PRECISION).to(SOLVE_DT)
    Tm = Dinv - W + tl.dot(M2, (Dinv - W).to(SOLVE_DT), input_precision=SOLVE_PRECISION)
""",
    """    M = tl.dot(Dinv, tl.where(same_blk, 0.0, A), input_precision=SOLVE_PRECISION)
    W = tl.dot(M, Dinv, input_precision=SOLVE_PRECISION)
    M2 = tl.dot(M, M, input_precision=SOLVE_PRECISION)
    Tm = Dinv - W + tl.dot(M2, Dinv - W, input_precision=SOLVE_PRECISION)
""",
)
_CAP = "regs1=168 if small and dtype == torch.bfloat16 else None,"
_AQK_STORE = (
    "tl.store(aqk + r[:, None] * (HV * BT) + r[None, :], a_qk.to(aqk.dtype.element_ty), mask=live[:, None])"
)
VARIANTS = {
    "base": [],
    "solve_f16": [_ON],
    "doubling_f16": [_ON, _CHAIN_F32],
    "chain_f16": [_ON, _DBL_F32],
    "solve_f16_nocap": [_ON, (_CAP, "regs1=None,")],
    "solve_f16_r144": [_ON, (_CAP, _CAP.replace("168", "144"))],  # 64 B of spill
    "solve_f16_r128": [_ON, (_CAP, _CAP.replace("168", "128"))],  # four programs per SM, 192 B of spill
    # ablation (wrong numbers by design): what Aqk's product and store cost now
    "abl_f16_noaqk": [_ON, (_CAP, "regs1=None,"), (_AQK_STORE, "")],
    "base2": [],
}
