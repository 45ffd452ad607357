"""The KV cache estimate (`status.kvCacheTokens`) and the KV budget handed to engines.

Only full-attention layers hold a KV cache; a Gated DeltaNet layer keeps a fixed-size recurrent
state per sequence, independent of length, so it does not enter the per-token cost.  The formula
is documented in docs/api.md ("kvCacheTokens"); keep the two in step.
"""

from __future__ import annotations

from clef_operator.api import DTYPE_BYTES, ClefModelSpec

MIB = 1024 * 1024


def kv_bytes_per_token(spec: ClefModelSpec) -> int:
    """K and V, for every full-attention layer, every KV head, at the serving dtype."""
    arch = spec.model.architecture
    return 2 * arch.full_attention_layers * arch.num_key_value_heads * arch.head_dim * DTYPE_BYTES[spec.dtype]


def kv_budget_bytes_per_gpu(spec: ClefModelSpec, gpu_memory_mib: int) -> int:
    """kvFraction of what is left on one GPU after its share of the weights (candle-vllm's
    `--gpu-memory-fraction` semantics, which the vLLM and mistral.rs presets reproduce with an
    amount: bytes, MiB)."""
    weights_per_gpu_mib = (spec.model.weights_mib or 0) / spec.gpus
    free_mib = max(0.0, gpu_memory_mib - weights_per_gpu_mib)
    return int(spec.kv_fraction * free_mib * MIB)


def estimate_kv_cache_tokens(spec: ClefModelSpec, gpu_memory_mib: int | None) -> int | None:
    """Tokens of KV cache one replica holds.  The GPUs of a replica pool their budgets: tensor
    parallelism splits the KV heads across them, pipeline parallelism splits the layers."""
    if gpu_memory_mib is None:
        return None
    return (spec.gpus * kv_budget_bytes_per_gpu(spec, gpu_memory_mib)) // kv_bytes_per_token(spec)
