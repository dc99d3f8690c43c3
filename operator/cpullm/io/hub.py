"""Fetches a model's config.json (and model.safetensors.index.json when there is one) from the Hugging
Face Hub or a mirror, with a timeout, an optional token and a cache."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from cpullm.core.sizing import ModelFiles
from cpullm.errors import ModelConfigUnavailable


@dataclass
class HubClient:
    endpoint: str
    timeout_seconds: float = 10.0
    cache_seconds: float = 3600.0
    _cache: dict[tuple[str, str], tuple[float, ModelFiles]] = field(default_factory=dict)

    def fetch(self, name: str, revision: str | None, token: str | None) -> ModelFiles:
        if name.startswith("/"):
            raise ModelConfigUnavailable(f"model {name} is a path the operator cannot read: give spec.model.config")
        key = (name, revision or "main")
        cached = self._cache.get(key)
        if cached and time.monotonic() - cached[0] < self.cache_seconds:
            return cached[1]
        config = self._get_json(name, key[1], "config.json", token, required=True)
        assert config is not None
        index = self._get_json(name, key[1], "model.safetensors.index.json", token, required=False)
        total = (index or {}).get("metadata", {}).get("total_size")
        files = ModelFiles(config=config, checkpoint_total_bytes=int(total) if isinstance(total, int) else None)
        self._cache[key] = (time.monotonic(), files)
        return files

    def _get_json(self, name: str, revision: str, filename: str, token: str | None, *, required: bool) -> Any:
        url = f"{self.endpoint.rstrip('/')}/{name}/resolve/{urllib.parse.quote(revision, safe='')}/{filename}"
        request = urllib.request.Request(url, headers={"User-Agent": "cpullm-operator"})
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_seconds) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            if not required and err.code == 404:
                return None
            hint = {
                401: "gated or private: set spec.hfTokenSecret",
                403: "access denied for this token",
                404: "no such model or revision",
            }.get(err.code, f"HTTP {err.code}")
            raise ModelConfigUnavailable(f"{filename} of {name}@{revision} from {self.endpoint}: {hint}") from err
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            raise ModelConfigUnavailable(f"cannot reach {self.endpoint} for {name}: {err}") from err
        except ValueError as err:
            raise ModelConfigUnavailable(f"{filename} of {name} is not JSON: {err}") from err
