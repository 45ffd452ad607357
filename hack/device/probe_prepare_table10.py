# Launch-1 variants for hack/device/probe_prepare.py (T_OUT=1 REF=1) on the tree with the bf16
# doubling at TF32 (eighth pass): the block-lower chain at depth 3 (table 9's mchain3) on top.
from probe_prepare_table9 import VARIANTS as NINTH

VARIANTS = {"base": [], "mchain3": NINTH["mchain3"], "base2": []}
