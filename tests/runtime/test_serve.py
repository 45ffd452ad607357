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
from chat_checkpoint import served, session_goldens

from clef_runtime.chat import ChatTokenizer

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


def test_models_and_health(openai: str) -> None:
    assert httpx.get(f"{openai}/health").json() == {"status": "ok", "generating": False}
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
