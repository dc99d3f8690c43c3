"""The plan: what the planner decided for one CpuLLMService. Printed by `cpullm plan` and stored in
`status.plan`; its schema in the CRD is generated from this model."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from cpullm.api.spec import ThreadsBindMode


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class NodeShape(_Model):
    """What makes nodes get the same plan, compared whole: the planner groups eligible nodes by it, keeps the shape a
    service runs on by it and predicts speed per shape. Memory is not part of it (a shape is planned with the least
    of its members')."""

    arch: str = Field(description="CPU architecture (kubernetes.io/arch).")
    numa_nodes: int = Field(description="NUMA nodes of each node.")
    cpus: int = Field(description="Allocatable whole CPUs of each node.")
    smt: bool | None = Field(default=None, description="Whether SMT is on (unset: not labelled).")
    cpu_manager_policy: str | None = Field(default=None, description="The kubelets' CPU manager policy, as labelled.")
    topology_manager_policy: str | None = Field(
        default=None,
        description="The kubelets' topology manager policy, as labelled or as their NodeResourceTopology reports it.",
    )
    isa: tuple[str, ...] = Field(
        default_factory=tuple, description="CPU flags all the nodes have (lscpu names), sorted."
    )
    numa_cpus: tuple[int, ...] = Field(
        default_factory=tuple,
        description="Allocatable CPUs of each NUMA node, smallest first, as the nodes' NodeResourceTopology reports "
        "them (empty: not reported, an even split assumed).",
    )

    @field_validator("isa", "numa_cpus")
    @classmethod
    def _sorted(cls, values: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(sorted(values))  # one shape, whatever order a source listed it in


class NodeProfileSummary(NodeShape):
    """The shape shared by the nodes the plan runs on, with where its NUMA count came from and its memory."""

    numa_source: str = Field(
        description="Where the NUMA count came from: a label, NodeResourceTopology, or 'default' (1)."
    )
    memory_bytes: int = Field(description="Smallest allocatable memory among the profile's nodes.")

    @property
    def shape(self) -> NodeShape:
        return NodeShape.model_validate(self.model_dump(include=set(NodeShape.model_fields)))


class ModelSizing(_Model):
    """How the model was sized: each figure with where it came from."""

    family: str = Field(description="The model family (config.json model_type) whose rules sized it.")
    parameters: int | None = Field(
        default=None, description="Parameters the family's formula counts in config.json (absent with weightsBytes)."
    )
    experts: str | None = Field(default=None, description="A mixture-of-experts model's experts and active experts.")
    weights_source: str = Field(
        description="Where weightsBytes came from: the checkpoint's safetensors headers, the safetensors index's "
        "total_size, the family formula over config.json, or spec.model.weightsBytes."
    )
    quantization: str | None = Field(
        default=None, description="The checkpoint's quantization as vLLM CPU serves it (method, bits, grouping)."
    )
    kv_layout: str = Field(
        description="The KV cache's layers as vLLM's KV specs count them: full attention, sliding window (holding "
        "at most the window per sequence), chunked local attention (at most the chunk), MLA (one latent per token, "
        "the same on every rank) or a state-space mixer's state (one per sequence, padded to the KV block)."
    )
    kv_cache_dtype: str = Field(description="The KV cache's element type (vLLM's --kv-cache-dtype).")
    kv_window_bytes_per_sequence: int = Field(
        default=0,
        description="Per rank and sequence: what the sliding-window, chunked and state-space layers hold (at most "
        "their window or chunk, or their state), on top of kvBytesPerToken for each token of context.",
    )
    notes: list[str] = Field(
        default_factory=list, description="What sizing could not count (e.g. a vision encoder of an unknown shape)."
    )


def binding_shown(launcher: bool, threads_bind: str) -> str:
    """How the ranks' threads are bound, in a word: 'launcher' where it turns 'auto' into lists, else the bind."""
    return "launcher" if launcher and threads_bind == ThreadsBindMode.AUTO else threads_bind


class ServerSecurity(_Model):
    """How the vLLM container is confined: chosen by its namespace's Pod Security level (core/podsecurity.py)."""

    seccomp_profile: str = Field(default="RuntimeDefault", description="RuntimeDefault, Unconfined or Localhost.")
    localhost_profile: str | None = Field(
        default=None,
        description="With Localhost: the profile's path under the kubelet's seccomp root, the operator's NUMA "
        "profile (the runtime's default plus vLLM's NUMA calls), where Pod Security rejects SYS_NICE.",
    )
    capabilities: list[str] = Field(
        default_factory=list,
        description="Capabilities added, every other one dropped: SYS_NICE for vLLM's NUMA calls under the "
        "runtime's default profile (spec.numaPrivileges).",
    )
    run_as_user: int | None = Field(
        default=None,
        description="The non-root user (and group and fsGroup) the server runs as where Pod Security restricted "
        "requires one; unset: the image's own.",
    )


class PlanCaution(_Model):
    """Something the plan runs slower than the nodes or the model allow (core/cautions.py)."""

    condition: str = Field(description="The condition that is False while it holds.")
    reason: str = Field(description="The condition's reason.")
    message: str = Field(description="What costs speed, and what to change.")


class FasterFormat(_Model):
    checkpoint: str = Field(description="The format, as vLLM CPU runs it (W8A8 int8, AWQ int4).")
    decode_speedup: float = Field(description="Its predicted decode tok/s over the plan's.")
    throughput_speedup: float = Field(description="Its predicted throughput over the plan's.")


class PredictedSpeed(_Model):
    """How fast the plan is predicted to serve, per server (core/performance.py; docs/performance.md)."""

    decode_tokens_per_second: float = Field(description="One sequence's generated tokens per second.")
    throughput_tokens_per_second: float = Field(
        description="Generated tokens per second with throughputStreams sequences at once."
    )
    throughput_streams: int = Field(description="The sequences at once of that figure: the plan's maxNumSeqs.")
    time_to_first_token_seconds: float = Field(
        description="An idle server's time to the first token of a promptTokens-token prompt."
    )
    prompt_tokens: int = Field(description="That prompt's tokens.")
    saturation_streams: int | None = Field(
        default=None,
        description="The most sequences a server decodes at once before each is predicted 1.25x slower than alone: "
        "what a CpuLLMGateway sends it at most (unset: maxNumSeqs).",
    )
    basis: str = Field(description="'probe' (a NodePerformance of the nodes) or 'estimate' (by ISA class).")
    source: str = Field(description="Which probe, or which row of the estimates.")
    cost_per_million_tokens: float | None = Field(
        default=None,
        description="What a million generated tokens cost at the throughput figure, in the currency of the nodes' "
        "cpullm.io/price-per-hour label: the node's price times the larger of the server's share of its CPUs and of "
        "its memory (unset: the nodes carry no price).",
    )
    faster_formats: list[FasterFormat] | None = Field(
        default=None,
        description="Checkpoints of the same model predicted at least 1.3x as fast here (unset: none); choosing one "
        "trades accuracy for speed, the owner's call.",
    )


class SpeculativePlan(_Model):
    """Speculative decoding as planned (spec.speculative; core/speculation.py, docs/speculative.md)."""

    method: str = Field(description="off, ngram or mtp.")
    tokens: int | None = Field(default=None, description="Tokens proposed per step (unset: off).")
    vllm_config: str | None = Field(default=None, description="vLLM's --speculative-config, as rendered (unset: off).")
    decode_gain: float | None = Field(
        default=None, description="One sequence's decode with it against without, as predicted (unset: not predicted)."
    )
    throughput_gain: float | None = Field(
        default=None, description="Throughput at maxNumSeqs with it against without, as predicted."
    )
    weights_bytes: int | None = Field(
        default=None, description="Weights loaded only to speculate (MTP layers), counted in the memory limit."
    )
    kept_off: bool | None = Field(
        default=None,
        description="auto kept it off for servers planned before the operator chose speculation, until "
        "spec.speculative.method chooses (no restart for an operator upgrade).",
    )
    reason: str = Field(description="Why it is on or off, and the acceptance the prediction assumed.")


class Plan(_Model):
    placement: str = Field(default="tensorParallel", description="The placement strategy that made this plan.")
    replicas: int = Field(default=1, description="vLLM pods planned (spec.replicas, capped by throughput placement).")
    capacity: int = Field(default=1, description="vLLM pods the chosen nodes can hold.")
    placement_note: str | None = Field(
        default=None, description="What the placement needs or could not do (a cap, best-effort NUMA alignment)."
    )
    tensor_parallel_size: int = Field(description="vLLM ranks per pod (--tensor-parallel-size).")
    kv_cache_gi_b: int = Field(alias="kvCacheGiB", description="VLLM_CPU_KVCACHE_SPACE, per rank.")
    kv_cache_source: str = Field(
        description="'explicit' (spec.kvCacheGiB), 'derived' (maxModelLen x maxNumSeqs) or 'default' (the same, with "
        "what the spec left open chosen: maxModelLenSource, maxNumSeqsSource)."
    )
    kv_tokens_per_rank: int = Field(
        description='Tokens the per-rank KV cache holds, as vLLM logs it ("KV cache size: N tokens"): the sequences '
        "of the context length it holds, times the context length."
    )
    threads_bind: str = Field(description="VLLM_CPU_OMP_THREADS_BIND.")
    launcher: bool = Field(
        default=False,
        description="vLLM starts through the in-pod launcher, which turns 'auto' into explicit per-rank CPU lists "
        "from the pod's cpuset and applies the operator's fixes to vLLM (docs/vllm-versions.md).",
    )
    rank_in_engine_core: bool = Field(
        default=False,
        description="The one rank runs in vLLM's engine core process (the launcher's fix to vLLM 0.32, which "
        "otherwise starts a worker process of its own): two processes instead of three, one import of torch and "
        "vLLM less at every start, and the engine core's process memory counted once.",
    )
    engine_core_forked: bool = Field(
        default=False,
        description="That engine core is forked from the API server rather than spawned (where the image's OpenMP "
        "runtime is Intel's, on x86): it shares the API server's imports of torch and vLLM, which it does not "
        "import again, and the memory limit counts the pages they share once.",
    )
    aot_compile_cache: bool = Field(
        default=False,
        description="vLLM's AOT compile cache is on (VLLM_USE_AOT_COMPILE, in the model cache): a later start of the "
        "same model and settings loads the compiled model instead of tracing it again with torch.compile; the first "
        "start compiles longer to save it. Only with a model cache kept across pods (persistentVolumeClaim, "
        "nodeLocal) and the launcher, whose fix lets vLLM 0.32 load it on CPU.",
    )
    reserved_cpus_per_rank: int = Field(description="Cores per rank kept off OpenMP for the HTTP front end.")
    omp_num_threads: int | None = Field(default=None, description="OMP_NUM_THREADS, set only with 'nobind'.")
    cpus_per_rank: int = Field(description="Whole CPUs per rank.")
    cpu: int = Field(description="Whole CPUs requested and limited for the container.")
    weights_bytes: int = Field(description="The served weights' bytes, all ranks together.")
    weight_shard_bytes: int = Field(description="Weight bytes per rank.")
    kv_bytes_per_token: int = Field(
        description="KV bytes per token of context for the whole model (TP 1): the full-attention and MLA layers; "
        "sliding-window, chunked and state-space layers hold a bounded amount per sequence "
        "(sizing.kvWindowBytesPerSequence)."
    )
    rank_overhead_bytes: int = Field(
        description="Runtime memory per rank beside weights and KV cache (measured: a base and a share per decoder "
        "layer)."
    )
    packed_embeddings_bytes: int = Field(
        default=0,
        description="oneDNN's packed copies of the input embedding and the LM head per rank, which vLLM keeps beside "
        "their weights where oneDNN builds a matmul for the serving dtype on the node (float32 on x86; bf16 and "
        "fp16 with AVX-512 or AVX-NE-CONVERT; arm64); 0 where vLLM falls back to torch's linear (bf16 and fp16 on "
        "AVX2).",
    )
    adapter_bytes: int = Field(
        default=0,
        description="Memory per rank for spec.adapters: vLLM's LoRA slots at the highest rank, and each adapter's "
        "weights in its CPU cache.",
    )
    server_overhead_bytes: int = Field(
        default=0,
        description="Memory of the API server and engine core processes (measured: a base and a share per "
        "vocabulary entry, for the tokenizer both hold).",
    )
    page_cache_bytes: int = Field(
        default=0,
        description="File pages the server keeps in use (libraries, the model's files): counted in the working set.",
    )
    shm_bytes: int = Field(description="Size of the memory-backed /dev/shm.")
    memory_limit_bytes: int = Field(description="Container memory request and limit.")
    max_model_len: int | None = Field(default=None, description="--max-model-len, when rendered.")
    max_model_len_source: str = Field(
        default="model",
        description="'spec' (maxModelLen), 'model' (the model's own, not rendered), 'kv-cache' (capped to what "
        "the KV cache holds) or 'default' (no kvCacheGiB nor maxModelLen: the model's own, at most 8192).",
    )
    max_num_seqs: int | None = Field(default=None, description="--max-num-seqs, when rendered.")
    max_num_seqs_source: str = Field(
        default="vllm",
        description="'spec' (maxNumSeqs), 'default' (no kvCacheGiB nor maxNumSeqs: 8) or 'vllm' (vLLM's own, not "
        "rendered).",
    )
    cautions: list[PlanCaution] | None = Field(
        default=None,
        description="What this plan runs slower than the nodes or the model allow, each with its condition (a rank "
        "across NUMA nodes, bfloat16 without bf16 arithmetic); unset: none.",
    )
    node_selector_terms: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Required node affinity the pods get: the labels that made the chosen nodes eligible.",
    )
    routing: str = Field(
        default="service",
        description="How requests reach the servers: service, router or inferencePool (spec.routing.mode, auto "
        "resolved).",
    )
    router_cpu_millis: int | None = Field(
        default=None,
        description="The CPU each router pod requests (spec.routing.router.cpu, or 0 where the nodes have no CPU "
        "to spare beside the servers' whole ones); unset without a router.",
    )
    router_image: str | None = Field(
        default=None,
        description="The router's image (spec.routing.router.image, else the operator's, its administrator's "
        "choice); unset without a router.",
    )
    drain_seconds: int = Field(
        default=0,
        description="The longest a request may run (spec.routing.drainSeconds, or the context length decoded at a "
        "pessimistic 4 GB/s of weights streamed per rank): a stopping server's drain and the router's timeout.",
    )
    step_timeout_seconds: int = Field(
        default=300,
        description="How long one scheduler step may run before vLLM declares its engine dead "
        "(VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS): twice a max_num_batched_tokens prefill at the slowest measured pace "
        "per CPU, at least vLLM's 300.",
    )
    expected_start_seconds: int | None = Field(
        default=None,
        description="How long a server's start is expected to take once the weights are on the node, at the pace "
        "measured (docs/startup.md); startupSeconds is the probe's far larger allowance.",
    )
    vllm_version: str | None = Field(
        default=None,
        description="The vLLM version the plan renders for: spec.vllmVersion, else the image's tag (unset: unknown, "
        "and no in-pod fix is credited).",
    )
    vllm_version_source: str = Field(default="image tag", description="'spec', 'image tag' or 'unknown'.")
    fixes_credited: list[str] = Field(
        default_factory=list,
        description="The launcher's fixes to vLLM whose effect the plan's figures count on: those for that version "
        "(cpullm/vllm_support.py) that spec.env leaves on and the plan uses; none without the launcher or for an "
        "unknown version. A server that reports one of them not loaded sets FixesLoaded=False.",
    )
    startup_seconds: int = Field(
        default=0,
        description="The startup probe's budget: twice a cold start at the slowest measured pace (imports and "
        "compilation, the weights' load, the warm-up prefill), and the weights' download.",
    )
    node_cache_path: str | None = Field(
        default=None,
        description="With spec.modelCache.nodeLocal: the directory on each node that holds the weights (mounted at "
        "/models), the namespace's per model: <nodeCacheDir>/ns.<namespace uid>/models/<model>-<hash>. A hostPath: "
        "no size limit, no ephemeral-storage accounting, kept when the namespace is gone (docs/tenancy.md).",
    )
    node_compile_cache_path: str | None = Field(
        default=None,
        description="With spec.modelCache.nodeLocal: the directory on each node that holds what a start compiles "
        "(mounted at /models/vllm), this service's own: <nodeCacheDir>/ns.<namespace uid>/services/<service uid>.",
    )
    security: ServerSecurity = Field(
        default_factory=ServerSecurity,
        description="The vLLM container's seccomp profile, capabilities and user, as its namespace's Pod Security "
        "level admits them.",
    )
    image: str = Field(
        description="The vLLM CPU image the pods run (spec.image, else the operator's for the nodes' arch, its "
        "administrator's choice, else vLLM's published one)."
    )
    sizing: ModelSizing
    predicted: PredictedSpeed | None = Field(default=None, description="How fast each server is predicted to serve.")
    speculative: SpeculativePlan | None = Field(
        default=None,
        description="Speculative decoding: on or off, why, and its predicted gain (unset: planned by an operator "
        "before it).",
    )
    node_profile: NodeProfileSummary
    eligible_nodes: list[str] = Field(description="Nodes of the plan's shape that can run a pod of it.")
    passed_over: list[str] | None = Field(
        default=None,
        description="Other node shapes a plan would fit too, and why the chosen one won (unset: no other fits).",
    )
    summary: str = Field(description="One line: what was chosen and why.")

    @property
    def binding(self) -> str:
        return binding_shown(self.launcher, self.threads_bind)

    @property
    def rank_extra_bytes(self) -> int:
        """What a rank holds beside its weight shard and KV cache: its runtime, the packed embeddings and the
        adapters."""
        return self.rank_overhead_bytes + self.packed_embeddings_bytes + self.adapter_bytes

    def rank_numa_nodes(self) -> list[int] | None:
        """The NUMA node each tensor-parallel rank binds to, where the plan knows it: one rank per NUMA node of the
        node (the launcher binds rank i to the i-th). With fewer ranks than NUMA nodes, the kubelet's cpuset decides
        which NUMA nodes the ranks get (None); throughput servers take any NUMA node each (None)."""
        if self.placement == "throughput" or self.tensor_parallel_size != self.node_profile.numa_nodes:
            return None
        return list(range(self.tensor_parallel_size))
