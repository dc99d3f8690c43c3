"""HubClient against a real HTTP server on 127.0.0.1 playing the Hub."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

from cpullm.errors import ModelConfigUnavailable
from cpullm.io.hub import HubClient

FILES = {
    "/org/model/resolve/main/config.json": {"model_type": "llama"},
    "/org/model/resolve/main/model.safetensors.index.json": {"metadata": {"total_size": 1234}},
    "/org/small/resolve/v1/config.json": {"model_type": "qwen2"},
}


class Handler(BaseHTTPRequestHandler):
    requests: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self):
        Handler.requests.append((self.path, self.headers.get("Authorization")))
        if self.path.startswith("/gated/"):
            self.send_response(401)
            self.end_headers()
            return
        body = FILES.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        if body is not None:
            self.wfile.write(json.dumps(body).encode())

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def endpoint():
    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_fetches_config_and_index_with_token_and_caches(endpoint):
    hub = HubClient(endpoint=endpoint)
    Handler.requests.clear()
    files = hub.fetch("org/model", None, "tok")
    assert files.config == {"model_type": "llama"} and files.checkpoint_total_bytes == 1234
    assert hub.fetch("org/model", None, "tok") is files
    assert Handler.requests == [
        ("/org/model/resolve/main/config.json", "Bearer tok"),
        ("/org/model/resolve/main/model.safetensors.index.json", "Bearer tok"),
    ]


def test_missing_index_is_fine(endpoint):
    assert HubClient(endpoint=endpoint).fetch("org/small", "v1", None).checkpoint_total_bytes is None


@pytest.mark.parametrize(
    ("name", "message"),
    [("gated/model", "gated or private: set spec.hfTokenSecret"), ("org/none", "no such model or revision")],
)
def test_http_errors_are_typed(endpoint, name, message):
    with pytest.raises(ModelConfigUnavailable, match=message):
        HubClient(endpoint=endpoint).fetch(name, None, None)


def test_unreachable_endpoint_is_typed():
    with pytest.raises(ModelConfigUnavailable, match="cannot reach"):
        HubClient(endpoint="http://127.0.0.1:9", timeout_seconds=2).fetch("org/model", None, None)
