"""Benchmark, not a test: requests through the plain Service and through the router, side by side in one run, at
the same two real vLLM servers (the tiny random-weight model, throughput placement, one server of 1 CPU on each
worker of the quick start's kind cluster, testbed/spread.py).

    .venv/bin/python bench/routing_bench.py [--clients 6] [--seconds 120] [--rounds 2] [--chat] [--model qwen2.5-0.5b]

A client pod inside the cluster (Debian's python3.11, testbed/load.py mounted from a ConfigMap) sends bursty, mixed
streamed completions (prompts of 16-1024 tokens, 8-128 tokens out; a client pauses 2-8 s after a third of its
requests) for --seconds to one address, then to the other, --rounds times:

- service: a plain ClusterIP Service selecting the servers (what spec.routing mode service renders: kube-proxy
  picks a server per connection at random);
- router: the service's own Service, in front of the operator's HAProxy router (least connections).

Prints, per route: requests, failures, latency and time to first token at p50/p95/p99, and how many requests each
server finished (vLLM's vllm:request_success_total, before and after). Needs root and the kind stage's images
(a Docker engine from scripts/docker.sh, the vLLM environment); takes ~15 minutes and the machine's two CPUs.

With --chat, multi-turn conversations instead (testbed/load.py's Conversations: a shared system prompt, a first
message of its own, then turns that send the whole conversation so far), through three routes: the Service, the
router with `affinity: none` (least connections, the default) and the router with `affinity: prefix`, switched by
patching the service between them. Each route's rows add the time to first token of the later turns alone (what
the prefix cache can save) and the servers' prefix-cache hit rate (vLLM's prefix_cache_hits / _queries, in tokens).

--model serves a random-weight model of a published size (tests/vllm/make_sized_model.py, built once under the
models cache) in place of the tiny one: a prefill that takes seconds, where a cache miss costs what it would in use.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.images import build_debian
from testbed.load import percentile
from testbed.registry import push_archive
from testbed.spread import (
    NAMESPACE,
    SPREAD,
    QuickStart,
    deploy_spread,
    patch_spec,
    quick_start_cluster,
    router_ready,
    served,
    server_counters,
)
from testbed.tools import ROOT, Kubectl, eventually
from testbed.vllm_server import TINY, built_model, vllm_python

CLIENT = "routing-bench-client"
DIRECT = f"{SPREAD}-direct"


def client_objects(image: str) -> list[dict[str, Any]]:
    """The load's source in a ConfigMap, the pod that runs it, and the plain Service to compare with."""
    meta = {"namespace": NAMESPACE, "labels": {"app.kubernetes.io/name": CLIENT}}
    source = (ROOT / "testbed" / "load.py").read_text()
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {**meta, "name": CLIENT}, "data": {"load.py": source}},
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**meta, "name": CLIENT},
            "spec": {
                "containers": [
                    {
                        "name": "client",
                        "image": image,
                        "command": ["sleep", "infinity"],
                        "volumeMounts": [{"name": "load", "mountPath": "/load"}],
                    }
                ],
                "volumes": [{"name": "load", "configMap": {"name": CLIENT}}],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {**meta, "name": DIRECT},
            "spec": {"selector": {"cpullm.io/service": SPREAD}, "ports": [{"port": 8000, "targetPort": "http"}]},
        },
    ]


def drive(
    kubectl: Kubectl, host: str, model: str, clients: int, seconds: int, seed: int, chat: bool = False
) -> list[dict[str, Any]]:
    command = ["python3.11", "/load/load.py", host, "8000", model, str(clients), str(seconds), str(seed)]
    command += ["chat"] if chat else []
    out = kubectl.run("exec", CLIENT, "-n", NAMESPACE, "--", *command, timeout=seconds + 900).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def row(route: str, outcomes: list[dict[str, Any]], per_server: list[float]) -> list[str]:
    done = [o for o in outcomes if o["error"] is None]
    latency = [o["seconds"] for o in done]
    first = [o["first_token"] for o in done]

    def at(values: list[float]) -> str:
        return " / ".join(f"{percentile(values, q):.2f}" for q in (50, 95, 99))

    spread = " / ".join(f"{n:.0f}" for n in sorted(per_server, reverse=True))
    return [route, str(len(outcomes)), str(len(outcomes) - len(done)), at(latency), at(first), spread]


