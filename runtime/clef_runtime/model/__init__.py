"""The hybrid Qwen3.5 decoder (GDN + gated attention) that runs on either op set.

from clef_runtime.model import HybridModel, GDNStats, preset, write_random_checkpoint
from clef_runtime.opset import get_opset

config = preset("clef-flash").reduced(hidden_size=256, vocab_size=512)
write_random_checkpoint(tmp, config, seed=0, dtype=torch.float16)
model = HybridModel.from_checkpoint(tmp, opset=get_opset("triton"), dtype=torch.float16, device="cuda")
stats = GDNStats()
with model.recording(stats):
    ids = model.generate_greedy(prompt, max_new_tokens=64)
"""

from __future__ import annotations

from clef_runtime.model.cache import GDNState, HybridCache, KVState
from clef_runtime.model.checkpoint import random_weights, write_random_checkpoint
from clef_runtime.model.config import PRESETS, ConfigError, ModelConfig, preset
from clef_runtime.model.model import HybridModel
from clef_runtime.model.stats import GDNLayerStats, GDNStats
from clef_runtime.model.weights import WeightsError, expected_tensors, load_weights

__all__ = [
    "PRESETS",
    "ConfigError",
    "GDNLayerStats",
    "GDNState",
    "GDNStats",
    "HybridCache",
    "HybridModel",
    "KVState",
    "ModelConfig",
    "WeightsError",
    "expected_tensors",
    "load_weights",
    "preset",
    "random_weights",
    "write_random_checkpoint",
]
