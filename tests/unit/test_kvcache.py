"""kvCacheTokens: only full-attention layers hold KV (docs/api.md, "kvCacheTokens")."""

from __future__ import annotations

from clef_builders import make_spec

from clef_operator.kvcache import estimate_kv_cache_tokens, kv_bytes_per_token


def test_only_attention_layers_count():
    spec = make_spec()
    # qwen3_5: 32 layers, every 4th full attention -> 8 layers; 4 KV heads x 256 dims; f16.
    assert kv_bytes_per_token(spec) == 2 * 8 * 4 * 256 * 2


def test_clef_flash_on_a_v100_16gb():
    # 16384 MiB, weights 9426 MiB, kvFraction 0.30: the homelab's ~66.8K tokens.
    spec = make_spec(model={"name": "clef-flash", "path": "/models/clef-flash", "weightsMiB": 9426})
    tokens = estimate_kv_cache_tokens(spec, 16384)
    assert tokens == int(0.30 * (16384 - 9426) * 2**20) // 32768
    assert 66_000 < tokens < 67_500


def test_gpus_pool_their_budgets_and_dtype_matters():
    one = estimate_kv_cache_tokens(make_spec(), 32768)
    two = estimate_kv_cache_tokens(make_spec(gpus=2), 32768)
    f32 = estimate_kv_cache_tokens(make_spec(dtype="f32"), 32768)
    assert one is not None and two is not None and f32 is not None
    assert two in (2 * one, 2 * one + 1)
    assert f32 == one // 2


def test_unknown_gpu_memory_gives_no_estimate():
    assert estimate_kv_cache_tokens(make_spec(), None) is None
