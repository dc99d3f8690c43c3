"""HubClient against real HTTP servers on 127.0.0.1 playing the Hub (and a CDN it redirects to): config.json, the
safetensors index, and safetensors headers read with range requests within the client's byte caps; its cache
bounded by entries and bytes, failures cached briefly."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from huggingface_hub import HfApi

from cpullm.api.spec import DType
from cpullm.core.sizing import size_model
from cpullm.errors import InvalidSpec, ModelConfigUnavailable
from cpullm.io.hub import (
    FAILURE_SECONDS,
    HEADER_PROBE_BYTES,
    INDEX_FILE,
    TENANT_READERS,
    HubClient,
    checked_token,
    index_facts,
    summarize_headers,
)

from .builders import LLAMA_8B

TOKEN = "hf_secret_token_value"
SLOW_SECONDS = 1.0


def safetensors(tensors: dict[str, tuple[str, list[int]]], payload: bool = True, metadata: str = "") -> bytes:
    """A safetensors file: 8-byte header length, the JSON header, then the data (zeros)."""
    sizes = {"BF16": 2, "F32": 4, "I32": 4, "F16": 2, "U8": 1, "F8_E4M3": 1}
    header: dict[str, object] = {"__metadata__": {"format": "pt", "note": metadata}} if metadata else {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = sizes[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + (b"\0" * offset if payload else b"")


def header_declaring(length: int, body: bytes) -> bytes:
    """A file whose first 8 bytes declare a header of `length` bytes, followed by `body` (however long)."""
    return struct.pack("<Q", length) + body


def layer_shard(layer: int) -> bytes:
    """One decoder layer of a quantized MoE-like checkpoint; layers 0 and 1 have headers past the first range read
    (~100 KB each, ~0.2 MB together)."""
    prefix = f"model.layers.{layer}."
    tensors = {
        prefix + "self_attn.q_proj.weight": ("BF16", [64, 64]),
        prefix + "mlp.experts.0.down_proj.weight": ("F8_E4M3", [64, 32]),
        prefix + "mlp.experts.0.down_proj.weight_scale_inv": ("F32", [1, 1]),
        prefix + "mlp.experts.0.down_proj.g_idx": ("I32", [32]),
    }
    return safetensors(tensors, payload=False, metadata="x" * 100_000 if layer < 2 else "")


MANY_SHARDS = {f"model-{layer:05d}.safetensors": layer_shard(layer) for layer in range(12)}
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
    "/org/huge/resolve/main/config.json": b'{"a": "' + b"x" * (2 * 2**20) + b'"}',
    "/org/hugeindex/resolve/main/config.json": json.dumps(CONFIG).encode(),
    "/org/hugeindex/resolve/main/model.safetensors.index.json": b'{"a": "' + b"x" * (17 * 2**20) + b'"}',
    "/org/badindex/resolve/main/config.json": json.dumps(CONFIG).encode(),
    "/org/badindex/resolve/main/model.safetensors.index.json": b'{"metadata": [1], "weight_map": 7}',
    "/org/junkheader/resolve/main/config.json": json.dumps(CONFIG).encode(),
    "/org/junkheader/resolve/main/model.safetensors": header_declaring(12, b"not json!!!!"),
    "/org/many/resolve/main/config.json": json.dumps(CONFIG).encode(),
    "/org/many/resolve/main/model.safetensors.index.json": json.dumps(
        {"metadata": {"total_size": 99}, "weight_map": {str(i): shard for i, shard in enumerate(MANY_SHARDS)}}
    ).encode(),
    **{f"/org/many/resolve/main/{shard}": body for shard, body in MANY_SHARDS.items()},
    "/org/declares24mb/resolve/main/config.json": json.dumps(CONFIG).encode(),
    "/org/declares24mb/resolve/main/model.safetensors": header_declaring(24 * 2**20, b"{" + b" " * 200_000),
    **{
        f"/org/{name}/resolve/main/{file}": body
        for name, body in [
            ("listheader", header_declaring(3, b"[1]")),
            ("nodtype", header_declaring(15, b'{"a": {"x": 1}}')),
            ("shortheader", header_declaring(1000, b'{"a": 1}')),
            ("shortfile", b"\x07\x00"),
            ("deepheader", header_declaring(200_000, b"[" * 200_000)),
        ]
        for file, body in [("config.json", json.dumps(CONFIG).encode()), ("model.safetensors", body)]
    },
    "/org/lora16/resolve/main/adapter_config.json": json.dumps({"peft_type": "LORA", "r": 16}).encode(),
    "/org/lorabool/resolve/main/adapter_config.json": json.dumps({"r": True}).encode(),
    "/org/loralist/resolve/main/adapter_config.json": b"[16]",
    "/org/lorabig/resolve/main/adapter_config.json": b'{"r": 8, "x": "' + b"x" * (2 * 2**20) + b'"}',
}


class Hub(BaseHTTPRequestHandler):
    """`/held/` serves `/org/`'s headers once `released` is set (each arrival counted in `arrived`); `/slow/` serves
    them after SLOW_SECONDS."""

    requests: ClassVar[list[tuple[str, str | None, str | None]]] = []
    cdn: ClassVar[str] = ""
    arrived: ClassVar[threading.Semaphore] = threading.Semaphore(0)
    released: ClassVar[threading.Event] = threading.Event()

    def do_GET(self) -> None:
        auth = self.headers.get("Authorization")
        Hub.requests.append((self.path, auth, self.headers.get("Range")))
        path = self.path.split("?")[0]
        for prefix in ("/held/", "/slow/"):
            if path.startswith(prefix) and path.endswith(".safetensors"):
                Hub.arrived.release()
                Hub.released.wait(SLOW_SECONDS if prefix == "/slow/" else 30)
            if path.startswith(prefix):
                path = path.replace(prefix, "/org/", 1)
        if path.startswith("/gated/"):
            return self._send(401, b"")
        if path.startswith("/overloaded/"):
            return self._send(503, b"")
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


def serve_checkpoint(monkeypatch: pytest.MonkeyPatch, name: str, index: bytes, shards: dict[str, bytes]) -> None:
    """`name` on the test Hub for one test: the tests' config.json, `index` as its safetensors index, and `shards`."""
    for file, body in {"config.json": json.dumps(CONFIG).encode(), INDEX_FILE: index, **shards}.items():
        monkeypatch.setitem(FILES, f"/{name}/resolve/main/{file}", body)


