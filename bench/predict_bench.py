"""Benchmark, not a test: the plan's predicted speed against real vLLM, side by side in one run on this machine.

For each case (a model shape, a checkpoint format, a TP size: TP 2 on simulated NUMA nodes where the machine has one),
`cpullm probe` measures this machine first (cpullm/perf_probe.py, in the vLLM environment; --probe FILE instead),
then the service is planned with that probe beside this machine's Node in the nodes file, its rendered container is
started as a local process (testbed/vllm_server.py), and measured:

- decode: one sequence's tok/s at about 512 tokens of context, from the difference of a 16- and a 144-token
  completion of a 448-token prompt (the median of --rounds, as for every figure);
- throughput: generated tok/s with 8 and 32 sequences at once (64-token prompts), from the difference of a round of
  16 and a round of 144 tokens out each (the steady state: the prefill cancels);
- TTFT: a 1,024-token prompt's one token (of twice --rounds and one distinct prompts: on two shared cores one such
  prompt took 0.79 to 1.49 s in a row).

Each figure is printed beside what core/performance.py predicts for the same request shapes on this probe (the
plan's own `predicted` is the same model at its maxNumSeqs), with their ratio.

    .venv/bin/python bench/predict_bench.py [--models qwen2.5-0.5b qwen2.5-1.5b qwen2.5-3b] [--formats bf16 w8a8-int8]
        [--tp 1 2] [--rounds 2] [--reserved-cpus-per-rank N] [--probe FILE] [--json FILE]
    .venv/bin/python bench/predict_bench.py --replay FILE [FILE ...] [--every-probe]

`--replay` reads runs' `--json` files (each case's measurements, probe, model config and plan shape) and prints the
table again with what core/performance.py predicts now: a change to the model's constants is checked against the
measurements of a run without running vLLM again. `--every-probe` predicts each case from every probe in the files
and prints each ratio's least, median and greatest: on a shared host, how much of a ratio is the probe's moment.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.engines_bench import built_quantized, isa_shown
from bench.sizes_bench import prompt_ids
from testbed import machine
from testbed.vllm_server import (
    LocalServer,
    built_model,
    make_adapter,
    render_service,
    server_for_container,
    vllm_python,
)

from cpullm import perf_probe
from cpullm.core.performance import Serving, kernel_of, parse_performance, predict
from cpullm.core.sizing import size_model

SIM_MULTI_NUMA = [{"name": "VLLM_CPU_SIM_MULTI_NUMA", "value": "1"}]
STREAMS = (8, 32)
STREAM_PROMPT = 64
DECODE_PROMPT, SHORT, LONG = 448, 16, 144
TTFT_PROMPT = 1024
NODE = "localhost"  # this machine's Node in the harness's nodes file
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Case:
    model: str
    fmt: str
    tp: int
    measured: dict[str, float] = field(default_factory=dict)
    predicted: dict[str, float] = field(default_factory=dict)
    plan_predicted: dict[str, Any] = field(default_factory=dict)
    start_s: float = 0.0
    error: str = ""
    # What the prediction is made from, kept for --replay: the probe, the model's config and the plan's shape.
    probe: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    threads: int = 0
    shares_cores: bool = False  # no CPU kept off the ranks' threads (reservedCpusPerRank 0), as the plan had it
    adapter_rank: int = 0  # with a LoRA adapter of this rank, every request naming it (0: none)
    reserved: int = 0  # CPUs of each rank kept for vLLM's front end (the spec's reservedCpusPerRank)


def probe(python: Path, seconds: float) -> dict[str, Any]:
    out = subprocess.run(
        [str(python), perf_probe.__file__, "--node-name", NODE, "--seconds-per-point", str(seconds)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def decode_rate(server: LocalServer, vocab: int, rounds: int, model: str | None = None) -> float:
    prompt = prompt_ids(DECODE_PROMPT, vocab, random.Random(1))
    server.complete(prompt, 8, model=model)  # warm-up, and the prompt's prefix cached for the timed runs
    rates = []
    for _ in range(rounds):
        times = []
        for tokens in (SHORT, LONG):
            started = time.monotonic()
            server.complete(prompt, tokens, model=model)
            times.append(time.monotonic() - started)
        rates.append((LONG - SHORT) / (times[1] - times[0]))
    return median(rates)


def throughput(server: LocalServer, vocab: int, streams: int, rounds: int, model: str | None = None) -> float:
    """Generated tok/s of `streams` sequences decoding together: `streams` requests at once of STREAM_PROMPT-token
    prompts, with SHORT and then LONG tokens out; the difference of the two rounds' times cancels the prefill and
    the requests' own costs (the median of `rounds`)."""
    rates = []
    for round_ in range(rounds):
        prompts = [prompt_ids(STREAM_PROMPT, vocab, random.Random(1000 * round_ + i)) for i in range(streams)]
        seconds = []
        for tokens in (SHORT, LONG):
            started = time.monotonic()
            with ThreadPoolExecutor(streams) as pool:
                done = list(pool.map(lambda prompt, n=tokens: server.complete(prompt, n, model=model), prompts))
            seconds.append(time.monotonic() - started)
            assert all(r["usage"]["completion_tokens"] == tokens for r in done)
        rates.append(streams * (LONG - SHORT) / (seconds[1] - seconds[0]))
    return median(rates)


