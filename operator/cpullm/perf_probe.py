"""Measures what the performance model (core/performance.py) reads of a node, per NUMA node: the streaming read
bandwidth of one thread and of all the node's cores, and how fast vLLM's own matrix kernels stream a layer's weights
at several batch sizes (bf16, and W8A8 int8 where vLLM has it), on the kernels the image really runs (AMX, AVX-512,
AVX2 or NEON, as oneDNN picks). Prints a NodePerformance object (JSON) that `cpullm plan --nodes` reads beside the
nodes, and the operator's probe Job publishes.

Runs with the python of the vLLM image or environment: the standard library, torch and (optionally) vLLM. Each
measurement runs in a process of its own, pinned before torch starts its threads, with its memory first touched
there (so it sits on the node's memory).

    python3 perf_probe.py [--node-name NAME] [--seconds-per-point S] [--output FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

KIND = "NodePerformance"
API_VERSION = "cpullm.io/v1alpha1"
NODE_DIR = Path("/sys/devices/system/node")
CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
# Batch sizes (rows of the activation) at which the kernels are timed: decode of 1 to 32 sequences streams the
# weights; 256 and 1,024 are prefill chunks, where the cores' arithmetic bounds it.
BATCHES = (1, 8, 32, 256, 1024)
STREAMED_BATCHES = (1, 8, 32)  # over weights larger than the caches; the rest over one matrix (compute-bound)
# The compute-bound points are timed in this many passes over every kernel's points, each pass a share of their
# budget, so each point's samples span the whole window rather than a second of it: on a 2-vCPU guest one thread's
# 1,024-row product ran at 250-930 GFLOP/s from one second to the next, the slow spells lasting seconds, and two
# probes minutes apart read 0.34 and 0.75 GB/s of weights for the same point (docs/benchmarks.md).
COMPUTE_PASSES = 4
HIDDEN = 4096  # the matrices' width: an 8B model's
# Every point again over matrices of this many inputs (a small model's layers; a 0.5B model's are 896 wide): how much
# of the wide product's rate a narrow layer keeps is the node's and the kernel's, not a constant (per call, the
# narrow product does a quarter of the work for the same dispatch). core/performance.py reads it as
# PROBE_NARROW_WIDTH.
NARROW_WIDTH = 1024
MiB = 1 << 20


def node_cpus() -> dict[int, list[int]]:
    """NUMA node -> the CPUs of it this process may run on (all on node 0 where the kernel has no NUMA sysfs)."""
    allowed = sorted(os.sched_getaffinity(0))
    nodes: dict[int, list[int]] = {}
    for path in sorted(NODE_DIR.glob("node[0-9]*")):
        cpus = set(parse_cpu_list((path / "cpulist").read_text()))
        mine = [cpu for cpu in allowed if cpu in cpus]
        if mine:
            nodes[int(path.name[4:])] = mine
    return nodes or {0: allowed}


def parse_cpu_list(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def last_level_cache_bytes() -> int:
    """The largest cache's size (the L3 a streaming read must exceed), 32 MiB when unreadable."""
    sizes = [32 * MiB]
    for index in CACHE_DIR.glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": MiB, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes)