def index_naming(shards: dict[str, bytes]) -> bytes:
    return json.dumps({"weight_map": {str(i): shard for i, shard in enumerate(shards)}}).encode()


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


@pytest.mark.parametrize(
    "name",
    [
        "org/badindex",
        "org/junkheader",
        "org/listheader",
        "org/nodtype",
        "org/shortheader",
        "org/shortfile",
        "org/deepheader",
    ],
)
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


def test_cache_is_bounded_by_bytes_the_least_recently_used_out_first(endpoint):
    names = ("org/sharded", "org/configonly", "org/badindex")
    unbounded = HubClient(endpoint=endpoint, allow_http=True)
    for name in names:
        unbounded.fetch(name, None, None)
    size = {key[0]: cached.size for key, cached in unbounded._cache.items()}
    assert size["org/sharded"] > size["org/configonly"] > len(json.dumps(CONFIG))  # parsed: more than its text
    hub = HubClient(endpoint=endpoint, allow_http=True, cache_bytes=size["org/sharded"] + size["org/badindex"])
    for name in ("org/sharded", "org/configonly", "org/sharded", "org/badindex"):
        hub.fetch(name, None, None)
    assert [key[0] for key in hub._cache] == ["org/sharded", "org/badindex"]
    assert hub.cached_bytes == hub.cache_bytes


