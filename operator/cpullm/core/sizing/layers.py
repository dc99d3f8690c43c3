"""The building blocks model families share (families.py, hybrids.py): the parts a model is made of, attention's
shape, the MLP and its experts, the embeddings, each layer's attention kind, the KV groups and the context length,
as transformers' modelling code and vLLM's model classes build them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cpullm.core.sizing.anatomy import EMBEDDING, Anatomy, KVGroup, LayerKind, Linear, Params, Split
from cpullm.core.sizing.config import MAX_CONFIG_VALUES, ConfigView, first_present, positive_int, show
from cpullm.errors import NotSizedHere, UnsupportedModel

# The names configs give a mixture of experts' fields, and the families that use each (a family of FAMILIES reads its
# own; a family not in the table is read by these, in this order).
EXPERT_COUNT_KEYS = (
    "num_experts",  # Qwen MoE, Granite MoE
    "num_local_experts",  # Mixtral, gpt-oss, Llama 4; Qwen3-MoE saved by transformers 5
    "n_routed_experts",  # DeepSeek V2/V3, Kimi K2
    "moe_num_experts",  # ERNIE 4.5
)
EXPERT_ACTIVE_KEYS = (
    "num_experts_per_tok",  # Mixtral, Qwen MoE, DeepSeek, gpt-oss, Llama 4
    "moe_k",  # ERNIE 4.5
    "moe_topk",  # Hunyuan
)
# Keys that say which layers slide in ways no family here reads: a config with one (and no layer_types) is refused,
# never sized as if every layer, or none, slid.
UNREAD_PATTERN_KEYS = (
    "global_attn_every_n_layers",
    "swa_layers",
    "sliding_window_layers",
    "full_attention_layers",
    "global_attention_layers",
    "attention_layer_pattern",
)


@dataclass(frozen=True)
class Family:
    """How a model_type is built, and transformers' defaults for the fields its configs may omit."""

    build: Callable[[str, ConfigView], Anatomy]
    defaults: Mapping[str, Any] = field(default_factory=dict)


# transformers' names for the layer kinds of `layer_types`.
LAYER_TYPES = {"full_attention": LayerKind.FULL, "sliding_attention": LayerKind.SLIDING}


class Parts:
    """Accumulates one model's weight matrices and plain parameters."""

    def __init__(self) -> None:
        self.linears: list[Linear] = []
        self.params: list[Params] = []
        self.routing: str | None = None  # the experts' routing method, as vLLM names it (routing_method)

    def linear(self, name: str, fan_in: int, fan_out: int, count: int, split: Split, expert: bool = False) -> None:
        if count:
            self.linears.append(Linear(name, fan_in, fan_out, count, split, expert))

    def param(self, name: str, count: int) -> None:
        if count:
            self.params.append(Params(name, count))

    def anatomy(
        self,
        family: str,
        config: ConfigView,
        kv_groups: tuple[KVGroup, ...],
        heads: int,
        kv_heads: int | None,
        experts: tuple[int | None, int | None] = (None, None),
    ) -> Anatomy:
        """The model these parts make, with its attention and the context its config gives."""
        return Anatomy(
            family=family,
            linears=tuple(self.linears),
            params=tuple(self.params),
            kv_groups=kv_groups,
            attention_heads=heads,
            kv_heads=kv_heads,
            max_context=max_context(config),
            experts=experts[0],
            active_experts=experts[1],
            vocabulary=own_vocabulary(config),
            routing=self.routing,
            activation=str(config.values.get("hidden_act", "silu")),
        )


def own_vocabulary(config: ConfigView) -> int | None:
    """The config's own vocab_size, not a placeholder's (spec.model.weightsBytes lets a config lack it)."""
    value = config.values.get("vocab_size")
    return None if value is None else positive_int("vocab_size", value)


