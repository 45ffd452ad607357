"""Per-GDN-layer statistics, and the random checkpoint's health (no vanishing, no blow-up, no
degenerate greedy output), which the model check in `verify` depends on."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import torch

from clef_runtime.model import GDNStats, HybridModel, preset, random_weights
from clef_runtime.opset import OpSet, get_opset

TINY = preset("tiny")


def prompt(b: int = 2, t: int = 6) -> torch.Tensor:
    return torch.randint(0, TINY.vocab_size, (b, t), generator=torch.Generator().manual_seed(4))


def test_stats_cover_every_gdn_layer_over_prefill_and_decode() -> None:
    cfg = TINY.replace(layer_types=(*TINY.layer_types, *TINY.layer_types))
    model = HybridModel(cfg, random_weights(cfg, seed=2))
    stats = GDNStats()
    with model.recording(stats):
        model.generate_greedy(prompt(), 5)
    model.generate_greedy(prompt(), 2)  # outside the block: nothing recorded
    report = stats.as_dict()
    json.dumps(report)  # JSON-ready for the verify report
    assert [row["layer"] for row in report["layers"]] == cfg.linear_layers == [0, 1, 2, 4, 5, 6]
    hv = cfg.linear_num_value_heads
    for row in report["layers"]:
        assert row["tokens"] == 2 * (6 + 4)  # prompt, then 4 decode steps (the 5th token is not fed)
        assert 0 < row["beta_sum"] < row["tokens"] * hv
        assert row["delta_rule_absmax"] > 0 and row["gated_norm_absmax"] > 0
        assert all(row["conv_absmax"][band] > 0 for band in "qkv")
    totals = report["totals"]
    assert abs(totals["beta_sum"] - sum(r["beta_sum"] for r in report["layers"])) < 1e-9


def _zero_key_band(ops: OpSet, split: tuple[int, int, int]) -> OpSet:
    """The incident of docs/verification.md, applied to the reference op set: the conv's key band is zero."""

    def zero_k(y: torch.Tensor) -> torch.Tensor:
        y = y.clone()
        y[..., split[0] : split[0] + split[1]] = 0
        return y

    def conv(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        y, final = ops.causal_conv1d(*args, **kwargs)
        return zero_k(y), final

    def conv_update(*args: Any, **kwargs: Any) -> torch.Tensor:
        return zero_k(ops.causal_conv1d_update(*args, **kwargs))

    fields = {name: getattr(ops, name) for name in dir(ops) if not name.startswith("_")}
    faulty: OpSet = SimpleNamespace(**{**fields, "causal_conv1d": conv, "causal_conv1d_update": conv_update})  # type: ignore[assignment]
    return faulty


def test_zeroed_key_band_shows_in_the_stats() -> None:
    weights = random_weights(TINY, seed=2)
    good, bad = GDNStats(), GDNStats()
    healthy = HybridModel(TINY, weights)
    broken = HybridModel(TINY, weights, opset=_zero_key_band(get_opset("reference"), TINY.qkv_split))
    with healthy.recording(good), broken.recording(bad):
        healthy.generate_greedy(prompt(), 4)
        broken.generate_greedy(prompt(), 4)
    for g, b in zip(good.as_dict()["layers"], bad.as_dict()["layers"], strict=True):
        assert g["conv_absmax"]["k"] > 0 and b["conv_absmax"]["k"] == 0
        # with k = 0 the delta rule never writes its state: every GDN layer returns zero
        assert g["delta_rule_absmax"] > 0 and b["delta_rule_absmax"] == 0
        assert b["gated_norm_absmax"] == 0


def _residual_rms(model: HybridModel, ids: torch.Tensor, new_tokens: int) -> tuple[list[float], torch.Tensor]:
    rms: list[float] = []

    def record(_m: torch.nn.Module, _i: Any, out: torch.Tensor) -> None:
        rms.append(float(out.float().pow(2).mean().sqrt()))

    hooks = [layer.register_forward_hook(record) for layer in model.layers]
    try:
        new = model.generate_greedy(ids, new_tokens)
    finally:
        for h in hooks:
            h.remove()
    return rms, new


def test_random_checkpoint_is_healthy() -> None:
    """Activations stay O(1) through the stack and greedy decoding is not degenerate, with tied
    and untied output heads (clef-flash ties its embeddings)."""
    for tied in (False, True):
        cfg = TINY.replace(layer_types=TINY.layer_types * 3, tie_word_embeddings=tied)
        model = HybridModel(cfg, random_weights(cfg, seed=0))
        rms, new = _residual_rms(model, prompt(1, 8), 24)
        assert all(0.05 < r < 50 for r in rms), (
            f"residual RMS out of range (tied={tied}): {rms[: len(model.layers)]}"
        )
        assert new.unique().numel() >= 12, f"degenerate greedy output (tied={tied}): {new.tolist()}"
