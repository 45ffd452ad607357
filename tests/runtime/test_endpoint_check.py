"""goldens → serve → endpoint-check, end to end on the CPU: the real server (`clef-runtime serve`)
answers in each engine's dialect and the real client judges it.

* A healthy server passes in every dialect (reference op set: fast), and on the Triton op set.
* A server whose kernels carry a catalogue fault (Triton op set, the fault read when its op set is
  built) exits 1 naming the prompt and position: the incident, caught at the engine.
* A near-tie divergence passes and is reported as one; the same divergence above the margin fails.
* Another chat template exits 2; so do garbage JSON, a timeout, a dropped connection, a refused
  connection and an answer of the wrong shape (a stand-in server for each way a network fails).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from chat_checkpoint import OTHER_TEMPLATE, endpoint_check, served, session_goldens

from clef_contract.endpoint import parse_endpoint_report
from clef_contract.report import MAX_REPORT_BYTES

SERVER_DIALECT = {"clef": "openai", "vllm": "vllm", "candle-vllm": "candle-vllm", "mistralrs": "mistralrs"}
CHAT_ONLY = ("candle-vllm", "mistralrs")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return session_goldens(tmp_path_factory.getbasetemp())


def _compact_ok(compact: dict) -> None:
    text = json.dumps(compact, ensure_ascii=False, separators=(",", ":"))
    assert len(text.encode()) <= MAX_REPORT_BYTES
    parse_endpoint_report(text)  # the operator's parser accepts it


@pytest.mark.parametrize("dialect", ["clef", "vllm", "candle-vllm", "mistralrs"])
def test_a_healthy_engine_passes_in_every_dialect(
    made: tuple[Path, Path], tmp_path: Path, dialect: str
) -> None:
    ckpt, goldens = made
    with served(ckpt, tmp_path, "--dialect", SERVER_DIALECT[dialect]) as (url, _):
        code, full, compact, err = endpoint_check(goldens, url, dialect, tmp_path)
    assert code == 0, f"{full['summary']}\n{err[-2000:]}"
    assert (
        compact["verdict"] == "pass" and compact["dialect"] == dialect and compact["firstDivergence"] is None
    )
    _compact_ok(compact)
    statuses = {p["name"]: p["status"] for p in full["prompts"]}
    if dialect in CHAT_ONLY:
        # No raw-prompt route: the token-id prompt is skipped, and ids alone are judged.
        assert statuses == {"tokens-1": "skipped", "hello": "match", "list": "match"}
        assert compact["logprobs"] == "placeholder" and "ids alone" in compact["summary"]
        assert "skipped" in compact["summary"]
    else:
        assert set(statuses.values()) == {"match"}
        assert compact["logprobs"] == "compared" and full["logprobStats"]["mean"] < 1e-3


def test_a_healthy_engine_on_the_triton_kernels_passes(made: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, goldens = made
    with served(ckpt, tmp_path, ops="triton") as (url, _):
        code, full, _compact, err = endpoint_check(goldens, url, "clef", tmp_path)
    assert code == 0, f"{full['summary']}\n{err[-2000:]}"
    assert all(p["status"] == "match" for p in full["prompts"])
    # The same kernels, the same dtype: the logprobs agree to rounding.
    assert full["logprobStats"]["max"] < 1e-4


@pytest.mark.parametrize(
    ("fault", "dialect"),
    [
        ("conv_key_band_zero", "candle-vllm"),  # the incident, in the dialect it happened in
        ("conv_state_not_advanced", "clef"),  # decode only: the prompt's first tokens still match
        ("gated_norm_no_gate", "vllm"),
        ("conv_key_band_zero", "mistralrs"),  # ids read from top_logprobs[0].token
    ],
)
def test_a_serving_engine_with_a_kernel_fault_fails_naming_prompt_and_position(
    made: tuple[Path, Path], tmp_path: Path, fault: str, dialect: str
) -> None:
    ckpt, goldens = made
    with served(ckpt, tmp_path, "--dialect", SERVER_DIALECT[dialect], ops="triton", fault=fault) as (url, _):
        code, full, compact, err = endpoint_check(goldens, url, dialect, tmp_path, "--prompt", "hello")
    assert code == 1, f"{fault}: {full['summary']}\n{err[-2000:]}"
    _compact_ok(compact)
    first = compact["firstDivergence"]
    assert first["prompt"] == "hello" and not first["nearTie"]
    assert first["goldenMargin"] is None  # not even among the golden's top-5: far from a near-tie
    hello = next(p for p in full["prompts"] if p["name"] == "hello")
    assert hello["status"] == "diverged" and hello["matched"] == first["position"]
    assert f"prompt hello, position {first['position']}" in compact["summary"]
    assert compact["failing"][0]["name"] == "prompt hello: token ids"
    if fault == "conv_state_not_advanced":
        assert first["position"] >= 1  # prefill is right; the first decode step reads a stale state


def _near_tie_goldens(goldens: Path, out: Path) -> tuple[str, int, float]:
    """The goldens with one prompt's chosen token swapped for its runner-up at the position where
    the two are closest: an honest engine then diverges there, at a near-tie."""
    doc = json.loads(goldens.read_text())
    prompt = next(p for p in doc["prompts"] if p["name"] == "hello")
    margins = [lps[0] - lps[1] for lps in prompt["topLogprobs"]]
    pos = min(range(len(margins)), key=margins.__getitem__)
    prompt["ids"][pos] = prompt["topIds"][pos][1]
    prompt["logprobs"][pos] = prompt["topLogprobs"][pos][1]
    # Nothing after the swap: the golden's later tokens followed the other token, and the check
    # now goes on from the golden's prefix (fewer ids than maxNewTokens is a valid golden).
    for key in ("ids", "logprobs", "topIds", "topLogprobs", "topPieces"):
        prompt[key] = prompt[key][: pos + 1]
    out.write_text(json.dumps(doc))
    return "hello", pos, margins[pos]


@pytest.mark.parametrize("dialect", ["clef", "candle-vllm"])
def test_a_near_tie_divergence_passes_and_is_reported(
    made: tuple[Path, Path], tmp_path: Path, dialect: str
) -> None:
    ckpt, goldens = made
    doctored = tmp_path / "goldens.json"
    name, pos, margin = _near_tie_goldens(goldens, doctored)
    with served(ckpt, tmp_path, "--dialect", SERVER_DIALECT[dialect]) as (url, _):
        above = f"{margin * 1.5 + 1e-3:.6f}"
        code, full, compact, err = endpoint_check(
            doctored, url, dialect, tmp_path, "--near-tie-margin", above
        )
        assert code == 0, f"{full['summary']}\n{err[-2000:]}"
        first = compact["firstDivergence"]
        assert first["nearTie"] and first["prompt"] == name and first["position"] == pos
        assert abs(first["goldenMargin"] - margin) < 1e-3 and "1 near-tie" in compact["summary"]
        _compact_ok(compact)
        # The same divergence with a margin above the threshold is a mismatch.
        below = f"{margin * 0.5:.6f}"
        code, full, compact, err = endpoint_check(
            doctored, url, dialect, tmp_path, "--near-tie-margin", below
        )
    assert code == 1 and not compact["firstDivergence"]["nearTie"], full["summary"]


class _Flipping(BaseHTTPRequestHandler):
    """A fault-injecting engine in front of a healthy one: for a /v1/completions prompt of a
    length in the server's `flips`, the token at that position becomes the engine's own
    runner-up (vLLM's shape).  Everything else passes through."""

    protocol_version = "HTTP/1.1"

    def _relay(self, method: str) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))) if method == "POST" else None
        upstream = httpx.request(method, self.server.upstream + self.path, content=body, timeout=300)  # type: ignore[attr-defined]
        data = upstream.content
        if method == "POST" and self.path == "/v1/completions" and upstream.status_code == 200:
            at = self.server.flips.get(len(json.loads(body or b"{}")["prompt"]))  # type: ignore[attr-defined]
            if at is not None:
                answer = upstream.json()
                _flip(answer["choices"][0], at)
                data = json.dumps(answer).encode()
        self.send_response(upstream.status_code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._relay("GET")

    def do_POST(self) -> None:
        self._relay("POST")

    def log_message(self, format: str, *args: object) -> None:
        pass


def _flip(choice: dict, at: int) -> None:
    logprobs = choice["logprobs"]
    key, lp = sorted(logprobs["top_logprobs"][at].items(), key=lambda kv: -kv[1])[1]
    choice["token_ids"][at] = int(key.removeprefix("token_id:"))
    logprobs["tokens"][at], logprobs["token_logprobs"][at] = key, lp


@contextmanager
def _flipping(upstream: str, flips: dict[int, int]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flipping)
    server.upstream, server.flips = upstream, flips  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_fault_past_a_near_tie_is_judged_from_the_golden_prefix(
    made: tuple[Path, Path], tmp_path: Path
) -> None:
    """Issue 38, item 2: an engine that flips to its runner-up at the golden's nearest tie passes
    it, is asked again from the golden's prefix, and the rest of the prompt is still judged: a
    second flip at a decisive position fails, where the check used to stop at the near-tie."""
    ckpt, goldens = made
    hello = next(p for p in json.loads(goldens.read_text())["prompts"] if p["name"] == "hello")
    margins = [lps[0] - lps[1] for lps in hello["topLogprobs"]]
    tie = min(range(len(margins) - 1), key=margins.__getitem__)
    decisive = max(range(tie + 1, len(margins)), key=margins.__getitem__)
    assert margins[tie] <= 0.5 < margins[decisive], margins  # the tiny model has both
    length = len(hello["promptIds"])
    with served(ckpt, tmp_path, "--dialect", "vllm") as (url, _):
        with _flipping(url, {length: tie}) as flipping:
            code, full, compact, err = endpoint_check(
                goldens, flipping, "vllm", tmp_path, "--prompt", "hello"
            )
        assert code == 0, f"{full['summary']}\n{err[-2000:]}"
        (result,) = full["prompts"]
        assert result["status"] == "near-tie" and result["continued"] == 1
        assert [n["position"] for n in result["nearTies"]] == [tie]
        assert result["matched"] == len(hello["ids"]) - 1  # every position but the flip judged equal
        again = {length: tie, length + tie + 1: decisive - tie - 1}  # the continuation flips too
        with _flipping(url, again) as flipping:
            code, full, compact, err = endpoint_check(
                goldens, flipping, "vllm", tmp_path, "--prompt", "hello"
            )
    assert code == 1, f"{full['summary']}\n{err[-2000:]}"
    first = compact["firstDivergence"]
    assert first["position"] == decisive and not first["nearTie"] and first["goldenMargin"] > 0.5
    assert "judged past 1 near-tie" in compact["summary"]
    _compact_ok(compact)


@pytest.mark.parametrize("dialect", ["clef", "candle-vllm"])
def test_an_engine_with_another_chat_template_cannot_be_judged(
    made: tuple[Path, Path], tmp_path: Path, dialect: str
) -> None:
    template = tmp_path / "other.jinja"
    template.write_text(OTHER_TEMPLATE)  # no think block: thinking off renders shorter prompts
    ckpt, goldens = made
    with served(ckpt, tmp_path, "--dialect", SERVER_DIALECT[dialect], "--chat-template", str(template)) as (
        url,
        _,
    ):
        code, _full, compact, _ = endpoint_check(goldens, url, dialect, tmp_path)
    assert code == 2 and compact["verdict"] == "error"
    assert "template" in compact["error"] and "hello" in compact["error"]
    _compact_ok(compact)


# ---------------------------------------------------------------------------- broken servers


class _Broken(BaseHTTPRequestHandler):
    """Answers /v1/models properly and every POST in the way named by the server's `mode`."""

    protocol_version = "HTTP/1.1"

    def _send(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send(200, b'{"object": "list", "data": [{"id": "m"}]}')

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.bodies.append(json.loads(body))  # type: ignore[attr-defined]
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode == "garbage":
            self._send(200, b'{"choices": [{"message": ')
        elif mode == "shape":
            self._send(200, b'{"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": 1}}')
        elif mode == "slow":
            time.sleep(3)
            self._send(200, b"{}")
        elif mode == "drop":
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
        elif mode == "500":
            self._send(500, b'{"message": "CUDA error: an illegal memory access"}')

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def broken() -> Iterator[tuple[ThreadingHTTPServer, str]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Broken)
    server.bodies = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("garbage", "not JSON"),
        ("shape", "unexpected response shape"),
        ("slow", "timed out"),
    ],
)
def test_an_engine_that_answers_badly_cannot_be_judged(
    made: tuple[Path, Path], tmp_path: Path, broken: tuple[ThreadingHTTPServer, str], mode: str, says: str
) -> None:
    server, url = broken
    server.mode = mode  # type: ignore[attr-defined]
    code, _, compact, _ = endpoint_check(made[1], url, "candle-vllm", tmp_path, "--timeout", "1")
    assert code == 2 and compact["verdict"] == "error" and says in compact["error"], compact
    _compact_ok(compact)


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("500", "HTTP 500: CUDA error: an illegal memory access"),
        ("drop", "POST /v1/chat/completions: the connection was lost"),
    ],
)
def test_an_engine_that_fails_a_prompt_is_an_engine_error(
    made: tuple[Path, Path], tmp_path: Path, broken: tuple[ThreadingHTTPServer, str], mode: str, says: str
) -> None:
    """Issue 38, item 5: an HTTP 5xx or a connection lost mid-answer is the engine's own failure:
    exit 3, `engineError` naming the first prompt asked and the engine's words."""
    server, url = broken
    server.mode = mode  # type: ignore[attr-defined]
    code, full, compact, _ = endpoint_check(made[1], url, "candle-vllm", tmp_path, "--timeout", "5")
    assert code == 3 and compact["verdict"] == "error", compact
    assert compact["engineError"]["prompt"] == "hello" and says in compact["engineError"]["message"]
    assert "engine error: the engine failed prompt hello" in compact["summary"]
    assert full["engineError"] == compact["engineError"] and full["exitCode"] == 3
    _compact_ok(compact)