@dataclass(frozen=True)
class MoE:
    """Mixture-of-experts MLP: which config keys name the experts, and which layers have them."""

    experts_key: str
    expert_size_key: str = "moe_intermediate_size"
    shared_size_key: str | None = None  # Qwen2-MoE: one shared expert of this size, behind a 1-output gate
    shared_count_key: str | None = None  # DeepSeek: n_shared_experts of the expert size, fused
    router_bias: bool = False
    expert_bias: bool = False
    score_bias: bool = False  # DeepSeek-V3's e_score_correction_bias
    first_dense_key: str | None = None  # DeepSeek: first_k_dense_replace
    step_key: str | None = None  # Qwen MoE: decoder_sparse_step (and mlp_only_layers)
    active_key: str = "num_experts_per_tok"
    range_keys: tuple[str, str, str] | None = None  # ERNIE 4.5: first and last MoE layer, and the interval

    def layers(self, config: ConfigView, layers: int) -> int:
        """How many layers route to experts (the others have a dense MLP of intermediate_size)."""
        if self.range_keys:
            start_key, end_key, interval_key = self.range_keys
            start, end = config.count(start_key), config.count(end_key, layers - 1)
            interval = config.positive(interval_key, 1)
            return sum(1 for i in range(layers) if start <= i <= end and (i + 1) % interval == 0)
        if self.first_dense_key:
            first_dense = min(config.count(self.first_dense_key), layers)
            frequency = config.positive("moe_layer_freq", 1)
            return sum(1 for i in range(first_dense, layers) if i % frequency == 0)
        if self.step_key:
            step, dense_only = config.positive(self.step_key, 1), set(config.layer_numbers("mlp_only_layers"))
            return sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
        return layers

    def add(self, parts: Parts, config: ConfigView, h: int, moe_layers: int) -> tuple[int, int]:
        # transformers writes a family's expert count under its own name or an alias (Qwen3-MoE saved by
        # transformers 5 has num_local_experts): any of them counts.
        experts_key = first_present(config, (self.experts_key, *EXPERT_COUNT_KEYS)) or self.experts_key
        config.require(experts_key, self.expert_size_key)
        experts, size = config.positive(experts_key), config.positive(self.expert_size_key)
        for name, fan_in, fan_out, split in gated_mlp(h, size):
            parts.linear(f"mlp.experts.{name}", fan_in, fan_out, moe_layers * experts, split, expert=True)
        parts.param("router", moe_layers * (h * experts + experts * (self.router_bias + self.score_bias)))
        parts.routing = routing_method(config, self.score_bias)
        parts.param("expert biases", moe_layers * experts * (2 * size + h) * self.expert_bias)
        shared = 0
        if self.shared_size_key and config.has(self.shared_size_key):
            shared = config.count(self.shared_size_key)
            parts.param("shared expert gate", moe_layers * h * (shared > 0))
        elif self.shared_count_key:
            shared = config.count(self.shared_count_key) * size
        for name, fan_in, fan_out, split in gated_mlp(h, shared):
            parts.linear(f"mlp.shared_expert.{name}", fan_in, fan_out, moe_layers if shared else 0, split)
        return experts, config.positive(self.active_key, 1)


def routing_method(config: ConfigView, score_bias: bool) -> str:
    """How vLLM routes tokens to the experts, named as its RoutingMethodType (fused_moe/config.py,
    get_routing_method_type), from the config's router fields: the scoring function, whether the top-k weights are
    renormalized, a score correction bias (DeepSeek-V3's noaux_tc, MiniMax's use_routing_bias) and expert groups."""
    scoring = config.values.get("scoring_func", "softmax")
    renormalize = config.flag("norm_topk_prob", True)
    bias = score_bias or config.values.get("topk_method") == "noaux_tc" or config.flag("use_routing_bias", False)
    if scoring == "sqrtsoftplus":
        return "DeepseekV4" if renormalize else "Unspecified"
    if bias:
        if scoring != "sigmoid" or not renormalize:
            return "Unspecified"
        return "DeepSeekV3" if config.count("n_group") else "MiniMax2"
    if scoring == "sigmoid":
        return "SigmoidRenorm" if renormalize else "Sigmoid"
    if scoring == "softmax":
        return "RenormalizeNaive" if renormalize else "Default"
    return "Unspecified"


def gated_mlp(h: int, i: int) -> list[tuple[str, int, int, Split]]:
    """gate and up (h -> i, split by output) and down (i -> h, split by input)."""
    return [("gate_proj", h, i, Split.COLUMN), ("up_proj", h, i, Split.COLUMN), ("down_proj", i, h, Split.ROW)]


def attention_heads(config: ConfigView, reads_head_dim: bool = True) -> tuple[int, int, int]:
    """(attention heads, KV heads, head_dim). Each KV head serves a whole group of attention heads (GQA), so the
    KV heads divide the attention heads; without num_key_value_heads there are as many as attention heads (MHA).
    head_dim is the config's, else hidden_size over the heads (always, for a family whose model reads no head_dim:
    `reads_head_dim` False)."""
    heads = config.positive("num_attention_heads")
    kv_heads = config.positive("num_key_value_heads", heads)
    if heads % kv_heads:
        raise UnsupportedModel(
            f"model config num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}"
        )
    if reads_head_dim and config.has("head_dim"):
        return heads, kv_heads, config.positive("head_dim")
    hidden = config.positive("hidden_size")
    if hidden < heads:
        hint = "; set head_dim in spec.model.config" if reads_head_dim else ""
        raise UnsupportedModel(
            f"model config hidden_size={hidden} is smaller than num_attention_heads={heads}: head_dim "
            f"(hidden_size // num_attention_heads) would be 0{hint}"
        )
    return heads, kv_heads, hidden // heads


def add_embeddings(parts: Parts, config: ConfigView, h: int, tied_default: bool) -> None:
    vocab = config.positive("vocab_size")
    tied = config.flag("tie_word_embeddings", tied_default)
    parts.param(EMBEDDING, vocab * h)
    parts.param("lm_head", vocab * h * (not tied))


