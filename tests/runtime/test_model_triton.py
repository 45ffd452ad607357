"""The hybrid model on clef's Triton op set: the same greedy ids and logits as upstream
``Qwen3_5ForCausalLM`` and as the reference op set, and the per-GDN-layer statistics side by side.

On CPU this runs the kernels under ``TRITON_INTERPRET=1`` (set by tests/conftest.py), so the
shapes are tiny: a few prompt tokens and 8 new tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from clef_runtime.compare import errors
from clef_runtime.model import GDNStats, HybridModel, preset, write_random_checkpoint
from clef_runtime.opset import get_opset
from clef_runtime.tolerances import Tolerance

CONFIG = preset("tiny")
NEW_TOKENS = 8
# float32 kernels vs float64 references (tolerances.py: delta rule rel_rms ≤ 1e-4) and vs upstream;
# through 4 layers the logits move by ~1e-5 relative (same reasoning as test_model_upstream).
LOGITS_TOL = Tolerance(rel_rms=1e-4, rel_max=1e-3)
STATS_REL = 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("ckpt"), CONFIG, seed=99)


def prompts(device: torch.device) -> torch.Tensor:
    ids = torch.randint(0, CONFIG.vocab_size, (2, 5), generator=torch.Generator().manual_seed(5))
    return ids.to(device)


def test_triton_model_matches_reference_and_upstream(checkpoint: Path, device: torch.device) -> None:
    from transformers import Qwen3_5ForCausalLM

    triton = HybridModel.from_checkpoint(checkpoint, opset=get_opset("triton"), device=device)
    reference = HybridModel.from_checkpoint(checkpoint, opset=get_opset("reference"), device=device)
    upstream = Qwen3_5ForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).to(device).eval()
    ids = prompts(device)

    t_stats, r_stats = GDNStats(), GDNStats()
    with triton.recording(t_stats), reference.recording(r_stats):
        t_ids, t_logits = triton.generate_greedy_with_logits(ids, NEW_TOKENS)
        r_ids, r_logits = reference.generate_greedy_with_logits(ids, NEW_TOKENS)
    with torch.no_grad():
        out = upstream.generate(
            ids,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            return_dict_in_generate=True,
            output_logits=True,
            pad_token_id=0,
        )
    u_ids = out.sequences[:, ids.shape[1] :]
    u_logits = torch.stack([s.float() for s in out.logits], dim=1)

    vs_ref, vs_up = errors(t_logits, r_logits), errors(t_logits, u_logits)
    print(f"triton vs reference logits: {vs_ref.describe(LOGITS_TOL)}")
    print(f"triton vs upstream logits:  {vs_up.describe(LOGITS_TOL)}")
    assert torch.equal(t_ids, r_ids), f"greedy ids, triton vs reference:\n{t_ids}\n{r_ids}"
    assert torch.equal(t_ids, u_ids), f"greedy ids, triton vs upstream:\n{t_ids}\n{u_ids}"
    assert vs_ref.within(LOGITS_TOL), f"triton vs reference logits: {vs_ref.describe(LOGITS_TOL)}"
    assert vs_up.within(LOGITS_TOL), f"triton vs upstream logits: {vs_up.describe(LOGITS_TOL)}"

    t_layers, r_layers = t_stats.as_dict()["layers"], r_stats.as_dict()["layers"]
    # one row per GDN layer, each visited: a recording that saw no layer must not pass vacuously
    n_gdn = len(CONFIG.linear_layers)
    assert n_gdn > 0 and len(t_layers) == len(r_layers) == n_gdn, (n_gdn, len(t_layers), len(r_layers))
    for t, r in zip(t_layers, r_layers, strict=True):
        pairs = {
            "beta_sum": (t["beta_sum"], r["beta_sum"]),
            "delta_rule_absmax": (t["delta_rule_absmax"], r["delta_rule_absmax"]),
            "gated_norm_absmax": (t["gated_norm_absmax"], r["gated_norm_absmax"]),
            **{f"conv_{b}_absmax": (t["conv_absmax"][b], r["conv_absmax"][b]) for b in "qkv"},
        }
        for name, (a, b) in pairs.items():
            assert b > 0, f"layer {r['layer']} {name}: the reference value is 0"
            assert abs(a - b) <= STATS_REL * abs(b), f"layer {r['layer']} {name}: triton {a} vs reference {b}"