NEUTRAL = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "top_k": -1,
    "top_p": 1.0,
    "min_p": 0.0,
}


@pytest.mark.parametrize("dialect", ["clef", "vllm", "candle-vllm"])
def test_every_dialect_sends_neutral_sampling_and_the_report_says_what_was_sent(
    made: tuple[Path, Path], tmp_path: Path, broken: tuple[ThreadingHTTPServer, str], dialect: str
) -> None:
    """Issue 38, item 3: engines fill a missing field from generation_config.json (vLLM applies its
    penalties even at temperature 0), so every field the engine reads goes out neutral, and a seed
    where the engine takes one; the report's `sampling` is exactly what the engine received."""
    server, url = broken
    server.mode = "500"  # type: ignore[attr-defined]
    _, full, _, _ = endpoint_check(made[1], url, dialect, tmp_path)
    (body,) = server.bodies  # type: ignore[attr-defined]
    sent = {k: body[k] for k in full["sampling"]}
    assert sent == full["sampling"] and full["sampling"]["temperature"] == 0
    expected = dict(NEUTRAL)
    if dialect == "candle-vllm":  # no repetition_penalty field, no per-request seed
        del expected["repetition_penalty"]
        assert "seed" not in body
    else:
        expected["seed"] = 0
    assert {k: body.get(k) for k in expected} == expected, body


