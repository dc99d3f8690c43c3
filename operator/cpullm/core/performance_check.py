"""Whether a service's servers run as fast as its plan predicted: the PerformanceAsPredicted condition.

The operator reads each ready server's /metrics now and then (controller/performance.py): vLLM's inter-token
latency and time-to-first-token histograms and its running requests, and the container's cgroup CPU figures the
pod's container_cpu_metrics adds (cpullm/vllm_fixes.py). Between two readings of a server, its decode tokens took
their mean inter-token latency at some number of sequences at once; the plan's prediction for that many (a straight
line between its one-sequence decode and its maxNumSeqs throughput step) is compared with it. Far below (under
SLOW_SHARE of the predicted speed) is False, with the likeliest cause the figures show: fewer CPUs than planned (its
cpuset or CFS quota), CFS throttling, ranks across NUMA nodes (the plan's own caution), else none visible. Too few
tokens between readings say nothing: the last verdict stands. docs/performance.md, "The check"."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cpullm.api.plan import Plan
from cpullm.core.children.router import ROUTER_LABEL
from cpullm.core.status import FeatureCondition
from cpullm.vllm_support import CONTAINER_CPUS, CPU_PERIODS, CPU_THROTTLED_PERIODS

PERFORMANCE_AS_PREDICTED = "PerformanceAsPredicted"
# vLLM's series (v1 engine); the inter-token latency histogram's older name second.
INTER_TOKEN = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
FIRST_TOKEN = "vllm:time_to_first_token_seconds"
RUNNING = "vllm:num_requests_running"
# Fewer decode tokens than this between two readings of all servers say nothing about their speed.
MIN_DECODE_TOKENS = 64
# Below this share of the predicted speed the servers run far below the prediction: the worst prediction benchmarked
# was 1.54x the measurement, a share of 0.65 (docs/benchmarks.md), so half is no noise.
SLOW_SHARE = 0.5
# CFS throttled this share of its periods: the container asks for more CPU time than its quota gives.
THROTTLED_SHARE = 0.1
NUMA_ALIGNED = "NUMAAligned"  # core/cautions.py's condition


@dataclass(frozen=True)
class ServerAddress:
    """A ready server pod, where its /metrics is read."""

    pod: str
    ip: str


def ready_server_address(pod: str, labels: Mapping[str, str], status: Mapping[str, Any]) -> ServerAddress | None:
    """The pod's address when it is a ready server (not the router) with an IP; None otherwise."""
    if ROUTER_LABEL in labels or not status.get("podIP"):
        return None
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return ServerAddress(pod, str(status["podIP"])) if ready else None


@dataclass(frozen=True)
class ServerSample:
    """One reading of a server's /metrics at `at` (monotonic seconds); the cgroup's figures None where the pod's
    container_cpu_metrics did not add them (turned off, another image)."""

    at: float
    decode_tokens: float
    decode_seconds: float
    first_tokens: float
    first_token_seconds: float
    running: float
    cpus: float | None = None
    periods: float | None = None
    throttled_periods: float | None = None

    @classmethod
    def of(cls, series: Mapping[str, float], at: float) -> ServerSample | None:
        """From a reading's series (each sample's value, summed over its labels); None when it holds no vLLM
        inter-token latency histogram (not vLLM's /metrics)."""
        name = next((n for n in INTER_TOKEN if f"{n}_count" in series), None)
        if name is None:
            return None
        return cls(
            at=at,
            decode_tokens=series[f"{name}_count"],
            decode_seconds=series.get(f"{name}_sum", 0.0),
            first_tokens=series.get(f"{FIRST_TOKEN}_count", 0.0),
            first_token_seconds=series.get(f"{FIRST_TOKEN}_sum", 0.0),
            running=series.get(RUNNING, 0.0),
            cpus=series.get(CONTAINER_CPUS),
            periods=series.get(CPU_PERIODS),
            throttled_periods=series.get(CPU_THROTTLED_PERIODS),
        )


@dataclass(frozen=True)
class Window:
    """What one server did between two readings."""

    seconds: float
    decode_tokens: float
    decode_seconds: float
    first_tokens: float
    first_token_seconds: float
    running: float  # the more of the two readings' running requests
    cpus: float | None
    periods: float
    throttled_periods: float


def window(before: ServerSample, after: ServerSample) -> Window | None:
    """The window between two readings of one server; None when a counter went back (the server restarted) or no
    time passed."""
    seconds = after.at - before.at
    counters = [(before.decode_tokens, after.decode_tokens), (before.first_tokens, after.first_tokens)]
    counters += [(before.decode_seconds, after.decode_seconds)]
    if seconds <= 0 or any(b > a for b, a in counters):
        return None
    throttled = periods = 0.0
    if None not in (before.periods, after.periods, before.throttled_periods, after.throttled_periods):
        periods = max(0.0, (after.periods or 0) - (before.periods or 0))
        throttled = max(0.0, (after.throttled_periods or 0) - (before.throttled_periods or 0))
    return Window(
        seconds=seconds,
        decode_tokens=after.decode_tokens - before.decode_tokens,
        decode_seconds=after.decode_seconds - before.decode_seconds,
        first_tokens=after.first_tokens - before.first_tokens,
        first_token_seconds=after.first_token_seconds - before.first_token_seconds,
        running=max(before.running, after.running),
        cpus=after.cpus,
        periods=periods,
        throttled_periods=throttled,
    )