def test_an_answer_larger_than_the_cache_is_not_kept(endpoint):
    hub = HubClient(endpoint=endpoint, allow_http=True, cache_bytes=1000)
    Hub.requests.clear()
    assert hub.fetch("org/configonly", None, None) == hub.fetch("org/configonly", None, None)
    assert not hub._cache
    assert [path for path, _, _ in Hub.requests if path.endswith("config.json")] == [
        "/org/configonly/resolve/main/config.json"
    ] * 2


@pytest.mark.parametrize(
    ("name", "cached"),
    [
        ("org/none", True),
        ("gated/model", True),
        ("org/list", True),
        ("org/declares24mb", True),
        ("overloaded/x", False),
    ],
)
def test_a_failure_is_answered_again_for_a_while_unless_transient(endpoint, name, cached):
    now = [0.0]
    hub = HubClient(endpoint=endpoint, allow_http=True, clock=lambda: now[0])
    asked, messages = [], set()
    for at in (0.0, FAILURE_SECONDS - 1, FAILURE_SECONDS):
        now[0] = at
        Hub.requests.clear()
        with pytest.raises(ModelConfigUnavailable) as caught:
            hub.fetch(name, None, None)
        asked.append(len(Hub.requests))
        messages.add(caught.value.message)
    assert asked[0] > 0 and asked[2] == asked[0]  # expired: asked again
    assert (asked[1] == 0) is cached
    assert len(messages) == 1


@pytest.mark.parametrize(("name", "revision"), [("org/sharded", None), ("org/single", "v1"), ("org/many", None)])
def test_each_header_summed_on_its_own_sums_as_all_at_once(endpoint, name, revision):
    """The files' summaries summed: the same as huggingface_hub's parsed headers summed at once (as before)."""
    Hub.requests.clear()
    files = HubClient(endpoint=endpoint, allow_http=True).fetch(name, revision, TOKEN)
    mine = [(path, ranges) for path, _, ranges in Hub.requests if path.endswith(".safetensors")]
    folder = f"/{name}/resolve/{revision or 'main'}/"
    shards = sorted(
        path.removeprefix(folder) for path in FILES if path.startswith(folder) and path.endswith(".safetensors")
    )
    api = HfApi(endpoint=endpoint, token=TOKEN)
    headers = [api.parse_safetensors_file_metadata(name, shard, revision=revision) for shard in shards]
    assert files.tensors is not None and files.tensors == summarize_headers(headers)
    if name == "org/many":  # a header past the first read is read again, whole
        long_header = len(MANY_SHARDS["model-00000.safetensors"])
        assert (f"{folder}model-00000.safetensors", f"bytes=0-{long_header - 1}") in mine


@pytest.mark.parametrize(
    ("caps", "name", "message"),
    [
        ({}, "org/declares24mb", "model.safetensors in org/declares24mb@main declares 25165824 bytes, over the 8 MiB"),
        (
            {"max_header_bytes": 2**16},
            "org/many",
            f"model-00000.safetensors in org/many@main declares {len(MANY_SHARDS['model-00000.safetensors']) - 8} "
            "bytes, over the 0.0625 MiB a checkpoint's header needs",
        ),
        ({"max_headers_bytes": 2**17}, "org/many", "headers of org/many@main declare more than 0.125 MiB together"),
    ],
)
def test_headers_beyond_the_caps_are_refused(endpoint, caps, name, message):
    with pytest.raises(ModelConfigUnavailable, match=re.escape(message)) as caught:
        HubClient(endpoint=endpoint, allow_http=True, **caps).fetch(name, None, TOKEN)
    assert TOKEN not in caught.value.message and "spec.model.weightsBytes" in caught.value.message


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("gated/model", "gated or private: set spec.hfTokenSecret"),
        ("org/none", "no such model or revision"),
        ("org/list", "config.json of org/list is a JSON list, not an object"),
        ("org/deep", "config.json of org/deep is not JSON (RecursionError)"),
        ("org/huge", "config.json is larger than 1 MiB"),
        ("org/hugeindex", "model.safetensors.index.json is larger than 16 MiB"),
    ],
)
def test_hub_answers_that_are_not_a_model_are_typed(endpoint, name, message):
    with pytest.raises(ModelConfigUnavailable, match=re.escape(message)):
        HubClient(endpoint=endpoint, allow_http=True).fetch(name, None, None)


