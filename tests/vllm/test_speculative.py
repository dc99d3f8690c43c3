"""A speculative plan on real vLLM: the tests' trained tiny model, its container rendered with n-gram speculation
(spec.speculative.method ngram), serves under a memory cgroup at the plan's limit; vLLM's metrics count the proposed
and accepted tokens, and each completion is the one the same plan without speculation gives (greedy decoding checks
every proposal against the model's own choice, so speculation changes the speed and never the text); the proposer's
numba loop runs in numba's own thread pool, off the OpenMP runtime torch uses."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from testbed.tools import metric_total
from testbed.vllm_server import LocalServer, render_service, server_for_container

pytestmark = pytest.mark.vllm

# Sentences the tiny model was trained on, so that it continues with words the prompt already holds: n-gram's
# proposals come from the prompt.
REPEATING = (
    "Large language models run on CPUs with the right thread binding and memory placement."
    "Each tensor parallel rank binds to one NUMA node and keeps its own KV cache."
    "Kubernetes schedules pods onto nodes that have enough CPU and memory."
    "Large language models run on"
)
PROMPTS = [REPEATING, "The capital of France is", "Once upon a time"]
DRAFTS, DRAFT_TOKENS, ACCEPTED = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)


def served(server: LocalServer) -> list[str]:
    """The completions of PROMPTS, one at a time and then together, from a started server."""
    texts = [server.complete(prompt, max_tokens=40)["choices"][0]["text"] for prompt in PROMPTS]
    together = server.complete(PROMPTS, max_tokens=40)["choices"]
    return texts + [choice["text"] for choice in sorted(together, key=lambda c: c["index"])]


def numba_layers(server: LocalServer) -> set[str]:
    """The numba threading layers the server's processes have loaded (their memory maps)."""
    assert server.cgroup is not None
    found: set[str] = set()
    for pid in server.cgroup.pids():
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:  # gone since the listing
            continue
        found |= {layer for layer in ("omppool", "tbbpool", "workqueue") if f"numba/np/ufunc/{layer}" in maps}
    return found


def test_an_ngram_speculative_plan_serves_the_plain_plans_text_within_its_memory_limit(
    vllm_python: Path, tiny_model: Path, tmp_path: Path
):
    outputs: dict[str, list[str]] = {}
    metrics: dict[str, dict[str, float]] = {}
    plans: dict[str, dict[str, Any]] = {}
    servers: dict[str, LocalServer] = {}
    for method in ("off", "ngram"):
        workdir = tmp_path / method
        workdir.mkdir()
        plan, container = render_service(workdir, tiny_model, 1, speculative={"method": method})
        plans[method] = plan
        args = container["args"]
        if method == "off":
            assert "--speculative-config" not in args
        else:
            assert args[args.index("--speculative-config") + 1] == plan["speculative"]["vllmConfig"]
            assert '"method":"ngram"' in plan["speculative"]["vllmConfig"]
        servers[method] = server_for_container(container, workdir=workdir, python=vllm_python, model=tiny_model)
    try:
        # Both start at once (each in a memory cgroup of its own): a start is mostly one thread's work.
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(LocalServer.start, servers.values()))
        for method, server in servers.items():
            outputs[method] = served(server)
            metrics[method] = server.metrics()
        # The proposer ran numba's loop in numba's own thread pool, not its OpenMP layer, which would have cut
        # torch's threads in the runtime they share (api/spec.py SPECULATIVE_ENV).
        assert numba_layers(servers["ngram"]) == {"workqueue"}
    finally:
        for server in servers.values():
            server.stop()
    for method, server in servers.items():
        measured = server.measured
        assert measured.oom_kills == 0, f"{method}: the kernel OOM-killed {measured.oom_kills} process(es)"
        assert measured.limit_bytes == plans[method]["memoryLimitBytes"]
        assert measured.peak_working_set_bytes < plans[method]["memoryLimitBytes"], method

    assert plans["ngram"]["speculative"]["method"] == "ngram" and plans["off"]["speculative"]["method"] == "off"
    assert outputs["ngram"] == outputs["off"]
    assert all(outputs["off"]), outputs
    spec = metrics["ngram"]
    drafts, proposed, accepted = (
        metric_total(spec, DRAFTS),
        metric_total(spec, DRAFT_TOKENS),
        metric_total(spec, ACCEPTED),
    )
    assert drafts > 0 and proposed >= drafts, spec
    # The repeating prompt's continuation is in the prompt: most of its proposals are the model's own tokens.
    assert 0 < accepted <= proposed
    assert accepted / proposed > 0.3, (accepted, proposed)
    assert metric_total(metrics["off"], DRAFTS) == 0
