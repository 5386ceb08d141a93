"""The server health probe against a stand-in OpenAI server on loopback (the real vLLM is
exercised on the simulated cluster). Checks parsing, auth header and failure shapes."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from sparkvllm.probes import server_health

METRICS = """# HELP vllm:num_requests_running x
vllm:num_requests_running{model_name="m"} 1.0
vllm:generation_tokens_total{model_name="m"} 40.0
vllm:generation_tokens_total{model_name="n"} 2.0
vllm:other 7
"""


class StandIn(BaseHTTPRequestHandler):
    health = 200
    require_key: str | None = None
    seen_auth: ClassVar[list[str | None]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: str, ctype: str = "application/json") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        auth = self.headers.get("Authorization")
        StandIn.seen_auth.append(auth)
        return self.require_key is None or auth == f"Bearer {self.require_key}"

    def do_GET(self) -> None:
        if self.path == "/health":
            return self._send(self.health, "")
        if not self._authorized():
            return self._send(401, '{"error":"unauthorized"}')
        if self.path == "/v1/models":
            return self._send(200, json.dumps({"data": [{"id": "m"}]}))
        if self.path == "/version":
            return self._send(200, json.dumps({"version": "0.17.1"}))
        if self.path == "/metrics":
            return self._send(200, METRICS, "text/plain")
        return self._send(404, "")

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        body = json.loads(self.rfile.read(length))
        if not self._authorized():
            return self._send(401, '{"error":"unauthorized"}')
        assert body["temperature"] == 0
        reply = {
            "choices": [{"message": {"role": "assistant", "content": "ready"}}],
            "usage": {"completion_tokens": 1},
        }
        return self._send(200, json.dumps(reply))


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    StandIn.health, StandIn.require_key, StandIn.seen_auth = 200, None, []
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_ready_server(server: str) -> None:
    report = server_health.probe(server, "m")
    assert report["ready"] is True
    assert report["models"] == ["m"]
    assert report["vllm_version"] == "0.17.1"
    assert report["metrics"] == {
        "vllm:num_requests_running": 1.0,
        "vllm:generation_tokens_total": 42.0,
    }
    smoke = report["smoke"]
    assert {k: smoke[k] for k in ("status", "ok", "text", "completion_tokens")} == {
        "status": 200, "ok": True, "text": "ready", "completion_tokens": 1,
    }  # fmt: skip
    assert 0 < smoke["tokens_per_s"] < 1e6  # one token over the request's own time


def test_engine_dead_is_not_ready(server: str) -> None:
    StandIn.health = 503
    report = server_health.probe(server, "m")
    assert report == {"health_status": 503, "ready": False}


def test_refused_connection_is_not_ready() -> None:
    report = server_health.probe("http://127.0.0.1:9", "m")
    assert report["ready"] is False and report["health_status"] == 0


def test_api_key_comes_from_the_environment(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    StandIn.require_key = "k-123"
    assert server_health.probe(server, "m")["smoke"]["ok"] is False
    monkeypatch.setenv("VLLM_API_KEY", "k-123")
    assert server_health.probe(server, "m")["smoke"]["ok"] is True
    assert "Bearer k-123" in StandIn.seen_auth