@pytest.mark.parametrize(
    ("source", "rank"),
    [
        ("org/lora16", 16),  # adapter_config.json's r
        ("org/noadapterfile", None),  # no adapter_config.json: the spec's rank stands
        ("org/lorabool", None),  # r is no positive integer
        ("org/loralist", None),  # not an object
        ("/models/adapters/sql", None),  # a path in the container: the server reads it
        ("private/lora16", None),  # not served to a request without the token: as the Hub answers, 404
    ],
)
def test_an_adapters_rank_is_read_from_its_adapter_config_where_it_can_be(endpoint, source, rank):
    assert HubClient(endpoint=endpoint, allow_http=True).adapter_rank(source, None) == rank


def test_adapters_ranks_do_not_push_a_models_answer_out_of_the_cache(endpoint):
    """A tenant's service names up to 16 adapters: their answers are kept apart from the models'."""
    hub = HubClient(endpoint=endpoint, allow_http=True, cache_entries=1)
    hub.fetch("org/configonly", None, None)
    for index in range(20):
        hub.adapter_rank(f"org/adapter{index}", None)
    Hub.requests.clear()
    hub.fetch("org/configonly", None, None)
    assert Hub.requests == []


def test_an_adapters_rank_is_cached_by_credential_and_its_failures_are_typed(endpoint):
    hub = HubClient(endpoint=endpoint, allow_http=True)
    Hub.requests.clear()
    assert hub.adapter_rank("private/lora16", TOKEN) == 16
    assert hub.adapter_rank("private/lora16", TOKEN) == 16
    assert len(Hub.requests) == 1
    with pytest.raises(ModelConfigUnavailable, match="gated or private"):
        hub.adapter_rank("gated/lora", None)
    with pytest.raises(ModelConfigUnavailable, match="larger than 1 MiB"):  # config.json's cap
        hub.adapter_rank("org/lorabig", None)


@pytest.mark.parametrize("name", ["org/with space", "org/new\nline", "a/b/c", "org/" + "x" * 200])
def test_a_name_that_is_no_repo_id_is_an_invalid_spec(name):
    with pytest.raises(InvalidSpec, match="neither a Hugging Face repo id"):
        HubClient(endpoint="http://127.0.0.1:9", allow_http=True).fetch(name, None, None)


def test_unreachable_endpoint_is_typed_and_not_cached():
    hub = HubClient(endpoint="http://127.0.0.1:9", allow_http=True, timeout_seconds=2)
    with pytest.raises(
        ModelConfigUnavailable, match=re.escape("cannot reach http://127.0.0.1:9 for org/model: Connect")
    ):
        hub.fetch("org/model", None, None)
    assert not hub._cache


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


@pytest.mark.parametrize(
    ("shards", "max_requests", "outcome", "requests"),
    [
        (12, 640, "files=12", 2 + 12 + 2),  # two headers past the first 100 KB: a second read each
        (12, 13, None, 2 + 13),  # over the budget: not summed (the index's total sizes it)
        (4096, 640, None, 2),  # an index of more shards than a checkpoint's: config and index alone
    ],
)
def test_a_fetch_makes_at_most_its_requests(endpoint, monkeypatch, shards, max_requests, outcome, requests):
    """An index of 4,096 one-tensor shards made 4,098 requests, holding every reader of the client."""
    name = f"org/shards{shards}"
    files = {f"model-{i:05d}.safetensors": MANY_SHARDS[f"model-{i % 12:05d}.safetensors"] for i in range(shards)}
    serve_checkpoint(monkeypatch, name, index_naming(files), files)
    Hub.requests.clear()
    tensors = HubClient(endpoint=endpoint, allow_http=True, max_requests=max_requests).fetch(name, None, None).tensors
    assert (tensors is None) if outcome is None else (outcome in repr(tensors))
    assert len(Hub.requests) == requests


