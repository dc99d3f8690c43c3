"""The router's HAProxy as its pod runs it (testbed/haproxy_pod.py: the router image's root filesystem, the ConfigMap
and command `cpullm render` gives a throughput service with `routing.router.affinity: prefix`), in front of two
stand-in servers on this machine: a conversation's turns reach one server, new conversations are spread by least
connections, and one hot conversation takes no more of its server than maxNumSeqs and its bound (loadFactor) allow,
its overflow served by the other server with no failed request. The only edit to the rendered configuration: its
servers' DNS name becomes the stand-ins' addresses. Pytest marker `kind` (root: a mount namespace, an overlay and
chroot), run with the kind tests."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from testbed.haproxy_pod import HAProxyPod
from testbed.objects import SAMPLE_NODES, tiny_service
from testbed.stand_in import StandInHandler, StandInServer
from testbed.tools import ROOT, eventually, free_port

from cpullm.core.children.router import CONFIG_FILE, CONFIG_MOUNT, HEALTH_PORT

pytestmark = [pytest.mark.kind, pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace and chroot need root")]
SERVING = 1  # maxNumSeqs: what each server runs at once
LOAD_FACTOR = 200  # a conversation's server holds at most twice that: one running, one waiting (maxqueue 1)


class StandIn(StandInHandler):
    """A server's shape: answers a POST after the body's `seconds` with its name, counting the requests it holds at
    once; GET /health is the router's check."""

    server: Server

    def do_GET(self) -> None:
        self.answer_json({})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        with self.server.lock:
            self.server.holding += 1
            self.server.most = max(self.server.most, self.server.holding)
        time.sleep(float(body.get("seconds", 0)))
        with self.server.lock:
            self.server.holding -= 1
        self.answer_json({"server": self.server.name})


class Server(StandInServer):
    def __init__(self, name: str) -> None:
        super().__init__(name, StandIn)
        self.holding, self.most = 0, 0  # requests held now, and at most


@dataclass(frozen=True)
class Bed:
    url: str
    servers: tuple[Server, ...]

    def ask(self, conversation: str, turn: int = 0, seconds: float = 0.0) -> str:
        """One turn of a chat: a system prompt every conversation shares, the conversation's first message, and
        `turn` more messages; answers the server's name."""
        messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": conversation}]
        messages += [{"role": "assistant" if i % 2 == 0 else "user", "content": f"turn {i}"} for i in range(turn)]
        body = json.dumps({"model": "tiny", "messages": messages, "seconds": seconds}).encode()
        request = urllib.request.Request(self.url, data=body, headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return str(json.loads(answer.read())["server"])


def rendered_router(port: int, tmp: Path) -> tuple[str, str]:
    """The router's configuration and container command as `cpullm render` gives them."""
    service = tiny_service(
        "chat",
        "serving",
        placement="throughput",
        maxNumSeqs=SERVING,
        nodeSelector=None,  # the sample nodes as the file has them
        service={"port": port},
        routing={"mode": "router", "router": {"affinity": "prefix", "loadFactor": LOAD_FACTOR}},
    )
    path = tmp / "service.yaml"
    path.write_text(yaml.safe_dump(service))
    done = subprocess.run(
        [sys.executable, "-m", "cpullm", "render", str(path), "--nodes", str(SAMPLE_NODES), "-o", "yaml"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    children = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(done.stdout)}
    config = children["ConfigMap", "chat-router"]["data"][CONFIG_FILE]
    container = children["Deployment", "chat-router"]["spec"]["template"]["spec"]["containers"][0]
    return config, shlex.join(container["command"])


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    servers = (Server("a"), Server("b"))
    for server in servers:
        server.start()
    port, health = free_port(), free_port()
    config, command = rendered_router(port, tmp_path_factory.mktemp("router"))
    template = next(line for line in config.splitlines() if line.startswith("  server-template "))
    here = "\n".join(f"  server server{i} 127.0.0.1:{s.server_port}" for i, s in enumerate(servers, 1))
    config = config.replace(template, here).replace(f"bind :{HEALTH_PORT}", f"bind :{health}")
    pod = HAProxyPod({CONFIG_FILE: config}, config_dir=CONFIG_MOUNT.lstrip("/"), command=command)
    pod.start()
    ready = f"http://127.0.0.1:{health}/ready"

    def up() -> bool:
        try:
            with urllib.request.urlopen(ready, timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    try:
        eventually(up, timeout=30, what="the router ready")
        yield Bed(f"http://127.0.0.1:{port}/v1/chat/completions", servers)
    finally:
        pod.stop()
        for server in servers:
            server.stop()


def test_a_conversations_turns_reach_the_server_that_served_it(router: Bed):
    for conversation in ("alpha", "beta", "gamma"):
        first = router.ask(conversation)
        assert [router.ask(conversation, turn) for turn in range(1, 6)] == [first] * 5, conversation


def test_new_conversations_are_spread_by_least_connections_and_then_stay(router: Bed):
    names = [f"new-{i}" for i in range(4)]
    with ThreadPoolExecutor(4) as pool:  # each holds its server 0.5 s: the next new one sees it busy
        placed = dict(zip(names, pool.map(lambda name: router.ask(name, seconds=0.5), names), strict=True))
    assert sorted(Counter(placed.values()).values()) == [2, 2], placed
    assert {name: router.ask(name, 1) for name in names} == placed


def test_one_hot_conversation_takes_no_more_than_its_bound(router: Bed):
    home = router.ask("hot")
    other = next(server.name for server in router.servers if server.name != home)
    for server in router.servers:
        server.most = 0
    with ThreadPoolExecutor(4) as pool:  # four turns at once, each holding a server 1 s
        served = Counter(pool.map(lambda turn: router.ask("hot", turn, seconds=1.0), range(1, 5)))
    # Its server runs one and holds one waiting (loadFactor 200 of maxNumSeqs 1); the other two went to the other
    # server (one running, one waiting there), and none failed.
    held = SERVING * LOAD_FACTOR // 100
    assert served == {home: held, other: 4 - held}, served
    assert max(server.most for server in router.servers) <= SERVING, "a server was sent more than maxNumSeqs"
