"""Safetensors loading with the upstream (Hugging Face ``transformers``) tensor names.

Canonical names are those of the text-only ``Qwen3_5ForCausalLM``::

    model.embed_tokens.weight                         [vocab, hidden]
    model.layers.N.input_layernorm.weight             [hidden]        applied as (1 + w)
    model.layers.N.post_attention_layernorm.weight    [hidden]        applied as (1 + w)
    model.layers.N.mlp.{gate,up}_proj.weight          [intermediate, hidden]
    model.layers.N.mlp.down_proj.weight               [hidden, intermediate]
    # GDN layers (layer_types[N] == "linear_attention")
    model.layers.N.linear_attn.in_proj_qkv.weight     [2*Hk*K + Hv*V, hidden]   rows [q | k | v]
    model.layers.N.linear_attn.in_proj_z.weight       [Hv*V, hidden]
    model.layers.N.linear_attn.in_proj_b.weight       [Hv, hidden]
    model.layers.N.linear_attn.in_proj_a.weight       [Hv, hidden]
    model.layers.N.linear_attn.conv1d.weight          [2*Hk*K + Hv*V, 1, W]
    model.layers.N.linear_attn.dt_bias                [Hv]
    model.layers.N.linear_attn.A_log                  [Hv]
    model.layers.N.linear_attn.norm.weight            [V]             applied as w (not 1 + w)
    model.layers.N.linear_attn.out_proj.weight        [hidden, Hv*V]
    # attention layers (layer_types[N] == "full_attention")
    model.layers.N.self_attn.q_proj.weight            [heads*head_dim*2, hidden]  per head [q | gate]
    model.layers.N.self_attn.{k,v}_proj.weight        [kv_heads*head_dim, hidden]
    model.layers.N.self_attn.o_proj.weight            [hidden, heads*head_dim]
    model.layers.N.self_attn.{q,k}_norm.weight        [head_dim]      applied as (1 + w)
    model.norm.weight                                 [hidden]        applied as (1 + w)
    lm_head.weight                                    [vocab, hidden] (absent when tied)

Multimodal checkpoints (``Qwen3_5ForConditionalGeneration``) store the decoder under
``model.language_model.`` instead of ``model.``; both load.  Vision-tower (``model.visual.``)
and multi-token-prediction (``mtp.``) tensors are skipped, as upstream's text model skips them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from clef_runtime.model.config import FULL, ModelConfig

MULTIMODAL_PREFIX = "model.language_model."
TEXT_PREFIX = "model."
IGNORED_PREFIXES = ("mtp.", "model.visual.", "visual.")

_MAX_LISTED = 12


class WeightsError(ValueError):
    """Missing, unexpected or mis-shaped tensors; the message names each one."""


@dataclass(frozen=True)
class Expected:
    shape: tuple[int, ...]
    meaning: str  # how the shape follows from the config, for error messages


def expected_tensors(config: ModelConfig) -> dict[str, Expected]:
    """Every tensor the decoder needs, by canonical name, in a stable order."""
    c = config
    h, inter, vocab = c.hidden_size, c.intermediate_size, c.vocab_size
    out: dict[str, Expected] = {
        "model.embed_tokens.weight": Expected((vocab, h), "[vocab_size, hidden_size]")
    }
    for i, kind in enumerate(c.layer_types):
        p = f"model.layers.{i}."
        if kind == FULL:
            q_rows = c.num_attention_heads * c.head_dim * (2 if c.attn_output_gate else 1)
            q_meaning = (
                "[num_attention_heads*head_dim*2 (query and output gate), hidden_size]"
                if c.attn_output_gate
                else "[num_attention_heads*head_dim, hidden_size]"
            )
            kv_rows = c.num_key_value_heads * c.head_dim
            out[p + "self_attn.q_proj.weight"] = Expected((q_rows, h), q_meaning)
            out[p + "self_attn.k_proj.weight"] = Expected(
                (kv_rows, h), "[num_key_value_heads*head_dim, hidden_size]"
            )
            out[p + "self_attn.v_proj.weight"] = Expected(
                (kv_rows, h), "[num_key_value_heads*head_dim, hidden_size]"
            )
            out[p + "self_attn.o_proj.weight"] = Expected(
                (h, c.num_attention_heads * c.head_dim), "[hidden_size, num_attention_heads*head_dim]"
            )
            out[p + "self_attn.q_norm.weight"] = Expected((c.head_dim,), "[head_dim]")
            out[p + "self_attn.k_norm.weight"] = Expected((c.head_dim,), "[head_dim]")
        else:
            hv, vdim = c.linear_num_value_heads, c.linear_value_dim
            conv = "2*linear_num_key_heads*linear_key_head_dim + linear_num_value_heads*linear_value_head_dim"
            vd = "linear_num_value_heads*linear_value_head_dim"
            out[p + "linear_attn.in_proj_qkv.weight"] = Expected((c.conv_dim, h), f"[{conv}, hidden_size]")
            out[p + "linear_attn.in_proj_z.weight"] = Expected((vdim, h), f"[{vd}, hidden_size]")
            out[p + "linear_attn.in_proj_b.weight"] = Expected(
                (hv, h), "[linear_num_value_heads, hidden_size]"
            )
            out[p + "linear_attn.in_proj_a.weight"] = Expected(
                (hv, h), "[linear_num_value_heads, hidden_size]"
            )
            out[p + "linear_attn.conv1d.weight"] = Expected(
                (c.conv_dim, 1, c.linear_conv_kernel_dim), f"[{conv}, 1, linear_conv_kernel_dim]"
            )
            out[p + "linear_attn.dt_bias"] = Expected((hv,), "[linear_num_value_heads]")
            out[p + "linear_attn.A_log"] = Expected((hv,), "[linear_num_value_heads]")
            out[p + "linear_attn.norm.weight"] = Expected(
                (c.linear_value_head_dim,), "[linear_value_head_dim]"
            )
            out[p + "linear_attn.out_proj.weight"] = Expected((h, vdim), f"[hidden_size, {vd}]")
        out[p + "mlp.gate_proj.weight"] = Expected((inter, h), "[intermediate_size, hidden_size]")
        out[p + "mlp.up_proj.weight"] = Expected((inter, h), "[intermediate_size, hidden_size]")
        out[p + "mlp.down_proj.weight"] = Expected((h, inter), "[hidden_size, intermediate_size]")
        out[p + "input_layernorm.weight"] = Expected((h,), "[hidden_size]")
        out[p + "post_attention_layernorm.weight"] = Expected((h,), "[hidden_size]")
    out["model.norm.weight"] = Expected((h,), "[hidden_size]")
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = Expected(
            (vocab, h), "[vocab_size, hidden_size] (tie_word_embeddings is false)"
        )
    return out


def canonical_name(name: str) -> str | None:
    """The text-only name of a stored tensor, or None for tensors the decoder never reads."""
    if name.startswith(IGNORED_PREFIXES):
        return None
    if name.startswith(MULTIMODAL_PREFIX):
        return TEXT_PREFIX + name[len(MULTIMODAL_PREFIX) :]
    return name


def safetensors_files(path: str | Path) -> list[Path]:
    """The safetensors file(s) of a checkpoint: a file, or a directory holding
    ``model.safetensors``, a sharded ``model.safetensors.index.json``, or ``*.safetensors``."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise WeightsError(f"{p}: no such file or directory")
    if (p / "model.safetensors").is_file():
        return [p / "model.safetensors"]
    index = p / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return [p / f for f in sorted(set(weight_map.values()))]
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"{p}: no model.safetensors, model.safetensors.index.json or *.safetensors")
    return files