def test_a_fetch_past_its_time_is_transient(endpoint):
    """Headers slower than the fetch's time: a failure that says so, not cached (the next reconcile asks again)."""
    hub = HubClient(endpoint=endpoint, allow_http=True, fetch_seconds=SLOW_SECONDS / 4)
    Hub.released.clear()
    with pytest.raises(ModelConfigUnavailable, match=r"slow/many@main from .* took over 0.25 s: tried again"):
        hub.fetch("slow/many", None, None)
    assert not hub._cache


def test_one_namespace_holds_at_most_half_the_readers(endpoint):
    """Namespace a's headers held by the Hub keep TENANT_READERS readers; b's fetch of 12 shards goes on beside
    them and a's next reads wait."""
    hub = HubClient(endpoint=endpoint, allow_http=True)
    Hub.released.clear()
    while Hub.arrived.acquire(blocking=False):
        pass
    held: list[object] = []
    first = threading.Thread(target=lambda: held.append(hub.in_namespace("a").fetch("held/many", None, None).tensors))
    first.start()
    try:
        for _ in range(TENANT_READERS):
            assert Hub.arrived.acquire(timeout=10)
        other = hub.in_namespace("b").fetch("org/many", None, None).tensors
        assert other is not None and other.files == 12
        assert not Hub.arrived.acquire(blocking=False) and hub._readers.held == {"a": TENANT_READERS}
    finally:
        Hub.released.set()
        first.join(timeout=30)
    assert repr(held[0]) == repr(other) and not hub._readers.held


# The operator's fetch in a process of its own, its peak RSS printed: the high-water mark of its own memory
# (VmHWM), as ru_maxrss in a child also counts the parent's RSS when it was spawned (pytest's, with these files).
HOSTILE_FETCH = """
import sys
from cpullm.errors import ModelConfigUnavailable
from cpullm.io.hub import HubClient
client = HubClient(endpoint=sys.argv[1], allow_http=True)
imported = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmRSS:"))
try:
    outcome = repr(client.fetch(sys.argv[2], None, None).tensors)
except ModelConfigUnavailable as err:
    outcome = err.message
peak = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print((int(peak) - int(imported)) // 1024, outcome)
"""
# What a fetch may add to the process (its peak over what the imports hold), against the chart's 512 MiB limit: at
# most 8 headers of 8 MiB read at once and their sums. Through huggingface_hub's parse_safetensors_file_metadata, the
# first case peaked at 1.8 GiB; summing a new layer per tensor and every shard at once raised it by 670 MiB, and a
# 16 MiB index of empty lists parsed whole by 442 MiB.
PEAK_RSS_MIB = 100


def parses_big(length: int) -> bytes:
    """A safetensors file whose header is `length` bytes of the JSON that parses to the most Python objects per
    byte (empty lists, ~25 bytes of objects per byte of text)."""
    lists = (length - 7) // 3
    return header_declaring(length, b'{"a":[' + b"[]," * (lists - 1) + b"[]]}" + b" " * ((length - 7) % 3))


def real_sized(length: int) -> bytes:
    """A safetensors file whose header is `length` bytes of real tensors (~140 bytes each) and padding."""
    tensors = {
        f"model.layers.{i // 512}.mlp.experts.{i % 512}.down_proj.qweight": ("I32", [64, 2048]) for i in range(56_000)
    }
    header = safetensors(tensors, payload=False)[8:]
    return header_declaring(length, header + b" " * (length - len(header)))


def many_layers(length: int) -> bytes:
    """A safetensors file whose header is `length` bytes of one-element tensors, each naming a layer of its own (the
    sums are keyed by layer: a key per tensor, held for every shard at once, raised the operator by 670 MiB)."""
    entries, size, layer = [], 2, 0
    while size < length - 100:
        entry = f'"model.layers.{layer}.w":{{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}'
        entries.append(entry)
        size += len(entry) + 1
        layer += 1
    header = ("{" + ",".join(entries) + "}").encode()
    return header_declaring(length, header + b" " * (length - len(header)))


