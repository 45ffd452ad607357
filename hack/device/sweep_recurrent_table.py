# Variants of the recurrent decode kernel for hack/device/sweep_bench.py (2026-11-30, third
# session): V block and warps.  The state tile is [K, BV] float32 per program.
FILE = "runtime/clef_runtime/ops/delta_rule_recurrent.py"
ROWS = "recurrent_b32,recurrent_b128,recurrent_b512"
ARGS = ["--no-fla", "--quick"]
BV = "    BV = min(32, pow2_at_least(V, 1))\n"
W = "        num_warps=4,\n"
VARIANTS = {
    "base (BV32 w4)": [],
    "BV16 w2": [(BV, BV.replace("32", "16")), (W, W.replace("4", "2"))],
    "BV32 w2": [(W, W.replace("4", "2"))],
    "BV32 w8": [(W, W.replace("4", "8"))],
    "BV64 w4": [(BV, BV.replace("32", "64"))],
    "BV64 w8": [(BV, BV.replace("32", "64")), (W, W.replace("4", "8"))],
    "BV128 w8": [(BV, BV.replace("32", "128")), (W, W.replace("4", "8"))],
    "base again": [],
}