def _stored_tensors(files: list[Path]) -> Iterator[tuple[str, Path]]:
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118  (safe_open is not a Mapping)
                yield name, f


def load_weights(
    path: str | Path,
    config: ModelConfig,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """Read a checkpoint's decoder tensors by canonical name, checked against `config`.

    Shapes are checked from the file headers before any tensor is read.  ``dtype`` casts every
    tensor (None keeps the stored dtypes; `HybridModel` applies its own dtype policy anyway).
    Raises `WeightsError` listing every missing, unexpected and mis-shaped tensor.
    """
    files = safetensors_files(path)
    where = str(files[0]) if len(files) == 1 else f"{Path(path)} ({len(files)} shards)"
    expected = expected_tensors(config)
    located, unexpected = _locate(files, config, expected, where)
    problems = [
        *(
            f"missing {n} (expected shape {list(e.shape)} = {e.meaning})"
            for n, e in expected.items()
            if n not in located
        ),
        *(
            f"unexpected {s}: not part of this config's decoder (check layer_types and the config)"
            for s in unexpected
        ),
        *_shape_problems(files, located, expected),
    ]
    if problems:
        shown = problems[:_MAX_LISTED]
        more = f"\n  ... and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
        raise WeightsError(
            f"{where}: the checkpoint does not match config.json ({len(problems)} problem(s)):\n  "
            + "\n  ".join(shown)
            + more
        )
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt", device=str(device)) as st:
            for name, (stored, src) in located.items():
                if src == f:
                    t = st.get_tensor(stored)
                    out[name] = t if dtype is None else t.to(dtype)
    return {n: out[n] for n in expected}


def _locate(
    files: list[Path], config: ModelConfig, expected: Mapping[str, Expected], where: str
) -> tuple[dict[str, tuple[str, Path]], list[str]]:
    """Each expected tensor's stored name and file, and the stored decoder tensors not expected."""
    located: dict[str, tuple[str, Path]] = {}
    unexpected: list[str] = []
    for stored, f in _stored_tensors(files):
        name = canonical_name(stored)
        if name is None:
            continue
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # tied: the output head is the embedding, a stored copy is not read
        if name in located:
            raise WeightsError(f"{where}: {stored} and {located[name][0]} are the same tensor {name}")
        if name not in expected:
            unexpected.append(stored)
            continue
        located[name] = (stored, f)
    return located, unexpected


def _shape_problems(
    files: list[Path], located: Mapping[str, tuple[str, Path]], expected: Mapping[str, Expected]
) -> list[str]:
    """The located tensors whose shapes (read from the file headers, no data) differ from the config's."""
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name, (stored, src) in located.items():
                if src == f:
                    shapes[name] = tuple(st.get_slice(stored).get_shape())
    problems = []
    for name, (stored, _) in located.items():
        e = expected[name]
        if shapes[name] != e.shape:
            problems.append(
                f"{stored} has shape {list(shapes[name])}, expected {list(e.shape)} = {e.meaning}"
            )
    return problems


def check_weights(weights: Mapping[str, torch.Tensor], config: ModelConfig, where: str = "weights") -> None:
    """The same checks as `load_weights`, for tensors already in memory (canonical names)."""
    expected = expected_tensors(config)
    problems = [
        f"missing {n} (expected shape {list(e.shape)} = {e.meaning})"
        for n, e in expected.items()
        if n not in weights
    ]
    problems += [f"unexpected {n}" for n in weights if n not in expected]
    problems += [
        f"{n} has shape {list(t.shape)}, expected {list(expected[n].shape)} = {expected[n].meaning}"
        for n, t in weights.items()
        if n in expected and tuple(t.shape) != expected[n].shape
    ]
    if problems:
        raise WeightsError(f"{where}: {len(problems)} problem(s):\n  " + "\n  ".join(problems[:_MAX_LISTED]))