@dataclass(frozen=True)
class PerformanceVerdict:
    ok: bool
    reason: str
    message: str
    speed_share: float  # the observed decode speed over the predicted, at the same sequences at once

    def condition(self) -> FeatureCondition:
        return FeatureCondition(PERFORMANCE_AS_PREDICTED, self.ok, self.reason, self.message)


def predicted_step_seconds(plan: Plan, sequences: float) -> float | None:
    """The plan's predicted decode step at `sequences` at once: a straight line from one sequence's step (its decode
    figure) to maxNumSeqs' (its throughput figure); None without a prediction."""
    p = plan.predicted
    if p is None or p.decode_tokens_per_second <= 0 or p.throughput_tokens_per_second <= 0:
        return None
    one, full = 1 / p.decode_tokens_per_second, p.throughput_streams / p.throughput_tokens_per_second
    if p.throughput_streams <= 1:
        return one
    at = min(max(sequences, 1.0), float(p.throughput_streams))
    return one + (full - one) * (at - 1) / (p.throughput_streams - 1)


def _sequences(w: Window, streams: int) -> float:
    """How many sequences decoded at once: the decode seconds per second of the window (each sequence's tokens'
    latencies add up to the time it decoded), or the running requests read, whichever is more."""
    return min(max(w.running, w.decode_seconds / w.seconds, 1.0), float(max(streams, 1)))


def judge(plan: Plan, windows: Sequence[Window]) -> PerformanceVerdict | None:
    """The verdict on the servers' windows since their last readings; None when they decoded too little to tell or
    the plan predicts nothing."""
    p = plan.predicted
    tokens = sum(w.decode_tokens for w in windows)
    if p is None or tokens < MIN_DECODE_TOKENS:
        return None
    predicted = observed = weighted_sequences = 0.0
    for w in windows:
        if w.decode_tokens <= 0:
            continue
        sequences = _sequences(w, p.throughput_streams)
        step = predicted_step_seconds(plan, sequences)
        if step is None:
            return None
        predicted += w.decode_tokens * step
        observed += w.decode_seconds
        weighted_sequences += w.decode_tokens * sequences
    if observed <= 0:
        return None
    share = predicted / observed
    seconds = max(w.seconds for w in windows)
    first = sum(w.first_tokens for w in windows)
    ttft = (
        f"; first tokens in {sum(w.first_token_seconds for w in windows) / first:.2f} s on average "
        f"(predicted {p.time_to_first_token_seconds:.2f} s for an idle server and a {p.prompt_tokens:,}-token prompt)"
        if first
        else ""
    )
    figures = (
        f"decode at {share:.2f} of the predicted speed over the last {seconds:.0f} s: {observed / tokens * 1000:.0f} "
        f"ms per token at {weighted_sequences / tokens:.1f} sequences at once, {predicted / tokens * 1000:.0f} ms "
        f"predicted ({p.basis}: {p.source}){ttft}"
    )
    if share >= SLOW_SHARE:
        return PerformanceVerdict(True, "AsPredicted", figures, share)
    reason, cause = _cause(plan, windows)
    return PerformanceVerdict(False, reason, f"{figures}. {cause}", share)


def _cause(plan: Plan, windows: Sequence[Window]) -> tuple[str, str]:
    """The likeliest cause of a slow decode the figures show, and what to do."""
    fewest = min((w.cpus for w in windows if w.cpus is not None), default=None)
    if fewest is not None and fewest < plan.cpu - 0.01:
        return "FewerCPUsThanPlanned", (
            f"A server may use {fewest:g} CPUs of the {plan.cpu} planned (its cgroup's cpuset and CFS quota): "
            "something changed its container's CPUs after the kubelet set them (an in-place resize, a node agent); "
            "delete the pod to have it made again as planned"
        )
    periods = sum(w.periods for w in windows)
    throttled = sum(w.throttled_periods for w in windows)
    if periods and throttled / periods >= THROTTLED_SHARE:
        return "CPUThrottled", (
            f"The servers' containers were throttled by CFS in {throttled / periods:.0%} of its periods (cgroup "
            "cpu.stat): they run more threads than their CPU limit allows for (spec.env setting OMP_NUM_THREADS, "
            "or a CPU manager policy other than static: label the nodes cpullm.io/cpu-manager-policy as configured)"
        )
    numa = next((c for c in plan.cautions or [] if c.condition == NUMA_ALIGNED), None)
    if numa is not None:
        return "RanksAcrossNUMANodes", f"The plan's ranks are not aligned to NUMA nodes: {numa.message}"
    return "SlowerThanPredicted", (
        "No cause is visible in the servers' figures: other work on the same cores or memory channels, or nodes "
        "slower than the figures the plan used (run `cpullm probe` on one and publish its NodePerformance)"
    )
