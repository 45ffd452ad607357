"""`clef-runtime goldens` on the CPU: the chat template and tokenizer as engines apply them, the
built-in prompt set's lengths, the goldens file's provenance and validation, and the refusal to
make goldens with kernels that fail their own checks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from chat_checkpoint import (
    OTHER_TEMPLATE,
    TEMPLATE,
    TEST_PROMPTS,
    clean_env,
    clef_runtime,
    session_goldens,
    variant,
    write_chat_checkpoint,
)

from clef_runtime.chat import CANDLE_VLLM, GOLDENS, HF, ChatTokenizer
from clef_runtime.goldens.make import checkpoint_digest
from clef_runtime.goldens.prompts import builtin_prompts, chat_spec, parse_user_prompts
from clef_runtime.goldens.schema import MIN_TOP_K, GoldensError, parse_goldens, read_goldens


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return session_goldens(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def tok(made: tuple[Path, Path]) -> ChatTokenizer:
    return ChatTokenizer.from_dir(made[0])


def test_the_template_renders_the_thinking_switch_as_qwen_does(tok: ChatTokenizer) -> None:
    user = [{"role": "user", "content": "Name the planets."}]
    off = tok.render(user, enable_thinking=False)
    assert (
        off == "<|im_start|>user\nName the planets.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert (
        tok.render(user, enable_thinking=True)
        == "<|im_start|>user\nName the planets.<|im_end|>\n<|im_start|>assistant\n"
    )
    # Special tokens are single ids (the tokenizer knows them), and the stop token is <|im_end|>.
    ids = tok.chat_ids(user)
    assert ids[0] == tok._tokenizer.token_to_id("<|im_start|>")
    assert tok.stop_ids == (tok._tokenizer.token_to_id("<|im_end|>"),)
    assert tok.decode(ids) == off


def test_a_template_file_wins_over_tokenizer_config(tmp_path: Path) -> None:
    ckpt = write_chat_checkpoint(tmp_path / "ckpt")
    (ckpt / "chat_template.jinja").write_text(TEMPLATE.replace("<|im_start|>assistant", "<|im_start|>bot"))
    assert "<|im_start|>bot" in ChatTokenizer.from_dir(ckpt).render([{"role": "user", "content": "x"}])


def test_builtin_prompts_hit_the_gdn_lengths_and_the_token_budget(tok: ChatTokenizer) -> None:
    specs = {s.name: s for s in builtin_prompts(tok)}
    lengths = {name: len(s.prompt_ids) for name, s in specs.items()}
    assert lengths["tokens-1"] == 1
    for target in (63, 64, 65, 1001, 8197):
        assert lengths[f"chat-{target}"] == target, lengths
    assert sum(s.max_new_tokens for s in specs.values()) >= 420
    # Chat prompts are the rendered user turn, thinking off: the ids an engine must produce too.
    s = specs["chat-65"]
    assert list(s.prompt_ids) == tok.chat_ids([{"role": "user", "content": s.text}], enable_thinking=False)


def test_goldens_record_ids_top_k_and_provenance(made: tuple[Path, Path], tok: ChatTokenizer) -> None:
    ckpt, path = made
    g = read_goldens(path)
    p = g.provenance
    assert p["opSet"] == "triton"
    counts = re.match(r"(\d+)/(\d+)", p["kernelChecks"])
    assert counts is not None and int(counts[2]) > 100 and counts[1] == counts[2], p["kernelChecks"]
    assert p["dtype"] == "f32" and p["checkpointDigest"] == checkpoint_digest(ckpt)
    assert p["gpuClass"] == "cpu (Triton interpreter)" and g.top_k >= MIN_TOP_K
    assert [x.name for x in g.prompts] == [x["name"] for x in TEST_PROMPTS["prompts"]]
    hello = next(x for x in g.prompts if x.name == "hello")
    assert list(hello.spec.prompt_ids) == tok.chat_ids([{"role": "user", "content": "Name the planets."}])
    for prompt in g.prompts:
        assert 1 <= len(prompt.ids) <= prompt.spec.max_new_tokens
        for step, chosen in enumerate(prompt.ids):
            assert prompt.top_ids[step][0] == chosen  # greedy: the best candidate
            assert list(prompt.top_logprobs[step]) == sorted(prompt.top_logprobs[step], reverse=True)
    assert g.stop_ids == tok.stop_ids


def _doc(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["prompts"][1]["promptIds"].append(5), "promptSetDigest"),
        (lambda d: d["prompts"][0]["topIds"].pop(), "one entry per generated token"),
        (lambda d: d["prompts"][0]["ids"].__setitem__(0, 10_000), "not in its own top-k"),
        (lambda d: d.__setitem__("schemaVersion", "clef.riotpiao.com/goldens/v0"), "schemaVersion"),
        (lambda d: d["provenance"].__setitem__("dtype", "bf16"), "cacheKey"),
        (lambda d: d["provenance"].pop("gpuClass"), "provenance lacks gpuClass"),
    ],
)
def test_a_goldens_file_that_was_changed_is_refused(made: tuple[Path, Path], edit, message: str) -> None:
    doc = _doc(made[1])
    edit(doc)
    with pytest.raises(GoldensError, match=message):
        parse_goldens(json.dumps(doc))


def test_truncated_goldens_are_refused(made: tuple[Path, Path], tmp_path: Path) -> None:
    cut = tmp_path / "cut.json"
    cut.write_bytes(made[1].read_bytes()[:-40])
    with pytest.raises(GoldensError, match="not JSON"):
        read_goldens(cut)


def test_the_digest_sees_the_weights_not_only_their_shapes(tmp_path: Path) -> None:
    a = write_chat_checkpoint(tmp_path / "a", seed=0)
    b = write_chat_checkpoint(tmp_path / "b", seed=1)
    assert checkpoint_digest(a) != checkpoint_digest(b)
    assert checkpoint_digest(a) == checkpoint_digest(write_chat_checkpoint(tmp_path / "c", seed=0))


def test_no_goldens_from_kernels_that_fail_their_own_checks(made: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, _ = made
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"prompts": [{"name": "hello", "text": "Hi", "maxNewTokens": 2}]}))
    out = tmp_path / "goldens.json"
    proc = clef_runtime(
        "goldens", "--checkpoint", str(ckpt), "--out", str(out), "--device", "cpu", "--dtype", "f32",
        "--no-builtin", "--prompts", str(prompts),
        env=clean_env(CLEF_RUNTIME_FAULT="conv_key_band_zero"),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert not out.exists()
    assert "key channel band" in json.loads(proc.stdout)["error"]


def test_goldens_without_a_tokenizer_cannot_run(tmp_path: Path, made: tuple[Path, Path]) -> None:
    ckpt = write_chat_checkpoint(tmp_path / "ckpt")
    (ckpt / "tokenizer.json").unlink()
    proc = clef_runtime(
        "goldens", "--checkpoint", str(ckpt), "--out", str(tmp_path / "g.json"), "--device", "cpu"
    )
    assert proc.returncode == 2 and "tokenizer.json" in json.loads(proc.stdout)["error"]


# Goldens render a prompt as every engine will, or refuse it (issue 38, item 4): candle-vllm
# trims message content, takes tokenizer_config.json's template first, adds special tokens when
# encoding and stops at config.json's eos ids.


@pytest.mark.parametrize("text", [" Name the planets.", "Name the planets.\n", "Name the planets.\u3000"])
def test_a_prompt_with_whitespace_at_an_end_is_refused_naming_the_field(
    tok: ChatTokenizer, text: str
) -> None:
    prompts = json.dumps({"prompts": [{"name": "ok", "text": "a  b"}, {"name": "padded", "text": text}]})
    with pytest.raises(
        GoldensError, match=r"prompts\[1\]\.text: leading or trailing whitespace .*candle-vllm trims"
    ):
        parse_user_prompts(prompts, "p.json", tok)


def test_two_different_chat_templates_are_refused_at_goldens_time(
    made: tuple[Path, Path], tmp_path: Path
) -> None:
    both = variant(made[0], tmp_path / "ckpt", jinja=OTHER_TEMPLATE)
    proc = clef_runtime(
        "goldens", "--checkpoint", str(both), "--out", str(tmp_path / "g.json"), "--device", "cpu",
        "--no-builtin", "--prompts-json", json.dumps(TEST_PROMPTS),
    )  # fmt: skip
    error = json.loads(proc.stdout)["error"]
    assert (
        proc.returncode == 2
        and "chat_template.jinja and tokenizer_config.json's chat_template differ" in error
    )
    assert not (tmp_path / "g.json").exists()
    same = variant(made[0], tmp_path / "same", jinja=TEMPLATE)  # the same template twice is fine
    assert (
        ChatTokenizer.from_dir(same, rendering=CANDLE_VLLM).template == ChatTokenizer.from_dir(same).template
    )


def test_a_tokenizer_that_adds_special_tokens_is_refused(made: tuple[Path, Path], tmp_path: Path) -> None:
    bos = ChatTokenizer.from_dir(variant(made[0], tmp_path / "ckpt", bos=True), rendering=GOLDENS)
    with pytest.raises(GoldensError, match=r"prompts\[0\]\.text: the tokenizer adds special tokens"):
        chat_spec(bos, "hello", "Name the planets.", 4, field="prompts[0].text")


def test_goldens_stop_where_any_engine_stops(made: tuple[Path, Path], tmp_path: Path) -> None:
    """candle-vllm stops at config.json's eos ids, vLLM at generation_config.json's: goldens stop at
    both, so no engine stops before a golden does (one that stops later is compared up to the
    golden's end)."""
    ckpt = variant(made[0], tmp_path / "ckpt", eos=7)
    im_end = ChatTokenizer.from_dir(ckpt).stop_ids[0]
    assert ChatTokenizer.from_dir(ckpt, rendering=HF).stop_ids == (im_end,)
    assert ChatTokenizer.from_dir(ckpt, rendering=CANDLE_VLLM).stop_ids == tuple(sorted({7, im_end}))
    assert ChatTokenizer.from_dir(ckpt, rendering=GOLDENS).stop_ids == tuple(sorted({7, im_end}))
