"""config.json parsing: both upstream layouts, upstream's defaults and derivations, clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clef_runtime.model import ConfigError, ModelConfig, preset
from clef_runtime.model.config import FULL, LINEAR

TINY = preset("tiny")


def text_config(**changes: Any) -> dict[str, Any]:
    raw = TINY.to_hf_dict()
    raw.update(changes)
    return {k: v for k, v in raw.items() if v is not None}


def test_text_config_round_trips() -> None:
    assert ModelConfig.from_dict(TINY.to_hf_dict()) == TINY


def test_multimodal_config_reads_text_config(tmp_path: Path) -> None:
    inner = text_config(tie_word_embeddings=False)
    raw = {
        "model_type": "qwen3_5",
        "text_config": inner,
        "vision_config": {"model_type": "qwen3_5_vision", "depth": 2},
        "tie_word_embeddings": True,  # the outer flag wins, as upstream ties by the outer config
    }
    (tmp_path / "config.json").write_text(json.dumps(raw))
    cfg = ModelConfig.from_json(tmp_path)
    assert cfg == TINY.replace(tie_word_embeddings=True)


def test_layer_types_derived_from_full_attention_interval() -> None:
    raw = text_config(layer_types=None, num_hidden_layers=8, full_attention_interval=4)
    cfg = ModelConfig.from_dict(raw)
    assert cfg.layer_types == (LINEAR, LINEAR, LINEAR, FULL) * 2
    # upstream's default interval is 4 as well
    raw.pop("full_attention_interval")
    assert ModelConfig.from_dict(raw).layer_types == (LINEAR, LINEAR, LINEAR, FULL) * 2
    cfg = ModelConfig.from_dict(text_config(layer_types=None, num_hidden_layers=6, full_attention_interval=2))
    assert cfg.layer_types == (LINEAR, FULL) * 3


def test_rope_parameters_and_legacy_keys() -> None:
    cfg = ModelConfig.from_dict(
        text_config(
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10_000_000,
                "partial_rotary_factor": 0.5,
                "mrope_section": [11, 11, 10],
                "mrope_interleaved": True,
            }
        )
    )
    assert (cfg.rope_theta, cfg.partial_rotary_factor, cfg.rotary_dim) == (1e7, 0.5, 16)
    # legacy: top-level rope_theta/partial_rotary_factor, and rope_scaling {"type": "mrope"}
    legacy = text_config(rope_parameters=None, rope_theta=5e6, partial_rotary_factor=0.25)
    legacy["rope_scaling"] = {"type": "mrope", "mrope_section": [2, 1, 1]}
    cfg = ModelConfig.from_dict(legacy)
    assert (cfg.rope_theta, cfg.partial_rotary_factor) == (5e6, 0.25)
    # nothing given: upstream's defaults
    cfg = ModelConfig.from_dict(text_config(rope_parameters=None))
    assert (cfg.rope_theta, cfg.partial_rotary_factor) == (10_000.0, 0.25)


def test_missing_keys_take_upstream_defaults() -> None:
    cfg = ModelConfig.from_dict({"model_type": "qwen3_5_text"})
    assert cfg.layer_types == (LINEAR, LINEAR, LINEAR, FULL) * 8
    assert (cfg.linear_num_key_heads, cfg.linear_num_value_heads) == (16, 32)
    assert (cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim) == (128, 128, 4)
    assert cfg.conv_dim == 2 * 16 * 128 + 32 * 128 == 8192
    assert (cfg.head_dim, cfg.rotary_dim) == (256, 64)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"linear_num_value_heads": 30, "linear_num_key_heads": 16},
            "config.json: linear_num_value_heads (30) must be a multiple of linear_num_key_heads (16)",
        ),
        (
            {"num_attention_heads": 6, "num_key_value_heads": 4},
            "num_attention_heads (6) must be a multiple of num_key_value_heads (4)",
        ),
        (
            {"layer_types": ["linear_attention", "mamba", "linear_attention", "full_attention"]},
            "layer_types[1] is 'mamba'",
        ),
        ({"num_hidden_layers": 6}, "layer_types has 4 entries but num_hidden_layers is 6"),
        ({"hidden_size": 0}, "hidden_size (0) must be a positive integer"),
        ({"hidden_size": "64"}, "hidden_size ('64') must be an integer"),
        ({"model_type": "llama"}, "model_type is 'llama'"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ({"attention_bias": True}, "attention_bias true is not supported"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn' is not supported"),
        (
            {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.3}},
            "rotary channels: must be an even",
        ),
        ({"linear_conv_kernel_dim": 1}, "linear_conv_kernel_dim (1) must be at least 2"),
    ],
)
def test_bad_configs_name_the_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        ModelConfig.from_dict(text_config(**changes), where="config.json")
    assert message in str(info.value)
    assert str(info.value).startswith("config.json")


def test_bad_multimodal_and_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs a text_config"):
        ModelConfig.from_dict({"model_type": "qwen3_5"})
    with pytest.raises(ConfigError, match=r"config.json: text_config: linear_num_value_heads \(30\)"):
        ModelConfig.from_dict(
            {
                "model_type": "qwen3_5",
                "text_config": text_config(linear_num_value_heads=30, linear_num_key_heads=16),
            }
        )
    with pytest.raises(ConfigError, match="no such file"):
        ModelConfig.from_json(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_json(tmp_path)


def test_presets_have_qwen3_5_shapes() -> None:
    for name in ("qwen3_5", "clef-flash"):
        cfg = preset(name)
        assert (cfg.linear_num_key_heads, cfg.linear_num_value_heads) == (16, 32)
        assert (cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim) == (
            128,
            128,
            4,
        )
        assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (16, 4, 256)
        assert cfg.partial_rotary_factor == 0.25 and cfg.attn_output_gate
    flash = preset("clef-flash")
    assert (len(flash.full_layers), len(flash.linear_layers)) == (8, 24)
    assert flash.layer_types == (LINEAR, LINEAR, LINEAR, FULL) * 8
    small = flash.reduced(hidden_size=256, intermediate_size=512, vocab_size=512)
    assert small.layer_types == flash.layer_types and small.conv_dim == flash.conv_dim == 8192
    assert (small.hidden_size, small.vocab_size) == (256, 512)
    with pytest.raises(ConfigError, match="unknown preset 'qwen4'"):
        preset("qwen4")
