"""The CpuLLMGateway's HAProxy as its pod runs it (testbed/haproxy_pod.py: the image's root filesystem, the rendered
ConfigMap and start script, the teams' keys as mounted Secrets), in front of two stand-in OpenAI servers on this
machine: each team reaches exactly its models, a wrong key is 401, an ungranted model 403, an unknown one 404, a team
over its rate or its generated tokens a minute 429 with Retry-After, GET /v1/models lists the team's models, a
service's own key is sent in place of the team's, a stream passes unbuffered, and a key rotated under steady traffic
drops no request. Pytest marker `kind` (root: a mount namespace, an overlay and chroot), run with the kind tests."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message
from typing import Any

import pytest
from testbed.haproxy_pod import HAProxyPod
from testbed.stand_in import StandInHandler, StandInServer
from testbed.tools import eventually, free_port, scrape

from cpullm.api.gateway import parse_gateway_spec
from cpullm.core.gateway import HEALTH_PORT, GatewayOwner, config_files, routes

pytestmark = [pytest.mark.kind, pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace and chroot need root")]
NAMESPACE = "teams"
STREAM_PAUSE = 0.3  # between a stand-in server's streamed chunks


class StandIn(StandInHandler):
    """An OpenAI server's shape (taking `seconds` to answer): echoes the model and the Authorization it was sent, with
    a usage (prompt tokens: the prompt's characters; generated: max_tokens, else 7) that it also counts, as vLLM
    counts its tokens; streams when asked, the usage in a last chunk where the request asked
    stream_options.include_usage."""

    server: CountingServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        time.sleep(float(body.get("seconds", 0)))  # a request that holds the server this long
        seen = {"server": self.server.name, "model": body.get("model"), "auth": self.headers.get("authorization")}
        usage = {"prompt_tokens": len(str(body.get("prompt", ""))), "completion_tokens": body.get("max_tokens", 7)}
        with self.server.lock:
            self.server.tokens[0] += usage["prompt_tokens"]
            self.server.tokens[1] += usage["completion_tokens"]
        if body.get("stream"):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            chunks = [f"data: {json.dumps(seen)}\n\n"]
            if (body.get("stream_options") or {}).get("include_usage"):
                chunks.append(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n")
            for chunk in (*chunks, "data: [DONE]\n\n"):
                data = chunk.encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
                time.sleep(STREAM_PAUSE)
            self.wfile.write(b"0\r\n\r\n")
            return
        self.answer_json({**seen, "usage": {**usage, "total_tokens": sum(usage.values())}})


class CountingServer(StandInServer):
    def __init__(self, name: str) -> None:
        super().__init__(name, StandIn)
        self.tokens = [0, 0]  # prompt, generated


def stand_in(name: str) -> CountingServer:
    server = CountingServer(name)
    server.start()
    return server


def service(name: str, model: str, port: int, adapters: tuple[str, ...] = (), key: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": model, "config": {}},
        "adapters": [{"name": a, "source": "org/adapter", "rank": 8} for a in adapters],
        "service": {"port": port},
    }
    if key:
        spec["apiKeySecret"] = {"name": key}
    return {"metadata": {"name": name}, "spec": spec, "status": {"plan": {"maxNumSeqs": 4}}}


class Gateway:
    def __init__(self, port: int, health: int) -> None:
        self.url, self.health = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{health}"

    def usage(self) -> dict[str, float]:
        """GET /usage on the health port: each counter by its name and labels."""
        return scrape(self.health + "/usage")

    def up(self) -> bool:
        try:
            return self.call("key-b", "/v1/models")[0] == 200
        except urllib.error.URLError:
            return False

    def call(self, key: str | None, path: str, body: dict[str, Any] | None = None) -> tuple[int, Message, Any]:
        headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.headers, json.loads(answer.read())
        except urllib.error.HTTPError as err:
            return err.code, err.headers, json.loads(err.read())


@dataclass(frozen=True)
class Bed:
    front: Gateway
    pod: HAProxyPod
    servers: tuple[CountingServer, ...]


@pytest.fixture(scope="module")
def gateway() -> Iterator[Bed]:
    chat, code = stand_in("chat"), stand_in("code")
    port, health = free_port(), free_port()
    spec = parse_gateway_spec(
        {
            "services": ["chat", "code"],
            "port": port,
            "replicas": 1,
            "teams": [
                {
                    "name": "team-a",
                    "keySecret": {"name": "a"},
                    "models": ["tiny", "tiny-lora"],
                },
                {"name": "team-b", "keySecret": {"name": "b"}, "priority": 5},
                {"name": "team-r", "keySecret": {"name": "r"}, "models": ["tiny"], "requestsPerMinute": 30},
                {"name": "team-t", "keySecret": {"name": "t"}, "models": ["org/coder"], "generatedTokensPerMinute": 20},
            ],
        }
    )
    services = {
        "chat": service("chat", "tiny", chat.server_port, adapters=("tiny-lora",)),
        "code": service("code", "org/coder", code.server_port, key="code-key"),
    }
    files = config_files(GatewayOwner("front", NAMESPACE), spec, routes(spec, services))
    files["haproxy.cfg"] = files["haproxy.cfg"].replace(f"bind :{HEALTH_PORT}", f"bind :{health}")
    for name in ("chat", "code"):  # the services' addresses, here on this machine
        files["haproxy.cfg"] = files["haproxy.cfg"].replace(f"{name}.{NAMESPACE}.svc.cluster.local", "127.0.0.1")
    pod = HAProxyPod(
        files,
        {"team-a": "key-a\n", "team-b": "key-b", "team-r": "key-r", "team-t": "key-t"},
        env={"CPULLM_SERVICE_KEY_1": "the-servers-key"},
    )
    pod.start()
    front = Gateway(port, health)
    try:
        eventually(front.up, timeout=30, what="the gateway answering")
        yield Bed(front, pod, (chat, code))
    finally:
        pod.stop()
        for server in (chat, code):
            server.stop()


def test_each_team_reaches_exactly_its_models(gateway: Bed):
    front = gateway.front
    status, _, seen = front.call(
        "key-a", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "model": "tiny-lora"}
    )
    assert (status, seen["server"], seen["model"], seen["auth"]) == (200, "chat", "tiny-lora", None)
    status, _, seen = front.call("key-b", "/v1/completions", {"model": "org/coder", "prompt": "def"})
    # The service's own guard: the gateway sends its key, never the team's.
    assert (status, seen["server"], seen["auth"]) == (200, "code", "Bearer the-servers-key")
    status, _, error = front.call("key-a", "/v1/completions", {"model": "org/coder", "prompt": "def"})
    assert (status, error["error"]["code"]) == (403, "model_not_allowed")
    status, _, error = front.call("key-b", "/v1/completions", {"model": "gpt-4", "prompt": "x"})
    assert (status, error["error"]["code"]) == (404, "model_not_found")
    status, _, error = front.call("key-b", "/v1/completions", {"prompt": "x"})
    assert (status, error["error"]["code"]) == (400, "model_missing")
    for key in (None, "key-c", "KEY-A", ""):
        status, _, error = front.call(key, "/v1/completions", {"model": "tiny", "prompt": "x"})
        assert (status, error["error"]["code"]) == (401, "invalid_api_key"), key
    assert [m["id"] for m in front.call("key-a", "/v1/models")[2]["data"]] == ["tiny", "tiny-lora"]
    assert [m["id"] for m in front.call("key-b", "/v1/models")[2]["data"]] == ["org/coder", "tiny", "tiny-lora"]


def test_a_body_over_the_limit_is_refused(gateway: Bed):
    front = gateway.front
    status, _, error = front.call("key-b", "/v1/completions", {"model": "tiny", "prompt": "x" * (300 * 1024)})
    assert (status, error["error"]["code"]) == (413, "request_too_large")


def test_a_stream_passes_chunk_by_chunk(gateway: Bed):
    front = gateway.front
    body = json.dumps({"model": "tiny", "prompt": "x", "stream": True}).encode()
    request = urllib.request.Request(
        front.url + "/v1/completions",
        data=body,
        headers={"authorization": "Bearer key-b", "content-type": "application/json"},
    )
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=30) as answer:
        first = answer.readline()
        first_at = time.monotonic() - started
        rest = answer.read()
    assert first.startswith(b"data: {") and b"[DONE]" in rest
    assert first_at < 2 * STREAM_PAUSE, f"the first chunk came after {first_at:.2f} s: buffered"


def test_a_team_over_its_rate_waits(gateway: Bed):
    front = gateway.front
    answers = [front.call("key-r", "/v1/completions", {"model": "tiny", "prompt": "x"}) for _ in range(35)]
    statuses = [a[0] for a in answers]
    assert statuses[:30] == [200] * 30 and statuses[30:] == [429] * 5, statuses
    assert answers[-1][1].get("Retry-After") == "2" and answers[-1][2]["error"]["code"] == "rate_limit_exceeded"
    # Another team is not held by it.
    assert front.call("key-b", "/v1/completions", {"model": "tiny", "prompt": "x"})[0] == 200


def test_a_team_over_its_generated_tokens_a_minute_waits(gateway: Bed):
    """20 generated tokens a minute, 8 a request: admitted at 0, 8 and 16 tokens of the last minute, refused at 24
    until the first request's second leaves the window; a stream's tokens count where its usage says them."""
    front = gateway.front
    asked = {"model": "org/coder", "prompt": "x", "max_tokens": 8}
    statuses = [front.call("key-t", "/v1/completions", asked)[0] for _ in range(3)]
    status, headers, error = front.call("key-t", "/v1/completions", asked)
    assert (statuses, status, error["error"]["code"]) == ([200] * 3, 429, "rate_limit_exceeded")
    assert 55 <= int(headers["Retry-After"]) <= 60, headers["Retry-After"]
    # Another team is not held by it.
    assert front.call("key-b", "/v1/completions", asked)[0] == 200


def test_a_flooding_team_leaves_the_others_a_free_slot_when_the_servers_are_full(gateway: Bed):
    """The chat service runs 4 at once (maxNumSeqs 4, one replica); three teams may use it, so each may hold 2
    (4 less a slot for each other team). Team B (priority 5) sends 8 requests of a second each: 2 run, 6 wait in
    its slot. Team A (priority 0) asks once meanwhile: it runs at once, as it would alone (done after about 1 s; it
    took 2 s when B could fill every slot and A waited for the first to free, 3 s by priority alone)."""
    front = gateway.front
    slow = {"model": "tiny", "prompt": "x", "seconds": 1}
    alone_started = time.monotonic()
    assert front.call("key-a", "/v1/completions", slow)[0] == 200
    alone = time.monotonic() - alone_started
    flood = [threading.Thread(target=front.call, args=("key-b", "/v1/completions", slow)) for _ in range(8)]
    for thread in flood:
        thread.start()
    time.sleep(0.3)  # the flood is in: 2 running, 6 waiting in B's slot
    started = time.monotonic()
    status, _, _ = front.call("key-a", "/v1/completions", slow)
    waited = time.monotonic() - started
    flood_started = time.monotonic()
    for thread in flood:
        thread.join()
    assert status == 200
    assert waited < alone + 0.5, f"team A's request took {waited:.2f} s against {alone:.2f} s alone"
    # B's 8 ran 2 at a time: about 4 s from the first, so the flood was still on when A's ran.
    assert time.monotonic() - flood_started > 1.5


def test_usage_per_team_equals_what_the_servers_counted(gateway: Bed):
    front = gateway.front
    before, counted = front.usage(), [list(server.tokens) for server in gateway.servers]
    for max_tokens in (3, 11, 40):
        assert (
            front.call("key-a", "/v1/completions", {"model": "tiny", "prompt": "x" * 17, "max_tokens": max_tokens})[0]
            == 200
        )
    assert front.call("key-b", "/v1/completions", {"model": "org/coder", "prompt": "def f():"})[0] == 200
    streamed = {"model": "tiny", "prompt": "abc", "max_tokens": 5, "stream": True}
    for options in ({"include_usage": True}, {}):  # a stream counts its tokens where it asked for its usage
        body = json.dumps({**streamed, "stream_options": options}).encode()
        headers = {"authorization": "Bearer key-b", "content-type": "application/json"}
        with urllib.request.urlopen(
            urllib.request.Request(front.url + "/v1/completions", data=body, headers=headers)
        ) as answer:
            answer.read()
    assert front.call("key-a", "/v1/completions", {"model": "org/coder", "prompt": "x"})[0] == 403  # not counted
    after = front.usage()

    def grown(name: str, team: str, model: str) -> float:
        key = f'cpullm_gateway_{name}{{team="{team}",model="{model}"}}'
        return after.get(key, 0) - before.get(key, 0)

    assert [grown("requests_total", "team-a", "tiny"), grown("requests_total", "team-b", "tiny")] == [3, 2]
    assert grown("requests_total", "team-b", "org/coder") == 1 and grown("requests_total", "team-a", "org/coder") == 0
    assert grown("unmetered_requests_total", "team-b", "tiny") == 1  # the stream that did not ask
    assert (
        grown("prompt_tokens_total", "team-a", "tiny") == 3 * 17
        and grown("generation_tokens_total", "team-a", "tiny") == 54
    )
    assert (grown("prompt_tokens_total", "team-b", "tiny"), grown("generation_tokens_total", "team-b", "tiny")) == (
        3,
        5,
    )
    # What the gateway counted is what the servers counted, but the unmetered stream's (3 prompt, 5 generated).
    served = [
        [now - then for now, then in zip(server.tokens, was, strict=True)]
        for server, was in zip(gateway.servers, counted, strict=True)
    ]
    metered = [
        sum(
            grown(f"{name}_tokens_total", team, model)
            for team in ("team-a", "team-b")
            for model in ("tiny", "org/coder")
        )
        for name in ("prompt", "generation")
    ]
    assert [sum(s[0] for s in served) - 3, sum(s[1] for s in served) - 5] == metered


def test_a_key_rotates_under_traffic_without_a_failed_request(gateway: Bed):
    front, pod = gateway.front, gateway.pod
    failures: list[Any] = []
    done, moving = threading.Event(), threading.Event()
    counts = {"old": 0, "new": 0}

    def traffic() -> None:  # team-b's requests: the old key, then the new one once the clients are told to move
        while not done.is_set():
            key = "key-b2" if moving.is_set() else "key-b"
            try:
                status, _, _ = front.call(key, "/v1/completions", {"model": "tiny", "prompt": "x"})
            except Exception as err:  # a cut connection is a failure too
                failures.append(repr(err))
                continue
            if status == 200:
                counts["new" if key == "key-b2" else "old"] += 1
            else:
                failures.append((key, status))

    threads = [threading.Thread(target=traffic) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        eventually(lambda: counts["old"] > 20, timeout=30, what="steady traffic")
        pod.rotate("team-b", "key-b\nkey-b2\n")  # the new key beside the old, while the clients move to it
        eventually(lambda: front.call("key-b2", "/v1/models")[0] == 200, timeout=30, what="the new key admitted")
        moving.set()
        eventually(lambda: counts["new"] > 20, timeout=30, what="traffic on the new key")
        pod.rotate("team-b", "key-b2\n")  # then the old one goes
        eventually(lambda: front.call("key-b", "/v1/models")[0] == 401, timeout=30, what="the old key refused")
        settled = counts["new"]
        eventually(lambda: counts["new"] > settled + 20, timeout=30, what="traffic after the old key went")
    finally:
        done.set()
        for thread in threads:
            thread.join()
    assert failures == [], failures
    assert "keys changed, reloading" in pod.output()
