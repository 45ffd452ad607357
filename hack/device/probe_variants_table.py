# Variants for hack/device/probe_variants.py: name -> text edits of the module's source.
# Read by exec; a variant that leaves a stage out has wrong numbers by design (its err says so).
BV_LINE = "KS, VS, BV = min(width, BK), min(width, BVF), min(width, BVF)"
PREP_IDS = (
    "    i_t = tl.program_id(0).to(tl.int64)\n    hv = tl.program_id(1)\n    h = hv // (HV // H)\n"
    "    b, t0, eos = _slot_bounds(i_t, cu_seqlens, T, NT, N, BT, IS_VARLEN)\n    # an empty slot"
)
SOLVE_3D = "    NB: tl.constexpr = BT // BC\n"
SOLVE_END = "    # the WY products run on tensor cores"
SOLVE_2D = '''    eye = (r[:, None] == r[None, :]).to(tl.float32)
    X = eye - tl.where(((r // 2)[:, None] == (r // 2)[None, :]), A, 0.0)
    for lvl in tl.static_range(1, 6):
        joins = ((r >> (lvl + 1))[:, None] == (r >> (lvl + 1))[None, :]) & (
            (r >> lvl)[:, None] != (r >> lvl)[None, :]
        )
        Lb = tl.where(joins, A, 0.0)
        X = X - tl.dot(tl.dot(X, Lb, input_precision=SOLVE_PRECISION), X, input_precision=SOLVE_PRECISION)
    Tm = X
'''


def solve_2d(src_marker_pairs=None):
    return [("__REGION__", SOLVE_3D, SOLVE_END, SOLVE_2D)]


VARIANTS = {
    "base": [],
    "prep_no_solve": [("    Tm = Tm.to(CHUNK_DT)", "    Tm = (eye + A).to(CHUNK_DT)")],
    "prep_hv_first": [
        (PREP_IDS, PREP_IDS.replace("program_id(0)", "program_id(9)").replace("program_id(1)", "program_id(0)").replace("program_id(9)", "program_id(1)")),
        ("_chunk_prepare_kernel[(slots, HV)]", "_chunk_prepare_kernel[(HV, slots)]"),
    ],
    "prep_ks64": [(BV_LINE, "KS, VS, BV = min(64, BK), min(64, BVF), min(width, BVF)")],
    "prep_ks128": [(BV_LINE, "KS, VS, BV = min(128, BK), min(128, BVF), min(width, BVF)")],
    "prep_solve2d_tf32": solve_2d(),
}
