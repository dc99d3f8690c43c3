"""How fast a plan will serve: one decode step, a prefill and a request, from the bytes and operations each reads and
what the node measured (a NodePerformance from `cpullm probe`, or an estimate by ISA class). Pure.

A decode step of B sequences on a rank streams the rank's weights once through the format's matrix kernel at batch
B (memory-bound at small B, compute-bound at large), runs each sequence's attention over its KV cache, a few small
kernels per layer and, at TP > 1, two all-reduces per layer; the engine adds its Python per step. A prefill is the
same at a batch of the prompt's tokens, with attention's quadratic arithmetic. docs/performance.md derives each term
and keeps the benchmark (bench/predict_bench.py) that checks them.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from cpullm.api.performance import KIND, NodePerformanceObject, ThreadsMeasured
from cpullm.core.sizing import ModelSize
from cpullm.core.sizing.anatomy import Linear, Split
from cpullm.core.sizing.quantization import WeightFormat
from cpullm.errors import NodePerformanceError

BF16, INT8 = "bf16", "int8"  # the matrix kernels a probe measures
# What the plan's figures assume of a request: a decode step at this much context per sequence, and the time to the
# first token of a prompt of this many tokens.
DECODE_CONTEXT_TOKENS = 512
TTFT_PROMPT_TOKENS = 1024
# vLLM CPU's prefill chunk (max_num_batched_tokens, its default on CPU: the plan renders none).
PREFILL_CHUNK_TOKENS = 2048
# What the probe's attention layers hold per token: 4 KV heads x (K and V) x 128 x 2 bytes, and its small layer's 1
# KV head of 64 (perf_probe.py LAYER, SMALL_LAYER).
PROBE_KV_BYTES_PER_TOKEN = 4 * 2 * 128 * 2
PROBE_SMALL_KV_BYTES_PER_TOKEN = 1 * 2 * 64 * 2
# Where the probe did not time the attention: a decode reads the KV cache at this share of the streaming read (vLLM's
# kernel read the probe's layer, its KV cache out of the caches, at 0.34-0.40 of it on two Zen 5 vCPUs, 2026-12-02).
KV_READ_SHARE = 0.4

# The terms the probe does not measure whole, in units it does (calibrated by bench/predict_bench.py against real
# vLLM 0.32 servers; docs/performance.md has the fit and the machine it was made on):
# - per step, the engine's Python (scheduler, sampler, output processing), in multiples of the probe's fixed piece
#   of Python;
STEP_PYTHON_MULTIPLE = 0.3
# - per step where the API server and the engine core run on the ranks' own cores (no CPU reserved for them: at one
#   or two cores a rank), what their work for the step (its outputs: detokenizing, streaming) takes from the ranks,
#   likewise: on six runs of two 2-vCPU classes (Zen 4, Zen 5), it brought the median ratio of 96 figures (over 1:
#   predicted faster) from 1.15 to 1.04, and those within 20% from 58 to 73 (docs/performance.md);
SHARED_CORES_PYTHON_MULTIPLE = 1.7
# - per request, the API server's (HTTP, tokenizing, detokenizing), likewise;
REQUEST_PYTHON_MULTIPLE = 4.0
# - per layer and step, the small kernels (norms, rotary, activation, residual adds), in multiples of the probe's
#   small kernel;
LAYER_SMALL_KERNELS = 2.0
# - with LoRA adapters on (spec.adapters), per wrapped projection (each of q, k, v, o, gate, up, down of every layer)
#   and step: a fixed cost, and one per row the step runs (a token decoded, or of a prefill chunk). vLLM's CPU backend
#   runs the adapters' shrink and expand as torch ops and compiles nothing with LoRA on: a rank-16 adapter on all seven
#   projections of Qwen2.5-0.5B's shape cost 118 ms per decode step plus 8.2 ms per row (decode 4.98 tok/s against
#   13.36 without, 32 streams 66 against 307, a 1,024-token prompt 12.3 s against 1.3; bench/predict_bench.py
#   --adapter-rank 16, 2 vCPUs of an Emerald Rapids guest, vLLM 0.32.0, 2026-11-30);
LORA_SLICE_SMALL_KERNELS = 17.6
LORA_SLICE_ROW_SMALL_KERNELS = 1.22
# - per all-reduce (two per layer and step at TP > 1), likewise;
ALLREDUCE_SMALL_KERNELS = 6.5
# - a layer's matrix product reaches the probe's 4096 x 4096 matrix's rate at the same batch from layers this wide,
#   and (width / this) ** exponent of it from narrower ones (a call does less work for the same dispatch, and their
#   blocks fill the kernel's less). The exponent is the node's and the batch's: what the probe's
#   PROBE_NARROW_WIDTH-input product kept of the wide one's rate at that batch puts that width on the curve. Where the
#   probe did not measure it, PREFILL_WIDTH_EXPONENT in a prefill (fitted on AMX) and none in a decode step.
FULL_RATE_WIDTH = 1536
PREFILL_WIDTH_EXPONENT = 0.75
PROBE_NARROW_WIDTH = 1024  # perf_probe.py NARROW_WIDTH


@dataclass(frozen=True)
class KernelRates:
    """A matrix kernel's weight bytes per second, at batch sizes (the activation's rows), measured or estimated."""

    points: tuple[tuple[int, float], ...]  # (batch, bytes/s), batch ascending

    def at(self, batch: int) -> float:
        """Interpolated in log-log between the points; past the largest, the kernel is compute-bound: the same
        arithmetic per second, so weight bytes per second fall as 1 / batch."""
        points, batch = self.points, max(1, batch)
        if batch <= points[0][0]:
            return points[0][1]
        if batch >= points[-1][0]:
            last, rate = points[-1]
            return rate * last / batch
        for (b0, r0), (b1, r1) in itertools.pairwise(points):
            if b0 <= batch <= b1:
                share = math.log(batch / b0) / math.log(b1 / b0)
                return math.exp(math.log(r0) + share * (math.log(r1) - math.log(r0)))
        return points[-1][1]  # pragma: no cover - the points are ascending

    def never_faster_with_more_rows(self) -> KernelRates:
        """Each point at most the rate of every smaller batch: a step of more rows streams the same weights and does
        more arithmetic, so it never takes less time. A probe point above a smaller batch's is the host's noise (the
        servers' 8-sequence steps took 3-13% longer than their one-sequence steps in every Zen 4 case, where the
        probe's 8-row point ran up to 1.2x its 1-row point; docs/benchmarks.md)."""
        points, lowest = [], math.inf
        for batch, rate in self.points:
            lowest = min(lowest, rate)
            points.append((batch, lowest))
        return KernelRates(tuple(points))


def _linear_in_context(points: tuple[tuple[int, float], ...], context: int) -> float:
    """Seconds per sequence at `context` from (context, seconds) points, linear between the two nearest (a decode
    step's time is), extended past them, never below the first point's."""
    if len(points) == 1:
        return points[0][1]
    (c0, t0), (c1, t1) = (points[0], points[1]) if context <= points[1][0] else points[-2:]
    return max(t0 + (context - c0) * (t1 - t0) / (c1 - c0), points[0][1] if context >= points[0][0] else 1e-12)


@dataclass(frozen=True)
class Attention:
    """vLLM's attention kernel as the probe's layers measured it: a prefill's arithmetic per second, and a decode
    step's seconds per sequence at each context length (per layer), on the probe's layer and its small one."""

    prefill_flops: float
    decode: tuple[tuple[int, float], ...]  # (context, seconds per sequence), context ascending
    small_decode: tuple[tuple[int, float], ...] = ()  # likewise on the small layer (none: not measured)

    def decode_seconds(self, context: int, kv_bytes: float) -> float:
        """One sequence's decode through a layer holding `kv_bytes` per token, at `context`: affine in the KV bytes
        through the probe's two layers (the kernel's cost per sequence and layer is part fixed, part its KV reads:
        on two Zen 5 vCPUs at 144 tokens, 7.2 us for the small layer's 256 bytes a token, 38 us for the large one's
        2,048); where only one layer was measured, in proportion to its KV bytes."""
        large = _linear_in_context(self.decode, context)
        if not self.small_decode:
            return large * kv_bytes / PROBE_KV_BYTES_PER_TOKEN
        small = _linear_in_context(self.small_decode, context)
        per_byte = max(0.0, large - small) / (PROBE_KV_BYTES_PER_TOKEN - PROBE_SMALL_KV_BYTES_PER_TOKEN)
        return max(0.0, small - per_byte * PROBE_SMALL_KV_BYTES_PER_TOKEN) + per_byte * kv_bytes


@dataclass(frozen=True)
class ThreadRates:
    """What `threads` threads of one NUMA node measured: the streaming read, each matrix kernel's rates, one small
    kernel's time, and the attention kernel (None: not run; estimated from the matrix kernel)."""

    threads: int
    read: float  # bytes/s
    kernels: tuple[tuple[str, KernelRates], ...]
    small_kernel_seconds: float
    attention: Attention | None = None
    narrow: tuple[tuple[str, KernelRates], ...] = ()  # each kernel over PROBE_NARROW_WIDTH inputs (none: not run)

    def kernel(self, fmt: str) -> KernelRates | None:
        return next((rates for name, rates in self.kernels if name == fmt), None)

    def narrow_kernel(self, fmt: str) -> KernelRates | None:
        return next((rates for name, rates in self.narrow if name == fmt), None)

    def attention_or_estimate(self) -> Attention:
        """The attention measured, else one from the bf16 kernel: a prefill at a third of its arithmetic at a
        1,024-token batch, a decode reading the KV cache at KV_READ_SHARE of the streaming read."""
        if self.attention is not None:
            return self.attention
        bf16 = self.kernel(BF16)
        flops = (bf16.at(1024) * 1024 / 3) if bf16 else 1e9
        read = KV_READ_SHARE * self.read
        return Attention(flops, tuple((c, c * PROBE_KV_BYTES_PER_TOKEN / read) for c in (128, 1024)))


@dataclass(frozen=True)
class NumaPerformance:
    """One NUMA node: one thread's rates and all its cores'. A rank of c cores gets c threads' worth until the
    node saturates: min(c x one thread, all cores)."""

    cpus: int
    one: ThreadRates
    every: ThreadRates

    def read(self, cores: int) -> float:
        return min(cores * self.one.read, self.every.read)

    def rate(self, fmt: str, cores: int, batch: int) -> float | None:
        one, every = self.one.kernel(fmt), self.every.kernel(fmt)
        if one is None or every is None:
            return None
        return min(cores * one.at(batch), every.at(batch))

    def narrow_share(self, fmt: str, cores: int, batch: int) -> float | None:
        """What a product of PROBE_NARROW_WIDTH inputs kept of the wide one's weight bytes per second (at one batch,
        its arithmetic) on `cores` at `batch` rows; None where the probe did not measure it."""
        one, every = self.one.narrow_kernel(fmt), self.every.narrow_kernel(fmt)
        wide = self.rate(fmt, cores, batch)
        if one is None or every is None or not wide:
            return None
        return min(cores * one.at(batch), every.at(batch)) / wide

    def attention_prefill_flops(self, cores: int) -> float:
        one, every = self.one.attention_or_estimate(), self.every.attention_or_estimate()
        return min(cores * one.prefill_flops, every.prefill_flops)

    def attention_decode_seconds(self, cores: int, context: int, kv_bytes: float) -> float:
        """One sequence's decode through a layer of `kv_bytes` per token (Attention.decode_seconds) on `cores`."""
        one, every = self.one.attention_or_estimate(), self.every.attention_or_estimate()
        return max(one.decode_seconds(context, kv_bytes) / cores, every.decode_seconds(context, kv_bytes))

    def small_kernel_seconds(self, cores: int) -> float:
        """One small kernel's cost on `cores` threads: between one thread's and all the node's, by thread count."""
        if self.cpus <= 1 or cores <= 1:
            return self.one.small_kernel_seconds
        share = (cores - 1) / (self.cpus - 1)
        return self.one.small_kernel_seconds + share * (self.every.small_kernel_seconds - self.one.small_kernel_seconds)


@dataclass(frozen=True)
class NodePerformance:
    """What a node's cores do (a NodeFact: node-fact source NodePerformance). `basis`: "probe" (measured on it, or
    on a node of its shape) or "estimate" (a table by ISA class); `source` says which."""

    node: str
    numa: tuple[NumaPerformance, ...]
    python_seconds: float
    basis: str
    source: str

    def slowest(self) -> NumaPerformance:
        """The NUMA node a rank would run slowest on (by its all-core read): ranks wait for each other."""
        return min(self.numa, key=lambda n: n.every.read)


@dataclass(frozen=True)
class Predicted:
    decode_tokens_per_second: float
    throughput_tokens_per_second: float
    throughput_streams: int
    time_to_first_token_seconds: float
    prompt_tokens: int
    basis: str
    source: str


@dataclass(frozen=True)
class Serving:
    """How a plan serves, as the model needs it: TP, the cores each rank has, the checkpoint's kernel."""

    tensor_parallel_size: int
    cores_per_rank: int
    kernel: str  # BF16, INT8, or what a format estimates from (kernel_of)
    kernel_factor: float  # the format's rate against the kernel's (1 where measured)
    lora: bool = False  # LoRA adapters on (spec.adapters): compilation off, the adapters' products per layer
    shares_cores: bool = False  # the API server and engine core on the ranks' cores (no CPU reserved per rank)


def kernel_of(model: ModelSize) -> tuple[str, float]:
    """The probe's kernel whose rates a checkpoint runs at, and the factor on them: bf16 for unquantized 16-bit
    weights; int8 for W8A8; 4-bit weights through vLLM's WNA16 kernel at a measured share of bf16's weight bytes per
    second (FORMAT_FACTORS); float32 weights stream as bf16's bytes."""
    fmt = model.quantization
    if fmt is None:
        return BF16, 1.0
    if fmt.activations == "int8":
        return INT8, 1.0
    return BF16, FORMAT_FACTORS.get(fmt.method if fmt.method in ("fp8", "mxfp4") else f"int{fmt.bits}", 1.0)


# Weight bytes per second of a format's kernel against bf16's, where no probe measures it (the LM head is bf16's,
# lm_head_seconds). int4: Qwen2.5-1.5B in AWQ int4 decoded 10.62 tok/s, 1.149 GB a token, where bf16 streamed
# 58.6 GB/s in the same run: its 0.467 GB bf16 LM head at that rate leaves 0.682 GB of int4 layers in 86.2 ms, 7.9
# GB/s (vLLM 0.32's cpu_gemm_wna16, 2 Zen 4 cores, avx512_bf16 without AMX; bench/engines_bench.py,
# docs/benchmarks.md). fp8 and mxfp4 run on AMX only and were not measured: counted as bf16's bytes rate.
FORMAT_FACTORS: Mapping[str, float] = {"int4": 7.9 / 58.6, "fp8": 1.0, "mxfp4": 1.0}


@dataclass(frozen=True)
class StepBytes:
    """A rank's weight bytes per step: the dense layers' and the LM head's, which every token reads, and the
    experts', which a batch reads only for the experts its tokens route to."""

    dense: int
    experts: int
    experts_total: int
    experts_active: int
    lm_head: int = 0

    def at(self, batch: int) -> float:
        """A step of `batch` tokens, each through the LM head (a decode step: every token is a sequence's last)."""
        return self.layers(batch) + self.lm_head

    def layers(self, batch: int) -> float:
        """The decoder layers' bytes for a batch of `batch` tokens."""
        if not self.experts or not self.experts_total:
            return float(self.dense)
        untouched = (1 - self.experts_active / self.experts_total) ** batch
        return self.dense + self.experts * (1 - untouched)


def matrix_bytes(model: ModelSize, linear: Linear) -> int:
    """One of a linear layer's matrices as the checkpoint stores it: quantized where its format quantizes the layer,
    else in the serving dtype."""
    fmt = model.quantization
    stored = fmt.linear_bytes(linear) if fmt is not None and fmt.quantizes(linear) else None
    return stored if stored is not None else linear.in_features * linear.out_features * model.dtype_bytes


def step_bytes(model: ModelSize, tp: int) -> StepBytes:
    """The weights a decode step streams on one rank: every linear layer as the checkpoint stores it, split by TP
    (replicated layers whole), and the LM head (vocabulary x width, tied or not) in the serving dtype. The input
    embedding is looked up, not streamed. A model sized only by weightsBytes streams those bytes."""
    anatomy = model.anatomy
    dense = experts = 0
    for linear in anatomy.linears:
        share = matrix_bytes(model, linear) * linear.count // (1 if linear.split == Split.REPLICATED else tp)
        if linear.expert:
            experts += share
        else:
            dense += share
    lm_head = anatomy.embedding_parameters * model.dtype_bytes // tp
    if not dense and not experts:
        return StepBytes(model.weights_bytes // tp, 0, 0, 0)
    return StepBytes(dense, experts, anatomy.experts or 0, anatomy.active_experts or 0, lm_head)


def _attention_width(model: ModelSize, tp: int) -> int:
    """Query heads x head width on one rank (the attention's arithmetic per token pair), from the KV layers."""
    anatomy = model.anatomy
    entry = max((g.entry // 2 for g in anatomy.kv_groups if g.entry), default=128)
    return max(1, anatomy.attention_heads // tp) * entry


@dataclass(frozen=True)
class StepTime:
    weights: float
    attention: float
    small_kernels: float
    allreduce: float
    python: float

    @property
    def seconds(self) -> float:
        return self.weights + self.attention + self.small_kernels + self.allreduce + self.python


def step_python_multiple(serving: Serving) -> float:
    """The Python a step costs beside its kernels, in multiples of the probe's piece of Python."""
    return STEP_PYTHON_MULTIPLE + (SHARED_CORES_PYTHON_MULTIPLE if serving.shares_cores else 0.0)


def decode_step(
    model: ModelSize,
    serving: Serving,
    node: NodePerformance,
    batch: int,
    context: int,
    kv_bytes_per_token: int,
    queries: int = 1,
) -> StepTime:
    """One decode step of `batch` sequences at `context` tokens each, on the node's slowest NUMA node. The attention
    costs each sequence what the probe's layers put on a layer of this model's KV bytes (Attention.decode_seconds).
    `queries`: tokens each sequence puts through the weights in the step (a speculative step checks the proposed
    tokens and one more: the matrix kernels run at batch x queries rows, each sequence's KV cache is read once)."""
    numa, cores, tp = node.slowest(), serving.cores_per_rank, serving.tensor_parallel_size
    small = numa.small_kernel_seconds(cores)
    layers = max(1, model.anatomy.layers)
    attention_layers = sum(g.layers for g in model.anatomy.kv_groups)
    layer_kv_bytes = kv_bytes_per_token / max(1, attention_layers)  # a layer's KV bytes per token on the rank
    per_sequence = numa.attention_decode_seconds(cores, context, layer_kv_bytes)
    rows, streamed = batch * max(1, queries), step_bytes(model, tp)
    lora = lora_small_kernels(model, rows) if serving.lora else 0.0
    return StepTime(
        weights=layers_seconds(model, streamed, numa, serving, rows) + lm_head_seconds(streamed, numa, serving, rows),
        attention=batch * attention_layers * per_sequence,
        small_kernels=(layers * LAYER_SMALL_KERNELS + lora) * small,
        allreduce=(2 * layers * ALLREDUCE_SMALL_KERNELS * small) if tp > 1 else 0.0,
        python=step_python_multiple(serving) * node.python_seconds,
    )


def lora_small_kernels(model: ModelSize, rows: int) -> float:
    """A step's LoRA cost with adapters on, in small kernels: per wrapped projection slice (an expert layer's
    projections count once per layer: the MoE kernel runs the experts together), a fixed cost and one per row."""
    experts = max(1, model.anatomy.experts or 1)
    slices = sum(linear.count // (experts if linear.expert else 1) for linear in model.anatomy.linears)
    return slices * (LORA_SLICE_SMALL_KERNELS + rows * LORA_SLICE_ROW_SMALL_KERNELS)


def width_efficiency(model: ModelSize, numa: NumaPerformance, serving: Serving, rows: int, prefill: bool) -> float:
    """The share of the probe's matrix rate the model's layers reach at `rows`: each linear layer at
    (width / FULL_RATE_WIDTH) ** exponent by its inputs on a rank (a row-parallel layer's are split by TP), weighted
    by its bytes (the time of each is its bytes over its rate); the exponent from the probe's narrow product at
    those rows."""
    share = numa.narrow_share(serving.kernel, serving.cores_per_rank, rows)
    if share is None:
        exponent = PREFILL_WIDTH_EXPONENT if prefill else 0.0
    else:
        exponent = max(0.0, math.log(min(1.0, share)) / math.log(PROBE_NARROW_WIDTH / FULL_RATE_WIDTH))
    tp, weighted, seconds = serving.tensor_parallel_size, 0.0, 0.0
    for linear in model.anatomy.linears:
        width = linear.in_features // (tp if linear.split == Split.ROW else 1)
        weighted += linear.parameters
        seconds += linear.parameters / min(1.0, max(1, width) / FULL_RATE_WIDTH) ** exponent
    return weighted / seconds if seconds else 1.0


def layers_seconds(
    model: ModelSize, streamed: StepBytes, numa: NumaPerformance, serving: Serving, rows: int, prefill: bool = False
) -> float:
    """The decoder layers' weights through the checkpoint's kernel at `rows`, at the model's width_efficiency."""
    rate = matrix_rate(numa, serving, rows) * width_efficiency(model, numa, serving, rows, prefill)
    return streamed.layers(rows) / rate


def prefill_seconds(
    model: ModelSize, serving: Serving, node: NodePerformance, prompt: int, kv_bytes_per_token: int
) -> float:
    """A prompt alone, in chunks of PREFILL_CHUNK_TOKENS: each chunk's matrix products at its batch (at
    width_efficiency of the probe's), its attention's arithmetic (each query against the keys before it) at
    the probe's attention rate, and a step's other costs."""
    numa, tp, cores = node.slowest(), serving.tensor_parallel_size, serving.cores_per_rank
    width = _attention_width(model, tp)
    attention_layers = sum(g.layers for g in model.anatomy.kv_groups)
    total, done = 0.0, 0
    while done < prompt:
        chunk = min(PREFILL_CHUNK_TOKENS, prompt - done)
        step = decode_step(model, serving, node, chunk, 0, kv_bytes_per_token)
        streamed = step_bytes(model, tp)
        # The decoder layers at the chunk's batch; the LM head for the sequence's last token only.
        layers = layers_seconds(model, streamed, numa, serving, chunk, prefill=True)
        matrices = layers + lm_head_seconds(streamed, numa, serving, 1)
        flops = 4 * chunk * (done + chunk / 2) * width * attention_layers
        attention = flops / numa.attention_prefill_flops(cores)
        total += matrices + attention + step.small_kernels + step.allreduce
        total += step.python
        done += chunk
    return total


def predict(
    model: ModelSize,
    serving: Serving,
    node: NodePerformance,
    streams: int,
    kv_bytes_per_token: int,
    prompt: int = TTFT_PROMPT_TOKENS,
    context: int = DECODE_CONTEXT_TOKENS,
) -> Predicted:
    """The plan's figures: one sequence's decode tok/s, `streams` sequences' generated tok/s, and the time to the
    first token of a `prompt`-token prompt on an idle server."""
    one = decode_step(model, serving, node, 1, context, kv_bytes_per_token).seconds
    many = decode_step(model, serving, node, streams, context, kv_bytes_per_token).seconds
    request = REQUEST_PYTHON_MULTIPLE * node.python_seconds
    ttft = request + prefill_seconds(model, serving, node, prompt, kv_bytes_per_token)
    return Predicted(
        decode_tokens_per_second=1 / one,
        throughput_tokens_per_second=streams / many,
        throughput_streams=streams,
        time_to_first_token_seconds=ttft,
        prompt_tokens=prompt,
        basis=node.basis,
        source=node.source,
    )


# Where a server saturates: each sequence's decode step this many times one sequence's alone. A CpuLLMGateway sends a
# server no more sequences than that at once (core/gateway.py), well before its KV cache fills; 1.25 leaves the
# others' prefills room under the 1.5x a team's latency may grow while another team floods (docs/gateway.md).
SATURATION_SLOWDOWN = 1.25


def saturation_streams(
    model: ModelSize,
    serving: Serving,
    node: NodePerformance,
    most: int,
    kv_bytes_per_token: int,
    context: int = DECODE_CONTEXT_TOKENS,
) -> int:
    """The most sequences (1 to `most`) a server decodes at once with each step at most SATURATION_SLOWDOWN times one
    sequence's. A step's time grows with the sequences in it (their KV reads and FLOPs), so the search halves."""
    limit = SATURATION_SLOWDOWN * decode_step(model, serving, node, 1, context, kv_bytes_per_token).seconds
    low, high = 1, max(1, most)
    while low < high:
        middle = (low + high + 1) // 2
        if decode_step(model, serving, node, middle, context, kv_bytes_per_token).seconds <= limit:
            low = middle
        else:
            high = middle - 1
    return low


# The checkpoints of the same model a plan compares its own with, as vLLM CPU runs them: W8A8 int8 (compressed-tensors,
# per output channel, activations per token) and AWQ int4 (groups of 128, zero points), the LM head unquantized.
ALTERNATIVE_FORMATS: tuple[tuple[str, WeightFormat], ...] = (
    ("W8A8 int8", WeightFormat("compressed-tensors", 8, excluded=("lm_head",), activations="int8")),
    ("AWQ int4", WeightFormat("awq", 4, group_size=128, zero_points=True, excluded=("lm_head",))),
)
# "Much faster": a plan names another format where it is predicted at least this much faster than its own.
FASTER_FORMAT_RATIO = 1.3


@dataclass(frozen=True)
class FasterFormat:
    checkpoint: str
    decode_speedup: float
    throughput_speedup: float


def faster_formats(
    model: ModelSize, serving: Serving, node: NodePerformance, streams: int, isa: frozenset[str], kv: int
) -> list[FasterFormat]:
    """The checkpoints of the same model predicted to decode or generate at least FASTER_FORMAT_RATIO as fast as
    an unquantized one on these nodes (that vLLM CPU runs on them), fastest first; none for a quantized model."""
    if model.quantization is not None:
        return []
    base = predict(model, serving, node, streams, kv)
    found = []
    for name, fmt in ALTERNATIVE_FORMATS:
        if fmt.kernel_problem(isa, model.anatomy) or fmt.tensor_parallel_problem(
            serving.tensor_parallel_size, model.anatomy
        ):
            continue
        other = dataclasses.replace(model, quantization=fmt)
        kernel, factor = kernel_of(other)
        figures = predict(other, dataclasses.replace(serving, kernel=kernel, kernel_factor=factor), node, streams, kv)
        decode = figures.decode_tokens_per_second / base.decode_tokens_per_second
        throughput = figures.throughput_tokens_per_second / base.throughput_tokens_per_second
        if max(decode, throughput) >= FASTER_FORMAT_RATIO:
            found.append(FasterFormat(name, round(decode, 2), round(throughput, 2)))
    return sorted(found, key=lambda f: -max(f.decode_speedup, f.throughput_speedup))


def lm_head_seconds(streamed: StepBytes, numa: NumaPerformance, serving: Serving, rows: int) -> float:
    """The LM head at `rows` (the tokens that need logits): in the serving dtype whatever the checkpoint quantizes
    (step_bytes), so through bf16's kernel at its own rate."""
    return streamed.lm_head / matrix_rate(numa, dataclasses.replace(serving, kernel=BF16, kernel_factor=1.0), rows)


def matrix_rate(numa: NumaPerformance, serving: Serving, batch: int) -> float:
    """The rank's weight bytes per second through the plan's kernel at `batch` rows."""
    rate = numa.rate(serving.kernel, serving.cores_per_rank, batch)
    if rate is None:  # a kernel the probe could not run (int8 without vLLM): bf16's, said in the basis
        rate = numa.rate(BF16, serving.cores_per_rank, batch)
    assert rate is not None, "every NodePerformance has bf16 rates"
    return rate * serving.kernel_factor


# ---- estimates, where no probe measured a node ----

GB = 1e9
# A NUMA node's sustained read with all its cores, where nothing measured it: labels do not say how many memory
# channels a NUMA node has. Half the peak of a DDR5-4800 socket of 8 channels (307 GB/s), an assumption the plan
# names as its basis; per core, the rows below bound it first on small nodes.
NUMA_READ_ESTIMATE = 150 * GB


@dataclass(frozen=True)
class Estimate:
    """One thread of a class of cores, as measured on one machine of the class (`source`): its streaming read, the
    bf16 and int8 kernels' weight bytes per second by batch, one small kernel's time, and the probe's Python."""

    flag: str  # the ISA flag (lscpu name) that puts a node in this class; "" for the rest
    arch: str
    source: str
    read: float
    bf16: tuple[tuple[int, float], ...]
    int8: tuple[tuple[int, float], ...] | None
    small_kernel_seconds: float
    python_seconds: float


# By class, the first row whose flag the node has. Where only a whole server was measured, the kernel's rate at a batch
# is the decode step's weight bytes per second at that many sequences (an under-estimate: it includes the step's
# other work).
ESTIMATES: tuple[Estimate, ...] = (
    Estimate(
        "amx_tile",
        "amd64",
        "cpullm probe on a 2-vCPU Emerald Rapids guest, vLLM 0.32.0, 2026-11-28 (docs/performance.md), per thread",
        8.3 * GB,
        ((1, 9.7 * GB), (8, 13.1 * GB), (32, 10.6 * GB), (256, 3.2 * GB), (1024, 0.95 * GB)),
        ((1, 8.0 * GB), (8, 11.5 * GB), (32, 7.2 * GB), (256, 2.1 * GB), (1024, 0.47 * GB)),
        3.2e-5,
        0.0072,
    ),
    Estimate(
        "avx512_bf16",
        "amd64",
        "the rendered pod of Qwen2.5-1.5B on 2 Zen 4 vCPUs, vLLM 0.32.0, 2026-11-28 (docs/benchmarks.md, "
        "bench/engines_bench.py), per thread",
        32.9 * GB,
        ((1, 29.3 * GB), (8, 13.7 * GB), (32, 5.6 * GB), (1024, 0.48 * GB)),
        ((1, 18.7 * GB), (8, 12.2 * GB), (32, 5.1 * GB), (1024, 0.47 * GB)),
        3.2e-5,
        0.0072,
    ),
    Estimate(
        "avx512f",
        "amd64",
        "the rendered pod of Qwen2.5-1.5B on 2 Zen 4 vCPUs with oneDNN held to AVX512_CORE (no bf16 arithmetic), "
        "vLLM 0.32.0, 2026-11-28 (docs/benchmarks.md), per thread",
        32.9 * GB,
        ((1, 17.4 * GB), (8, 3.1 * GB), (32, 1.2 * GB), (1024, 0.095 * GB)),
        ((1, 22.7 * GB), (8, 6.8 * GB), (32, 2.6 * GB), (1024, 0.29 * GB)),
        3.2e-5,
        0.0072,
    ),
    Estimate(
        "",
        "",
        "the rendered pod of Qwen2.5-1.5B on 2 AVX2-only EPYC (Zen 1) vCPUs, vLLM 0.32.0, 2026-11-27 "
        "(docs/benchmarks.md), per thread; other CPUs (arm64) alike, unmeasured",
        22.3 * GB,
        ((1, 11.5 * GB), (8, 1.5 * GB), (32, 0.4 * GB), (1024, 0.013 * GB)),
        None,
        4.0e-5,
        0.0090,
    ),
)


def estimated_performance(
    name: str, arch: str, isa: frozenset[str], numa_nodes: int, cpus_per_numa: int
) -> NodePerformance:
    """A node nothing measured, from the first ESTIMATES row of its class: each NUMA node's cores scale one thread's
    figures until NUMA_READ_ESTIMATE bounds their reads."""
    row = next(r for r in ESTIMATES if (not r.flag or r.flag in isa) and (not r.arch or r.arch == arch))
    cpus = max(1, cpus_per_numa)
    one = ThreadRates(1, row.read, _estimate_kernels(row), row.small_kernel_seconds)
    read_all = min(cpus * row.read, NUMA_READ_ESTIMATE)
    bound = read_all / (cpus * row.read)  # the share of one thread's rates each core keeps when memory saturates
    every = ThreadRates(
        cpus,
        read_all,
        tuple((fmt, _node_rates(rates, cpus, bound)) for fmt, rates in one.kernels),
        row.small_kernel_seconds,
    )
    numa = NumaPerformance(cpus, one, every)
    return NodePerformance(name, (numa,) * max(1, numa_nodes), row.python_seconds, "estimate", row.source)


def _node_rates(one: KernelRates, cpus: int, bound: float) -> KernelRates:
    """A NUMA node's rates from one thread's: up to 8 rows the weights stream from memory, so the cores share its
    read (`bound`); past that the cores add arithmetic, but weights never stream faster than at the memory-bound
    rows' best."""
    streamed = [(b, r * cpus * min(1.0, bound)) for b, r in one.points if b <= 8]
    ceiling = max((r for _, r in streamed), default=math.inf)
    return KernelRates((*streamed, *((b, min(r * cpus, ceiling)) for b, r in one.points if b > 8)))


def _estimate_kernels(row: Estimate) -> tuple[tuple[str, KernelRates], ...]:
    kernels = [(BF16, KernelRates(row.bf16))]
    if row.int8:
        kernels.append((INT8, KernelRates(row.int8)))
    return tuple(kernels)


# ---- reading a NodePerformance (the probe's output, cpullm/perf_probe.py) ----


def parse_performance(obj: Mapping[str, Any]) -> NodePerformance:
    """A NodePerformance object as the probe prints it; raises NodePerformanceError naming what is wrong."""
    return performance_of(validated_performance(obj))


def validated_performance(obj: Mapping[str, Any]) -> NodePerformanceObject:
    """The object through its schema (api/performance.py); NodePerformanceError naming the first field wrong."""
    name = str((obj.get("metadata") or {}).get("name", "")) if isinstance(obj, Mapping) else ""
    try:
        return NodePerformanceObject.model_validate(obj)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise NodePerformanceError(f"{KIND} {name}: {where}: {first['msg']}") from None


def performance_of(parsed: NodePerformanceObject) -> NodePerformance:
    """What the planner reads of a validated object; NodePerformanceError where its rates cannot be used."""
    name = str(parsed.metadata.get("name", ""))
    spec = parsed.spec
    numa = tuple(
        NumaPerformance(n.cpus, _thread_rates(n.one_thread), _thread_rates(n.all_cores)) for n in spec.numa_nodes
    )
    source = f"probe of {name}" + (f" ({spec.cpu.model})" if spec.cpu.model else "")
    return NodePerformance(
        node=name,
        numa=numa,
        python_seconds=spec.python_seconds,
        basis="probe",
        source=source + (f", {spec.measured_at}" if spec.measured_at else ""),
    )


def _thread_rates(measured: ThreadsMeasured) -> ThreadRates:
    kernels = [(BF16, _rates(measured.bf16_weight_bytes_per_second).never_faster_with_more_rows())]
    if measured.int8_weight_bytes_per_second:
        kernels.append((INT8, _rates(measured.int8_weight_bytes_per_second).never_faster_with_more_rows()))
    attention = None
    decode = measured.attention_decode_seconds_per_sequence
    if measured.attention_prefill_flops_per_second and decode:
        small = measured.attention_small_decode_seconds_per_sequence
        attention = Attention(
            measured.attention_prefill_flops_per_second, _rates(decode).points, _rates(small).points if small else ()
        )
    narrow = [
        (fmt, _rates(rates).never_faster_with_more_rows())
        for fmt, rates in (
            (BF16, measured.bf16_narrow_weight_bytes_per_second),
            (INT8, measured.int8_narrow_weight_bytes_per_second),
        )
        if rates
    ]
    return ThreadRates(
        measured.threads,
        measured.read_bytes_per_second,
        tuple(kernels),
        measured.small_kernel_seconds,
        attention,
        tuple(narrow),
    )


def _rates(by_batch: Mapping[str, float]) -> KernelRates:
    try:
        points = tuple(sorted((int(batch), float(rate)) for batch, rate in by_batch.items()))
    except ValueError:
        raise NodePerformanceError(f"batch sizes {sorted(by_batch)} are not whole numbers") from None
    if any(batch < 1 or not math.isfinite(rate) or rate <= 0 for batch, rate in points):
        raise NodePerformanceError(f"rates {dict(by_batch)} are not positive, at batch sizes from 1")
    return KernelRates(points)