@pytest.mark.parametrize(
    ("dialect", "says"),
    [
        ("vllm", "HTTP 422"),  # mistral.rs takes no token-id prompt
        ("clef", "HTTP 422"),  # the token-id prompt comes first
        ("candle-vllm", "not a token id"),  # content[].token is the text piece
    ],
)
def test_mistralrs_cannot_be_asked_in_another_dialect(
    made: tuple[Path, Path], tmp_path: Path, dialect: str, says: str
) -> None:
    """Issue 38, item 6: what happened against real mistral.rs 0.8.1 before its dialect existed:
    every other dialect exits 2, never a verdict read by guesswork."""
    ckpt, goldens = made
    with served(ckpt, tmp_path, "--dialect", "mistralrs") as (url, _):
        code, _, compact, _ = endpoint_check(goldens, url, dialect, tmp_path)
    assert code == 2 and compact["verdict"] == "error", compact
    assert says in compact["error"], compact["error"]


def test_an_engine_that_is_not_there_cannot_be_judged(made: tuple[Path, Path], tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    code, _, compact, _ = endpoint_check(made[1], f"http://127.0.0.1:{port}", "vllm", tmp_path)
    assert code == 2 and "GET /v1/models" in compact["error"]


def test_endpoint_check_runs_without_torch(made: tuple[Path, Path], tmp_path: Path) -> None:
    """The comparison Job is CPU-only and its image need not carry torch or Triton."""
    log = tmp_path / "termination-log"
    blocked = "import sys; sys.modules.update(torch=None, triton=None, numpy=None)"
    run = "from clef_runtime.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-c", f"{blocked}; {run}", "endpoint-check", "--goldens", str(made[1]),
         "--url", "http://127.0.0.1:9", "--dialect", "vllm", "--termination-log", str(log), "--timeout", "5"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert json.loads(log.read_text())["verdict"] == "error" and "ModuleNotFoundError" not in proc.stderr


def _digest(path: Path) -> str:
    import gzip
    import hashlib

    data = path.read_bytes()
    return "sha256:" + hashlib.sha256(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).hexdigest()


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip as the ConfigMap mounts it"])
def test_goldens_that_are_not_the_signed_bytes_are_refused_before_any_prompt(
    made: tuple[Path, Path], tmp_path: Path, broken: tuple[ThreadingHTTPServer, str], compressed: bool
) -> None:
    """Issue 33, finding 1: the Job names the digest of the goldens the operator signed; other
    bytes under the same path (a ConfigMap swapped after signing) are refused, exit 2, and the
    engine is never asked.  The report names the digest it read."""
    import gzip

    server, url = broken
    server.mode = "500"  # type: ignore[attr-defined]
    asked: list[str] = []
    handler = server.RequestHandlerClass
    server.RequestHandlerClass = type(  # type: ignore[assignment]
        "Recording", (handler,), {"log_request": lambda self, *a: asked.append(self.path)}
    )
    signed = _digest(made[1])
    data = made[1].read_bytes()
    forged_bytes = data.replace(b'"maxNewTokens":', b'"maxNewTokens": ', 1)
    assert forged_bytes != data
    forged = tmp_path / ("goldens.json.gz" if compressed else "goldens.json")
    forged.write_bytes(gzip.compress(forged_bytes) if compressed else forged_bytes)
    code, full, compact, _ = endpoint_check(forged, url, "vllm", tmp_path, "--goldens-sha256", signed)
    assert code == 2 and compact["verdict"] == "error", compact
    assert f"not the expected {signed}" in compact["error"] and "no prompt was sent" in compact["error"]
    assert compact["goldensSha256"] == _digest(forged) != signed
    assert asked == [], "nothing was asked of the engine"
    _compact_ok(compact)
    # The signed bytes themselves pass the digest check and are echoed.
    with served(made[0], tmp_path, "--dialect", "vllm") as (good_url, _):
        code, full, compact, _ = endpoint_check(
            made[1], good_url, "vllm", tmp_path, "--goldens-sha256", signed
        )
    assert code == 0 and compact["goldensSha256"] == signed == full["goldens"]["sha256"], compact


def test_a_malformed_goldens_digest_is_an_error_naming_the_flag(
    made: tuple[Path, Path], tmp_path: Path
) -> None:
    code, _, compact, _ = endpoint_check(
        made[1], "http://127.0.0.1:9", "vllm", tmp_path, "--goldens-sha256", "md5:abc"
    )
    assert code == 2 and "--goldens-sha256 'md5:abc'" in compact["error"], compact


def test_an_engine_that_goes_bad_after_n_requests_passes_then_fails_the_same_sample(
    made: tuple[Path, Path], tmp_path: Path
) -> None:
    """`serve --fault-after N` (the local cluster's engine that goes bad while it serves): a probe
    of the same golden prompt passes while requests 1..N are answered, and fails from N+1 on.
    /health counts the generation requests, which is how the cluster tier tells pods apart."""
    ckpt, goldens = made
    sample = ("--sample", "1", "--sample-round", "1")  # the second prompt: `hello`, which the fault moves
    with served(ckpt, tmp_path, "--fault-after", "1", fault="conv_key_band_zero") as (url, _):
        code, full, compact, err = endpoint_check(goldens, url, "clef", tmp_path, *sample)
        assert code == 0, f"{full['summary']}\n{err[-2000:]}"
        assert [p["name"] for p in full["prompts"]] == ["hello"], "one prompt: the sample asked"
        assert httpx.get(f"{url}/health").json()["requests"] == 1
        code, full, compact, err = endpoint_check(goldens, url, "clef", tmp_path, *sample)
        assert code == 1, f"request 2 is answered by the faulty kernels: {full['summary']}\n{err[-2000:]}"
        assert compact["firstDivergence"]["prompt"] == "hello"
        assert httpx.get(f"{url}/health").json()["requests"] == 2


def test_a_sample_rotates_through_every_prompt(made: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, goldens = made
    names = [p["name"] for p in json.loads(goldens.read_text())["prompts"]]
    asked = []
    with served(ckpt, tmp_path) as (url, _):
        for round_ in range(len(names)):
            code, full, _compact, err = endpoint_check(
                goldens, url, "clef", tmp_path, "--sample", "2", "--sample-round", str(round_)
            )
            assert code == 0, f"{full['summary']}\n{err[-2000:]}"
            asked.append([p["name"] for p in full["prompts"]])
    assert all(len(a) == min(2, len(names)) for a in asked)
    assert {n for a in asked for n in a} == set(names), "every prompt asked in turn"
    assert asked[0] == names[:2] and asked[1] == [names[(2 + i) % len(names)] for i in range(2)]


@pytest.mark.parametrize("dialect", CHAT_ONLY)
def test_a_chat_only_engines_sample_draws_only_prompts_it_can_be_asked(
    made: tuple[Path, Path], tmp_path: Path, dialect: str
) -> None:
    """A probe of a chat-only engine (candle-vllm, mistral.rs) never draws a round of token-id
    prompts only: that round would compare nothing and fail as an error.  The goldens here start
    with a token-id prompt (`tokens-1`); every round asks one chat prompt, in turn."""
    ckpt, goldens = made
    prompts = json.loads(goldens.read_text())["prompts"]
    chat = [p["name"] for p in prompts if p["kind"] == "chat"]
    assert prompts[0]["name"] == "tokens-1" and len(chat) == 2, [p["name"] for p in prompts]
    asked = []
    with served(ckpt, tmp_path, "--dialect", SERVER_DIALECT[dialect]) as (url, _):
        for round_ in range(3):
            code, full, _compact, err = endpoint_check(
                goldens, url, dialect, tmp_path, "--sample", "1", "--sample-round", str(round_)
            )
            assert code == 0, f"round {round_}: {full['summary']}\n{err[-2000:]}"
            asked.append([(p["name"], p["status"]) for p in full["prompts"]])
    assert asked == [[(chat[0], "match")], [(chat[1], "match")], [(chat[0], "match")]], asked
