"""The decisive verification checkpoint (`clef_devcluster.decisive`): its training covers the
built-in prompt set and its image-and-text copy (for mistral.rs) answers as the text model.  Its
margins are measured in the real-engine tier (tests/engines/test_decisive_margins.py), which
trains it first.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from clef_devcluster import decisive
from clef_devcluster.checkpoints import write_chat_checkpoint, write_chat_files, write_image_text_layout
from clef_runtime.chat import GOLDENS, ChatTokenizer
from clef_runtime.goldens.prompts import builtin_prompts


def test_the_training_covers_every_builtin_prompt(tmp_path: Path) -> None:
    """Every built-in prompt but the 8197-token one is one the trainer teaches an answer to: the
    numbered list from wherever it stops (with the filler words that pad it), the two questions,
    and a bare "The".  (The long prompt's 348 lines are past the training's LIST_MAX.)"""
    write_chat_files(tmp_path)
    tok = ChatTokenizer.from_dir(tmp_path, rendering=GOLDENS)
    specs = builtin_prompts(tok, long=False)
    untrained = [s.name for s in specs if s.kind == "chat" and not decisive.trained_on(s.text)]
    assert not untrained, f"built-in prompts the decisive checkpoint is not trained on: {untrained}"
    tokens = [s for s in specs if s.kind == "tokens"]
    raw = tok.encode(decisive.RAW_TEXT)
    assert tokens and all(list(s.prompt_ids) == raw[: len(s.prompt_ids)] for s in tokens), (
        "the built-in token-id prompt is not the start of the raw text the checkpoint is trained on"
    )


def test_a_list_prompt_longer_than_the_training_is_not_covered() -> None:
    assert decisive.trained_on(decisive._list_prompt(decisive.LIST_MAX - decisive.REPLY_LINES, 0))
    assert not decisive.trained_on(decisive._list_prompt(decisive.LIST_MAX, 0))
    assert not decisive.trained_on("Name the moons.")


def test_image_text_layout_gives_the_text_models_logits(tmp_path: Path) -> None:
    """mistral.rs loads Qwen3.5 only as Qwen3_5ForConditionalGeneration: the copy with a random
    one-layer vision tower and mrope must give the text model's logits (upstream transformers)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

    text = write_chat_checkpoint(tmp_path / "text")
    both = write_image_text_layout(text, tmp_path / "image-text")
    raw = json.loads((both / "config.json").read_text())
    assert raw["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert raw["text_config"]["rope_parameters"]["mrope_section"] == [2, 1, 1]
    ids = torch.tensor([[5, 60, 61, 62, 100, 7, 8, 9, 200, 201]])
    with torch.no_grad():
        a = Qwen3_5ForCausalLM.from_pretrained(text, dtype=torch.float32).eval()(input_ids=ids).logits
        b = (
            Qwen3_5ForConditionalGeneration.from_pretrained(both, dtype=torch.float32)
            .eval()(input_ids=ids)
            .logits
        )
    assert torch.equal(a, b)
