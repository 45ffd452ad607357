"""The Qwen3.5 text decoder's shape, read from a Hugging Face style ``config.json``.

Two layouts are accepted, as upstream `transformers` writes them:

* text only: ``{"model_type": "qwen3_5_text", "hidden_size": ..., ...}``;
* multimodal: ``{"model_type": "qwen3_5", "text_config": {...}, "vision_config": {...}}``: only
  the text part is read (``tie_word_embeddings`` at the top level wins, as upstream's
  ``Qwen3_5ForConditionalGeneration`` ties by the outer config).

Missing keys take upstream's defaults (``Qwen3_5TextConfig`` in transformers 5.23), so a
config.json that upstream loads, clef loads to the same shape.  Rotary position embeddings:
Qwen3.5 declares multimodal rope (``mrope_section``), but for text every position id is
the same on the temporal, height and width axes, which makes mrope plain rope over the first
``head_dim * partial_rotary_factor`` channels.  Only that ("default"/"mrope") rope is supported.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LINEAR = "linear_attention"
FULL = "full_attention"
LAYER_KINDS = (LINEAR, FULL)

TEXT_MODEL_TYPE = "qwen3_5_text"
MULTIMODAL_MODEL_TYPE = "qwen3_5"


class ConfigError(ValueError):
    """A config.json (or a config built in code) that clef cannot run, with the field named."""


@dataclass(frozen=True)
class ModelConfig:
    """Everything the hybrid decoder's shapes depend on.  Field names follow upstream's keys."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    partial_rotary_factor: float = 0.25
    tie_word_embeddings: bool = False
    attn_output_gate: bool = True
    max_position_embeddings: int = 32768

    def __post_init__(self) -> None:
        # Accept any sequence for layer_types but store a tuple, so configs hash and compare.
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        self.validate()

    # ---- derived shapes -------------------------------------------------------------------

    @property
    def num_hidden_layers(self) -> int:
        return len(self.layer_types)

    @property
    def linear_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == LINEAR]

    @property
    def full_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == FULL]

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the GDN conv: the concatenated ``[q | k | v]``."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def qkv_split(self) -> tuple[int, int, int]:
        return (self.linear_key_dim, self.linear_key_dim, self.linear_value_dim)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    # ---- checks ---------------------------------------------------------------------------

    def validate(self, where: str = "config") -> None:
        """Raise `ConfigError` naming the first field that makes the model impossible to build."""
        positive = (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel_dim",
            "max_position_embeddings",
        )
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{where}: {name} ({value!r}) must be a positive integer")
        if not self.layer_types:
            raise ConfigError(f"{where}: layer_types is empty: the model needs at least one layer")
        for i, kind in enumerate(self.layer_types):
            if kind not in LAYER_KINDS:
                raise ConfigError(
                    f"{where}: layer_types[{i}] is {kind!r}: use 'linear_attention' or 'full_attention'"
                )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"{where}: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError(
                f"{where}: linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                f"linear_num_key_heads ({self.linear_num_key_heads})"
            )
        if self.linear_conv_kernel_dim < 2:
            raise ConfigError(
                f"{where}: linear_conv_kernel_dim ({self.linear_conv_kernel_dim}) must be at least 2 "
                "(the conv state holds the last kernel-1 inputs)"
            )
        if not 0.0 < self.partial_rotary_factor <= 1.0:
            raise ConfigError(
                f"{where}: partial_rotary_factor ({self.partial_rotary_factor}) must be in (0, 1]"
            )
        if self.rotary_dim < 2 or self.rotary_dim % 2:
            raise ConfigError(
                f"{where}: head_dim ({self.head_dim}) * partial_rotary_factor ({self.partial_rotary_factor})"
                f" = {self.rotary_dim} rotary channels: must be an even number ≥ 2"
            )
        if not self.rope_theta > 0:
            raise ConfigError(f"{where}: rope_theta ({self.rope_theta}) must be positive")
        if not self.rms_norm_eps > 0:
            raise ConfigError(f"{where}: rms_norm_eps ({self.rms_norm_eps}) must be positive")

    # ---- variants -------------------------------------------------------------------------

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def reduced(
        self,
        *,
        hidden_size: int = 256,
        intermediate_size: int = 512,
        vocab_size: int = 512,
        num_layers: int | None = None,
    ) -> ModelConfig:
        """The same head counts, head dims, conv width and layer pattern at a smaller width and
        vocabulary (what `verify` runs when no real weights are mounted).  ``num_layers`` keeps
        the first that many layers of the pattern."""
        layers = self.layer_types if num_layers is None else self.layer_types[:num_layers]
        return self.replace(
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            vocab_size=vocab_size,
            layer_types=layers,
        )

    # ---- (de)serialisation ----------------------------------------------------------------

    def to_hf_dict(self) -> dict[str, Any]:
        """A text-only config.json that both clef and upstream `Qwen3_5ForCausalLM` load."""
        return {
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": TEXT_MODEL_TYPE,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "layer_types": list(self.layer_types),
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "attention_bias": False,
            "attn_output_gate": self.attn_output_gate,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
            },
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "config.json") -> ModelConfig:
        return _parse(raw, where)

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        """Read ``config.json`` (or the ``config.json`` inside a checkpoint directory)."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        try:
            raw = json.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{p}: no such file: a checkpoint directory needs a config.json") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p}: not valid JSON ({e})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{p}: must hold a JSON object, got {type(raw).__name__}")
        return _parse(raw, str(p))


# Upstream defaults (transformers 5.23 Qwen3_5TextConfig) for keys a config.json may leave out.
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 248320,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "tie_word_embeddings": False,
    "max_position_embeddings": 32768,
    "full_attention_interval": 4,
    "attn_output_gate": True,
}
_DEFAULT_THETA = 10_000.0
_DEFAULT_PARTIAL_ROTARY = 0.25
_SUPPORTED_ROPE = ("default", "mrope")


def _parse(raw: Mapping[str, Any], where: str) -> ModelConfig:
    text, where = _text_config(raw, where)

    def get(key: str) -> Any:
        return _setting(text, key)

    if get("hidden_act") not in ("silu", "swish"):
        raise ConfigError(f"{where}: hidden_act {get('hidden_act')!r} is not supported: Qwen3.5 uses 'silu'")
    if get("attention_bias"):
        raise ConfigError(f"{where}: attention_bias true is not supported: Qwen3.5 attention has no biases")

    num_layers = _int(get("num_hidden_layers"), "num_hidden_layers", where)
    layer_types = _layer_types(text, num_layers, where)
    theta, partial = _rope(text, where)
    try:
        return ModelConfig(
            vocab_size=_int(get("vocab_size"), "vocab_size", where),
            hidden_size=_int(get("hidden_size"), "hidden_size", where),
            intermediate_size=_int(get("intermediate_size"), "intermediate_size", where),
            layer_types=tuple(layer_types),
            num_attention_heads=_int(get("num_attention_heads"), "num_attention_heads", where),
            num_key_value_heads=_int(get("num_key_value_heads"), "num_key_value_heads", where),
            head_dim=_int(get("head_dim"), "head_dim", where),
            linear_num_key_heads=_int(get("linear_num_key_heads"), "linear_num_key_heads", where),
            linear_num_value_heads=_int(get("linear_num_value_heads"), "linear_num_value_heads", where),
            linear_key_head_dim=_int(get("linear_key_head_dim"), "linear_key_head_dim", where),
            linear_value_head_dim=_int(get("linear_value_head_dim"), "linear_value_head_dim", where),
            linear_conv_kernel_dim=_int(get("linear_conv_kernel_dim"), "linear_conv_kernel_dim", where),
            rms_norm_eps=_float(get("rms_norm_eps"), "rms_norm_eps", where),
            rope_theta=theta,
            partial_rotary_factor=partial,
            tie_word_embeddings=bool(get("tie_word_embeddings")),
            attn_output_gate=bool(get("attn_output_gate")),
            max_position_embeddings=_int(get("max_position_embeddings"), "max_position_embeddings", where),
        )
    except ConfigError as e:
        # Re-label errors raised by validate() with the file they came from.
        raise ConfigError(str(e).replace("config:", f"{where}:", 1)) from None


def _setting(text: Mapping[str, Any], key: str) -> Any:
    """A decoder key's value; upstream's default where it is missing or null."""
    value = text.get(key)
    return _DEFAULTS[key] if value is None else value


def _text_config(raw: Mapping[str, Any], where: str) -> tuple[Mapping[str, Any], str]:
    """The decoder's keys, and where they come from: the file itself ('qwen3_5_text'), or its
    text_config ('qwen3_5', the multimodal wrapper; its tie_word_embeddings wins)."""
    model_type = raw.get("model_type", TEXT_MODEL_TYPE)
    if model_type == TEXT_MODEL_TYPE:
        return raw, where
    if model_type != MULTIMODAL_MODEL_TYPE:
        raise ConfigError(
            f"{where}: model_type is {model_type!r}: clef runs Qwen3.5 hybrid decoders "
            "('qwen3_5_text', or 'qwen3_5' with a text_config)"
        )
    sub = raw.get("text_config")
    if not isinstance(sub, Mapping):
        raise ConfigError(
            f"{where}: model_type 'qwen3_5' needs a text_config object with the decoder's shape"
        )
    inner_type = sub.get("model_type", TEXT_MODEL_TYPE)
    if inner_type != TEXT_MODEL_TYPE:
        raise ConfigError(f"{where}: text_config.model_type is {inner_type!r}, expected 'qwen3_5_text'")
    text = dict(sub)
    if "tie_word_embeddings" in raw:
        text["tie_word_embeddings"] = raw["tie_word_embeddings"]
    return text, f"{where}: text_config"


def _layer_types(text: Mapping[str, Any], num_layers: int, where: str) -> list[str] | tuple[str, ...]:
    """layer_types as given, or derived from full_attention_interval; one per layer."""
    layer_types = text.get("layer_types")
    if layer_types is None:
        interval = _int(_setting(text, "full_attention_interval"), "full_attention_interval", where)
        if interval <= 0:
            raise ConfigError(f"{where}: full_attention_interval ({interval}) must be a positive integer")
        # Upstream's rule: every interval-th layer (1-based) is full attention.
        layer_types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers)]
    if not isinstance(layer_types, list | tuple):
        raise ConfigError(f"{where}: layer_types must be a list of 'linear_attention'/'full_attention'")
    if len(layer_types) != num_layers:
        raise ConfigError(
            f"{where}: layer_types has {len(layer_types)} entries but num_hidden_layers is {num_layers}"
        )
    return layer_types


def _rope(text: Mapping[str, Any], where: str) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor) with upstream's priority: the rope_parameters (or the
    legacy rope_scaling) dict first, then top-level keys, then defaults."""
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"{where}: rope_parameters must be an object")
    if any(isinstance(v, Mapping) for v in params.values()):
        raise ConfigError(f"{where}: rope_parameters nested per layer type is not supported")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in _SUPPORTED_ROPE:
        raise ConfigError(
            f"{where}: rope_parameters.rope_type {rope_type!r} is not supported: clef implements "
            "Qwen3.5's unscaled rope ('default'; 'mrope' is the same for text)"
        )
    theta = params.get("rope_theta", text.get("rope_theta", _DEFAULT_THETA))
    partial = params.get("partial_rotary_factor", text.get("partial_rotary_factor", _DEFAULT_PARTIAL_ROTARY))
    return _float(theta, "rope_theta", where), _float(partial, "partial_rotary_factor", where)


