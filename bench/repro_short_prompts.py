"""The hybrid model on 1-65 token prompts per dtype on the GPU, one process per case.

Short prompts on the GPU, one process per case: the hybrid model (clef-flash's GDN heads, the
verify model profile's width) generating from prompts of 1..65 tokens on the Triton op set, per
dtype, and each GDN op alone at T=1.  A case that faults the GPU kills only its own process.

    PYTHONPATH=operator:runtime:contract:. python3 bench/repro_short_prompts.py   # writes $OUT
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

OUT = Path(os.environ.get("OUT", "/tmp/repro-out"))

CASE = r"""
import sys, torch
from clef_runtime.model import HybridModel, preset
from clef_runtime.model.checkpoint import random_weights
from clef_runtime.opset import get_opset
from clef_runtime.verify.run import MODEL_PROFILE_WIDTH
dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[sys.argv[1]]
T, cfg_name = int(sys.argv[2]), sys.argv[3]
config = preset("qwen3_5").replace(tie_word_embeddings=False, **MODEL_PROFILE_WIDTH)
config = config.replace(layer_types=config.layer_types[:4])
model = HybridModel(config, random_weights(config, seed=0), opset=get_opset("triton", kernel_config=cfg_name), dtype=dtype, device="cuda")
ids = torch.randint(0, config.vocab_size, (1, T), generator=torch.Generator().manual_seed(T)).cuda()
out = model.generate_greedy(ids, 8)
torch.cuda.synchronize()
ref = HybridModel(config, random_weights(config, seed=0), opset=get_opset("reference"), dtype=dtype, device="cuda")
same = ref.generate_greedy(ids, 8).tolist() == out.tolist()
print("OK", "ids equal to the reference op set's" if same else "ids DIFFER from the reference op set's", out.tolist())
"""


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    results = []
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    cases = [("bf16", T, "auto") for T in (1, 2, 17, 64, 65)]
    cases += [("f16", T, "auto") for T in (1, 17)] + [("f32", 1, "auto")]
    for dtype, T, cfg in cases:
        p = subprocess.run(
            [sys.executable, "-c", CASE, dtype, str(T), cfg],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        ok = p.returncode == 0 and "OK" in p.stdout
        tail = (p.stdout + p.stderr).strip().splitlines()[-12:]
        results.append({"dtype": dtype, "T": T, "config": cfg, "ok": ok, "tail": tail})
        print(dtype, T, cfg, "OK" if ok else "FAIL", tail[-1] if ok else "", flush=True)
        if not ok:
            print("\n".join(tail), flush=True)
        (OUT / "repro.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
