"""Small real checkpoints for the local cluster's serve images and for the endpoint tests: tiny
hybrid weights (3 GDN + 1 attention layer, Qwen3.5's layer pattern), a byte-level BPE tokenizer
trained here on a fixed text (no downloads), a Qwen-style chat template with the thinking switch,
and a generation config naming the stop token.  `clef-runtime goldens` and `clef-runtime serve`
load it on the CPU in seconds (docs/local-cluster.md, "A small checkpoint").

The weights come from the runtime's own generator (`clef_runtime.model.checkpoint`), so they load
in clef and in upstream transformers alike; the same seed gives the same bits on every machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from clef_runtime.model import preset
from clef_runtime.model.checkpoint import write_random_checkpoint

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
VOCAB = 320

# Qwen's shape: one turn per message, the assistant's turn opened by add_generation_prompt, and
# with thinking off an empty think block, which is what engines send when asked `thinking: false`.
TEMPLATE = """{%- for message in messages %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}
<think>

</think>

{% endif %}
{%- endif %}
"""

# The same conversation rendered without the think block: what a server with another template sends.
OTHER_TEMPLATE = TEMPLATE.replace("<think>\n\n</think>\n\n", "")

_CORPUS = [
    "Line {i}: {i} squared is {sq}. The river runs north past the mill and the old stone bridge.",
    "Name the planets of the solar system in order: Mercury, Venus, Earth, Mars, Jupiter, Saturn.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Continue this list in exactly the same style for as long as you can. yes yes yes",
]


def _train_tokenizer(path: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = [line.format(i=i, sq=i * i) for i in range(1, 40) for line in _CORPUS]
    tok.train_from_iterator(text, trainer)
    tok.save(str(path))


def _sharpen(path: Path) -> None:
    """Make the random model decisive and its GDN layers matter: the output head x8 (top-1 margins
    of about a nat instead of a fraction: a near-tie is then a rarity, as in a trained model) and
    each GDN layer's output x4 (so every catalogue fault changes the greedy ids within 4 tokens)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    tensors["lm_head.weight"] *= 8
    for name in tensors:
        if name.endswith("linear_attn.out_proj.weight"):
            tensors[name] *= 4
    save_file(tensors, str(path), metadata={"format": "pt"})


def write_chat_files(directory: Path, vocab: int = VOCAB) -> int:
    """Everything but the weights: tokenizer.json, tokenizer_config.json (chat template, eos),
    generation_config.json.  Returns the tokenizer's vocabulary size."""
    from tokenizers import Tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    _train_tokenizer(directory / "tokenizer.json", vocab)
    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": TEMPLATE, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    )
    (directory / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [tok.token_to_id("<|im_end|>")]})
    )
    return int(tok.get_vocab_size(with_added_tokens=True))


def write_chat_checkpoint(directory: Path, *, seed: int = 0) -> Path:
    """The checkpoint directory: the chat files and tiny hybrid weights (float32) over their vocabulary."""
    vocab = write_chat_files(directory)
    config = preset("tiny").replace(vocab_size=vocab)
    write_random_checkpoint(directory, config, seed=seed, dtype=torch.float32)
    _sharpen(directory / "model.safetensors")
    return directory


def write_image_text_layout(text_dir: Path, out_dir: Path, *, seed: int = 0) -> Path:
    """A copy of the text-only checkpoint `text_dir` in Qwen3.5's image-and-text layout
    (``Qwen3_5ForConditionalGeneration``), the only Qwen3.5 that mistral.rs 0.8.1 loads: the
    decoder under ``text_config`` and ``model.language_model.*``, ``rope_parameters.mrope_section``
    (text positions are equal on the three axes, so mrope is the text model's rope), and a
    one-layer random vision tower (``model.visual.*``) that text prompts never run.  The logits of
    a text prompt are the text model's (tests/runtime/test_decisive.py checks it in transformers).
    """
    import shutil

    from safetensors.torch import load_file, save_file
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = json.loads((text_dir / "config.json").read_text())
    rotary_half = int(text["head_dim"] * text.get("partial_rotary_factor", 0.25)) // 2
    third = rotary_half // 3
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": text.get("rope_theta", text.get("rope_parameters", {}).get("rope_theta", 10_000.0)),
        "partial_rotary_factor": text.get("partial_rotary_factor", 0.25),
        "mrope_section": [rotary_half - 2 * third, third, third],
        "mrope_interleaved": True,
    }
    text.pop("architectures", None)
    dtype = text.get("dtype", "float32")
    vision = {
        "depth": 1,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "out_hidden_size": text["hidden_size"],
    }
    config = Qwen3_5Config(
        text_config=text, vision_config=vision, tie_word_embeddings=text.get("tie_word_embeddings", False)
    )
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(config)
    visual = {
        k: v.detach().to(getattr(torch, dtype)).contiguous()
        for k, v in model.state_dict().items()
        if k.startswith("model.visual.")
    }
    tensors = load_file(str(text_dir / "model.safetensors"))
    renamed = {
        ("model.language_model." + k[len("model.") :] if k.startswith("model.") else k): v
        for k, v in tensors.items()
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in text_dir.iterdir():
        if f.name not in ("config.json", "model.safetensors") and f.is_file():
            shutil.copy2(f, out_dir / f.name)
    raw = config.to_dict()
    raw["architectures"] = ["Qwen3_5ForConditionalGeneration"]
    raw["dtype"] = dtype
    raw["text_config"]["dtype"] = dtype
    # mistral.rs reads a missing list as Qwen3-VL's [8, 16, 24] and then wants deepstack mergers.
    raw["vision_config"]["deepstack_visual_indexes"] = []
    (out_dir / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    save_file({**renamed, **visual}, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir
