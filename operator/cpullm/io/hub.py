"""The Hugging Face Hub (or a mirror) through huggingface_hub: config.json, the safetensors index, and every
safetensors header (range requests, as `HfApi.parse_safetensors_file_metadata` reads them), so a model is sized
from its checkpoint's real bytes. huggingface_hub builds the URLs and auth headers and types the Hub's errors;
its HTTP client drops the token on a redirect to another host. Responses are size-capped; results are cached in
a bounded LRU keyed by the model, the revision and a digest of the credential, so one tenant's private answer
never serves another."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx2
from huggingface_hub import HfApi, get_session, hf_hub_url, hf_raise_for_status
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    RevisionNotFoundError,
    SafetensorsParsingError,
)
from huggingface_hub.utils._headers import build_hf_headers  # huggingface_hub.utils re-exports them implicitly
from huggingface_hub.utils._validators import validate_repo_id

from cpullm.core.sizing import CheckpointTensors, CheckpointUnreadable, ModelFiles, summarize
from cpullm.errors import InvalidSpec, ModelConfigUnavailable

LIBRARY = "cpullm-operator"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MAX_SHARDS = 4096
HEADER_READERS = 8  # safetensors headers read at once (a 163-shard checkpoint in ~20 round trips)


@dataclass
class HubClient:
    endpoint: str
    timeout_seconds: float = 10.0
    cache_seconds: float = 3600.0
    max_json_bytes: int = 16 * 2**20  # a 1T-parameter model's index is ~6 MiB
    cache_entries: int = 64
    allow_http: bool = False
    _cache: OrderedDict[tuple[str, str, str], tuple[float, ModelFiles]] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if not self.endpoint.startswith("https://") and not (self.allow_http and self.endpoint.startswith("http://")):
            raise ValueError(
                f"the Hub endpoint {self.endpoint[:200]!r} is not https:// (tokens would travel in the clear): "
                "use https, or allow http explicitly (CPULLM_HUB_ALLOW_HTTP=true) for a mirror on a trusted network"
            )

    def fetch(self, name: str, revision: str | None, token: str | None) -> ModelFiles:
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
        key = (name, revision or "main", hashlib.sha256(token.encode()).hexdigest() if token else "")
        with self._lock:
            cached = self._cache.get(key)
            if cached and time.monotonic() - cached[0] < self.cache_seconds:
                self._cache.move_to_end(key)
                return cached[1]
        files = _Fetch(self, name, key[1], token).files()
        with self._lock:
            self._cache[key] = (time.monotonic(), files)
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_entries:
                self._cache.popitem(last=False)
        return files


def summarize_headers(headers: Sequence[Any]) -> CheckpointTensors:
    """huggingface_hub's safetensors headers, one per file (a Hub repo's or a local directory's), summed."""
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


@dataclass
class _Fetch:
    """One model's files from the Hub."""

    client: HubClient
    name: str
    revision: str
    token: str | None

    @property
    def api(self) -> HfApi:
        return HfApi(endpoint=self.client.endpoint, token=self.token or False, library_name=LIBRARY)

    def files(self) -> ModelFiles:
        config = self.json("config.json", required=True)
        if not isinstance(config, dict):
            raise ModelConfigUnavailable(f"config.json of {self.name} is a JSON {type(config).__name__}, not an object")
        index = self.json(INDEX_FILE, required=False)
        total, shards = _index_facts(index)
        tensors = self.tensors(shards if index is not None else [SINGLE_FILE])
        return ModelFiles(config=config, checkpoint_total_bytes=total, tensors=tensors)

    def json(self, filename: str, *, required: bool) -> Any:
        url = hf_hub_url(self.name, filename, revision=self.revision, endpoint=self.client.endpoint)
        headers = build_hf_headers(token=self.token or False, library_name=LIBRARY)
        try:
            with get_session().stream("GET", url, headers=headers, timeout=self.client.timeout_seconds) as response:
                if response.status_code >= 400:
                    response.read()
                hf_raise_for_status(response)
                body = b"".join(_capped(response.iter_bytes(), self.client.max_json_bytes, filename))
        except HfHubHTTPError as err:  # RepositoryNotFound, RevisionNotFound, EntryNotFound, Gated...
            if not required and _status(err) == 404:
                return None
            raise ModelConfigUnavailable(self._http_hint(filename, err)) from None
        except httpx2.HTTPError as err:
            raise ModelConfigUnavailable(
                f"cannot reach {self.client.endpoint} for {self.name}: {type(err).__name__}"
            ) from None
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as err:
            raise ModelConfigUnavailable(f"{filename} of {self.name} is not JSON ({type(err).__name__})") from None

    def tensors(self, shards: list[str]) -> CheckpointTensors | None:
        """The checkpoint's tensors from its safetensors headers; None (size from the index or the formula) when
        there are none or one cannot be read."""
        if not shards or len(shards) > MAX_SHARDS:
            return None
        try:
            with ThreadPoolExecutor(min(HEADER_READERS, len(shards))) as pool:
                headers = list(pool.map(self._header, shards))
            return summarize_headers(headers)
        except (SafetensorsParsingError, CheckpointUnreadable, HfHubHTTPError, httpx2.HTTPError, ValueError):
            return None

    def _header(self, shard: str) -> Any:
        return self.api.parse_safetensors_file_metadata(
            self.name, shard, revision=self.revision, timeout=self.client.timeout_seconds
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


def _index_facts(index: Any) -> tuple[int | None, list[str]]:
    """(metadata.total_size, the shard files) of a safetensors index, each None/empty when malformed."""
    if not isinstance(index, dict):
        return None, []
    metadata = index.get("metadata")
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    weight_map = index.get("weight_map")
    shards: list[str] = []
    if isinstance(weight_map, dict):
        names = {value for value in weight_map.values() if isinstance(value, str)}
        shards = sorted(name for name in names if name.endswith(".safetensors") and "/" not in name.strip("/"))
    return (total if type(total) is int else None), shards
