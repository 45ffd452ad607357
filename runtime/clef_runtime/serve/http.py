"""The HTTP side of `clef-runtime serve`: routes, size bounds and JSON errors.

`Service.handle` maps (method, path, body bytes) to (status, JSON body) and holds the one lock
generation runs under; the handler class only moves bytes.  One request generates at a time (a
batch of one: no padding, and answers that do not depend on what else is in flight); others wait
for the lock while /health and /v1/models still answer.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from clef_runtime.chat import ChatError, ChatTokenizer
from clef_runtime.generation import Generation
from clef_runtime.serve.requests import (
    BadRequest,
    Generate,
    Limits,
    chat_messages,
    chat_request,
    completion_prompt,
    completion_request,
    enable_thinking,
)
from clef_runtime.serve.responses import Shaper, bad_request_status, error_body

Generator = Callable[[Generate], Generation]
ROUTES = {
    "/health": "GET",
    "/v1/models": "GET",
    "/v1/completions": "POST",
    "/v1/chat/completions": "POST",
}


class Service:
    def __init__(
        self, dialect: str, shaper: Shaper, tok: ChatTokenizer, limits: Limits, generate: Generator
    ) -> None:
        self.dialect, self.shaper, self.tok, self.limits = dialect, shaper, tok, limits
        self._generate = generate
        self.lock = threading.Lock()
        self.generating = False  # /health says so: a preview that is busy is not idle
        self.requests = 0  # generation requests answered, for /health

    def error(self, status: int, message: str) -> tuple[int, dict[str, Any]]:
        status = bad_request_status(self.dialect, status)
        return status, error_body(self.dialect, status, message)

    def handle(self, method: str, path: str, body: bytes | None) -> tuple[int, dict[str, Any]]:
        path = path.split("?", 1)[0]
        if path == "/v1/completions" and self.dialect == "candle-vllm":
            return self.error(404, "no such route: candle-vllm serves /v1/chat/completions only")
        if path not in ROUTES:
            return self.error(404, f"no such route: {path}")
        if ROUTES[path] != method:
            return self.error(405, f"{path} takes {ROUTES[path]}")
        if path == "/health":
            return 200, {"status": "ok", "generating": self.generating, "requests": self.requests}
        if path == "/v1/models":
            return 200, self.shaper.models(self.limits.max_positions)
        try:
            request = _json_body(body)
            model = request.get("model")
            if model is not None and model != self.shaper.model:
                return self.error(404, f"the model {model!r} does not exist here: {self.shaper.model!r} does")
            if path == "/v1/completions":
                return 200, self._complete(request)
            return 200, self._chat(request)
        except BadRequest as exc:
            return self.error(exc.status, exc.message)
        except ChatError as exc:
            return self.error(400, str(exc))

    def _run(self, req: Generate) -> Generation:
        with self.lock:
            self.generating = True
            try:
                return self._generate(req)
            finally:
                self.generating = False
                self.requests += 1

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = completion_prompt(body)
        if self.dialect == "mistralrs" and not isinstance(prompt, str):
            raise BadRequest(
                422, "prompt: invalid type: sequence, expected a string (mistral.rs takes text only)"
            )
        ids = self.tok.encode(prompt) if isinstance(prompt, str) else prompt
        req = completion_request(body, ids, self.limits)
        return self.shaper.completion(req, self._run(req))

    def _chat(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = chat_messages(body)
        ids = self.tok.chat_ids(messages, enable_thinking=enable_thinking(body))
        req = chat_request(body, ids, self.limits)
        return self.shaper.chat(req, self._run(req))


def _json_body(body: bytes | None) -> dict[str, Any]:
    if not body:
        raise BadRequest(400, "the request has no JSON body")
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(400, f"the body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BadRequest(400, "the body must be a JSON object")
    return obj


class Handler(BaseHTTPRequestHandler):
    """Moves bytes between the socket and `Service` (set on the server as `service`)."""

    protocol_version = "HTTP/1.1"
    # An idle keep-alive connection is closed after this long, so a shutdown that joins the
    # handler threads never waits on a client that keeps its connection open.
    timeout = 30
    server: ClefHTTPServer

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes | None:
        """The request body within the bound; None and an error sent when it is not."""
        raw = self.headers.get("Content-Length")
        if raw is None:
            return b""
        try:
            length = int(raw)
        except ValueError:
            self._send_error(400, "Content-Length is not an integer")
            return None
        if length > self.server.max_request_bytes:
            self.close_connection = True  # the unread body must not be parsed as the next request
            self._send_error(413, f"the body is {length} bytes, more than {self.server.max_request_bytes}")
            return None
        return self.rfile.read(length)

    def _send_error(self, status: int, message: str) -> None:
        service = self.server.service
        self._reply(*service.error(status, message))

    def _serve(self, method: str) -> None:
        body = self._body() if method == "POST" else b""
        if body is None:
            return
        try:
            status, reply = self.server.service.handle(method, self.path, body)
        except Exception as exc:  # the model failed: say so, keep serving
            print(f"serve: {method} {self.path} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            status, reply = self.server.service.error(500, f"{type(exc).__name__}: {exc}")
        self._reply(status, reply)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def log_message(self, format: str, *args: Any) -> None:  # one line per request, to stderr
        sys.stderr.write(f"serve: {self.address_string()} {format % args}\n")


class ClefHTTPServer(ThreadingHTTPServer):
    # Threads are joined on close, so a SIGTERM lets the request in flight finish.
    daemon_threads = False
    block_on_close = True

    def __init__(self, address: tuple[str, int], service: Service, max_request_bytes: int) -> None:
        super().__init__(address, Handler)
        self.service = service
        self.max_request_bytes = max_request_bytes
