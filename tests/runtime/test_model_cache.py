"""Cache correctness: decoding token by token (the decode ops, conv and recurrent state updated in
place, KV appended) must give the logits of one full prefill, for both layer kinds."""

from __future__ import annotations

import pytest
import torch

from clef_runtime.compare import errors
from clef_runtime.model import GDNState, HybridModel, KVState, ModelConfig, preset, random_weights
from clef_runtime.model.config import FULL, LINEAR
from clef_runtime.tolerances import Tolerance

# float32 on both paths; only the summation order of the attention over a growing cache and the
# float32 rounding of the reference ops' outputs differ.
SAME = Tolerance(rel_rms=1e-5, rel_max=1e-4)

TINY = preset("tiny")
CONFIGS: dict[str, ModelConfig] = {
    "gdn": TINY.replace(layer_types=(LINEAR, LINEAR)),
    "attention": TINY.replace(layer_types=(FULL, FULL)),
    "hybrid": TINY,
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def model(request: pytest.FixtureRequest) -> HybridModel:
    cfg = CONFIGS[request.param]
    return HybridModel(cfg, random_weights(cfg, seed=11))


def tokens(b: int, t: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, TINY.vocab_size, (b, t), generator=torch.Generator().manual_seed(seed))


def check(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    e = errors(a, b)
    assert e.within(SAME), f"{what}: {e.describe(SAME)}"


def test_prefill_then_decode_equals_full_prefill(model: HybridModel) -> None:
    ids = tokens(2, 10)
    full, _ = model.prefill(ids)
    logits, cache = model.prefill(ids[:, :6])
    check(logits, full[:, :6], "prefill of a prefix")
    for t in range(6, 9):
        check(model.decode_step(ids[:, t], cache), full[:, t], f"decode step at position {t}")
    # a decode step of two tokens at once (the decode ops take a few tokens per sequence)
    logits, cache = model.prefill(ids[:, :6])
    check(model.decode_step(ids[:, 6:8], cache), full[:, 6:8], "two-token decode step")
    assert cache.seq_len == 8


def test_chunked_prefill_equals_full_prefill(model: HybridModel) -> None:
    ids = tokens(2, 11, seed=1)
    full, _ = model.prefill(ids)
    first, cache = model.prefill(ids[:, :4])
    second, cache = model.prefill(ids[:, 4:], cache)
    check(torch.cat([first, second], dim=1), full, "prefill in two chunks")


def test_batch_rows_are_independent(model: HybridModel) -> None:
    ids = tokens(3, 7, seed=2)
    together = model.generate_greedy(ids, 5)
    alone = torch.cat([model.generate_greedy(ids[i : i + 1], 5) for i in range(3)])
    assert torch.equal(together, alone)


def test_packed_prefill_equals_separate_prefills(model: HybridModel) -> None:
    seqs = [tokens(1, n, seed=n)[0] for n in (5, 9, 3)]
    cu = torch.tensor([0, 5, 14, 17], dtype=torch.int32)
    packed = model.forward_packed(torch.cat(seqs), cu)
    for s, (a, b) in zip(seqs, [(0, 5), (5, 14), (14, 17)], strict=True):
        alone, _ = model.prefill(s[None])
        check(packed[:, a:b], alone, f"packed sequence [{a}, {b})")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cache_layout_and_dtypes(dtype: torch.dtype) -> None:
    cfg = TINY
    model = HybridModel(cfg, random_weights(cfg, seed=5), dtype=dtype)
    logits, cache = model.prefill(tokens(2, 3))  # shorter than the conv width - 1 + 1
    model.decode_step(tokens(2, 1, seed=9)[:, 0], cache)
    for i, state in enumerate(cache.layers):
        if cfg.layer_types[i] == LINEAR:
            assert isinstance(state, GDNState) and state.conv is not None and state.recurrent is not None
            assert state.conv.shape == (2, cfg.conv_dim, cfg.linear_conv_kernel_dim - 1)
            assert state.conv.dtype == dtype
            assert state.recurrent.shape == (2, 4, 16, 16) and state.recurrent.dtype == torch.float32
        else:
            assert isinstance(state, KVState) and state.k is not None
            assert state.k.shape == (2, cfg.num_key_value_heads, 4, cfg.head_dim) and state.k.dtype == dtype
    assert logits.dtype == torch.float32 and bool(torch.isfinite(logits).all())


def test_decode_needs_a_prefill() -> None:
    model = HybridModel(TINY, random_weights(TINY, seed=5))
    with pytest.raises(ValueError, match="run prefill first"):
        model.decode_step(torch.tensor([1]), model.new_cache(1))
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 256\)"):
        model.prefill(torch.tensor([[1, 256]]))