def first_token_seconds(server: LocalServer, vocab: int, rounds: int, model: str | None = None) -> float:
    """The median of `rounds` distinct 1,024-token prompts' first token (no prefix cache helps)."""
    seconds = []
    for index in range(rounds):
        prompt = prompt_ids(TTFT_PROMPT, vocab, random.Random(200 + index))
        started = time.monotonic()
        server.complete(prompt, 1, model=model)
        seconds.append(time.monotonic() - started)
    return median(seconds)


def model_dir(python: Path, name: str, fmt: str) -> Path:
    bf16 = built_model(python, name)
    return bf16 if fmt == "bf16" else built_quantized(python, bf16, fmt)


def predict_case(case: Case, ratios: dict[str, list[float]] | None = None) -> None:
    """What core/performance.py predicts for the case's request shapes, on its probe (the plan's own `predicted` is
    the same model at its maxNumSeqs); each figure's predicted / measured appended to `ratios` where given."""
    size = size_model(case.config, "bfloat16")
    serving = Serving(
        case.tp, case.threads, *kernel_of(size), lora=bool(case.adapter_rank), shares_cores=case.shares_cores
    )
    node = parse_performance(case.probe)
    kv = size.kv_bytes_per_token_per_rank(case.tp)
    for streams in (1, *STREAMS):
        context = DECODE_PROMPT + (SHORT + LONG) // 2 if streams == 1 else STREAM_PROMPT + (SHORT + LONG) // 2
        figures = predict(size, serving, node, streams, kv, prompt=TTFT_PROMPT, context=context)
        key = "decode" if streams == 1 else f"{streams} streams"
        case.predicted[key] = figures.throughput_tokens_per_second
        case.predicted["TTFT"] = figures.time_to_first_token_seconds
    if ratios is not None:
        for column, measured in case.measured.items():
            ratios[column].append(case.predicted[column] / measured)


def run_case(case: Case, python: Path, performance: dict[str, Any], rounds: int, workdir: Path) -> None:
    model = model_dir(python, case.model, case.fmt)
    config = json.loads((model / "config.json").read_text())
    spec: dict[str, Any] = {"kvCacheGiB": None, "maxModelLen": 2048, "maxNumSeqs": max(STREAMS)}
    if case.tp > 1:
        spec["env"] = SIM_MULTI_NUMA
    if case.reserved:
        spec["cpu"] = {"reservedCpusPerRank": case.reserved}
    adapter = None
    if case.adapter_rank:
        adapter = "tuned"
        built = workdir / "models" / "adapters" / adapter  # the pod's /models (testbed/vllm_server.pod_mounts)
        make_adapter(python, model, built, case.adapter_rank)
        spec["adapters"] = [{"name": adapter, "source": f"/models/adapters/{adapter}", "rank": case.adapter_rank}]
    plan, container = render_service(workdir, model, case.tp, node_facts=[performance], **spec)
    case.plan_predicted = plan.get("predicted") or {}
    case.probe, case.config = performance, config
    case.threads = plan["cpusPerRank"] - plan["reservedCpusPerRank"]
    case.shares_cores = not plan["reservedCpusPerRank"]
    predict_case(case)
    server = server_for_container(container, workdir=workdir, python=python, model=model)
    try:
        server.start(timeout=3600)
        case.start_s = server.measured.startup_seconds
        vocab = config["vocab_size"]
        case.measured["decode"] = decode_rate(server, vocab, rounds, adapter)
        for streams in STREAMS:
            case.measured[f"{streams} streams"] = throughput(server, vocab, streams, rounds, adapter)
        case.measured["TTFT"] = first_token_seconds(server, vocab, 2 * rounds + 1, adapter)
    except (OSError, RuntimeError, TimeoutError) as err:
        case.error = str(err).splitlines()[0][:200]
    finally:
        server.stop()


