"""NodePerformance: what `cpullm probe` (cpullm/perf_probe.py) measured of a node's cores, one object per node, named
after it (cluster-scoped). The planner reads it as a node fact (core/node_facts.py) and predicts a plan's speed from
it (core/performance.py). This model is the object's schema: its CRD is generated from it (`cpullm crd --kind
NodePerformance`), and the probe's output is read through it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from cpullm.api.spec import GROUP, VERSION

KIND = "NodePerformance"
PLURAL = "nodeperformances"
SINGULAR = "nodeperformance"
MAX_NUMA_NODES = 64
MAX_BATCHES = 16

Rates = dict[str, float]  # batch size (as a string: a JSON object's key) -> weight bytes per second


class _Model(BaseModel):
    # Fields it does not know are left out, not refused: a newer probe's output reads with an older operator.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class ThreadsMeasured(_Model):
    """What a number of threads pinned to one NUMA node measured."""

    threads: int = Field(ge=1, le=4096, description="Threads, one per CPU.")
    read_bytes_per_second: float = Field(ge=0, description="Streaming read of memory much larger than the caches.")
    small_kernel_seconds: float = Field(ge=0, description="One small matrix product's time, all overhead.")
    bf16_weight_bytes_per_second: Rates = Field(
        min_length=1,
        max_length=MAX_BATCHES,
        description="vLLM's bf16 matrix kernel: weight bytes per second at each batch size (activation rows).",
    )
    int8_weight_bytes_per_second: Rates | None = Field(
        default=None, max_length=MAX_BATCHES, description="vLLM's W8A8 int8 kernel, likewise (absent: not run)."
    )
    bf16_narrow_weight_bytes_per_second: Rates | None = Field(
        default=None,
        max_length=MAX_BATCHES,
        description="The bf16 kernel over 1,024 inputs (a small model's layers), likewise (absent: not run).",
    )
    int8_narrow_weight_bytes_per_second: Rates | None = Field(
        default=None, max_length=MAX_BATCHES, description="The int8 kernel over 1,024 inputs, likewise."
    )
    attention_prefill_flops_per_second: float | None = Field(
        default=None, ge=0, description="vLLM's attention kernel over a 1,024-token causal prefill (absent: not run)."
    )
    attention_decode_seconds_per_sequence: Rates | None = Field(
        default=None,
        max_length=MAX_BATCHES,
        description="Its decode step's seconds per sequence, by context length (16 heads over 4 KV heads of 128).",
    )
    attention_small_decode_seconds_per_sequence: Rates | None = Field(
        default=None,
        max_length=MAX_BATCHES,
        description="The same on a small layer (4 heads over 1 KV head of 64): its fixed cost (absent: not run).",
    )
    attention_kernel: str | None = Field(default=None, max_length=128, description="The attention kernel measured.")
    bf16_kernel: str | None = Field(default=None, max_length=64, description="The bf16 kernel measured.")
    int8_kernel: str | None = Field(default=None, max_length=64, description="The int8 kernel measured.")


class NumaMeasured(_Model):
    node: int = Field(ge=0, le=1023, description="The NUMA node's number.")
    cpus: int = Field(ge=1, le=4096, description="Its CPUs the probe ran on.")
    one_thread: ThreadsMeasured = Field(description="One thread's figures.")
    all_cores: ThreadsMeasured = Field(description="Every CPU's figures.")


class CpuMeasured(_Model):
    model: str = Field(default="", max_length=256, description="The CPU's model name.")
    arch: str = Field(default="", max_length=32, description="The machine (uname -m).")
    flags: list[str] = Field(default_factory=list, max_length=512, description="Its flags (/proc/cpuinfo).")


class NodePerformanceSpec(_Model):
    cpu: CpuMeasured = Field(default_factory=CpuMeasured, description="The CPU measured.")
    torch: str | None = Field(default=None, max_length=64, description="The torch version measured with.")
    vllm: str | None = Field(default=None, max_length=64, description="The vLLM version whose kernels were run.")
    streamed_bytes: int | None = Field(default=None, ge=0, description="How much each streaming measurement read.")
    python_seconds: float = Field(ge=0, description="A fixed piece of plain Python's time (the engine's overhead).")
    measured_at: str | None = Field(default=None, max_length=64, description="When (RFC 3339).")
    numa_nodes: list[NumaMeasured] = Field(
        min_length=1, max_length=MAX_NUMA_NODES, description="Each NUMA node's figures."
    )


class NodePerformanceObject(_Model):
    api_version: str = Field(default=f"{GROUP}/{VERSION}")
    kind: str = Field(default=KIND)
    metadata: dict[str, object]
    spec: NodePerformanceSpec
