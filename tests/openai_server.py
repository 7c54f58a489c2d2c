"""A real HTTP server on 127.0.0.1 that speaks the OpenAI chat-completions API and replays
scripted replies, for tests and benchmarks of the LLM stages (standard library only).

    with OpenAIServer(latency=0.05) as server:
        server.reply("first answer", "second answer")    # queued, served in order
        server.fail(429, times=2, retry_after=0)         # the next two requests get HTTP 429
        server.responder = lambda request: "..."         # answers when the queue is empty
        client = LLMClient("test-model", base_url=server.url, api_key="sk-test")
        ...
        server.requests                                   # every request body received, in order

Each request is handled in its own thread, so ``latency`` (seconds slept before answering)
overlaps between concurrent requests as on a real server. With ``api_key`` set, a request
without ``Authorization: Bearer <api_key>`` gets 401. ``GET /v1/models`` lists ``model``.
"""
from __future__ import annotations

import collections
import json
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclass
class Status:
    """A scripted non-200 answer."""
    code: int
    message: str = "scripted failure"
    retry_after: float | None = None


class OpenAIServer:
    def __init__(self, *, latency: float = 0.0, api_key: str | None = None,
                 model: str = "test-model",
                 responder: Callable[[dict], str | Status] | None = None):
        self.latency, self.api_key, self.model = latency, api_key, model
        self.responder = responder
        self.requests: list[dict] = []          # request bodies of chat completions, in order
        self.statuses: list[int] = []           # the status answered to each of them
        self._queue: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ scripting

    def reply(self, *contents: str | Status) -> None:
        """Queue replies (assistant texts, or a :class:`Status`), served in order."""
        with self._lock:
            self._queue.extend(contents)

    def fail(self, code: int, times: int = 1, retry_after: float | None = None,
             message: str = "scripted failure") -> None:
        """Queue ``times`` answers with HTTP status ``code``."""
        self.reply(*[Status(code, message, retry_after)] * times)

    @property
    def ok_count(self) -> int:
        """How many chat requests were answered 200."""
        with self._lock:
            return sum(1 for s in self.statuses if s == 200)

    def reset_log(self) -> None:
        with self._lock:
            self.requests.clear()
            self.statuses.clear()

    # ------------------------------------------------------------------ life

    @property
    def url(self) -> str:
        assert self._httpd is not None, "start the server first (use it as a context manager)"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> "OpenAIServer":
        server = self

        class Handler(_Handler):
            owner = server

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "OpenAIServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ answering

    def _next(self, body: dict) -> str | Status:
        with self._lock:
            self.requests.append(body)
            if self._queue:
                return self._queue.popleft()
        if self.responder is not None:
            return self.responder(body)
        return Status(500, "the test server has no scripted reply left")

    def _record(self, code: int) -> None:
        with self._lock:
            self.statuses.append(code)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """No traceback: on Python 3.11, formatting one parses source lines (``ast``, for its
        carets), and a parse in this server's thread while the code under test parses in its own
        fails one of them ("SystemError: AST constructor recursion depth mismatch": CI, 2026-11-27,
        when a client hung up on an error reply). A client that went away is no error at all."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, ConnectionError):
            print(f"openai_server: {type(exc).__name__}: {exc}", file=sys.stderr)


class _Handler(BaseHTTPRequestHandler):
    owner: OpenAIServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else Nagle + delayed ACK add ~40 ms to keep-alive replies

    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass

    def _send(self, code: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, message: str, headers: dict | None = None) -> None:
        kind = {401: "invalid_request_error", 404: "invalid_request_error",
                429: "rate_limit_exceeded"}.get(code, "server_error")
        self._send(code, {"error": {"message": message, "type": kind, "code": None}}, headers)

    def _authorized(self) -> bool:
        owner = self.owner
        if owner.api_key and self.headers.get("Authorization") != f"Bearer {owner.api_key}":
            self._error(401, "Incorrect API key provided")
            return False
        return True

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            self._send(200, {"object": "list", "data": [
                {"id": self.owner.model, "object": "model", "created": 0, "owned_by": "test"}]})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if not self._authorized():
            return
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._error(404, f"no route {self.path}")
            return
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            self._error(400, "request body is not JSON")
            return
        owner = self.owner
        if owner.latency:
            time.sleep(owner.latency)
        answer = owner._next(body)
        if isinstance(answer, Status):
            owner._record(answer.code)
            headers = {} if answer.retry_after is None else {"Retry-After": str(answer.retry_after)}
            self._error(answer.code, answer.message, headers)
            return
        owner._record(200)
        self._send(200, {
            "id": f"chatcmpl-test-{len(owner.requests)}", "object": "chat.completion",
            "created": int(time.time()), "model": body.get("model", owner.model),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": answer}}],
            "usage": {"prompt_tokens": len(raw) // 4, "completion_tokens": len(answer) // 4,
                      "total_tokens": (len(raw) + len(answer)) // 4},
        })