@pytest.mark.parametrize(
    ("name", "shards", "shard", "header_bytes", "outcome"),
    [
        # Eight headers at the caps naming a new decoder layer per tensor: refused at layer 1024, a few KB of sums.
        ("org/manylayers", 8, many_layers, 8 * 2**20, "None"),
        # Three 24 MB headers (under huggingface_hub's 25 MB cap): refused from their first 100 KB.
        ("org/hostile", 3, parses_big, 24_000_000, "declares 24000000 bytes, over the 8 MiB"),
        # Eight headers at the caps (8 MiB each, 64 MiB together) of real tensors: read, summed.
        ("org/atthecaps", 8, real_sized, 8 * 2**20, "files=8, tensors=448000"),
        # ... or of what parses to 25 times its bytes: read, not decoded; the sizing falls back to the formula.
        ("org/nested", 8, parses_big, 8 * 2**20, "None"),
    ],
)
def test_hostile_headers_keep_the_fetch_within_its_memory(
    endpoint, monkeypatch, name, shards, shard, header_bytes, outcome
):
    header = shard(header_bytes)
    files = {f"model-{index}.safetensors": header for index in range(shards)}
    serve_checkpoint(monkeypatch, name, index_naming(files), files)
    Hub.requests.clear()
    fetched = subprocess.run(
        [sys.executable, "-c", HOSTILE_FETCH, endpoint, name], capture_output=True, text=True, timeout=60, check=True
    )
    peak_mib, said = fetched.stdout.strip().split(" ", 1)
    assert outcome in said and int(peak_mib) < PEAK_RSS_MIB, fetched.stdout
    read = [int(ranges.rsplit("-", 1)[1]) + 1 for path, _, ranges in Hub.requests if ranges and name in path]
    assert max(read) == (HEADER_PROBE_BYTES if header_bytes > 8 * 2**20 else 8 + header_bytes)


def test_an_index_is_read_an_entry_at_a_time(endpoint, monkeypatch):
    """An index at its 16 MiB cap of what parses to the most objects (empty lists) raised the operator by 442 MiB
    through json.loads; read an entry at a time, it holds its bytes and the distinct shard names alone."""
    name, size = "org/listindex", 16 * 2**20 - 16
    lists = (size - 2) // 3
    serve_checkpoint(monkeypatch, name, b"[" + b"[]," * (lists - 1) + b"[]]", {})
    fetched = subprocess.run(
        [sys.executable, "-c", HOSTILE_FETCH, endpoint, name], capture_output=True, text=True, timeout=60, check=True
    )
    peak_mib, said = fetched.stdout.strip().split(" ", 1)
    assert said == "None" and int(peak_mib) < PEAK_RSS_MIB, fetched.stdout


@pytest.mark.parametrize(
    ("index", "facts"),
    [
        (b'{"metadata": {"total_size": 42}, "weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors", '
         b'"c": "m-1.safetensors"}}', (42, ["m-1.safetensors", "m-2.safetensors"])),
        (b'{"weight_map": {"a": "../x.safetensors", "b": "m.bin"}}', (None, [])),  # a path, not a shard of ours
        (b'{"weight_map": {"a": 1}}', (None, [])),  # not names to file names
        (b'{"weight_map": {"a": "m\\u002esafetensors"}}', (None, ["m.safetensors"])),  # JSON escapes read
        (b'[[], []]', (None, [])),
        (b'{"weight_map": {' + b",".join(b'"%d": "s%d.safetensors"' % (i, i) for i in range(4097)) + b"}}",
         (None, [])),  # more shards than MAX_SHARDS: none read
    ],
)  # fmt: skip
def test_an_indexs_facts_are_its_total_and_distinct_shards(index, facts):
    assert index_facts(index) == facts
