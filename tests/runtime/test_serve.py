"""`clef-runtime serve` as a client sees it: the real server in a subprocess on 127.0.0.1 (reference
op set, f32: the interpreter would make the Triton one slow here; the endpoint tests serve on
Triton), its routes, its 4xx JSON errors and bounds, candle-vllm's shape, one request at a time,
and a SIGTERM that lets the request in flight finish."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from chat_checkpoint import OTHER_TEMPLATE, TEMPLATE, served, session_goldens, variant

from clef_runtime.chat import CANDLE_VLLM, HF, ChatTokenizer, rust_trim

USER = [{"role": "user", "content": "Name the planets."}]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return session_goldens(tmp_path_factory.getbasetemp())[0]


@pytest.fixture(scope="module")
def openai(ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with served(ckpt, tmp_path_factory.mktemp("serve"), "--max-prompt-tokens", "200") as (url, _):
        yield url


@pytest.fixture(scope="module")
def candle(ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with served(ckpt, tmp_path_factory.mktemp("serve"), "--dialect", "candle-vllm") as (url, _):
        yield url


@pytest.fixture(scope="module")
def candle_quirky(ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """candle-vllm's stand-in on a checkpoint whose files the engines read differently: a
    chat_template.jinja (another template) beside tokenizer_config.json's, and a tokenizer whose
    post-processor adds a BOS token."""
    base = tmp_path_factory.mktemp("quirky")
    quirky = variant(ckpt, base / "ckpt", jinja=OTHER_TEMPLATE, bos=True)
    with served(quirky, base, "--dialect", "candle-vllm") as (url, _):
        yield url, quirky


def _candle_chat(url: str, content: str, **extra: object) -> dict:
    body = {"messages": [{"role": "user", "content": content}], "logprobs": True, **extra}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_models_and_health(openai: str) -> None:
    assert httpx.get(f"{openai}/health").json() == {"status": "ok", "generating": False, "requests": 0}
    models = httpx.get(f"{openai}/v1/models").json()
    assert models["data"][0]["id"] == "chat-checkpoint" and models["data"][0]["max_model_len"] == 4096


def test_completions_with_token_ids_logprobs_and_ids_back(openai: str) -> None:
    body = {
        "prompt": [60, 61],
        "max_tokens": 4,
        "logprobs": 5,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    r = httpx.post(f"{openai}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["prompt_token_ids"] == [60, 61] and len(choice["token_ids"]) == 4
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    for chosen, lp, top in zip(
        choice["token_ids"],
        choice["logprobs"]["token_logprobs"],
        choice["logprobs"]["top_logprobs"],
        strict=True,
    ):
        assert len(top) == 5 and top[f"token_id:{chosen}"] == lp == max(top.values())  # greedy
    assert r.json()["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    # A string prompt is tokenized without a template.
    text = httpx.post(f"{openai}/v1/completions", json={"prompt": "Line 1", "max_tokens": 1}, timeout=60)
    assert text.status_code == 200 and text.json()["usage"]["prompt_tokens"] >= 1


def test_chat_renders_the_template_with_the_thinking_switch(openai: str, ckpt: Path) -> None:
    tok = ChatTokenizer.from_dir(ckpt)
    for kwargs, thinking in (({"chat_template_kwargs": {"enable_thinking": False}}, False), ({}, True)):
        body = {"messages": USER, "max_tokens": 2, "return_token_ids": True, **kwargs}
        r = httpx.post(f"{openai}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["prompt_token_ids"] == tok.chat_ids(USER, enable_thinking=thinking)
        assert r.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/v1/completions", b"{not json", 400, "not JSON"),
        ("/v1/completions", b'{"prompt": [1], "temperature": 0.7}', 400, "greedily"),
        ("/v1/completions", b'{"prompt": [1], "n": 2}', 400, "n must be 1"),
        (
            "/v1/completions",
            b'{"prompt": [1], "repetition_penalty": 1.1}',
            400,
            "repetition_penalty must be 1",
        ),
        ("/v1/chat/completions", b'{"messages": "hi", "presence_penalty": 0.5}', 400, "presence_penalty"),
        ("/v1/chat/completions", b'{"messages": "hi", "top_k": 20}', 400, "top_k must be -1 or 0"),
        ("/v1/completions", b'{"prompt": [1], "seed": "x"}', 400, "seed must be an integer"),
        ("/v1/completions", b'{"prompt": [1], "stream": true}', 400, "stream"),
        ("/v1/completions", b'{"prompt": [999999]}', 400, "token ids must be"),
        ("/v1/completions", b'{"prompt": [1], "max_tokens": 0}', 400, "max_tokens"),
        ("/v1/completions", json.dumps({"prompt": [1] * 201}).encode(), 400, "more than this server's 200"),
        ("/v1/completions", b'{"prompt": [1], "model": "other"}', 404, "does not exist"),
        ("/v1/chat/completions", b'{"messages": []}', 400, "messages"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user"}]}', 400, "messages[0]"),
        ("/v1/embeddings", b"{}", 404, "no such route"),
    ],
)
def test_bad_requests_get_a_json_error_saying_why(
    openai: str, path: str, body: bytes, status: int, says: str
) -> None:
    r = httpx.post(f"{openai}{path}", content=body, timeout=60)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]["message"]


def test_wrong_method_and_oversized_bodies(ckpt: Path, tmp_path: Path) -> None:
    with served(ckpt, tmp_path, "--max-request-bytes", "1000") as (url, _):
        assert httpx.get(f"{url}/v1/completions").status_code == 405
        r = httpx.post(f"{url}/v1/completions", json={"prompt": [1] * 600}, timeout=60)
        assert r.status_code == 413 and "more than 1000" in r.json()["error"]["message"]


def test_candle_vllm_dialect_answers_in_candle_vllms_shape(candle: str, ckpt: Path) -> None:
    tok = ChatTokenizer.from_dir(ckpt)
    assert httpx.post(f"{candle}/v1/completions", json={"prompt": [1]}).status_code == 404
    body = {"messages": "Name the planets.", "max_tokens": 3, "logprobs": True, "thinking": False}
    r = httpx.post(f"{candle}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert all(
        isinstance(e["token"], int) and e["logprob"] == 0.0 and e["top_logprobs"] == [] for e in content
    )
    assert [e["bytes"] for e in content] == [tok.piece(e["token"]) for e in content]
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] == len(tok.chat_ids(USER, enable_thinking=False))
    assert {"prompt_time_costs", "completion_time_costs", "request_id"} <= usage.keys()
    bad = httpx.post(f"{candle}/v1/chat/completions", json={"messages": 5}, timeout=60)
    assert bad.status_code == 422 and "messages" in bad.json()["message"]


def test_concurrent_requests_are_served_one_after_another(openai: str) -> None:
    body = {"prompt": [60], "max_tokens": 3, "return_token_ids": True}
    answers: list[list[int]] = []

    def ask() -> None:
        answers.append(
            httpx.post(f"{openai}/v1/completions", json=body, timeout=120).json()["choices"][0]["token_ids"]
        )

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 3 and answers[0] == answers[1] == answers[2]  # no batch-dependent answers


def test_sigterm_lets_the_request_in_flight_finish(ckpt: Path, tmp_path: Path) -> None:
    with served(ckpt, tmp_path) as (url, proc):
        result: dict[str, httpx.Response] = {}
        body = {"prompt": [60] * 50, "max_tokens": 40}
        t = threading.Thread(
            target=lambda: result.setdefault("r", httpx.post(f"{url}/v1/completions", json=body, timeout=120))
        )
        t.start()
        while t.is_alive() and not httpx.get(f"{url}/health", timeout=5).json()["generating"]:
            time.sleep(0.05)
        assert t.is_alive(), "the request finished before SIGTERM could be sent"
        proc.send_signal(signal.SIGTERM)
        t.join(120)
        assert proc.wait(timeout=120) == 0
    assert result["r"].status_code == 200 and result["r"].json()["usage"]["completion_tokens"] == 40


# candle-vllm's behaviours that change ids (its source at 36fe5d9, shared/ENGINES.md), each
# reproduced by `serve --dialect candle-vllm` (issue 38, item 4).


def test_candle_vllm_trims_message_content_before_templating(candle: str, openai: str, ckpt: Path) -> None:
    """Upstream: each message's content is `.trim()`med before the chat template renders it."""
    tok = ChatTokenizer.from_dir(ckpt)
    padded = "  Name the planets.\n"
    usage = _candle_chat(candle, padded, max_tokens=2, thinking=False)["usage"]
    assert usage["prompt_tokens"] == len(tok.chat_ids(USER, enable_thinking=False))
    untrimmed = tok.chat_ids([{"role": "user", "content": padded}], enable_thinking=False)
    assert usage["prompt_tokens"] != len(untrimmed)  # the padding would have been tokens
    body = {"messages": [{"role": "user", "content": padded}], "max_tokens": 2, "return_token_ids": True}
    vllm_like = httpx.post(
        f"{openai}/v1/chat/completions",
        json=body | {"chat_template_kwargs": {"enable_thinking": False}},
        timeout=120,
    )
    assert vllm_like.json()["prompt_token_ids"] == untrimmed  # vLLM keeps it


