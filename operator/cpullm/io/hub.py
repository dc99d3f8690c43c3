"""The Hugging Face Hub (or a mirror) through huggingface_hub's URLs, auth headers, HTTP client and typed errors:
config.json, the safetensors index, and every safetensors header (range requests), so a model is sized from its
checkpoint's real bytes. Its HTTP client drops the token on a redirect to another host.

Whoever may create a service names the model, so everything read is bounded: config.json and the index by size;
a header by its declared length (max_header_bytes), all of a checkpoint's together (max_headers_bytes), and the
client-wide header reads (HEADER_READERS at once, at most half of them for one namespace); each is decoded a tensor
at a time (never the whole header as Python objects, up to ~25 times its bytes) and summed by decoder layer (at most
MAX_LAYERS of them) into one running total; the index is read an entry at a time for its distinct shard names. A
fetch makes at most max_requests requests within fetch_seconds. Results are cached in an LRU bounded by entries and
bytes, keyed by the model, the revision and a digest of the credential, so one tenant's private answer never serves
another (docs/tenancy.md)."""

from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx2
from huggingface_hub import get_session, hf_hub_url, hf_raise_for_status
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, HFValidationError, RevisionNotFoundError
from huggingface_hub.utils._headers import build_hf_headers  # huggingface_hub.utils re-exports them implicitly
from huggingface_hub.utils._validators import validate_repo_id

from cpullm.core.sizing import CheckpointTensors, CheckpointUnreadable, ModelFiles, summarize
from cpullm.errors import InvalidSpec, ModelConfigUnavailable

LIBRARY = "cpullm-operator"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"  # a PEFT LoRA adapter's: its rank is `r`
MAX_SHARDS = 512  # an index naming more is not read (real ones: DeepSeek-V3 163 shards, Llama-3.1-405B 191)
HEADER_READERS = 8  # safetensors headers read at once by the client (a 163-shard checkpoint in ~20 round trips)
TENANT_READERS = HEADER_READERS // 2  # of them, at once for one namespace's fetches: another's never wait for all
HEADER_PROBE_BYTES = 100_000  # a shard's first read; as huggingface_hub's, it holds 97% of headers whole
FAILURE_SECONDS = 30.0  # a model's failure is answered again for this long without asking the Hub
MAX_MEMBER_BYTES = 4096  # a tensor's name, dtype, shape and offsets in a header: ~100-300 bytes in real ones
# A header is one JSON object: `{`, then members, each a name and a flat object (a tensor's dtype, shape and
# data_offsets, or __metadata__'s strings) followed by `,` or the header's closing `}`. Possessive quantifiers:
# no backtracking, linear in the header's length.
_SPACE = rb"[ \t\n\r]*"
_STRING = rb'"(?:[^"\\]++|\\.)*+"'
_NUMBERS = rb'\[[^\[\]{}"]*+\]'
_FIELD = _SPACE + _STRING + _SPACE + rb":" + _SPACE + rb"(?:" + _STRING + rb"|" + _NUMBERS + rb")" + _SPACE + rb",?"
_FLAT_OBJECT = rb"\{(?:" + _FIELD + rb")*+" + _SPACE + rb"\}"
_HEADER_OPEN = re.compile(_SPACE + rb"\{")
_MEMBER = re.compile(
    _SPACE + rb"(" + _STRING + rb")" + _SPACE + rb":" + _SPACE + rb"(" + _FLAT_OBJECT + rb")" + _SPACE
    + rb"(,|\}" + _SPACE + rb"\Z)"
)  # fmt: skip


class _Transient(ModelConfigUnavailable):
    """A failure the next reconcile may not meet (the Hub unreachable, timing out, HTTP 429 or 5xx): not cached."""


@dataclass(frozen=True)
class _AdapterConfig:
    """What an adapter's adapter_config.json says of its rank (None: no such file, or no rank in it)."""

    rank: int | None


_Answer = ModelFiles | _AdapterConfig | ModelConfigUnavailable


@dataclass(frozen=True)
class _Cached:
    stamp: float
    answer: _Answer
    size: int  # bytes it holds, as far as the cache budget is concerned


