"""Benchmark, not a test: speculative decoding's predicted gain against real vLLM's, side by side in one run.

Each model is rendered twice for this machine (`cpullm plan` and `render`, as tests/vllm does), with
`spec.speculative.method: off` and with n-gram, and both containers are served at once as local processes, measured
in turns (the host's bandwidth drifts within minutes). On each prompt, one sequence's decode tok/s is the difference
of a SHORT- and a LONG-token greedy completion (the median of --rounds), and the acceptance (accepted / proposed
tokens) and tokens per engine step are read from vLLM's counters over those runs. The prediction
(core/speculation.py's gain, on the plan's basis: a probe with --probe FILE, else the estimate by ISA class) is shown
at the rate the plan assumes and at the rate measured, beside the measured gain.

Prompts: `repeating` (sentences the tiny trained model continues, so its continuation is in the prompt: the case
n-gram is for) and `fresh` (a story's opening it has seen once: little to look up). A random-weight model
(`--models qwen2.5-1.5b`) has no text: its prompt is random tokens, and the row shows what proposals that miss cost.

    .venv/bin/python bench/spec_bench.py [--models tiny qwen2.5-1.5b] [--rounds 3] [--probe FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.engines_bench import isa_shown
from bench.sizes_bench import prompt_ids
from testbed import machine
from testbed.tools import metric_total
from testbed.vllm_server import (
    LocalServer,
    built_model,
    make_tiny_model,
    render_service,
    server_for_container,
    vllm_python,
)

from cpullm import perf_probe
from cpullm.core.performance import Serving, estimated_performance, kernel_of, parse_performance
from cpullm.core.sizing import size_model
from cpullm.core.speculation import ACCEPTANCE, NGRAM, Acceptance, gains

SHORT, LONG = 8, 72
REPEATING = (
    "Large language models run on CPUs with the right thread binding and memory placement."
    "Each tensor parallel rank binds to one NUMA node and keeps its own KV cache."
    "Kubernetes schedules pods onto nodes that have enough CPU and memory."
    "Large language models run on"
)
FRESH = "Once upon a time"
COUNTERS = (
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:generation_tokens_total",
)


@dataclass
class Decoded:
    """One sequence's decode on one prompt: tok/s, and over the timed runs the proposed, accepted and generated
    tokens (vLLM's counters)."""

    rate: float
    proposed: float
    accepted: float
    generated: float

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None

    @property
    def tokens_per_step(self) -> float:
        """Generated tokens per engine step: each step yields one token and the proposals it accepted."""
        return self.generated / max(self.generated - self.accepted, 1.0)


def counted(server: LocalServer) -> list[float]:
    samples = server.metrics()
    return [metric_total(samples, name) for name in COUNTERS]


def decode(servers: dict[str, LocalServer], prompt: str | list[int], rounds: int) -> dict[str, Decoded]:
    """Per server, one sequence's tok/s (LONG - SHORT tokens over the difference of the two completions' times, the
    median of `rounds`) and its counters over those runs. The servers take turns, round by round: on a shared host
    the bandwidth drifts by a third within minutes, and each pair of figures is measured within the same minute."""
    for server in servers.values():
        server.complete(prompt, SHORT)  # warm-up; the prompt's prefix cached for the timed runs
    before = {method: counted(server) for method, server in servers.items()}
    rates: dict[str, list[float]] = {method: [] for method in servers}
    for _ in range(rounds):
        for method, server in servers.items():
            times = []
            for tokens in (SHORT, LONG):
                started = time.monotonic()
                server.complete(prompt, tokens)
                times.append(time.monotonic() - started)
            rates[method].append((LONG - SHORT) / (times[1] - times[0]))
    found = {}
    for method, server in servers.items():
        proposed, accepted, generated = (a - b for a, b in zip(counted(server), before[method], strict=True))
        found[method] = Decoded(sorted(rates[method])[rounds // 2], proposed, accepted, generated)
    return found


def chained_rate(tokens_per_step: float, proposed: int) -> float:
    """The acceptance a (each proposal accepted with chance a given the one before) whose 1 + a + ... + a^k is
    `tokens_per_step`: what core/speculation.py's formula takes."""
    low, high = 0.0, 1.0
    for _ in range(50):
        middle = (low + high) / 2
        if Acceptance(middle, "").tokens_per_step(proposed) < tokens_per_step:
            low = middle
        else:
            high = middle
    return low


def model_dir(python: Path, name: str, tmp: Path) -> Path:
    return make_tiny_model(python, tmp / "tiny-llama") if name == "tiny" else built_model(python, name)


def prompts(name: str, vocab: int) -> dict[str, str | list[int]]:
    if name == "tiny":
        return {"repeating": REPEATING, "fresh": FRESH}
    return {"random": prompt_ids(256, vocab, random.Random(7))}


def run(name: str, python: Path, tmp: Path, rounds: int, probe: dict[str, Any] | None) -> list[dict[str, Any]]:
    model = model_dir(python, name, tmp)
    config = json.loads((model / "config.json").read_text())
    plans: dict[str, dict[str, Any]] = {}
    servers: dict[str, LocalServer] = {}
    try:
        for method in ("off", NGRAM):  # both up at once (each in its own memory cgroup), measured in turns
            workdir = tmp / f"{name}-{method}"
            workdir.mkdir()
            facts = [probe] if probe else []
            plan, container = render_service(workdir, model, 1, node_facts=facts, speculative={"method": method})
            plans[method] = plan
            servers[method] = server_for_container(container, workdir=workdir, python=python, model=model)
            servers[method].start(timeout=3600)
        by_prompt = {key: decode(servers, p, rounds) for key, p in prompts(name, config["vocab_size"]).items()}
    finally:
        for server in servers.values():
            server.stop()
    plan = plans[NGRAM]
    size = size_model(config, "bfloat16")
    threads = plan["cpusPerRank"] - plan["reservedCpusPerRank"]
    serving = Serving(1, threads, *kernel_of(size))
    node = parse_performance(probe) if probe else estimated_performance("localhost", *_this_machine())
    kv = size.kv_bytes_per_token_per_rank(1)
    tokens = plan["speculative"]["tokens"]
    rows = []
    for key, pair in by_prompt.items():
        plain, fast = pair["off"], pair[NGRAM]
        rate = chained_rate(fast.tokens_per_step, tokens)
        predicted = {
            "at plan": gains(size, serving, node, 1, kv, NGRAM, tokens, context=LONG).decode,
            "at measured": gains(size, serving, node, 1, kv, NGRAM, tokens, acceptance=rate, context=LONG).decode,
        }
        rows.append(
            {
                "model": name,
                "prompt": key,
                "plain": plain.rate,
                "ngram": fast.rate,
                "acceptance": fast.acceptance,
                "tokens per step": fast.tokens_per_step,
                "chained rate": rate,
                "measured gain": fast.rate / plain.rate,
                "predicted": predicted,
                # What a checking step cost beyond a plain one, where the weights are too small to matter: the
                # tokens a step made at n-gram's pace against one plain step.
                "extra ms per step": 1000 * (fast.tokens_per_step / fast.rate - 1 / plain.rate),
                "basis": node.basis,
            }
        )
    return rows


def _this_machine() -> tuple[str, frozenset[str], int, int]:
    return machine.arch(), frozenset(machine.cpu_flags()), 1, machine.cpu_count()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--probe", type=Path, help="a NodePerformance of this machine (default: the estimate)")
    args = parser.parse_args()
    python = vllm_python()
    probe = json.loads(args.probe.read_text()) if args.probe else None
    if probe:
        probe["metadata"]["name"] = "localhost"
    tmp = Path(tempfile.mkdtemp(prefix="cpullm-spec-"))  # kept: plans and server logs
    rows = [row for name in args.models for row in run(name, python, tmp, args.rounds, probe)]
    print(f"\n{machine.cpu_count()} CPUs ({isa_shown()}); {perf_probe.cpu_facts()['model']}; n-gram, one sequence")
    print(
        f"{'model':<8}{'prompt':<11}{'plain':>8}{'n-gram':>8}{'accepted':>9}{'tok/step':>9}{'a':>6}{'gain':>6}"
        f"{'pred @' + str(ACCEPTANCE[NGRAM].rate):>9}{'pred @a':>8}{'extra ms':>9}"
    )
    for r in rows:
        accepted = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        print(
            f"{r['model']:<8}{r['prompt']:<11}{r['plain']:>8.1f}{r['ngram']:>8.1f}{accepted:>9}"
            f"{r['tokens per step']:>9.2f}{r['chained rate']:>6.2f}{r['measured gain']:>6.2f}"
            f"{r['predicted']['at plan']:>9.2f}{r['predicted']['at measured']:>8.2f}{r['extra ms per step']:>9.2f}"
        )
    print(f"engine Python here: {1000 * perf_probe.python_seconds():.2f} ms (the probe's fixed piece)")
    print(f"basis: {rows[0]['basis'] if rows else '-'}; logs and plans: {tmp}")


if __name__ == "__main__":
    main()