def table(cases: list[Case]) -> str:
    columns = ("decode", *(f"{s} streams" for s in STREAMS), "TTFT")
    head = f"{'model':<20}{'format':<11}{'TP':>3}" + "".join(f"{c + ' pred / meas':>30}" for c in columns)
    lines = [head, "-" * len(head)]
    for case in cases:
        model = case.model + (f"+lora{case.adapter_rank}" if case.adapter_rank else "")
        model += f" r{case.reserved}" if case.reserved else ""  # CPUs a rank keeps for the front end
        line = f"{model:<20}{case.fmt:<11}{case.tp:>3}"
        if case.error:
            lines.append(line + f"  {case.error}")
            continue
        if not case.measured:
            continue  # not run yet
        for column in columns:
            p, m = case.predicted[column], case.measured[column]
            unit = "s" if column == "TTFT" else ""
            line += f"{f'{p:.2f}{unit} / {m:.2f}{unit} ({p / m:.2f})':>30}"
        lines.append(line)
    return "\n".join(lines)


def every_probe(cases: list[Case]) -> str:
    """Each measured case's ratios (predicted / measured) over every case's probe: least / median / greatest."""
    measured = [case for case in cases if case.measured and case.config]
    columns = ("decode", *(f"{s} streams" for s in STREAMS), "TTFT")
    head = f"{'model':<20}{'format':<11}{'TP':>3}" + "".join(f"{c + ' least / median / most':>36}" for c in columns)
    lines = [head, "-" * len(head)]
    for case in measured:
        ratios: dict[str, list[float]] = {column: [] for column in columns}
        for probe in [other.probe for other in measured]:
            predict_case(replace(case, probe=probe, predicted={}), ratios)
        line = f"{case.model:<20}{case.fmt:<11}{case.tp:>3}"
        for column in columns:
            found = sorted(ratios[column])
            line += f"{f'{found[0]:.2f} / {found[len(found) // 2]:.2f} / {found[-1]:.2f}':>36}"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b"])
    parser.add_argument("--formats", nargs="+", default=["bf16", "w8a8-int8"])
    parser.add_argument("--tp", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--adapter-rank", type=int, default=0, help="serve a LoRA adapter of this rank, and ask it")
    parser.add_argument(
        "--reserved-cpus-per-rank", type=int, default=0, help="keep this many of each rank's CPUs for the front end"
    )
    parser.add_argument("--probe", type=Path, help="a NodePerformance of this machine (default: probed for each case)")
    parser.add_argument("--probe-seconds", type=float, default=0.5, help="the probe's seconds per point")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument("--replay", type=Path, nargs="+", help="--json files: predict their cases again, run nothing")
    parser.add_argument("--every-probe", action="store_true", help="with --replay: each case from every probe")
    args = parser.parse_args(argv)
    if args.replay:
        cases = [Case(**fields) for run in args.replay for fields in json.loads(run.read_text())]
        if args.every_probe:
            print(every_probe(cases))
            return
        for case in cases:
            if not case.error and case.config:  # a run still going has written its cases to come, unmeasured
                predict_case(case)
        print(table(cases))
        return
    python = vllm_python()
    given = json.loads(args.probe.read_text()) if args.probe else None
    cases = [
        Case(m, f, tp, adapter_rank=args.adapter_rank, reserved=args.reserved_cpus_per_rank)
        for m in args.models
        for f in args.formats
        for tp in args.tp
    ]
    tmp = Path(tempfile.mkdtemp(prefix="cpullm-predict-"))  # kept: each case's plan, probe and server log
    for index, case in enumerate(cases):
        workdir = tmp / f"{index}-{case.model}-{case.fmt}-tp{case.tp}"
        workdir.mkdir()
        # A probe right before each case: on a shared host the bandwidth a thread gets drifts (6.9 to 13.5 GB/s of
        # one thread's bf16 matrix-vector product within minutes, on a 2-vCPU guest).
        performance = given or probe(python, args.probe_seconds)
        performance["metadata"]["name"] = NODE
        (workdir / "probe.json").write_text(json.dumps(performance))
        run_case(case, python, performance, args.rounds, workdir)
        print(f"predict_bench: {case.model} {case.fmt} TP {case.tp}: {case.measured or case.error}", file=sys.stderr)
        if args.json:
            args.json.write_text(json.dumps([vars(c) for c in cases], indent=1))
    cpus = machine.cpu_count()
    print(f"\n{cpus} CPUs ({isa_shown()}); {perf_probe.cpu_facts()['model']}; random weights; predicted / measured")
    print(table(cases))
    print(
        f"decode: one sequence at ~{DECODE_PROMPT + (SHORT + LONG) // 2} tokens of context, tok/s; N streams: generated"
    )
    print(f"tok/s of N sequences at once ({STREAM_PROMPT}-token prompts, {SHORT} and {LONG} out: steady state);")
    print(f"TTFT: a {TTFT_PROMPT}-token prompt's first token, s. Logs and plans: {tmp}")


if __name__ == "__main__":
    main()