def listed_layer_kinds(
    config: ConfigView, layers: int, names: Mapping[str, LayerKind], sized: str
) -> list[LayerKind] | None:
    """Each layer's kind as the config's `layer_types` names it (`names`: the names a family knows; `sized`: what a
    refusal of another says), or None where the config has no layer_types."""
    types = config.strings("layer_types")
    if types is None:
        return None
    if len(types) < layers:
        raise UnsupportedModel(f"model config layer_types lists {len(types)} layers of {layers}")
    unknown = sorted({t for t in types[:layers] if t not in names})
    if unknown:
        raise NotSizedHere(f"model config layer_types has {', '.join(map(show, unknown))}: {sized}")
    return [names[t] for t in types[:layers]]


def layer_kinds(config: ConfigView, layers: int, sliding: Callable[[ConfigView, int], bool] | None) -> list[LayerKind]:
    """Each layer's attention, as vLLM decides it: `layer_types` when the config lists them, else the family's
    pattern, else every layer slides when the config sets a sliding_window (vLLM's cache-wide window: Mistral
    v0.1, Phi-3), else full."""
    sized = (
        f"model_type {show(config.family)} is sized with full and sliding attention layers only (state-space and "
        "chunked layers are sized for the families of core/sizing/hybrids.py)"
    )
    listed = listed_layer_kinds(config, layers, LAYER_TYPES, sized)
    if listed is not None:
        return listed
    if sliding is None:
        unread = [key for key in UNREAD_PATTERN_KEYS if config.has(key)]
        if unread:
            raise NotSizedHere(
                f"model config {unread[0]}={show(config.values[unread[0]])} says which layers slide in a way "
                f"{sized.split(' is sized')[0]} is not sized by; give layer_types, or spec.model.weightsBytes and an "
                "explicit kvCacheGiB"
            )
        if config.has("sliding_window_pattern"):  # transformers' rule for the families that name one
            return [LayerKind.SLIDING if sliding_by_pattern(config, i, 1) else LayerKind.FULL for i in range(layers)]
        # vLLM keeps no window where the config turns it off (Qwen2's use_sliding_window: false).
        window = config.count("sliding_window") if config.flag("use_sliding_window", True) else 0
        return [LayerKind.SLIDING if window else LayerKind.FULL] * layers
    return [LayerKind.SLIDING if sliding(config, i) else LayerKind.FULL for i in range(layers)]


def sliding_by_pattern(config: ConfigView, layer: int, default: int) -> bool:
    """Whether `layer` slides by sliding_window_pattern, as transformers derives layer_types: a count n (every n-th
    layer is global, the others slide; 1: none slides) or letters ("LLLG": L slides, G is global), repeated over
    the layers; no sliding_window: none slides."""
    if not config.count("sliding_window"):
        return False
    pattern = config.values.get("sliding_window_pattern", default)
    if isinstance(pattern, str):
        if not pattern or set(pattern.upper()) - {"L", "G"}:
            raise UnsupportedModel(
                f"model config sliding_window_pattern={show(pattern)} is neither a count nor L/G letters"
            )
        return pattern.upper()[layer % len(pattern)] == "L"
    return (layer + 1) % config.positive("sliding_window_pattern", default) != 0


def kv_groups(config: ConfigView, kinds: list[LayerKind], kv_heads: int, entry: int) -> tuple[KVGroup, ...]:
    """Layers of one kind make one group. A window as long as the context still slides in vLLM's accounting
    (Phi-3-mini-128k's 262144, Phi-3-mini-4k's 2047: vLLM 0.32 keeps a SlidingWindowSpec for them, whose request
    takes one block more than the context's)."""
    sliding = kinds.count(LayerKind.SLIDING)
    window = config.positive("sliding_window") if sliding else None
    groups = []
    if len(kinds) - sliding:
        groups.append(KVGroup(LayerKind.FULL, len(kinds) - sliding, kv_heads, entry))
    if sliding:
        groups.append(KVGroup(LayerKind.SLIDING, sliding, kv_heads, entry, window))
    return tuple(groups)


# vLLM derives a model's context length from the smallest of these its config sets (model_max_length, when set,
# overrides them), then multiplies it by a RoPE scaling factor for the scaling types that do not already count it.
CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
ROPE_TYPES_ALREADY_SCALED = frozenset({"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"})


def max_context(config: ConfigView) -> int | None:
    """The longest context vLLM serves without VLLM_ALLOW_LONG_MAX_MODEL_LEN."""
    if config.has("model_max_length"):
        length = config.positive("model_max_length")
    else:
        lengths = [config.positive(key) for key in CONTEXT_KEYS if config.has(key)]
        if not lengths:
            return None
        length = min(lengths)
    rope = config.mapping("rope_scaling") or config.mapping("rope_parameters") or {}
    kind = rope.get("rope_type", rope.get("type"))
    factor = rope.get("factor")
    scales = isinstance(kind, str) and kind not in ROPE_TYPES_ALREADY_SCALED and "gemma3" not in config.family
    if scales and isinstance(factor, int | float) and not isinstance(factor, bool) and 1 < factor <= 2**20:
        length = int(length * factor)
    return min(length, MAX_CONFIG_VALUES["max_position_embeddings"])
