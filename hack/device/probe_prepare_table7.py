# Launch-1 variants for hack/device/probe_prepare.py against the tree of the seventh pass: the
# fifth pass's two schedule-only candidates that were never measured (their edits still apply:
# the fifth pass's table, whose other edits target the module from before 3xTF32 and maxnreg
# were kept), and the register cap around today's 168.
from probe_prepare_table import VARIANTS as FIFTH

_CAP = "maxnreg=cfg.regs1,"
VARIANTS = {
    "base": [],
    "solve3": FIFTH["solve3"],
    "early_v": FIFTH["early_v"],
    "solve3_early_v": FIFTH["solve3"] + FIFTH["early_v"],
    "maxnreg152": [(_CAP, "maxnreg=152,")],
    "maxnreg184": [(_CAP, "maxnreg=184,")],
    "base2": [],
}