@dataclass
class HubClient:
    """Answers are cached for cache_seconds, failures a reconcile would meet again (no such model or revision,
    gated, not a model's file, over a cap) for FAILURE_SECONDS, so a tenant's broken model is not fetched again
    on every reconcile; a _Transient failure is not cached."""

    endpoint: str
    timeout_seconds: float = 10.0
    cache_seconds: float = 3600.0
    max_json_bytes: int = 16 * 2**20  # a 1T-parameter model's index is ~6 MiB
    # Real config.json files are under ~100 KiB (a multimodal model's, with its vision and audio towers); one parses
    # to ~3-8 times its text, for every reconcile running at once: a larger one is no model's config.
    max_config_bytes: int = 1 * 2**20
    # A header lists ~100-200 bytes per tensor. Real shards hold up to a few thousand tensors (DeepSeek-V3's ~560:
    # ~80 KiB; Kimi-K2's ~2,300: ~0.3 MiB), an int4 MoE of small experts up to ~40,000 (Qwen3-Next's 512 experts
    # of 512x2048, 4 tensors per matrix, in 5 GB shards: ~5.5 MiB). The client holds HEADER_READERS at most.
    max_header_bytes: int = 8 * 2**20
    # DeepSeek-V3's 163 headers: ~92,000 tensors at ~140 bytes, ~12 MiB; an int4 Qwen3-Next's ~300,000: ~40 MiB.
    max_headers_bytes: int = 64 * 2**20
    cache_entries: int = 64
    # Adapters' ranks, in a cache of their own: a tenant's 16 adapters a service must not push models' answers out.
    adapter_cache_entries: int = 1024
    cache_bytes: int = 32 * 2**20  # a parsed config.json holds ~3-8 times its text: ~115 MiB for a 14.8 MiB one
    # Requests of one fetch (config, index, headers: one each, a second for a header past HEADER_PROBE_BYTES): a
    # real checkpoint makes about one a shard. Beyond it the headers are not summed (the index's total sizes it).
    max_requests: int = 640
    # One fetch's whole time, waiting for readers included; past it, it is tried again on a later reconcile.
    fetch_seconds: float = 120.0
    allow_http: bool = False
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    _cache: OrderedDict[tuple[str, str, str], _Cached] = field(default_factory=OrderedDict, init=False, repr=False)
    _adapters: OrderedDict[tuple[str, str, str], _Cached] = field(default_factory=OrderedDict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _readers: _Readers = field(default_factory=lambda: _Readers(HEADER_READERS, TENANT_READERS), init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.endpoint.startswith("https://") and not (self.allow_http and self.endpoint.startswith("http://")):
            raise ValueError(
                f"the Hub endpoint {self.endpoint[:200]!r} is not https:// (tokens would travel in the clear): "
                "use https, or allow http explicitly (CPULLM_HUB_ALLOW_HTTP=true) for a mirror on a trusted network"
            )

    def in_namespace(self, namespace: str) -> NamespaceHub:
        """This client as one namespace's reconciles ask it: their header reads share that namespace's readers."""
        return NamespaceHub(self, namespace)

    def fetch(self, name: str, revision: str | None, token: str | None, *, tenant: str | None = None) -> ModelFiles:
        """A model's files; `tenant` (a namespace) holds at most TENANT_READERS of the client's header readers,
        None (the CLI's one model) any of them."""
        if name.startswith("/"):
            raise ModelConfigUnavailable(f"model {name} is a path the operator cannot read: give spec.model.config")
        try:
            validate_repo_id(name)
        except HFValidationError as err:
            raise InvalidSpec(
                "spec.model.name is neither a Hugging Face repo id (org/name: letters, digits, '-', '_', '.') nor an "
                "absolute path"
            ) from err
        token = checked_token(token)
        revision = revision or "main"

        def read() -> tuple[ModelFiles, int]:
            files = _Fetch(self, name, revision, token, tenant).files()
            return files, _footprint((files.config, files.tensors and files.tensors.elements), self.cache_bytes)

        files = self._answer((name, revision, _credential(token)), self._cache, read)
        assert isinstance(files, ModelFiles), "the models' cache holds models' answers"
        return files

    def adapter_rank(self, source: str, token: str | None, *, tenant: str | None = None) -> int | None:
        """A LoRA adapter's rank, `r` in its adapter_config.json on the Hub; None where that cannot be told: a path
        in the container (the server reads it), a repository without the file, or a rank that is not a positive
        integer. A repository the Hub does not serve to this token is a failure, as a model's is."""
        if source.startswith("/"):
            return None
        try:
            validate_repo_id(source)
        except HFValidationError:
            return None  # the spec's pattern admits only repo ids here: nothing to read
        token = checked_token(token)

        def read() -> tuple[_AdapterConfig, int]:
            config = _Fetch(self, source, "main", token, tenant).json(
                ADAPTER_CONFIG, required=False, limit=self.max_config_bytes
            )
            rank = config.get("r") if isinstance(config, dict) else None
            positive = isinstance(rank, int) and not isinstance(rank, bool) and rank > 0
            return _AdapterConfig(rank if positive else None), 64

        answer = self._answer((source, "main", _credential(token)), self._adapters, read)
        assert isinstance(answer, _AdapterConfig), "the adapters' cache holds adapters' answers"
        return answer.rank

    def _answer(
        self, key: tuple[str, str, str], store: OrderedDict[Any, _Cached], read: Callable[[], tuple[_Answer, int]]
    ) -> _Answer:
        """`store`'s answer for `key`, else `read`'s (an answer and the bytes it holds), kept there: a failure a
        reconcile would meet again is answered again, a _Transient one is not kept."""
        answer = self._recall(key, store)
        if isinstance(answer, ModelConfigUnavailable):
            raise ModelConfigUnavailable(answer.message)  # a new one: raising the cached one would grow its traceback
        if answer is not None:
            return answer
        try:
            answer, size = read()
        except _Transient:
            raise
        except ModelConfigUnavailable as err:
            self._remember(key, ModelConfigUnavailable(err.message), sys.getsizeof(err.message), store)  # no traceback
            raise
        self._remember(key, answer, size, store)
        return answer

    def _recall(self, key: tuple[str, str, str], store: OrderedDict[Any, _Cached]) -> _Answer | None:
        with self._lock:
            cached = store.get(key)
            if cached is None:
                return None
            lifetime = FAILURE_SECONDS if isinstance(cached.answer, ModelConfigUnavailable) else self.cache_seconds
            if self.clock() - cached.stamp >= lifetime:
                del store[key]
                return None
            store.move_to_end(key)
            return cached.answer

    def _remember(
        self, key: tuple[str, str, str], answer: _Answer, size: int, store: OrderedDict[Any, _Cached]
    ) -> None:
        """Least recently used out first, down to cache_entries and cache_bytes (adapter_cache_entries for the
        adapters'); an answer larger than cache_bytes on its own is not kept."""
        models = store is self._cache
        entries = self.cache_entries if models else self.adapter_cache_entries
        with self._lock:
            store.pop(key, None)
            if size > self.cache_bytes:
                return
            store[key] = _Cached(self.clock(), answer, size)
            while len(store) > entries or (models and self.cached_bytes > self.cache_bytes):
                store.popitem(last=False)

    @property
    def cached_bytes(self) -> int:
        return sum(cached.size for cached in self._cache.values())


def _credential(token: str | None) -> str:
    """What a cache key holds of a token: its digest (answers differ by who asks; the token itself is not kept)."""
    return hashlib.sha256(token.encode()).hexdigest() if token else ""


def summarize_headers(headers: Sequence[Any]) -> CheckpointTensors:
    """huggingface_hub's safetensors headers, one per file (a local directory's), summed."""
    tensors = ((name, info.dtype, info.shape) for header in headers for name, info in header.tensors.items())
    return summarize(tensors, files=len(headers))


def checked_token(token: str | None) -> str | None:
    """A token as a Secret holds it: surrounding whitespace (a file's newline) trimmed; anything an HTTP header
    cannot carry refused with a message that never shows it."""
    if token is None:
        return None
    token = token.strip()
    if not token:
        return None
    if not token.isascii() or not token.isprintable() or any(ch.isspace() for ch in token):
        raise ModelConfigUnavailable(
            "the Hugging Face token in spec.hfTokenSecret is not a token (it holds spaces, control or non-ASCII "
            "characters); store the token alone in the Secret's key"
        )
    return token


@dataclass(frozen=True)
class NamespaceHub:
    """The client as one namespace's reconciles ask it (gather's ModelConfigSource and AdapterConfigSource)."""

    client: HubClient
    namespace: str

    def fetch(self, name: str, revision: str | None, token: str | None) -> ModelFiles:
        return self.client.fetch(name, revision, token, tenant=self.namespace)

    def adapter_rank(self, source: str, token: str | None) -> int | None:
        return self.client.adapter_rank(source, token, tenant=self.namespace)


class _Readers:
    """Header reads at once: `total` for the client, at most `per_tenant` of them for one tenant (a namespace), so
    one tenant's checkpoints of many shards never hold every reader while another's wait. A read without a tenant
    (the CLI) is bound by the total alone."""

    def __init__(self, total: int, per_tenant: int) -> None:
        self.total, self.per_tenant = total, per_tenant
        self.held: dict[str | None, int] = {}
        self._changed = threading.Condition()

    @contextmanager
    def slot(self, tenant: str | None, deadline: float) -> Iterator[None]:
        """One reader, waited for until `deadline` (time.monotonic), then _Transient."""
        with self._changed:
            while sum(self.held.values()) >= self.total or (
                tenant is not None and self.held.get(tenant, 0) >= self.per_tenant
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Transient("the Hub's readers stayed busy: tried again on a later reconcile")
                self._changed.wait(left)
            self.held[tenant] = self.held.get(tenant, 0) + 1
        try:
            yield
        finally:
            with self._changed:
                self.held[tenant] -= 1
                if not self.held[tenant]:
                    del self.held[tenant]
                self._changed.notify_all()


@dataclass
class _Fetch:
    """One model's files from the Hub, within the client's request budget and time."""

    client: HubClient
    name: str
    revision: str
    token: str | None
    tenant: str | None = None
    header_bytes: int = field(default=0, init=False)  # declared by the headers read so far
    requests: int = field(default=0, init=False)
    deadline: float = field(default=0.0, init=False)  # time.monotonic(): the injected clock is the cache's
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.client.fetch_seconds

    def files(self) -> ModelFiles:
        config = self.json("config.json", required=True, limit=self.client.max_config_bytes)
        if not isinstance(config, dict):
            raise ModelConfigUnavailable(f"config.json of {self.name} is a JSON {type(config).__name__}, not an object")
        index = self.body(INDEX_FILE, required=False, limit=self.client.max_json_bytes)
        total, shards = index_facts(index) if index is not None else (None, [])
        tensors = self.tensors(shards if index is not None else [SINGLE_FILE])
        return ModelFiles(config=config, checkpoint_total_bytes=total, tensors=tensors)

    def json(self, filename: str, *, required: bool, limit: int) -> Any:
        body = self.body(filename, required=required, limit=limit)
        if body is None:
            return None
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as err:
            raise ModelConfigUnavailable(f"{filename} of {self.name} is not JSON ({type(err).__name__})") from None

    def body(self, filename: str, *, required: bool, limit: int) -> bytes | None:
        """A file's bytes, at most `limit`; None for a file that is not required and not there."""
        try:
            with self._get(filename) as response:
                body = b"".join(_capped(self._in_time(response.iter_bytes()), limit, filename))
        except HfHubHTTPError as err:  # RepositoryNotFound, RevisionNotFound, EntryNotFound, Gated...
            status = _status(err)
            if not required and status == 404:
                return None
            error = _Transient if status is not None and (status == 429 or status >= 500) else ModelConfigUnavailable
            raise error(self._http_hint(filename, err)) from None
        except httpx2.HTTPError as err:
            raise _Transient(f"cannot reach {self.client.endpoint} for {self.name}: {type(err).__name__}") from None
        return body

    def tensors(self, shards: list[str]) -> CheckpointTensors | None:
        """The checkpoint's tensors from its safetensors headers; None (size from the index or the formula) when
        there are none or one cannot be read; ModelConfigUnavailable when they are beyond the client's caps."""
        if not shards or len(shards) > MAX_SHARDS:
            return None
        total = _Sum()
        try:
            with ThreadPoolExecutor(min(HEADER_READERS, len(shards))) as pool:
                # One running total, added to in the shards' order (the first shard's error is the one raised), a
                # reader's worth of shards at a time: no more summaries are held than there are readers.
                for start in range(0, len(shards), HEADER_READERS):
                    for tensors in pool.map(self._shard_tensors, shards[start : start + HEADER_READERS]):
                        total.add(tensors)
        except CheckpointUnreadable:
            return None
        return total.tensors()

    def _shard_tensors(self, shard: str) -> CheckpointTensors:
        """One shard's tensors (_read_shard), its errors raised afresh out of the except block: their tracebacks'
        frames hold a header, and a failed future keeps its error until the pool is done."""
        try:
            return self._read_shard(shard)
        except ModelConfigUnavailable as err:
            error: Exception = type(err)(err.message)  # _Transient stays so: not cached
        except (CheckpointUnreadable, HfHubHTTPError, httpx2.HTTPError) as err:
            error = CheckpointUnreadable(f"{shard[:100]}: {type(err).__name__}")
        raise error

    def _read_shard(self, shard: str) -> CheckpointTensors:
        """Its header read and summed while holding one of the client's readers: at once at most HEADER_READERS
        headers of at most max_header_bytes."""
        with self.client._readers.slot(self.tenant, self.deadline):
            header = self._prefix(shard, HEADER_PROBE_BYTES)
            if len(header) < 8:
                raise CheckpointUnreadable(f"{shard} is shorter than a safetensors header")
            length = int.from_bytes(header[:8], "little")
            self._count_header(shard, length)
            if len(header) < 8 + length:
                header = self._prefix(shard, 8 + length)
            if len(header) < 8 + length:
                raise CheckpointUnreadable(f"{shard} ends within its header")
            del header[8 + length :]  # in place: no copy of a header
            del header[:8]
            return summarize(_header_tensors(header), files=1)

    def _count_header(self, shard: str, length: int) -> None:
        """A header's declared length against the caps, before it is read."""
        if length > self.client.max_header_bytes:
            raise ModelConfigUnavailable(
                f"the safetensors header of {shard[:100]} in {self.name}@{self.revision} declares {length} bytes, "
                f"over the {self.client.max_header_bytes / 2**20:g} MiB a checkpoint's header needs: give "
                "spec.model.config and spec.model.weightsBytes to size it without reading its headers"
            )
        with self._lock:
            self.header_bytes += length
            over = self.header_bytes > self.client.max_headers_bytes
        if over:
            raise ModelConfigUnavailable(
                f"the safetensors headers of {self.name}@{self.revision} declare more than "
                f"{self.client.max_headers_bytes / 2**20:g} MiB together, more than a checkpoint's: give "
                "spec.model.config and spec.model.weightsBytes to size it without reading its headers"
            )

    def _prefix(self, filename: str, size: int) -> bytearray:
        """The file's first `size` bytes (fewer if it is shorter), however much the server sends; one of the
        fetch's max_requests, beyond which the headers are not summed."""
        with self._lock:
            self.requests += 1
            over = self.requests > self.client.max_requests
        if over:
            raise CheckpointUnreadable(f"more than {self.client.max_requests} requests for its headers")
        body = bytearray()
        with self._get(filename, byte_range=f"bytes=0-{size - 1}") as response:
            for chunk in self._in_time(response.iter_bytes()):
                body += chunk[: size - len(body)]
                if len(body) == size:
                    break
        return body

    @contextmanager
    def _get(self, filename: str, byte_range: str | None = None) -> Iterator[httpx2.Response]:
        """A streamed GET of one of the model's files; huggingface_hub's typed error for an HTTP error."""
        self._check_time()
        url = hf_hub_url(self.name, filename, revision=self.revision, endpoint=self.client.endpoint)
        headers = build_hf_headers(token=self.token or False, library_name=LIBRARY)
        if byte_range:
            headers["Range"] = byte_range
        with get_session().stream("GET", url, headers=headers, timeout=self.client.timeout_seconds) as response:
            if response.status_code >= 400:
                response.read()
            hf_raise_for_status(response)
            yield response

    def _in_time(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            self._check_time()
            yield chunk

    def _check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise _Transient(
                f"reading {self.name}@{self.revision} from {self.client.endpoint} took over "
                f"{self.client.fetch_seconds:g} s: tried again on a later reconcile"
            )

    def _http_hint(self, filename: str, err: HfHubHTTPError) -> str:
        status = _status(err)
        if isinstance(err, GatedRepoError) or status == 401:
            hint = "gated or private: set spec.hfTokenSecret"
        elif status == 403:
            hint = "access denied for this token"
        elif isinstance(err, RevisionNotFoundError):
            hint = "no such revision"
        elif status == 404:
            hint = "no such model or revision"
        else:
            hint = f"HTTP {status}"
        return f"{filename} of {self.name}@{self.revision} from {self.client.endpoint}: {hint}"


def _header_tensors(header: bytearray) -> Iterator[tuple[str, str, list[Any]]]:
    """(name, dtype, shape) of a safetensors header's tensors, decoded one at a time: in memory the header's bytes
    and one tensor's facts, never the whole header as Python objects (up to ~25 times its bytes for a hostile
    one). __metadata__ is passed over unread."""
    opened = _HEADER_OPEN.match(header)
    position, closed = (opened.end() if opened else 0), False
    while opened and not closed:
        member = _MEMBER.match(header, position)
        if member is None:
            break
        position, closed = member.end(), member[3] != b","
        if member[1] == b'"__metadata__"':
            continue
        if member.end(2) - member.start(1) > MAX_MEMBER_BYTES:
            raise CheckpointUnreadable(f"a tensor's entry is longer than {MAX_MEMBER_BYTES} bytes")
        try:
            name, facts = json.loads(member[1]), json.loads(member[2])
        except ValueError:
            raise CheckpointUnreadable("a tensor's entry is not JSON") from None
        dtype, shape = facts.get("dtype"), facts.get("shape")
        if not isinstance(dtype, str) or not isinstance(shape, list):
            raise CheckpointUnreadable(f"tensor {name[:80]!r} has no dtype and shape")
        yield name, dtype, shape
    if not closed:
        raise CheckpointUnreadable("a safetensors header is not a JSON object of tensors")


class _Sum:
    """The checkpoint's tensors from its files' (each summed by `summarize`), as `summarize` sums them all."""

    def __init__(self) -> None:
        self.elements: dict[tuple[str, int], int] = {}
        self.files = self.count = 0

    def add(self, tensors: CheckpointTensors) -> None:
        for dtype, layer, count in tensors.elements:
            self.elements[dtype, layer] = self.elements.get((dtype, layer), 0) + count
        self.files += 1
        self.count += tensors.tensors

    def tensors(self) -> CheckpointTensors:
        elements = tuple((dtype, layer, count) for (dtype, layer), count in sorted(self.elements.items()))
        return CheckpointTensors(elements, files=self.files, tensors=self.count)


def _footprint(value: object, limit: int) -> int:
    """The bytes a parsed JSON value (dicts, lists, tuples, scalars) holds, counted up to just past `limit`."""
    total, pending = 0, [value]
    while pending and total <= limit:
        item = pending.pop()
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return total


def _status(err: HfHubHTTPError) -> int | None:
    response = getattr(err, "response", None)
    return getattr(response, "status_code", None)


def _capped(chunks: Iterator[bytes], limit: int, filename: str) -> Iterator[bytes]:
    read = 0
    for chunk in chunks:
        read += len(chunk)
        if read > limit:
            raise ModelConfigUnavailable(f"{filename} is larger than {limit // 2**20} MiB: not a model's file")
        yield chunk


_TOTAL_SIZE = re.compile(rb'"total_size"' + _SPACE + rb":" + _SPACE + rb"(\d{1,20})" + _SPACE + rb"[,}]")
_WEIGHT_MAP = re.compile(rb'"weight_map"' + _SPACE + rb":" + _SPACE + rb"\{")
_ENTRY = re.compile(
    _SPACE + rb"(" + _STRING + rb")" + _SPACE + rb":" + _SPACE + rb"(" + _STRING + rb")" + _SPACE + rb"(,|\})"
)


def index_facts(index: bytes) -> tuple[int | None, list[str]]:
    """(metadata.total_size, the shard files) of a safetensors index, each None/empty when it has none: read from
    its bytes an entry at a time (json.loads of a 16 MiB index of empty lists holds ~400 MiB of objects), keeping
    the distinct shard names alone, at most MAX_SHARDS of them."""
    found = _TOTAL_SIZE.search(index)
    total = int(found[1]) if found else None
    start = _WEIGHT_MAP.search(index)
    shards: set[str] = set()
    position = start.end() if start else len(index)
    while start:
        entry = _ENTRY.match(index, position)
        if entry is None:
            return total, []  # not an object of names to file names
        position = entry.end()
        try:
            shard = json.loads(entry[2])
        except ValueError:
            return total, []
        if shard.endswith(".safetensors") and "/" not in shard.strip("/"):
            shards.add(shard)
            if len(shards) > MAX_SHARDS:
                return total, []
        if entry[3] == b"}":
            break
    return total, sorted(shards)
