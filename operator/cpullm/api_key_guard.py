"""The API key on every path of vLLM's server: an ASGI middleware vLLM loads through its own `--middleware` flag.

vLLM's VLLM_API_KEY guards only the path prefixes /v1, /v2, /inference and /cohere (vLLM 0.32): /invocations
serves completions without it (vllm#58144), and /tokenize, /pooling, /classify, /score and /rerank are open too.
This guard refuses every request without `Authorization: Bearer <key>` but those of the server's health and
metrics (the probes, the router's checks, the drain hook and Prometheus), whatever routes a vLLM version adds:
a new route is closed until listed here. With METRICS_ENV=key (spec.apiKeySecret.metrics), /metrics needs the key
too, but from the pod itself (the drain hook asks 127.0.0.1). The key is VLLM_API_KEY, which the operator sets from
spec.apiKeySecret; without it the server does not start (never open by mistake). Stdlib only: it runs in the vLLM
image, shipped in the launcher's ConfigMap.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

KEY_ENV = "VLLM_API_KEY"
METRICS_ENV = "CPULLM_GUARD_METRICS"  # "key": /metrics needs the key from anywhere but the pod itself
# Paths answered without the key: health for the kubelet's probes and the router, metrics for Prometheus and the
# drain hook (the metrics app answers /metrics/ too).
HEALTH_PATHS = frozenset({"/health"})
METRICS_PATHS = frozenset({"/metrics", "/metrics/"})
LOOPBACK = frozenset({"127.0.0.1", "::1"})
REFUSED_BODY = json.dumps({"error": "Unauthorized: this server requires 'Authorization: Bearer <API key>'"}).encode()

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class ApiKeyGuard:
    """vLLM adds a middleware class with `app.add_middleware(ApiKeyGuard)`: it gets the app and nothing else."""

    def __init__(self, app: App) -> None:
        key = os.environ.get(KEY_ENV, "")
        if not key:
            raise RuntimeError(f"{KEY_ENV} is empty: the API key guard refuses to start a server it cannot guard")
        self.app = app
        self._expected = f"Bearer {key}".encode()
        self._metrics_need_key = os.environ.get(METRICS_ENV) == "key"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self._allowed(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # before accepting: the handshake gets 403
        else:
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                }
            )
            await send({"type": "http.response.body", "body": REFUSED_BODY})

    def _allowed(self, scope: Scope) -> bool:
        """Health and metrics (metrics from the pod itself alone, where they need the key), a CORS preflight (it
        carries no credentials and reaches no route), or the key."""
        path = scope.get("path")
        if path in HEALTH_PATHS or scope.get("method") == "OPTIONS":
            return True
        if path in METRICS_PATHS and (not self._metrics_need_key or (scope.get("client") or ("",))[0] in LOOPBACK):
            return True
        presented = [value for name, value in scope.get("headers") or () if name.lower() == b"authorization"]
        return len(presented) == 1 and hmac.compare_digest(presented[0], self._expected)
