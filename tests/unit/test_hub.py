"""HubClient against real HTTP servers on 127.0.0.1 playing the Hub (and a CDN it redirects to): config.json, the
safetensors index, and safetensors headers read with range requests through huggingface_hub."""

from __future__ import annotations

import json
import re
import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from cpullm.api.spec import DType
from cpullm.core.sizing import size_model
from cpullm.errors import InvalidSpec, ModelConfigUnavailable
from cpullm.io.hub import HubClient, checked_token

from .builders import LLAMA_8B

TOKEN = "hf_secret_token_value"


def safetensors(tensors: dict[str, tuple[str, list[int]]], payload: bool = True) -> bytes:
    """A safetensors file: 8-byte header length, the JSON header, then the data (zeros)."""
    sizes = {"BF16": 2, "F32": 4, "I32": 4, "F16": 2, "U8": 1}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = sizes[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + (b"\0" * offset if payload else b"")


SHARD_1 = safetensors({"model.embed_tokens.weight": ("F32", [100, 8]), "model.layers.0.mlp.w": ("BF16", [8, 8])})
SHARD_2 = safetensors({"model.layers.1.mlp.w": ("BF16", [8, 8]), "lm_head.weight": ("BF16", [100, 8])})
CONFIG = {**LLAMA_8B, "num_hidden_layers": 2}
FILES: dict[str, bytes] = {
    "/org/sharded/resolve/main/config.json": json.dumps(CONFIG).encode(),
    "/org/sharded/resolve/main/model.safetensors.index.json": json.dumps(
        {"metadata": {"total_size": 1234}, "weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}}
    ).encode(),
    "/org/sharded/resolve/main/model-1.safetensors": SHARD_1,
    "/org/sharded/resolve/main/model-2.safetensors": SHARD_2,
    "/org/single/resolve/v1/config.json": json.dumps(CONFIG).encode(),
    "/org/single/resolve/v1/model.safetensors": SHARD_1,
    "/org/configonly/resolve/main/config.json": json.dumps(CONFIG).encode(),
    "/org/list/resolve/main/config.json": b"[1, 2, 3]",
    "/org/deep/resolve/main/config.json": b"[" * 100_000 + b"]" * 100_000,
    "/org/huge/resolve/main/config.json": b'{"a": "' + b"x" * (17 * 2**20) + b'"}',
    "/org/badindex/resolve/main/config.json": json.dumps(CONFIG).encode(),
    "/org/badindex/resolve/main/model.safetensors.index.json": b'{"metadata": [1], "weight_map": 7}',
    "/org/junkheader/resolve/main/config.json": json.dumps(CONFIG).encode(),
    "/org/junkheader/resolve/main/model.safetensors": struct.pack("<Q", 12) + b"not json!!!!",
}


class Hub(BaseHTTPRequestHandler):
    requests: ClassVar[list[tuple[str, str | None, str | None]]] = []
    cdn: ClassVar[str] = ""

    def do_GET(self) -> None:
        auth = self.headers.get("Authorization")
        Hub.requests.append((self.path, auth, self.headers.get("Range")))
        path = self.path.split("?")[0]
        if path.startswith("/gated/"):
            return self._send(401, b"")
        if path.startswith("/private/") and auth != f"Bearer {TOKEN}":
            return self._send(404, b"")
        if path.startswith("/private/"):
            path = path.replace("/private/", "/org/", 1)
        if path.startswith("/redirect/") and path.endswith(".safetensors"):
            self.send_response(302)
            self.send_header("Location", f"{Hub.cdn}{path.replace('/redirect/', '/org/', 1)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if path.startswith("/redirect/"):
            path = path.replace("/redirect/", "/org/", 1)
        body = FILES.get(path)
        if body is None:
            return self._send(404, b"")
        match = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
        if match:
            start, end = int(match.group(1)), int(match.group(2))
            return self._send(206, body[start : end + 1])
        return self._send(200, body)

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _serve() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    hub, address = _serve()
    cdn, Hub.cdn = _serve()  # another origin: a token must not follow a redirect there
    yield address
    for server in (hub, cdn):
        server.shutdown()
        server.server_close()


def test_sharded_checkpoint_is_sized_from_its_headers_and_cached(endpoint):
    hub = HubClient(endpoint=endpoint, allow_http=True)
    Hub.requests.clear()
    files = hub.fetch("org/sharded", None, TOKEN)
    assert files.config == CONFIG and files.checkpoint_total_bytes == 1234
    assert files.tensors is not None and files.tensors.describe() == "safetensors headers (2 files, 4 tensors)"
    size = size_model(files.config, DType.BFLOAT16, checkpoint_total_bytes=1234, tensors=files.tensors)
    assert size.weights_bytes == (800 + 64 + 64 + 800) * 2  # F32 embeddings cast to bf16
    assert hub.fetch("org/sharded", None, TOKEN) is files
    assert {auth for _, auth, _ in Hub.requests} == {f"Bearer {TOKEN}"}
    assert any(path.endswith("model-2.safetensors") and ranges for path, _, ranges in Hub.requests)


def test_single_file_checkpoint_and_a_revision(endpoint):
    files = HubClient(endpoint=endpoint, allow_http=True).fetch("org/single", "v1", None)
    assert files.tensors is not None and files.tensors.files == 1 and files.checkpoint_total_bytes is None


def test_no_safetensors_leaves_the_formula(endpoint):
    files = HubClient(endpoint=endpoint, allow_http=True).fetch("org/configonly", None, None)
    assert (files.tensors, files.checkpoint_total_bytes) == (None, None)


@pytest.mark.parametrize("name", ["org/badindex", "org/junkheader"])
def test_a_malformed_index_or_header_falls_back(endpoint, name):
    files = HubClient(endpoint=endpoint, allow_http=True).fetch(name, None, None)
    assert (files.tensors, files.checkpoint_total_bytes) == (None, None)


def test_token_is_not_sent_to_another_host_on_redirect(endpoint):
    Hub.requests.clear()
    files = HubClient(endpoint=endpoint, allow_http=True).fetch("redirect/sharded", None, TOKEN)
    assert files.tensors is not None
    cdn_port = Hub.cdn.rsplit(":", 1)[1]
    assert Hub.requests  # both servers log to the same list; the CDN's requests carry no token
    redirected = [auth for path, auth, _ in Hub.requests if path.startswith("/org/") and path.endswith(".safetensors")]
    assert redirected and set(redirected) == {None}, (cdn_port, Hub.requests)


def test_cache_is_keyed_by_the_credential(endpoint):
    hub = HubClient(endpoint=endpoint, allow_http=True)
    assert hub.fetch("private/sharded", None, TOKEN).config == CONFIG
    with pytest.raises(ModelConfigUnavailable, match="no such model or revision"):
        hub.fetch("private/sharded", None, None)  # not served from the token's cache entry


def test_cache_is_bounded(endpoint):
    hub = HubClient(endpoint=endpoint, allow_http=True, cache_entries=2)
    for name in ("org/sharded", "org/configonly", "org/badindex"):
        hub.fetch(name, None, None)
    assert [key[0] for key in hub._cache] == ["org/configonly", "org/badindex"]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("gated/model", "gated or private: set spec.hfTokenSecret"),
        ("org/none", "no such model or revision"),
        ("org/list", "config.json of org/list is a JSON list, not an object"),
        ("org/deep", "config.json of org/deep is not JSON (RecursionError)"),
        ("org/huge", "config.json is larger than 16 MiB"),
    ],
)
def test_hub_answers_that_are_not_a_model_are_typed(endpoint, name, message):
    with pytest.raises(ModelConfigUnavailable, match=re.escape(message)):
        HubClient(endpoint=endpoint, allow_http=True).fetch(name, None, None)


@pytest.mark.parametrize("name", ["org/with space", "org/new\nline", "a/b/c", "org/" + "x" * 200])
def test_a_name_that_is_no_repo_id_is_an_invalid_spec(name):
    with pytest.raises(InvalidSpec, match="neither a Hugging Face repo id"):
        HubClient(endpoint="http://127.0.0.1:9", allow_http=True).fetch(name, None, None)


def test_unreachable_endpoint_is_typed():
    with pytest.raises(
        ModelConfigUnavailable, match=re.escape("cannot reach http://127.0.0.1:9 for org/model: Connect")
    ):
        HubClient(endpoint="http://127.0.0.1:9", allow_http=True, timeout_seconds=2).fetch("org/model", None, None)


@pytest.mark.parametrize(
    ("raw", "clean"),
    [(TOKEN + "\n", TOKEN), ("  " + TOKEN, TOKEN), ("", None), (None, None), ("\n", None)],
)
def test_a_token_is_trimmed(raw, clean):
    assert checked_token(raw) == clean


@pytest.mark.parametrize("raw", ["hf_abc\ndef", "hf abc", "hf_\x00abc", "hf_äbc"])
def test_a_token_a_header_cannot_carry_is_refused_without_showing_it(raw):
    with pytest.raises(ModelConfigUnavailable) as caught:
        checked_token(raw)
    assert "abc" not in caught.value.message and "is not a token" in caught.value.message


@pytest.mark.parametrize(("endpoint", "allow_http"), [("http://hub.example", False), ("ftp://hub.example", True)])
def test_a_hub_endpoint_that_is_not_https_is_refused_unless_allowed(endpoint, allow_http):
    with pytest.raises(ValueError, match="is not https://"):
        HubClient(endpoint=endpoint, allow_http=allow_http)
    assert HubClient(endpoint="https://hub.example").endpoint == "https://hub.example"
