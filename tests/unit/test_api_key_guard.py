"""The API key guard as vLLM's --middleware runs it: an ASGI app wrapped, every path but health and metrics
refused without the key (tests/vllm/test_api_key.py serves a real model behind it)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cpullm import vllm_support
from cpullm.api_key_guard import METRICS_ENV, ApiKeyGuard

KEY = "sk-guarded"


def call(
    scope: dict[str, Any], monkeypatch: pytest.MonkeyPatch, metrics: str | None = None
) -> tuple[list[dict[str, Any]], bool]:
    """What the guard sent, and whether the wrapped app was reached (`metrics`: the guard's METRICS_ENV)."""
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    if metrics is not None:
        monkeypatch.setenv(METRICS_ENV, metrics)
    reached = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request"}

    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    asyncio.run(ApiKeyGuard(app)(scope, receive, send))
    return sent, bool(reached)


def http(path: str, method: str = "POST", *headers: tuple[bytes, bytes]) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "headers": list(headers)}


BEARER = (b"authorization", f"Bearer {KEY}".encode())


@pytest.mark.parametrize(
    ("scope", "reached"),
    [
        (http("/v1/completions"), False),
        (http("/invocations"), False),  # vLLM's own key check misses it (vllm#58144)
        (http("/tokenize"), False),
        (http("/pooling"), False),
        (http("/score"), False),
        (http("/rerank"), False),
        (http("/a-route-a-later-vllm-adds", "GET"), False),
        (http("/v1/completions", "POST", (b"authorization", b"Bearer sk-wrong")), False),
        (http("/v1/completions", "POST", (b"authorization", KEY.encode())), False),  # no scheme
        (http("/v1/completions", "POST", BEARER, BEARER), False),  # two: which one counts is not guessed
        (http("/health", "GET"), True),
        (http("/metrics", "GET"), True),
        (http("/metrics/", "GET"), True),
        (http("/v1/completions", "OPTIONS"), True),
        (http("/v1/completions", "POST", BEARER), True),
        (http("/invocations", "POST", (b"Authorization", f"Bearer {KEY}".encode())), True),
        ({"type": "lifespan"}, True),
    ],
    ids=lambda v: (
        f"{v.get('method', '')} {v.get('path', v['type'])} {len(v.get('headers', ()))}"
        if isinstance(v, dict)
        else str(v)
    ),
)
def test_every_path_but_health_and_metrics_needs_the_key(scope, reached, monkeypatch):
    sent, app_reached = call(scope, monkeypatch)
    assert app_reached is reached
    if not reached:
        assert sent[0]["status"] == 401 and (b"www-authenticate", b"Bearer") in sent[0]["headers"]
        assert KEY.encode() not in sent[1]["body"]


def test_a_websocket_without_the_key_is_closed_before_it_is_accepted(monkeypatch):
    sent, reached = call({"type": "websocket", "path": "/v1/realtime", "headers": []}, monkeypatch)
    assert (reached, sent) == (False, [{"type": "websocket.close", "code": 1008}])


def test_without_a_key_the_server_does_not_start(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="refuses to start a server it cannot guard"):
        ApiKeyGuard(lambda *_: None)  # type: ignore[arg-type,return-value]


def from_(client: str, path: str, *headers: tuple[bytes, bytes]) -> dict[str, Any]:
    return {**http(path, "GET", *headers), "client": (client, 40000)}


@pytest.mark.parametrize(
    ("scope", "reached"),
    [
        (from_("10.0.0.7", "/metrics"), False),  # Prometheus, or anyone in the cluster, without the key
        (from_("10.0.0.7", "/metrics/"), False),
        (from_("10.0.0.7", "/metrics", BEARER), True),  # the PodMonitor sends it
        (from_("127.0.0.1", "/metrics"), True),  # the drain hook, inside the pod
        (from_("::1", "/metrics"), True),
        (from_("127.0.0.1", "/v1/models"), False),  # loopback opens /metrics alone
        (from_("10.0.0.7", "/health"), True),  # the kubelet's probes and the router's checks
        (http("/metrics", "GET"), False),  # no client address: not the pod itself
    ],
    ids=lambda v: (
        f"{(v.get('client') or ('none',))[0]} {v['path']} {len(v['headers'])}" if isinstance(v, dict) else str(v)
    ),
)
def test_metrics_need_the_key_where_the_spec_says_so_but_from_the_pod_itself(scope, reached, monkeypatch):
    """spec.apiKeySecret.metrics: key (the guard's METRICS_ENV): /metrics is closed like any route, but to the pod's
    own loopback (the drain hook reads it from there)."""
    sent, app_reached = call(scope, monkeypatch, "key")
    assert app_reached is reached
    if not reached:
        assert sent[0]["status"] == 401


def test_the_guards_metrics_switch_is_the_one_the_operator_renders():
    """The guard runs alone in the pod and spells the variable itself; the operator's is vllm_support's."""
    assert METRICS_ENV == vllm_support.GUARD_METRICS_ENV
