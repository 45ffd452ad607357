"""Safetensors loading: upstream names in both layouts, and errors that name the tensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from clef_runtime.model import (
    HybridModel,
    WeightsError,
    expected_tensors,
    load_weights,
    preset,
    write_random_checkpoint,
)

TINY = preset("tiny")


def rewrite(ckpt: Path, tensors: dict[str, torch.Tensor]) -> None:
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return write_random_checkpoint(tmp_path, TINY, seed=3)


def test_text_checkpoint_loads_with_upstream_names(ckpt: Path) -> None:
    from transformers import AutoConfig, Qwen3_5ForCausalLM

    weights = load_weights(ckpt, TINY)
    # The expectation comes from outside clef: the parameters upstream's model holds for this
    # config.json (names and shapes), and the tensors the file holds (read by safetensors itself).
    upstream = Qwen3_5ForCausalLM(AutoConfig.from_pretrained(ckpt)).state_dict()
    assert {n: tuple(t.shape) for n, t in weights.items()} == {n: tuple(t.shape) for n, t in upstream.items()}
    stored = load_file(str(ckpt / "model.safetensors"))
    assert sorted(stored) == sorted(weights)
    assert all(torch.equal(weights[n], stored[n]) for n in stored)
    assert weights["model.layers.0.linear_attn.conv1d.weight"].shape == (TINY.conv_dim, 1, 4)
    assert weights["model.layers.3.self_attn.q_proj.weight"].shape == (4 * 32 * 2, 64)


def test_multimodal_checkpoint_loads_and_computes_the_same(ckpt: Path, tmp_path: Path) -> None:
    mm = write_random_checkpoint(tmp_path / "mm", TINY, seed=3, multimodal=True)
    stored = load_file(str(mm / "model.safetensors"))
    assert "model.language_model.layers.0.linear_attn.in_proj_qkv.weight" in stored
    assert json.loads((mm / "config.json").read_text())["model_type"] == "qwen3_5"
    # Released multimodal checkpoints also carry a vision tower and MTP heads: skipped.
    stored["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(3, 3)
    stored["mtp.fc.weight"] = torch.zeros(2, 2)
    rewrite(mm, stored)

    ids = torch.tensor([[1, 2, 3, 4, 5]])
    a, _ = HybridModel.from_checkpoint(ckpt).prefill(ids)
    b, _ = HybridModel.from_checkpoint(mm).prefill(ids)
    assert torch.equal(a, b)


def test_missing_tensor_is_named_with_its_shape(ckpt: Path) -> None:
    tensors = load_file(str(ckpt / "model.safetensors"))
    del tensors["model.layers.2.linear_attn.A_log"]
    rewrite(ckpt, tensors)
    with pytest.raises(WeightsError) as info:
        load_weights(ckpt, TINY)
    msg = str(info.value)
    assert "missing model.layers.2.linear_attn.A_log (expected shape [4] = [linear_num_value_heads])" in msg
    assert "model.safetensors" in msg


def test_wrong_shape_is_named_with_expected_shape(ckpt: Path) -> None:
    tensors = load_file(str(ckpt / "model.safetensors"))
    # a q_proj without the output gate half
    tensors["model.layers.3.self_attn.q_proj.weight"] = torch.zeros(4 * 32, 64)
    tensors["model.layers.0.linear_attn.conv1d.weight"] = torch.zeros(TINY.conv_dim, 1, 3)
    rewrite(ckpt, tensors)
    with pytest.raises(WeightsError) as info:
        load_weights(ckpt, TINY)
    msg = str(info.value)
    assert "2 problem(s)" in msg
    assert (
        "model.layers.3.self_attn.q_proj.weight has shape [128, 64], expected [256, 64] = "
        "[num_attention_heads*head_dim*2 (query and output gate), hidden_size]" in msg
    )
    d = TINY.conv_dim
    assert f"model.layers.0.linear_attn.conv1d.weight has shape [{d}, 1, 3], expected [{d}, 1, 4]" in msg


def test_unexpected_tensor_is_named(ckpt: Path) -> None:
    tensors = load_file(str(ckpt / "model.safetensors"))
    tensors["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(256, 64)  # layer 0 is a GDN layer
    rewrite(ckpt, tensors)
    with pytest.raises(WeightsError, match=r"unexpected model\.layers\.0\.self_attn\.q_proj\.weight"):
        load_weights(ckpt, TINY)


def test_config_that_does_not_match_the_checkpoint(ckpt: Path) -> None:
    other = TINY.replace(linear_num_value_heads=8)
    with pytest.raises(WeightsError) as info:
        load_weights(ckpt, other)
    assert "model.layers.0.linear_attn.in_proj_b.weight has shape [4, 64], expected [8, 64]" in str(
        info.value
    )


def test_tied_embeddings_need_no_lm_head(tmp_path: Path) -> None:
    tied = TINY.replace(tie_word_embeddings=True)
    ckpt = write_random_checkpoint(tmp_path, tied, seed=0)
    assert "lm_head.weight" not in load_file(str(ckpt / "model.safetensors"))
    model = HybridModel.from_checkpoint(ckpt)
    assert model.lm_head is None
    logits, _ = model.prefill(torch.tensor([[5, 6, 7]]))
    h = model.embed_tokens.weight
    assert logits.shape == (1, 3, tied.vocab_size) and h.shape == (tied.vocab_size, tied.hidden_size)
    # untied config on the same file: the head is reported missing
    with pytest.raises(WeightsError, match=r"missing lm_head\.weight .*tie_word_embeddings is false"):
        load_weights(ckpt, TINY)


def test_sharded_checkpoint_loads(ckpt: Path) -> None:
    tensors = load_file(str(ckpt / "model.safetensors"))
    names = sorted(tensors)
    half = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    for fname, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(ckpt / fname), metadata={"format": "pt"})
    (ckpt / "model.safetensors").unlink()
    index = {"weight_map": {n: f for f, part in shards.items() for n in part}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    weights = load_weights(ckpt, TINY)
    assert all(torch.equal(weights[n], tensors[n]) for n in names)


def test_low_precision_checkpoint(tmp_path: Path) -> None:
    ckpt = write_random_checkpoint(tmp_path, TINY, seed=0, dtype=torch.bfloat16)
    assert json.loads((ckpt / "config.json").read_text())["dtype"] == "bfloat16"
    weights = load_weights(ckpt, TINY)
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    model = HybridModel(TINY, weights, dtype=torch.float16)
    # compute weights in the compute dtype; zero-centred norms, A_log and dt_bias in float32
    assert model.layers[0].linear_attn.in_proj_qkv.weight.dtype == torch.float16
    assert model.layers[0].linear_attn.A_log.dtype == torch.float32
    assert model.layers[0].input_layernorm.weight.dtype == torch.float32


def test_attention_without_output_gate(tmp_path: Path) -> None:
    cfg = TINY.replace(attn_output_gate=False)
    assert expected_tensors(cfg)["model.layers.3.self_attn.q_proj.weight"].shape == (4 * 32, 64)
    ckpt = write_random_checkpoint(tmp_path, cfg, seed=0)
    logits, _ = HybridModel.from_checkpoint(ckpt).prefill(torch.tensor([[1, 2, 3]]))
    assert bool(torch.isfinite(logits).all())