def failures(outcomes: list[dict[str, Any]]) -> str:
    """Why requests failed, most frequent first (an error's first 80 characters)."""
    counts: dict[str, int] = {}
    for outcome in outcomes:
        if outcome["error"] is not None:
            counts[outcome["error"][:80]] = counts.get(outcome["error"][:80], 0) + 1
    return "; ".join(f"{n} x {why}" for why, n in sorted(counts.items(), key=lambda item: -item[1])) or "none"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--chat", action="store_true", help="multi-turn conversations through three routes")
    parser.add_argument("--model", default=TINY, help=f"{TINY}, or a random-weight size of make_sized_model.py")
    parser.add_argument(
        "--bounds", type=int, nargs="*", default=[], help="with --chat, prefix routes at these loadFactors too"
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=2048,
        help="the servers' context (a random model's replies come back as several times their tokens)",
    )
    args = parser.parse_args(argv)
    model_dir = None if args.model == TINY else built_model(vllm_python(), args.model)
    docker = subprocess.run(
        [str(ROOT / "scripts" / "docker.sh"), "start"], check=True, capture_output=True, text=True
    ).stdout
    host = docker.strip().splitlines()[-1].removeprefix("DOCKER_HOST=")
    docker_env = {**os.environ, **({"DOCKER_HOST": host} if host else {})}
    try:
        with (
            tempfile.TemporaryDirectory(prefix="routing-bench-") as workdir,
            quick_start_cluster(docker_env, Path(workdir), model_dir) as quick_start,
        ):
            if args.chat:
                print(
                    table(
                        measure_chat(
                            quick_start, args.clients, args.seconds, args.rounds, args.bounds, args.max_model_len
                        ),
                        CHAT_HEADER,
                    )
                )
            else:
                print(table(measure(quick_start, args.clients, args.seconds, args.rounds)))
    finally:
        subprocess.run([str(ROOT / "scripts" / "docker.sh"), "stop"], check=True)
    return 0


def measure(quick_start: QuickStart, clients: int, seconds: int, rounds: int) -> list[list[str]]:
    kubectl = quick_start.kubectl
    model = deploy_spread(quick_start, 2, networkPolicy={"enabled": False})  # the Service route, as below
    eventually(lambda: router_ready(kubectl), timeout=180, interval=1, what="the router ready")
    debian = build_debian()
    kubectl.apply(*client_objects(push_archive(quick_start.registry, debian, debian.ref.split("/", 1)[1])))
    kubectl.run("wait", "--for=condition=Ready", f"pod/{CLIENT}", "-n", NAMESPACE, "--timeout=300s")
    results: dict[str, tuple[list[dict[str, Any]], dict[str, float]]] = {"service": ([], {}), "router": ([], {})}
    for round_ in range(rounds):
        for route, address in (("service", DIRECT), ("router", SPREAD)):
            before = served(kubectl)
            outcomes = drive(kubectl, address, model, clients, seconds, seed=round_)
            after = served(kubectl)
            results[route][0].extend(outcomes)
            for pod, count in after.items():
                results[route][1][pod] = results[route][1].get(pod, 0.0) + count - before.get(pod, 0.0)
    for route, (outcomes, _) in results.items():
        print(f"{route}: failures: {failures(outcomes)}")
    return [row(route, outcomes, list(per_server.values())) for route, (outcomes, per_server) in results.items()]


HEADER = ["route", "requests", "failed", "latency s p50/p95/p99", "first token s p50/p95/p99", "per server"]
CHAT_HEADER = [*HEADER, "later turns' first token s p50/p95/p99", "prefix cache hits"]
# The servers' chat template: the tiny model has none of its own; any template makes each turn's prompt begin with
# the one before it, which is what the prefix cache keys on.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
PREFIX_COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")


