"""A model's anatomy as vLLM builds it: its weight matrices (what quantization and tensor parallelism act on), the
parameters kept in the serving dtype (embeddings, norms, biases, routers), and its attention and state-space layers
as the KV cache holds them. Families (families.py) describe a config as an Anatomy; sizing reads only the Anatomy."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Split(StrEnum):
    """How tensor parallelism splits a weight matrix between ranks (vLLM's parallel linear layers)."""

    HEADS = "heads"  # output features split by attention heads (q, k, v; MLA's q and kv_b): the head rules apply,
    # and KV heads are replicated when TP exceeds them
    COLUMN = "column"  # output features split: gate/up, an expert's gate/up
    ROW = "row"  # input features split: o, down, an expert's down
    REPLICATED = "replicated"  # whole on every rank: MLA's latent projections


@dataclass(frozen=True)
class Linear:
    """`count` weight matrices of in_features x out_features (one per layer, or per layer and expert)."""

    name: str  # module path within a layer, as checkpoints name it ("self_attn.q_proj", "mlp.experts.down_proj")
    in_features: int
    out_features: int
    count: int
    split: Split
    expert: bool = False

    @property
    def parameters(self) -> int:
        return self.in_features * self.out_features * self.count


# The input embedding's Params name (families.add_embeddings): vLLM's VocabParallelEmbedding, which the LM head's
# module (ParallelLMHead) is shaped like, tied or not.
EMBEDDING = "embed_tokens"


@dataclass(frozen=True)
class Params:
    """Parameters no quantization method touches, held in the serving dtype."""

    name: str
    count: int


class LayerKind(StrEnum):
    FULL = "full"
    SLIDING = "sliding"
    MLA = "mla"
    CHUNKED = "chunked"  # chunked local attention (Llama 4): a token sees the tokens of its chunk only
    STATE = "state"  # a state-space, linear-attention or short-convolution mixer: a state per sequence


# The SSM cache dtypes a model may ask vLLM for (StateShape.ssm_dtype; "auto" besides: vLLM's choice), by element size.
SSM_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class StateShape:
    """What a state-space or linear-attention mixer keeps per sequence, as vLLM's MambaStateShapeCalculator shapes it
    per rank: a convolution state of `conv_rows` x channels (`conv_channels`, plus 2 x `state_size` per group of
    `groups`: Mamba2's B and C, with the groups extended to a multiple of TP), split by TP; and a temporal state of
    `heads` x `head_a` x `head_b`, its heads split by TP. vLLM keeps `pages_per_request` pages of it per sequence
    (prefix caching's align mode: the running state, the previous block's, and Mamba2's prefill checkpoint).
    `ssm_dtype` is the temporal state's dtype the family asks vLLM for ("auto": vLLM's choice; Nemotron-H: its
    config's mamba_ssm_cache_dtype); model.temporal_bytes turns it into bytes on a node."""

    mixer: str  # "mamba2", "gated_deltanet" or "short_conv": what vLLM CPU runs for it
    conv_rows: int
    conv_channels: int
    groups: int
    state_size: int
    heads: int
    head_a: int
    head_b: int
    pages_per_request: int
    ssm_dtype: str = "auto"

    def tensor_parallel_problem(self, tp: int) -> str | None:
        """vLLM splits the mixer's heads and channels between ranks (and Mamba2's groups, unless there is one)."""
        for count, what in ((self.heads, "heads"), (self.conv_channels, "channels"), (self.groups, "groups")):
            if count > 1 and count % tp:
                return f"tensor parallel size {tp} does not divide the {count} {what} of the {self.mixer} layers"
        return None

    def bytes(self, tensor_parallel_size: int, conv_bytes: int, temporal_bytes: int) -> int:
        """Per rank and sequence, one page's content: the two states in their element sizes."""
        tp = tensor_parallel_size
        groups = self.groups + (0 if not self.groups or self.groups % tp == 0 else tp - self.groups)
        channels = (self.conv_channels + 2 * groups * self.state_size) // tp
        return self.conv_rows * channels * conv_bytes + self.heads // tp * self.head_a * self.head_b * temporal_bytes


@dataclass(frozen=True)
class KVGroup:
    """Attention layers that cache alike: per token and layer, `kv_heads` entries of `entry` elements each
    (K and V: 2 x head_dim; MLA: one latent of kv_lora_rank + qk_rope_head_dim, the same on every rank)."""

    kind: LayerKind
    layers: int
    kv_heads: int
    entry: int
    window: int | None = None  # the sliding window, or the attention chunk of CHUNKED layers
    state: StateShape | None = None  # STATE layers' (their kv_heads and entry are 0)

    def heads_per_rank(self, tensor_parallel_size: int) -> int:
        """A rank holds K/TP KV heads; with TP > K vLLM replicates and each rank holds one. MLA's latent is one
        entry on every rank."""
        if self.kind == LayerKind.MLA:
            return 1
        return max(1, self.kv_heads // tensor_parallel_size)

    def bytes_per_token(self, tensor_parallel_size: int, dtype_bytes: int) -> int:
        return self.layers * self.heads_per_rank(tensor_parallel_size) * self.entry * dtype_bytes


@dataclass(frozen=True)
class Anatomy:
    family: str
    linears: tuple[Linear, ...]
    params: tuple[Params, ...]
    kv_groups: tuple[KVGroup, ...]
    attention_heads: int
    kv_heads: int | None  # None for MLA: no KV head count constrains tensor parallelism
    max_context: int | None
    experts: int | None = None
    active_experts: int | None = None
    notes: tuple[str, ...] = field(default=())
    vocabulary: int | None = None  # vocab_size, as the config gives it (None: it does not)
    decoder_layers: int | None = None  # where layers carry both attention and a state mixer (Falcon-H1): their count
    routing: str | None = None  # how tokens are routed to the experts, as vLLM's RoutingMethodType names it
    activation: str = "silu"  # the MLP's and experts' activation (hidden_act)
    tensor_parallel_refusals: tuple[tuple[int, str], ...] = ()  # (size, vLLM's words) where vLLM sized the model

    @property
    def parameters(self) -> int:
        return sum(linear.parameters for linear in self.linears) + sum(p.count for p in self.params)

    @property
    def embedding_parameters(self) -> int:
        """The input embedding's parameters (vocabulary x width); the LM head has as many, tied or not."""
        return sum(p.count for p in self.params if p.name == EMBEDDING)

    @property
    def layers(self) -> int:
        """Decoder layers: one per attention or state layer, or as the family says (parallel hybrids)."""
        return self.decoder_layers or sum(group.layers for group in self.kv_groups)