def test_candle_vllm_trims_the_reply_content(candle: str, ckpt: Path) -> None:
    """Upstream: the returned `content` is trimmed too (the ids in `logprobs` are not)."""
    tok = ChatTokenizer.from_dir(ckpt)
    # Found by trying: this reply of the tiny model's (12 tokens: 11 + 1) ends in a vertical tab.
    reply = _candle_chat(candle, "Hello", max_tokens=11)
    ids = [e["token"] for e in reply["choices"][0]["logprobs"]["content"]]
    text = tok.decode(ids)
    assert text != rust_trim(text), f"the test needs a reply with whitespace at an end: {text!r}"
    assert reply["choices"][0]["message"]["content"] == rust_trim(text)


def test_candle_vllm_takes_tokenizer_config_template_before_chat_template_jinja(
    candle_quirky: tuple[str, Path],
) -> None:
    """Upstream: the chat template comes from tokenizer_config.json in preference to
    chat_template.jinja (vLLM and transformers prefer the .jinja file)."""
    url, quirky = candle_quirky
    usage = _candle_chat(url, "Name the planets.", max_tokens=1, thinking=False)["usage"]

    def length(template: str) -> int:  # the prompt under `template`, special tokens added
        tok = ChatTokenizer.from_dir(quirky, template=template)
        return len(tok.encode(tok.render(USER, enable_thinking=False), add_special_tokens=True))

    assert json.loads((quirky / "tokenizer_config.json").read_text())["chat_template"] == TEMPLATE
    assert usage["prompt_tokens"] == length(TEMPLATE) != length(OTHER_TEMPLATE)


