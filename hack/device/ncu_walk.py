"""One call of the chunked op at a bench row, for Nsight Compute: two warm-up calls, then one
call between cudaProfilerStart/Stop, so ``--profile-from-start off`` sees launch 1 and the walk
of that call only.  bf16, the Qwen3.5 shapes, the bench's gates.

    ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats python3 hack/device/ncu_walk.py b1_t32768
    (PYTHONPATH=runtime:contract; KNOBS="FOLD_BV=128,FOLD_WARPS=8" sets
    delta_rule_chunk_split's constants for the call, integers or None)
"""

from __future__ import annotations

import os
import sys

import torch
from probe_fold import inputs  # hack/device, the script's folder
from probe_timing import CHUNK_ROWS

from clef_runtime.ops import delta_rule_chunk_split as ds
from clef_runtime.ops.delta_rule_chunk import chunk_gated_delta_rule


def main() -> None:
    B, T, seqs = CHUNK_ROWS[sys.argv[1]]
    for item in filter(None, os.environ.get("KNOBS", "").split(",")):
        name, val = item.split("=")
        setattr(ds, name, None if val == "None" else int(val))
    cu = torch.arange(0, T + 1, T // seqs, dtype=torch.int32, device="cuda") if seqs else None
    s = inputs(B, T, 0)

    def call() -> object:
        return chunk_gated_delta_rule(s["q"], s["k"], s["v"], s["g"], s["beta"], output_final_state=True,
                                      use_qk_l2norm=True, cu_seqlens=cu)  # fmt: skip

    call()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
