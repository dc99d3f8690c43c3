"""Sizing a model as vLLM CPU serves it: weight bytes (from the checkpoint's real bytes where they are known, else
the family formula with the checkpoint's quantization), the KV cache per layer kind, and the tensor-parallel
sizes and CPUs it can run on."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Concatenate, ParamSpec

from cpullm.api.spec import DType
from cpullm.core import constants as c
from cpullm.core.constants import DTYPE_BYTES, UNSUPPORTED_TENSOR_PARALLEL_SIZES
from cpullm.core.memo import cached
from cpullm.core.sizing.anatomy import SSM_DTYPE_BYTES, Anatomy, KVGroup, LayerKind, Split, StateShape
from cpullm.core.sizing.checkpoint import CheckpointTensors
from cpullm.core.sizing.config import architecture, model_type, mtp_layers, show
from cpullm.core.sizing.families import anatomy_of
from cpullm.core.sizing.quantization import AMX, BF16_ARITHMETIC, WeightFormat, weight_format
from cpullm.core.sizing.vllm_report import VllmSizer, anatomy_from_report
from cpullm.errors import NotSizedHere, UnsupportedModel

P = ParamSpec("P")

# A safetensors index's total_size beyond this (4 EiB) is no checkpoint.
MAX_CHECKPOINT_BYTES = 2**62
# Fields that only size the weights: with spec.model.weightsBytes they may be missing, the KV cache needs none.
_WEIGHTS_ONLY = {"intermediate_size": 1, "vocab_size": 1, "moe_intermediate_size": 1, "ffn_dim": 1}


@dataclass(frozen=True)
class ModelFiles:
    """What a model repository says about its size: config.json, the safetensors index's total size, and the
    tensors of its safetensors headers."""

    config: dict[str, Any]
    checkpoint_total_bytes: int | None = None
    tensors: CheckpointTensors | None = None


def temporal_bytes(ssm_dtype: str, dtype_bytes: int, isa: frozenset[str]) -> int:
    """A state's temporal part's element size, as vLLM CPU settles its SSM cache dtype (platforms/cpu.py,
    check_and_update_config): where the CPU has bf16 arithmetic, a 16-bit dtype the model asks for is kept (the
    accelerated GDN backend takes it) and anything else becomes float32; elsewhere "auto" is the serving dtype."""
    asked = SSM_DTYPE_BYTES.get(ssm_dtype)
    if BF16_ARITHMETIC in isa:
        return asked if asked == 2 else 4
    return asked or dtype_bytes


@dataclass(frozen=True)
class KVLayout:
    """The KV cache of one model in one element size (the serving dtype, or fp8), as vLLM's hybrid KV cache manager
    lays it out (vllm/v1/core/kv_cache_utils.py), per rank:
    - every layer slot holds pages of one size: a block of `block_tokens` tokens of one attention layer; a
      state-space layer's state per sequence is padded to that page, and where a state is larger than a 128-token
      page the block grows to the multiple of 128 tokens whose page holds it (the CPU platform's
      `_align_hybrid_block_size`);
    - the layers of each kind make groups of one size (the smaller kind's count, or the larger's when it is under 1.5x
      the smaller), padded up to whole groups; a block of the shared pool is one page in each layer of a group;
    - a request takes, per group: a full or MLA layer's every token in blocks; a sliding layer at most its window
      plus the tokens in flight and one block; a chunked layer at most its chunk plus the tokens in flight; a state
      layer its pages (StateShape.pages_per_request);
    - the pool holds kv_bytes // (page x group size) blocks, and vLLM's token capacity ("KV cache size: N tokens") is
      the requests of `context` tokens it holds, times `context`.
    A state's convolution part is in the serving dtype (`state_bytes`), its temporal part in `temporal_bytes`
    (temporal_bytes() below).
    MLA's block is 16 tokens where vLLM CPU runs its reference MLA kernel (no AMX), else 128."""

    groups: tuple[KVGroup, ...]
    element_bytes: int
    state_bytes: int = 2
    temporal_bytes: int = 2
    attention_block: int = c.KV_BLOCK_TOKENS  # tokens per block where no state widens it

    @cached
    def _counts(self) -> dict[LayerKind, int]:
        counts: dict[LayerKind, int] = {}
        for g in self.groups:
            counts[g.kind] = counts.get(g.kind, 0) + g.layers
        return counts

    @cached
    def group_size(self) -> int:
        """Layers per KV cache group."""
        counts = self._counts.values()
        if not counts:
            return 1
        small, large = min(counts), max(counts)
        return large if large < 1.5 * small else small

    @cached
    def _slots(self) -> dict[LayerKind, int]:
        """Layers per kind as allocated: padded to whole groups when kinds are mixed."""
        if len(self._counts) < 2:
            return dict(self._counts)
        size = self.group_size
        return {kind: -(-layers // size) * size for kind, layers in self._counts.items()}

    def _layer_bytes(self, group: KVGroup, tensor_parallel_size: int) -> int:
        """Per attention layer slot and token."""
        return group.heads_per_rank(tensor_parallel_size) * group.entry * self.element_bytes

    def _state_page(self, tensor_parallel_size: int) -> int:
        """One sequence's state, the largest of the state layers'."""
        return max(
            (state.bytes(tensor_parallel_size, self.state_bytes, self.temporal_bytes) for state in self._states),
            default=0,
        )

    @cached
    def _states(self) -> tuple[StateShape, ...]:
        return tuple(g.state for g in self.groups if g.state is not None)

    def _attention_token_bytes(self, tensor_parallel_size: int) -> int:
        """Per layer slot and token, of the attention layers (every attention kind of a model has the same)."""
        attention = [g for g in self.groups if g.state is None]
        return self._layer_bytes(attention[0], tensor_parallel_size) if attention else 0

    def block_tokens(self, tensor_parallel_size: int = 1) -> int:
        """Tokens per block: 128 on CPU, or the multiple of 128 whose attention page holds a state."""
        state, token = self._state_page(tensor_parallel_size), self._attention_token_bytes(tensor_parallel_size)
        if not state or not token:
            return self.attention_block
        return self.attention_block * -(-state // (self.attention_block * token))

    def page_bytes(self, tensor_parallel_size: int = 1) -> int:
        """One block of one layer slot (a state padded to it)."""
        token = self._attention_token_bytes(tensor_parallel_size)
        return self.block_tokens(tensor_parallel_size) * token or self._state_page(tensor_parallel_size)

    def _blocks(self, group: KVGroup, tensor_parallel_size: int, context: int) -> int:
        """The blocks one request of `context` tokens takes in one layer slot of the group's kind."""
        block = self.block_tokens(tensor_parallel_size)
        in_flight = c.SERVER_BATCHED_TOKENS_PER_RANK * tensor_parallel_size
        if group.state is not None:
            return group.state.pages_per_request
        if group.window is None:
            return -(-context // block)
        if group.kind == LayerKind.CHUNKED:
            return -(-min(group.window + in_flight, context) // block)
        return -(-min(group.window - 1 + in_flight, context) // block) + 1

    def _request_blocks(self, tensor_parallel_size: int, context: int, growing: bool | None = None) -> int:
        """Blocks of the shared pool one request of `context` tokens takes: per group of each kind, its blocks
        (growing: only the layers that keep every token; False: only the others)."""
        total = 0
        for kind, slots in self._slots.items():
            group = next(g for g in self.groups if g.kind == kind)
            keeps_every_token = group.window is None and group.state is None
            if growing is None or growing is keeps_every_token:
                total += slots // self.group_size * self._blocks(group, tensor_parallel_size, context)
        return total

    def _pool_block_bytes(self, tensor_parallel_size: int) -> int:
        return self.page_bytes(tensor_parallel_size) * self.group_size

    def bytes_per_token(self, tensor_parallel_size: int = 1) -> int:
        """Per rank, for each token of context: the layers that keep every token (full attention, MLA); 0 when
        every layer slides, chunks or keeps a state."""
        return sum(
            self._slots[g.kind] * self._layer_bytes(g, tensor_parallel_size)
            for g in self.groups
            if g.window is None and g.state is None
        )

    def window_bytes(self, tensor_parallel_size: int, context: int) -> int:
        """Per rank and sequence: what the sliding, chunked and state layers hold of it."""
        blocks = self._request_blocks(tensor_parallel_size, context, growing=False)
        return blocks * self._pool_block_bytes(tensor_parallel_size)

    def sequence_bytes(self, tensor_parallel_size: int, context: int) -> int:
        """Per rank: what one sequence of `context` tokens takes."""
        return self._request_blocks(tensor_parallel_size, context) * self._pool_block_bytes(tensor_parallel_size)

    def tokens(self, kv_bytes: int, tensor_parallel_size: int, context: int | None) -> int:
        """The KV cache's capacity in tokens as vLLM logs it ("KV cache size: N tokens"): the requests of `context`
        tokens its blocks hold, times `context`."""
        if context is None:
            per_token = self.bytes_per_token(tensor_parallel_size)
            return kv_bytes // per_token if per_token else 0
        blocks = kv_bytes // self._pool_block_bytes(tensor_parallel_size)
        return int(blocks / self._request_blocks(tensor_parallel_size, context) * context)

    def longest_context(self, kv_bytes: int, tensor_parallel_size: int, at_most: int) -> int:
        """The longest sequence (at most `at_most` tokens) a KV cache of kv_bytes per rank holds."""
        low, high = 0, at_most
        while low < high:  # sequence_bytes grows with the context: bisect
            middle = (low + high + 1) // 2
            if self.sequence_bytes(tensor_parallel_size, middle) <= kv_bytes:
                low = middle
            else:
                high = middle - 1
        return low

    def describe(self) -> str:
        parts = []
        for g in self.groups:
            if g.kind == LayerKind.MLA:
                parts.append(f"{g.layers} MLA layers, latent {g.entry}")
            elif g.kind == LayerKind.SLIDING:
                parts.append(f"{g.layers} sliding (window {g.window})")
            elif g.kind == LayerKind.CHUNKED:
                parts.append(f"{g.layers} chunked (chunk {g.window})")
            elif g.state is not None:
                parts.append(f"{g.layers} {g.state.mixer} state")
            else:
                parts.append(f"{g.layers} full")
        heads = next((g for g in self.groups if g.kind != LayerKind.MLA and g.state is None), None)
        if heads and all(g.kind == LayerKind.FULL for g in self.groups):
            parts.append("0 sliding")
        shape = f" layers, {heads.kv_heads} KV heads x {heads.entry // 2}" if heads else ""
        padded = sum(self._slots.values()) - sum(self._counts.values())
        padding = f", {padded} padding layer{'s' * (padded != 1)}" if padded else ""
        block = f", {self.block_tokens()}-token blocks" if self._states else ""
        return " + ".join(parts) + shape + padding + block + f", {self.element_bytes} B/element"


def _blocks(tokens: int) -> int:
    """Tokens rounded up to whole KV blocks."""
    return -(-tokens // c.KV_BLOCK_TOKENS) * c.KV_BLOCK_TOKENS


@dataclass(frozen=True)
class ModelSize:
    anatomy: Anatomy
    parameters: int | None
    weights_bytes: int
    weights_source: str
    quantization: WeightFormat | None
    dtype_bytes: int
    # What vLLM's MTP drafter keys on: the checkpoint's MTP layers beyond num_hidden_layers (not in weights_bytes:
    # vLLM loads them only to speculate), its model_type and first architecture.
    mtp_layers: int = 0
    model_type: str = ""
    architecture: str = ""

    @property
    def num_layers(self) -> int:
        return self.anatomy.layers

    @property
    def num_attention_heads(self) -> int:
        return self.anatomy.attention_heads

    @property
    def max_position_embeddings(self) -> int | None:
        return self.anatomy.max_context

    def kv(self, element_bytes: int | None = None, isa: frozenset[str] = frozenset()) -> KVLayout:
        """The KV cache as vLLM CPU lays it out on a node with these CPU flags (which decide MLA's block and the
        element size of a state's temporal part)."""
        mla = self.uses_mla and AMX not in isa
        states = [g.state for g in self.anatomy.kv_groups if g.state is not None]
        temporal = temporal_bytes(states[0].ssm_dtype if states else "auto", self.dtype_bytes, isa)
        return KVLayout(
            self.anatomy.kv_groups,
            element_bytes or self.dtype_bytes,
            state_bytes=self.dtype_bytes,
            temporal_bytes=temporal,
            attention_block=c.MLA_KV_BLOCK_TOKENS if mla else c.KV_BLOCK_TOKENS,
        )

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv().bytes_per_token(1)

    def kv_bytes_per_token_per_rank(self, tensor_parallel_size: int) -> int:
        return self.kv().bytes_per_token(tensor_parallel_size)

    @property
    def uses_mla(self) -> bool:
        return any(g.kind == LayerKind.MLA for g in self.anatomy.kv_groups)

    def tensor_parallel_problem(self, tp: int) -> str | None:
        """Why vLLM cannot split this model into `tp` ranks, or None: TP divides the attention heads, divides or
        is a multiple of the KV heads, divides every dimension a parallel layer splits, keeps whole quantization
        groups per rank, and is never 6."""
        if tp in UNSUPPORTED_TENSOR_PARALLEL_SIZES:
            return f"tensor parallel size {tp} is not supported by vLLM's CPU backend"
        anatomy = self.anatomy
        refused = dict(anatomy.tensor_parallel_refusals).get(tp)
        if refused:
            return f"vLLM refuses tensor parallel size {tp}: {refused}"
        if anatomy.attention_heads % tp:
            return f"tensor parallel size {tp} does not divide the {anatomy.attention_heads} attention heads"
        kv = anatomy.kv_heads
        if kv is not None and kv % tp and tp % kv:
            return f"tensor parallel size {tp} neither divides nor is a multiple of the {kv} KV heads"
        for group in anatomy.kv_groups:
            problem = group.state.tensor_parallel_problem(tp) if group.state else None
            if problem:
                return problem
        for linear in anatomy.linears:
            size = {Split.COLUMN: linear.out_features, Split.ROW: linear.in_features}.get(linear.split)
            if size is not None and size % tp:
                side = "outputs" if linear.split == Split.COLUMN else "inputs"
                return f"tensor parallel size {tp} does not divide the {size} {side} of {linear.name}"
        return self.quantization.tensor_parallel_problem(tp, anatomy) if self.quantization else None

    def node_problem(self, isa: frozenset[str]) -> str | None:
        """Why a node with these CPU flags cannot run this model's kernels, or None."""
        return self.quantization.kernel_problem(isa, self.anatomy) if self.quantization else None

    def describe_weights(self) -> str:
        quantized = f", {self.quantization.describe()}" if self.quantization else ""
        return f"{self.weights_source}{quantized}"


def _with_drafter_facts(
    sizer: Callable[Concatenate[Mapping[str, Any], DType, P], ModelSize],
) -> Callable[Concatenate[Mapping[str, Any], DType, P], ModelSize]:
    """The sizer's ModelSize with what vLLM's MTP drafter keys on beside: the config's MTP layers, model_type and
    first architecture, however the weights were sized."""

    def sized(config: Mapping[str, Any], dtype: DType, /, *args: P.args, **options: P.kwargs) -> ModelSize:
        found = sizer(config, dtype, *args, **options)
        return replace(
            found,
            mtp_layers=mtp_layers(config),
            model_type=model_type(config) or "",
            architecture=architecture(config) or "",
        )

    sized.__doc__, sized.__name__ = sizer.__doc__, sizer.__name__
    return sized


@_with_drafter_facts
def size_model(
    config: Mapping[str, Any],
    dtype: DType,
    *,
    weights_bytes: int | None = None,
    checkpoint_total_bytes: int | None = None,
    tensors: CheckpointTensors | None = None,
    vllm: VllmSizer | None = None,
    always_vllm: bool = False,
) -> ModelSize:
    """Size a model. Weight bytes come from, in order: the explicit override, the checkpoint's safetensors
    headers, the safetensors index's total size, the family formula. A config the formulas do not know is sized by
    `vllm` where one is given (vLLM builds it on the meta device: vllm_report.py), unless vLLM cannot serve it;
    `always_vllm` (spec.model.sizedBy: vllm) has vLLM size every model, the formulas' weights in a note beside."""
    if not isinstance(config, Mapping):
        raise UnsupportedModel(f"model config is {type(config).__name__}, not an object")
    dtype_bytes = DTYPE_BYTES[dtype]
    quantization = weight_format(config)
    try:
        anatomy = anatomy_of(config, placeholders=_WEIGHTS_ONLY if weights_bytes is not None else None)
    except NotSizedHere:  # a family or pattern the formulas do not know: vLLM is asked where it can be
        if vllm is None or weights_bytes is not None:
            raise
        return _by_vllm(config, dtype, vllm, quantization, dtype_bytes)
    problem = quantization.model_problem(anatomy) if quantization else None
    if problem:
        raise UnsupportedModel(problem)
    if weights_bytes is not None:
        return ModelSize(anatomy, None, weights_bytes, "spec.model.weightsBytes", quantization, dtype_bytes)
    sized = _by_formulas(config, anatomy, checkpoint_total_bytes, tensors, quantization, dtype_bytes)
    if not always_vllm:
        return sized
    if vllm is None:
        return _noted(sized, "spec.model.sizedBy is vllm, but no vLLM was there to ask (cpullm plan --vllm-python)")
    by_vllm = _by_vllm(config, dtype, vllm, quantization, dtype_bytes)
    share = sized.weights_bytes / by_vllm.weights_bytes - 1
    return _noted(
        by_vllm,
        f"the formulas' weights, {sized.weights_bytes / c.GiB:.2f} GiB from {sized.weights_source}, are {share:+.1%} "
        "of vLLM's",
    )


def _by_formulas(
    config: Mapping[str, Any],
    anatomy: Anatomy,
    checkpoint_total_bytes: int | None,
    tensors: CheckpointTensors | None,
    quantization: WeightFormat | None,
    dtype_bytes: int,
) -> ModelSize:
    parameters = anatomy.parameters
    if tensors is not None:
        loaded = tensors.weights_bytes(anatomy.layers, dtype_bytes)
        return ModelSize(anatomy, parameters, loaded, tensors.describe(), quantization, dtype_bytes)
    if checkpoint_total_bytes is not None:
        total = _checkpoint_total(config, checkpoint_total_bytes, dtype_bytes, quantization)
        return ModelSize(
            anatomy, parameters, total, "model.safetensors.index.json total_size", quantization, dtype_bytes
        )
    formula = formula_bytes(anatomy, quantization, dtype_bytes)
    return ModelSize(anatomy, parameters, formula, f"config.json ({anatomy.family} formula)", quantization, dtype_bytes)


def _by_vllm(
    config: Mapping[str, Any], dtype: DType, vllm: VllmSizer, quantization: WeightFormat | None, dtype_bytes: int
) -> ModelSize:
    report = vllm(config, dtype.value)
    anatomy = anatomy_from_report(model_type(config) or "(none)", report)
    source = f"vLLM {report.get('vllm')} (meta device)"
    return ModelSize(anatomy, anatomy.parameters, _vllm_bytes(report), source, quantization, dtype_bytes)


def _noted(model: ModelSize, note: str) -> ModelSize:
    return replace(model, anatomy=replace(model.anatomy, notes=(*model.anatomy.notes, note)))


def _vllm_bytes(report: Mapping[str, Any]) -> int:
    value = report.get("weights_bytes")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UnsupportedModel(f"vLLM's sizing report has weights_bytes={value!r}, not a size")
    return value


def formula_bytes(anatomy: Anatomy, quantization: WeightFormat | None, dtype_bytes: int) -> int:
    total = sum(p.count for p in anatomy.params) * dtype_bytes
    for linear in anatomy.linears:
        if quantization is not None and quantization.quantizes(linear):
            total += quantization.linear_bytes(linear) * linear.count
        else:
            total += linear.parameters * dtype_bytes
    return total


def _checkpoint_total(
    config: Mapping[str, Any], total: int, dtype_bytes: int, quantization: WeightFormat | None
) -> int:
    """The index's total size: a quantized checkpoint is served as stored; a floating point one is rescaled from
    its stored dtype to the serving dtype."""
    torch_dtype = config.get("torch_dtype", config.get("dtype"))
    stored = DTYPE_BYTES.get(torch_dtype, 2) if isinstance(torch_dtype, str) else 2
    if isinstance(total, bool) or not isinstance(total, int) or not stored <= total <= MAX_CHECKPOINT_BYTES:
        raise UnsupportedModel(
            f"model.safetensors.index.json total_size={show(total)} is not a checkpoint size "
            f"({stored} to {MAX_CHECKPOINT_BYTES} bytes); set spec.model.weightsBytes to size the model"
        )
    return total if quantization is not None else total // stored * dtype_bytes