def streamed_bytes(free_bytes: int) -> int:
    """How much a streaming measurement reads: four times the last-level cache, within 512 MiB to 2 GiB and a
    quarter of the memory free."""
    return int(min(max(4 * last_level_cache_bytes(), 512 * MiB), 2048 * MiB, free_bytes // 4))


def typical_seconds(run: Any, budget: float, before: Any = None) -> float:
    """The median of repeated runs within `budget` seconds (at least five, after one warm-up): on a node whose other
    work interrupts a thread now and then, what a server meets most of the time (the fastest run flatters it: two
    threads' 1,024-row product ran from 0.68 to 1.76 GB/s of weights, median 0.68, on a 2-vCPU guest). `before`, if
    given, runs untimed before each run."""
    run()
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < 5 or (time.perf_counter() - started < budget and len(times) < 51):
        if before is not None:
            before()
        begun = time.perf_counter()
        run()
        times.append(time.perf_counter() - begun)
    return sorted(times)[len(times) // 2]


def spread_seconds(runs: dict[str, Any], budget: float, passes: int = COMPUTE_PASSES) -> dict[str, float]:
    """Each run's median time, its samples taken in `passes` rounds over all the runs (`budget` seconds per run
    in all, at least two samples a round, after one warm-up each)."""
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {key: [] for key in runs}
    for _ in range(passes):
        for key, run in runs.items():
            started, taken = time.perf_counter(), 0
            while taken < 2 or time.perf_counter() - started < budget / passes:
                begun = time.perf_counter()
                run()
                times[key].append(time.perf_counter() - begun)
                taken += 1
    return {key: sorted(samples)[len(samples) // 2] for key, samples in times.items()}


def median_seconds(run: Any, rounds: int) -> float:
    """The median of `rounds` timed runs, after a few untimed ones."""
    for _ in range(10):
        run()
    times = []
    for _ in range(rounds):
        begun = time.perf_counter()
        run()
        times.append(time.perf_counter() - begun)
    return sorted(times)[rounds // 2]


def python_seconds() -> float:
    """A fixed piece of plain Python work (what vLLM's scheduler and sampler spend per step scales with it)."""

    def work() -> int:
        total = 0
        for i in range(100_000):
            total += i % 7
        return total

    return median_seconds(work, 15)


def ask_for_amx() -> None:
    """The AMX tile permission vLLM's kernels need and do not ask for (cpullm/vllm_fixes.py, fix 6)."""
    import torch

    if hasattr(torch.cpu, "_is_amx_tile_supported") and torch.cpu._is_amx_tile_supported():
        torch.cpu._init_amx()


def measure(threads: int, size: int, budget: float) -> dict[str, Any]:
    """In this process (pinned by the caller): the read bandwidth, one small kernel's time, and each kernel's
    weight bytes per second at each batch size."""
    import torch

    torch.set_num_threads(threads)
    ask_for_amx()
    out: dict[str, Any] = {"threads": threads, "readBytesPerSecond": read_rate(torch, size, budget)}
    # What one small kernel costs whatever its work (dispatch and the threads' fork and join): a decode step runs
    # about a dozen per layer (norms, rotary, activations, the matrices of a small model).
    small, vector = torch.randn(256, 256, dtype=torch.bfloat16), torch.randn(1, 256, dtype=torch.bfloat16)
    out["smallKernelSeconds"] = median_seconds(lambda: torch.nn.functional.linear(vector, small), 300)
    compute_bound: dict[str, Any] = {}
    points: dict[str, tuple[str, str, int]] = {}  # a compute-bound run's key -> (field, batch, its weight bytes)
    for fmt, kernel in kernels(torch).items():
        out[f"{fmt}Kernel"] = kernel.name
        for width, field in (
            (HIDDEN, f"{fmt}WeightBytesPerSecond"),
            (NARROW_WIDTH, f"{fmt}NarrowWeightBytesPerSecond"),
        ):
            out[field] = kernel_rates(torch, kernel, size, budget, width)
            for batch in BATCHES:
                if batch not in STREAMED_BATCHES:
                    compute_bound[f"{field} {batch}"] = _product(torch, kernel, batch, width)
                    points[f"{field} {batch}"] = (field, str(batch), width * HIDDEN * kernel.bytes_per_weight)
    for key, seconds in spread_seconds(compute_bound, budget).items():
        field, rows, weight_bytes = points[key]
        out[field][rows] = round(weight_bytes / seconds)
    out.update(attention(torch, budget))
    return out


# The attention measured: a layer of ATTENTION_HEADS query heads sharing ATTENTION_KV_HEADS KV heads of HEAD_DIM, bf16,
# in 32-token blocks: one causal prefill of PREFILL_TOKENS, and a decode step of DECODE_SEQUENCES sequences at each
# of DECODE_CONTEXTS tokens of context; the decode again on SMALL_LAYER (query heads, KV heads, head width): a small
# model's layer, whose time per sequence is mostly the kernel's fixed cost, not its KV bytes. Each decode run comes
# after writing twice the last-level cache per thread: in a server a layer's weights stream through the caches
# between two layers' attention, so each reads its KV cache from memory (on 2 Zen 5 vCPUs a 0.5B model's layer at
# 144 tokens took about 10 us a sequence in vLLM's engine and 14 us so, against 3 us with its KV cache cached).
ATTENTION_HEADS, ATTENTION_KV_HEADS, HEAD_DIM, BLOCK = 16, 4, 128, 32
SMALL_LAYER = (4, 1, 64)
PREFILL_TOKENS, DECODE_SEQUENCES, DECODE_CONTEXTS = 1024, 32, (128, 1024)
LAYER = (ATTENTION_HEADS, ATTENTION_KV_HEADS, HEAD_DIM)


def attention_call(
    ops: Any, isa: str, query: Any, caches: tuple[Any, Any], table: Any, starts: Any, contexts: list[int]
) -> tuple[Any, Any]:
    """One call of vLLM's CPU attention (`cpu_attention_with_kv_cache`, vLLM 0.31 and 0.32) of `query` (tokens x
    heads x width, bf16) over paged caches (blocks x KV heads x BLOCK x width), causal, scheduled once: the call to
    run again and again, and the output it writes."""
    import torch

    key_cache, value_cache = caches
    lengths = torch.tensor(contexts, dtype=torch.int32)
    output = torch.empty_like(query)
    metadata = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=len(contexts),
        num_heads=query.shape[1],
        num_kv_heads=key_cache.shape[1],
        head_dim=query.shape[2],
        seq_lens=lengths,
        dtype=torch.bfloat16,
        query_start_loc=starts,
        causal=True,
        sliding_window_size=-1,
        isa=isa,
        enable_kv_split=False,
    )

    def run() -> None:
        ops.cpu_attention_with_kv_cache(
            query=query,
            key_cache=key_cache,
            value_cache=value_cache,
            output=output,
            query_start_loc=starts,
            seq_lens=lengths,
            scale=query.shape[2] ** -0.5,
            causal=True,
            alibi_slopes=None,
            sliding_window=-1,
            block_table=table,
            softcap=0.0,
            scheduler_metadata=metadata,
            s_aux=None,
        )

    return run, output


def attention(torch: Any, budget: float) -> dict[str, Any]:
    """vLLM's CPU attention kernel (the ISA it chooses here): a prefill's arithmetic per second (its multiply-adds
    over the causal half, x 4 flops), and a decode step's seconds per sequence at each context. {} without vLLM."""
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        from vllm import _custom_ops as ops
    except Exception:  # torch alone: the model estimates attention from the matrix kernel
        return {}
    isa = _get_attn_isa(torch.bfloat16, BLOCK)

    def step(queries: list[int], contexts: list[int], layer: tuple[int, int, int] = LAYER) -> Any:
        heads, kv_heads, head_dim = layer
        blocks = [-(-c // BLOCK) for c in contexts]
        kv_shape = (sum(blocks), kv_heads, BLOCK, head_dim)
        key_cache, value_cache = (
            torch.randn(kv_shape, dtype=torch.bfloat16),
            torch.randn(kv_shape, dtype=torch.bfloat16),
        )
        table = torch.zeros(len(contexts), max(blocks), dtype=torch.int32)
        first = 0
        for row, count in enumerate(blocks):
            table[row, :count] = torch.arange(first, first + count, dtype=torch.int32)
            first += count
        starts = torch.tensor([0, *itertools.accumulate(queries)], dtype=torch.int32)
        query = torch.randn(sum(queries), heads, head_dim, dtype=torch.bfloat16)
        run, _ = attention_call(ops, isa, query, (key_cache, value_cache), table, starts, contexts)
        return run

    # Twice the last-level cache per thread, up to 1 GiB: a node's cores may sit under several L3s (one per AMD CCD),
    # and each thread's share of the write passes through its own.
    evicting = torch.empty(min(2 * last_level_cache_bytes() * torch.get_num_threads(), 1024 * MiB), dtype=torch.uint8)

    def decode(layer: tuple[int, int, int]) -> dict[str, float]:
        return {
            str(context): typical_seconds(
                step([1] * DECODE_SEQUENCES, [context] * DECODE_SEQUENCES, layer), budget, lambda: evicting.fill_(1)
            )
            / DECODE_SEQUENCES
            for context in DECODE_CONTEXTS
        }

    try:
        prefill = typical_seconds(step([PREFILL_TOKENS], [PREFILL_TOKENS]), budget)
        decoded, small = decode(LAYER), decode(SMALL_LAYER)
    except Exception:  # a vLLM whose kernel takes other arguments: the model estimates attention instead
        return {}
    flops = 4 * PREFILL_TOKENS * (PREFILL_TOKENS / 2) * ATTENTION_HEADS * HEAD_DIM
    return {
        "attentionKernel": f"vllm cpu_attention_with_kv_cache ({isa})",
        "attentionPrefillFlopsPerSecond": round(flops / prefill),
        "attentionDecodeSecondsPerSequence": decoded,
        "attentionSmallDecodeSecondsPerSequence": small,
    }


def read_rate(torch: Any, size: int, budget: float) -> int:
    data = torch.ones(size // 2, dtype=torch.bfloat16)
    return round(size / typical_seconds(data.sum, budget))


def kernel_rates(torch: Any, kernel: _Kernel, size: int, budget: float, width: int = HIDDEN) -> dict[str, int]:
    """Weight bytes per second at each of STREAMED_BATCHES, over a chain of matrices of `width` inputs larger than
    the caches (the compute-bound batches are timed over one matrix, in measure())."""
    matrix_bytes = width * HIDDEN * kernel.bytes_per_weight
    chain = [kernel.weight(torch, width) for _ in range(max(1, size // matrix_bytes))]
    rates = {}
    for batch in STREAMED_BATCHES:
        x = torch.randn(batch, width, dtype=torch.bfloat16)

        def run(x: Any = x) -> None:
            for w in chain:
                kernel.multiply(x, w)

        rates[str(batch)] = round(len(chain) * matrix_bytes / typical_seconds(run, budget))
    return rates


def _product(torch: Any, kernel: _Kernel, batch: int, width: int = HIDDEN) -> Any:
    """One product of `width` inputs to HIDDEN outputs at `batch` rows."""
    w, x = kernel.weight(torch, width), torch.randn(batch, width, dtype=torch.bfloat16)
    return lambda: kernel.multiply(x, w)


class _Kernel:
    name = ""
    bytes_per_weight = 2

    def weight(self, torch: Any, width: int = HIDDEN) -> Any:
        """A HIDDEN x `width` weight (outputs x inputs), as the kernel holds it."""

    def multiply(self, x: Any, w: Any) -> Any: ...


class _VllmBF16(_Kernel):
    """vLLM's oneDNN matmul for unquantized linear layers (layers/utils.py dispatch_cpu_unquantized_gemm)."""

    name = "vllm onednn_mm"

    def __init__(self, ops: Any) -> None:
        self.ops = ops

    def weight(self, torch: Any, width: int = HIDDEN) -> Any:
        return self.ops.create_onednn_mm(torch.randn(HIDDEN, width, dtype=torch.bfloat16).t(), 32)

    def multiply(self, x: Any, w: Any) -> Any:
        return self.ops.onednn_mm(w, x, None)


class _TorchBF16(_Kernel):
    name = "torch linear"

    def weight(self, torch: Any, width: int = HIDDEN) -> Any:
        return torch.randn(HIDDEN, width, dtype=torch.bfloat16)

    def multiply(self, x: Any, w: Any) -> Any:
        import torch

        return torch.nn.functional.linear(x, w)


class _VllmInt8(_Kernel):
    """vLLM's W8A8 int8 kernel (CPUInt8ScaledMMLinearKernel): per-token dynamic quantization of the activation,
    then oneDNN's int8 matmul with per-channel weight scales."""

    name = "vllm onednn_scaled_mm"
    bytes_per_weight = 1

    def __init__(self, ops: Any) -> None:
        self.ops = ops

    def weight(self, torch: Any, width: int = HIDDEN) -> Any:
        w = torch.randint(-127, 127, (HIDDEN, width), dtype=torch.int8).t()
        scales = torch.rand(HIDDEN, 1, dtype=torch.float32) / 100
        return self.ops.create_onednn_scaled_mm(w, scales, torch.bfloat16, True, False, 32)

    def multiply(self, x: Any, w: Any) -> Any:
        import torch

        q, scale, _ = self.ops.onednn_scaled_int8_quant(x, None, None, True)
        out = torch.empty(x.shape[0], HIDDEN, dtype=torch.bfloat16)
        return self.ops.onednn_scaled_mm(w, q, out, scale, None, None, None)


class _VllmInt8Packed(_Kernel):
    """vLLM's W8A8 int8 kernel where it picks SGL's (x86 with AMX tiles: check_cpu_sgl_kernel): the weight packed
    once, the activation quantized per token inside the product."""

    name = "vllm int8_scaled_mm_with_quant"
    bytes_per_weight = 1

    def weight(self, torch: Any, width: int = HIDDEN) -> Any:
        w = torch.randint(-127, 127, (HIDDEN, width), dtype=torch.int8)
        return torch.ops._C.convert_weight_packed(w), torch.rand(HIDDEN, 1, dtype=torch.float32) / 100

    def multiply(self, x: Any, w: Any) -> Any:
        import torch

        packed, scales = w
        return torch.ops._C.int8_scaled_mm_with_quant(x, packed, scales, None, torch.bfloat16, True)


def int8_kernel(torch: Any, ops: Any) -> _Kernel:
    """The kernel vLLM runs a symmetric W8A8 layer on here (model_executor/kernels/linear/scaled_mm/cpu.py, 0.31 and
    0.32): SGL's where vLLM's own check_cpu_sgl_kernel holds on x86, oneDNN's otherwise."""
    try:
        from vllm.model_executor.layers.utils import check_cpu_sgl_kernel

        sgl = platform.machine() in ("x86_64", "AMD64") and check_cpu_sgl_kernel(HIDDEN, NARROW_WIDTH, torch.int8)
    except Exception:  # a vLLM without it: oneDNN's, as before SGL's kernels came
        sgl = False
    return _VllmInt8Packed() if sgl else _VllmInt8(ops)


def kernels(torch: Any) -> dict[str, _Kernel]:
    """The formats measured, by the kernels this environment has: vLLM's own where it imports, else torch's bf16."""
    try:
        from vllm import _custom_ops as ops
    except Exception:  # a torch without vLLM (a development environment): bf16 through torch alone
        return {"bf16": _TorchBF16()}
    found: dict[str, _Kernel] = {}
    for fmt, kernel in (("bf16", _VllmBF16(ops)), ("int8", int8_kernel(torch, ops))):
        try:
            kernel.multiply(torch.randn(1, HIDDEN, dtype=torch.bfloat16), kernel.weight(torch))
        except Exception:  # a kernel this vLLM or CPU does not have
            continue
        found[fmt] = kernel
    return found or {"bf16": _TorchBF16()}


def cpu_facts() -> dict[str, Any]:
    model, flags = "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            if key.strip() in ("flags", "Features") and not flags:
                flags = value.strip()
    except OSError:
        pass
    return {"model": model, "arch": platform.machine(), "flags": sorted(flags.split())}


def free_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def run_pinned(cpus: list[int], size: int, budget: float) -> dict[str, Any]:
    """measure() in a child process pinned to `cpus` before it imports torch."""
    command = [sys.executable, __file__, "--measure", ",".join(map(str, cpus)), str(size), str(budget)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the measurement on CPUs {cpus} failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def probe(node_name: str, budget: float) -> dict[str, Any]:
    import torch

    size = streamed_bytes(free_bytes())
    numa = []
    for node, cpus in node_cpus().items():
        one = run_pinned(cpus[:1], size, budget)
        every = run_pinned(cpus, size, budget) if len(cpus) > 1 else one
        numa.append({"node": node, "cpus": len(cpus), "oneThread": one, "allCores": every})
    try:
        import vllm

        vllm_version = str(vllm.__version__)
    except Exception:
        vllm_version = None
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": node_name},
        "spec": {
            "cpu": cpu_facts(),
            "torch": str(torch.__version__),
            "vllm": vllm_version,
            "streamedBytes": size,
            "pythonSeconds": python_seconds(),
            "measuredAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "numaNodes": numa,
        },
    }


def main(argv: list[str]) -> int:
    if argv[:1] == ["--measure"]:
        cpus, size, budget = parse_cpu_list(argv[1]), int(argv[2]), float(argv[3])
        os.sched_setaffinity(0, cpus)
        print(json.dumps(measure(len(cpus), size, budget)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME") or socket.gethostname())
    parser.add_argument("--seconds-per-point", type=float, default=1.0)
    # A file of its own for the result: what vLLM logs on import goes to stdout too.
    parser.add_argument("--output", help="write the NodePerformance here instead of printing it")
    args = parser.parse_args(argv)
    measured = json.dumps(probe(args.node_name, args.seconds_per_point))
    if args.output:
        Path(args.output).write_text(measured + "\n")
    else:
        print(measured)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
