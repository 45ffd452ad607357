# Launch-1 variants for hack/device/probe_prepare.py (T_OUT=1: the fold's launch 1, which stores T
# and the factors instead of w and u) against the tree of the eighth pass: the register cap and
# warps again (the fold dropped the w/u pass, launch 1's register peak), and two ablations that
# say where its time goes: no solve (T = I) and no Aqk (its Gram dot, product and store; that edit
# needs the tree of commit ea6e9b0, where launch 1 has `aqk_out`).
_CAP = "maxnreg=cfg.regs1,"
_W = "warps1=4 if small else 8,"
VARIANTS = {
    "base": [],
    "maxnreg128": [(_CAP, "maxnreg=128,")],
    "maxnreg144": [(_CAP, "maxnreg=144,")],
    "maxnreg200": [(_CAP, "maxnreg=200,")],
    "nocap": [(_CAP, "maxnreg=None,")],
    "w8_nocap": [(_CAP, "maxnreg=None,"), (_W, "warps1=8,")],
    "w8_cap128": [(_CAP, "maxnreg=128,"), (_W, "warps1=8,")],
    "ablate_solve": [("    Tm = Tm.to(CHUNK_DT)\n", "    Tm = eye.to(CHUNK_DT)\n")],
    "ablate_aqk": [
        (
            "aqk_out: bool = True,\n) -> Prepared:",
            "aqk_out: bool = True,\n) -> Prepared:\n    aqk_out = False",
        )
    ],
    "base2": [],
}