def test_candle_vllm_adds_special_tokens_when_encoding(candle_quirky: tuple[str, Path], ckpt: Path) -> None:
    """Upstream: the rendered prompt is encoded with the tokenizer's special tokens added (its
    post-processor's BOS here); vLLM's chat route adds none."""
    url, _ = candle_quirky
    usage = _candle_chat(url, "Name the planets.", max_tokens=1, thinking=False)["usage"]
    plain = ChatTokenizer.from_dir(ckpt).chat_ids(USER, enable_thinking=False)  # tokenizer_config's template
    assert usage["prompt_tokens"] == len(plain) + 1


def test_candle_vllm_stops_at_config_eos_and_the_tokenizers_eos(
    candle: str, ckpt: Path, tmp_path: Path
) -> None:
    """Upstream: the stop set is config.json's eos_token_id together with tokenizer_config.json's
    eos token (not generation_config.json's).  A config.json naming the token the model says first
    stops it there; vLLM's stop set (generation_config) would not."""
    first = _candle_chat(candle, "Name the planets.", max_tokens=1, thinking=False)
    said = first["choices"][0]["logprobs"]["content"][0]["token"]
    stopping = variant(ckpt, tmp_path / "ckpt", eos=said)
    assert said not in ChatTokenizer.from_dir(stopping, rendering=HF).stop_ids
    im_end = ChatTokenizer.from_dir(ckpt).stop_ids[0]
    assert ChatTokenizer.from_dir(stopping, rendering=CANDLE_VLLM).stop_ids == tuple(sorted({said, im_end}))
    with served(stopping, tmp_path, "--dialect", "candle-vllm") as (url, _):
        reply = _candle_chat(url, "Name the planets.", max_tokens=4, thinking=False)
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["logprobs"]["content"] == [], choice


def test_candle_vllm_returns_one_token_more_than_max_tokens(candle: str) -> None:
    """Upstream: a request for max_tokens N returns N + 1 tokens when nothing stops it."""
    reply = _candle_chat(candle, "Name the planets.", max_tokens=3, thinking=False)
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "length", choice
    assert len(choice["logprobs"]["content"]) == 4 and reply["usage"]["completion_tokens"] == 4


def test_candle_vllm_thinks_unless_told_not_to(candle: str, ckpt: Path) -> None:
    """Upstream: thinking is on unless the request sends `thinking: false`."""
    tok = ChatTokenizer.from_dir(ckpt)
    usage = _candle_chat(candle, "Name the planets.", max_tokens=1)["usage"]
    assert usage["prompt_tokens"] == len(tok.chat_ids(USER, enable_thinking=True))
    assert usage["prompt_tokens"] != len(tok.chat_ids(USER, enable_thinking=False))


def test_mistralrs_dialect_answers_in_mistralrs_shape(ckpt: Path, tmp_path: Path) -> None:
    """mistral.rs 0.8.1's shapes (issue 38, item 6): the text piece in content[].token, the integer
    id in top_logprobs[0].token with its text in bytes, positive placeholder logprobs, and a
    token-id prompt refused with 422."""
    tok = ChatTokenizer.from_dir(ckpt)
    with served(ckpt, tmp_path, "--dialect", "mistralrs") as (url, _):
        refused = httpx.post(f"{url}/v1/completions", json={"prompt": [60, 61]}, timeout=60)
        body = {
            "messages": USER,
            "max_tokens": 3,
            "logprobs": True,
            "top_logprobs": 2,
            "enable_thinking": False,
        }
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
    assert refused.status_code == 422 and "expected a string" in refused.json()["message"]
    content = reply["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and reply["usage"]["prompt_tokens"] == len(tok.chat_ids(USER))
    for e in content:
        first = e["top_logprobs"][0]
        assert isinstance(first["token"], int) and len(e["top_logprobs"]) == 2
        assert e["token"] == tok.piece(first["token"]) == first["bytes"]
        assert all(1.3 <= x["logprob"] <= 1.4 for x in (e, *e["top_logprobs"]))  # not log-probabilities
    assert "total_time_sec" in reply["usage"]  # its usage carries timings
