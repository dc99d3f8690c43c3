"""Speculative plans on real vLLM, each served beside the same plan without speculation under memory cgroups at
the plans' limits: n-gram on the tests' trained tiny model, MTP on a tiny DeepSeek-V3 with an MTP layer. vLLM's
metrics count the proposed (and accepted) tokens, and each completion is the one the plan without speculation gives
(greedy decoding checks every proposal against the model's own choice, so speculation changes the speed and never
the text); the n-gram proposer's numba loop runs in numba's own thread pool, off the OpenMP runtime torch uses."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
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


@dataclass
class Served:
    """Each plan's (speculation off, and on) rendered plan, completions and final metrics, served at once."""

    plans: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: dict[str, list[str]] = field(default_factory=dict)
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    numba: dict[str, set[str]] = field(default_factory=dict)  # the numba threading layers each server loaded
    servers: dict[str, LocalServer] = field(default_factory=dict)


def serve_off_and(method: str, model: Path, vllm_python: Path, tmp_path: Path) -> Served:
    """The plan without speculation and the plan with `method`, each rendered and served under a memory cgroup at
    its limit, both started at once (a start is mostly one thread's work); PROMPTS completed by each, then both
    stopped. Checks what holds for every method: the rendered flag is the plan's, no OOM kill, the peak within the
    limit, the same text with and without speculation."""
    run = Served()
    for chosen in ("off", method):
        workdir = tmp_path / chosen
        workdir.mkdir()
        plan, container = render_service(workdir, model, 1, speculative={"method": chosen})
        run.plans[chosen] = plan
        args = container["args"]
        if chosen == "off":
            assert "--speculative-config" not in args
        else:
            assert args[args.index("--speculative-config") + 1] == plan["speculative"]["vllmConfig"]
            assert f'"method":"{method}"' in plan["speculative"]["vllmConfig"]
        run.servers[chosen] = server_for_container(container, workdir=workdir, python=vllm_python, model=model)
    try:
        with ThreadPoolExecutor(len(run.servers)) as pool:
            list(pool.map(LocalServer.start, run.servers.values()))
        for chosen, server in run.servers.items():
            run.outputs[chosen] = served(server)
            run.metrics[chosen] = server.metrics()
            run.numba[chosen] = numba_layers(server)
    finally:
        for server in run.servers.values():
            server.stop()
    for chosen, server in run.servers.items():
        measured = server.measured
        assert measured.oom_kills == 0, f"{chosen}: the kernel OOM-killed {measured.oom_kills} process(es)"
        assert measured.limit_bytes == run.plans[chosen]["memoryLimitBytes"]
        assert measured.peak_working_set_bytes < run.plans[chosen]["memoryLimitBytes"], chosen
    assert run.plans[method]["speculative"]["method"] == method and run.plans["off"]["speculative"]["method"] == "off"
    assert run.outputs[method] == run.outputs["off"]
    assert all(run.outputs["off"]), run.outputs
    assert metric_total(run.metrics["off"], DRAFTS) == 0
    return run


def test_an_ngram_speculative_plan_serves_the_plain_plans_text_within_its_memory_limit(
    vllm_python: Path, tiny_model: Path, tmp_path: Path
):
    run = serve_off_and("ngram", tiny_model, vllm_python, tmp_path)
    # The proposer ran numba's loop in numba's own thread pool, not its OpenMP layer, which would have cut torch's
    # threads in the runtime they share (api/spec.py SPECULATIVE_ENV).
    assert run.numba["ngram"] == {"workqueue"}
    spec = run.metrics["ngram"]
    drafts, proposed, accepted = (
        metric_total(spec, DRAFTS),
        metric_total(spec, DRAFT_TOKENS),
        metric_total(spec, ACCEPTED),
    )
    assert drafts > 0 and proposed >= drafts, spec
    # The repeating prompt's continuation is in the prompt: most of its proposals are the model's own tokens.
    assert 0 < accepted <= proposed
    assert accepted / proposed > 0.3, (accepted, proposed)


@pytest.fixture(scope="module")
def mtp_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny DeepSeek-V3 (MLA, experts) with one MTP layer, random weights (tests/vllm/make_models.py mtp)."""
    out = tmp_path_factory.mktemp("models") / "tiny-deepseek-v3-mtp"
    script = Path(__file__).parent / "make_models.py"
    subprocess.run([str(vllm_python), str(script), "mtp", str(out)], check=True, capture_output=True)
    return out


def mtp_layer_bytes(model: Path) -> int:
    """The checkpoint's bytes of its MTP layer (model.layers.<num_hidden_layers>.*), from the safetensors header."""
    config = json.loads((model / "config.json").read_text())
    path = model / "model.safetensors"
    with path.open("rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    prefix = f"model.layers.{config['num_hidden_layers']}."
    return sum(t["data_offsets"][1] - t["data_offsets"][0] for name, t in header.items() if name.startswith(prefix))


def test_an_mtp_speculative_plan_drafts_from_the_checkpoints_layer_within_its_memory_limit(
    vllm_python: Path, mtp_model: Path, tmp_path: Path
):
    """vLLM's CPU backend drafts from a DeepSeek-V3 checkpoint's MTP layer with the rendered --speculative-config
    (MLA attention, experts): it serves the plain plan's text, within the limit that counts the MTP layer's weights.
    Random weights accept next to nothing: the acceptance is the DeepSeek-V3 report's (docs/speculative.md)."""
    run = serve_off_and("mtp", mtp_model, vllm_python, tmp_path)
    plan = run.plans["mtp"]
    assert plan["speculative"]["weightsBytes"] >= mtp_layer_bytes(mtp_model) > 0  # counted high, never short
    assert plan["memoryLimitBytes"] > run.plans["off"]["memoryLimitBytes"]
    tokens = plan["speculative"]["tokens"]
    drafts, proposed = metric_total(run.metrics["mtp"], DRAFTS), metric_total(run.metrics["mtp"], DRAFT_TOKENS)
    assert drafts > 0 and proposed == drafts * tokens, run.metrics["mtp"]