def _int(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: {name} ({value!r}) must be an integer")
    return value


def _float(value: Any, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {name} ({value!r}) must be a number")
    return float(value)


# ---- presets ----------------------------------------------------------------------------------


def _pattern(num_layers: int, interval: int = 4) -> tuple[str, ...]:
    return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers))


# Qwen3.5's GDN and attention shapes (upstream's text-config defaults; Qwen3.5-9B sized).
_QWEN3_5 = ModelConfig(
    vocab_size=248320,
    hidden_size=4096,
    intermediate_size=12288,
    layer_types=_pattern(32),
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    rope_theta=10_000_000.0,
    partial_rotary_factor=0.25,
    tie_word_embeddings=False,
    max_position_embeddings=262144,
)

PRESETS: dict[str, ModelConfig] = {
    "qwen3_5": _QWEN3_5,
    # The homelab's served model (docs/api.md's example): 8 full-attention + 24 GDN layers, one V100 in f16.
    # A Qwen3.5-4B-like width; head counts, head dims and conv width are Qwen3.5's.
    "clef-flash": _QWEN3_5.replace(hidden_size=2560, intermediate_size=9216, tie_word_embeddings=True),
    # Test-sized (CPU tests, the Triton interpreter): one hybrid block of 3 GDN + 1 attention layers,
    # grouped heads on both kinds, partial rotary, untied head.
    "tiny": ModelConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        layer_types=_pattern(4),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        rope_theta=10_000.0,
        partial_rotary_factor=0.25,
        max_position_embeddings=4096,
    ),
}


def preset(name: str) -> ModelConfig:
    """A named architecture (``qwen3_5``, ``clef-flash``, ``tiny``).  Combine with `ModelConfig.reduced`
    for the small-width models that `verify` generates from a seed."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown preset {name!r}: known presets are {', '.join(sorted(PRESETS))}"
        ) from None