def switch_router(kubectl: Kubectl, affinity: str, load_factor: int = 150) -> None:
    """The service's router to `affinity` (with prefix, bounded at `load_factor`), once the router runs its new
    configuration alone."""
    patch_spec(kubectl, {"routing": {"router": {"affinity": affinity, "loadFactor": load_factor}}})
    sticks = affinity != "none"  # prefix affinity's stick table is in the configuration, or not

    def rolled() -> bool:
        config = (kubectl.get("configmap", f"{SPREAD}-router", NAMESPACE) or {}).get("data", {}).get("haproxy.cfg", "")
        pods = kubectl.get("pods", namespace=NAMESPACE, **{"cpullm.io/router": SPREAD})
        return (
            ("  stick on var(txn.affinity),sha1" in config.splitlines()) == sticks
            and router_ready(kubectl)
            and (len(pods) == 1 and not pods[0]["metadata"].get("deletionTimestamp"))
        )

    eventually(rolled, timeout=300, interval=2, what=f"the router with affinity {affinity}")


def measure_chat(
    quick_start: QuickStart, clients: int, seconds: int, rounds: int, bounds: list[int], max_model_len: int
) -> list[list[str]]:
    kubectl = quick_start.kubectl
    # The Service route reaches the servers from the client pod, which their NetworkPolicy admits only from the router.
    model = deploy_spread(
        quick_start,
        2,
        extraArgs=["--chat-template", CHAT_TEMPLATE],
        networkPolicy={"enabled": False},
        maxModelLen=max_model_len,
    )
    eventually(lambda: router_ready(kubectl), timeout=180, interval=1, what="the router ready")
    debian = build_debian()
    kubectl.apply(*client_objects(push_archive(quick_start.registry, debian, debian.ref.split("/", 1)[1])))
    kubectl.run("wait", "--for=condition=Ready", f"pod/{CLIENT}", "-n", NAMESPACE, "--timeout=300s")
    routes = (
        ("service", DIRECT, "prefix", 150),
        ("router, least connections", SPREAD, "none", 150),
        ("router, prefix", SPREAD, "prefix", 150),
        *((f"router, prefix, bound {bound}", SPREAD, "prefix", bound) for bound in bounds),
    )
    results: dict[str, tuple[list[dict[str, Any]], dict[str, float], list[float]]] = {
        route: ([], {}, [0.0, 0.0]) for route, *_ in routes
    }
    for round_ in range(rounds):
        for index, (route, address, affinity, bound) in enumerate(routes):
            if address == SPREAD:
                switch_router(kubectl, affinity, bound)
            before, cache_before = served(kubectl), server_counters(kubectl, PREFIX_COUNTERS)
            # Fresh conversations per route and round: no route finds another's in the caches.
            outcomes = drive(kubectl, address, model, clients, seconds, seed=100 * round_ + index, chat=True)
            after, cache_after = served(kubectl), server_counters(kubectl, PREFIX_COUNTERS)
            results[route][0].extend(outcomes)
            for pod, count in after.items():
                results[route][1][pod] = results[route][1].get(pod, 0.0) + count - before.get(pod, 0.0)
                for i in range(2):
                    results[route][2][i] += cache_after[pod][i] - cache_before.get(pod, [0.0, 0.0])[i]
    rows = []
    for route, (outcomes, per_server, (hits, queries)) in results.items():
        print(f"{route}: failures: {failures(outcomes)}")
        later = [o["first_token"] for o in outcomes if o["error"] is None and o.get("turn", 0) > 1]
        spread = " / ".join(f"{percentile(later, q):.2f}" for q in (50, 95, 99))
        rows.append([*row(route, outcomes, list(per_server.values())), spread, f"{hits / max(queries, 1):.2f}"])
    return rows


def table(rows: list[list[str]], header: list[str] = HEADER) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in [header, *rows])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
