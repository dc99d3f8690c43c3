"""Model families: how each `model_type` lays out its weights and attention, as transformers' modelling code and
vLLM's model classes build them. One table entry per family (FAMILIES); a family that follows the common field
names needs none (`_generic`). The counts are checked against published parameter counts
(tests/unit/test_sizing.py).

Shared shapes, with h = hidden_size, H = attention heads, K = KV heads, d = head_dim, i = intermediate size:
  attention   q: h x H*d   k, v: h x K*d   o: H*d x h          (biases and q/k norms where the family has them)
  MLP         gate, up: h x i   down: i x h                   (OPT: fc1 and fc2, no gate)
  MoE layer   router: h x E, and per expert gate, up, down of the expert size (+ shared experts)
  MLA         q: h x H*(nope+rope) (or through q_lora_rank), kv_a: h x (kv_lora+rope), kv_b: kv_lora x H*(nope+v),
              o: H*v x h; the KV cache holds the kv_lora+rope latent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from cpullm.core import constants as c
from cpullm.core.sizing.anatomy import EMBEDDING, Anatomy, KVGroup, LayerKind, Linear, Params, Split
from cpullm.core.sizing.config import (
    MAX_CONFIG_VALUES,
    ConfigView,
    first_present,
    model_type,
    positive_int,
    show,
    text_config,
)
from cpullm.errors import UnsupportedModel

EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
COMMON_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# transformers' names for the layer kinds of `layer_types`.
LAYER_TYPES = {"full_attention": LayerKind.FULL, "sliding_attention": LayerKind.SLIDING}


class _Parts:
    """Accumulates one model's weight matrices and plain parameters."""

    def __init__(self) -> None:
        self.linears: list[Linear] = []
        self.params: list[Params] = []

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
            vocabulary=_own_vocabulary(config),
        )


def _own_vocabulary(config: ConfigView) -> int | None:
    """The config's own vocab_size, not a placeholder's (spec.model.weightsBytes lets a config lack it)."""
    value = config.values.get("vocab_size")
    return None if value is None else positive_int("vocab_size", value)


@dataclass(frozen=True)
class Decoder:
    """A decoder-only family: attention and MLP options, and which layers slide or route to experts."""

    qkv_bias: bool | None = None  # None: config attention_bias (default false)
    o_bias: bool | None = None  # None: config attention_bias
    qk_norm: bool = False  # an RMSNorm over head_dim on q and on k (Qwen3, Gemma 3)
    norms_per_layer: int = 2  # Gemma 2 and 3 add pre- and post-feedforward norms
    moe: MoE | None = None
    sliding: Callable[[ConfigView, int], bool] | None = None  # layer index -> slides (when no layer_types)
    defaults: Mapping[str, Any] = field(default_factory=dict)  # transformers' defaults for fields configs omit
    tied_default: bool = False
    attention_sinks: bool = False  # gpt-oss: one learned sink per head and layer

    def build(self, family: str, config: ConfigView) -> Anatomy:
        config.require(*[key for key in COMMON_FIELDS if not (key == "intermediate_size" and self.moe)])
        h, layers = config.positive("hidden_size"), config.positive("num_hidden_layers")
        heads, kv_heads, d = attention_heads(config)
        parts = _Parts()
        qkv_bias = self.qkv_bias if self.qkv_bias is not None else config.flag("attention_bias", False)
        o_bias = self.o_bias if self.o_bias is not None else config.flag("attention_bias", False)
        parts.linear("self_attn.q_proj", h, heads * d, layers, Split.HEADS)
        parts.linear("self_attn.k_proj", h, kv_heads * d, layers, Split.HEADS)
        parts.linear("self_attn.v_proj", h, kv_heads * d, layers, Split.HEADS)
        parts.linear("self_attn.o_proj", heads * d, h, layers, Split.ROW)
        parts.param("attention biases", layers * ((heads + 2 * kv_heads) * d * qkv_bias + h * o_bias))
        parts.param("q/k norms", layers * 2 * d * self.qk_norm)
        parts.param("attention sinks", layers * heads * self.attention_sinks)
        parts.param("layer norms", layers * self.norms_per_layer * h + h)
        experts = active = None
        moe_layers = self.moe.layers(config, layers) if self.moe else 0
        if self.moe:
            experts, active = self.moe.add(parts, config, h, moe_layers)
        if layers - moe_layers:
            mlp_bias = config.flag("mlp_bias", False)
            i = config.positive("intermediate_size")
            for name, fan_in, fan_out, split in _gated_mlp(h, i):
                parts.linear(f"mlp.{name}", fan_in, fan_out, layers - moe_layers, split)
            parts.param("mlp biases", (layers - moe_layers) * (2 * i + h) * mlp_bias)
        add_embeddings(parts, config, h, self.tied_default)
        kinds = layer_kinds(config, layers, self.sliding)
        groups = kv_groups(config, kinds, kv_heads, 2 * d)
        return parts.anatomy(family, config, groups, heads, kv_heads, (experts, active))


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

    def layers(self, config: ConfigView, layers: int) -> int:
        """How many layers route to experts (the others have a dense MLP of intermediate_size)."""
        if self.first_dense_key:
            first_dense = min(config.count(self.first_dense_key), layers)
            frequency = config.positive("moe_layer_freq", 1)
            return sum(1 for i in range(first_dense, layers) if i % frequency == 0)
        if self.step_key:
            step, dense_only = config.positive(self.step_key, 1), set(config.layer_numbers("mlp_only_layers"))
            return sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
        return layers

    def add(self, parts: _Parts, config: ConfigView, h: int, moe_layers: int) -> tuple[int, int]:
        # transformers writes a family's expert count under its own name or an alias (Qwen3-MoE saved by
        # transformers 5 has num_local_experts): any of them counts.
        experts_key = first_present(config, (self.experts_key, *EXPERT_COUNT_KEYS)) or self.experts_key
        config.require(experts_key, self.expert_size_key)
        experts, size = config.positive(experts_key), config.positive(self.expert_size_key)
        for name, fan_in, fan_out, split in _gated_mlp(h, size):
            parts.linear(f"mlp.experts.{name}", fan_in, fan_out, moe_layers * experts, split, expert=True)
        parts.param("router", moe_layers * (h * experts + experts * (self.router_bias + self.score_bias)))
        parts.param("expert biases", moe_layers * experts * (2 * size + h) * self.expert_bias)
        shared = 0
        if self.shared_size_key and config.has(self.shared_size_key):
            shared = config.count(self.shared_size_key)
            parts.param("shared expert gate", moe_layers * h * (shared > 0))
        elif self.shared_count_key:
            shared = config.count(self.shared_count_key) * size
        for name, fan_in, fan_out, split in _gated_mlp(h, shared):
            parts.linear(f"mlp.shared_expert.{name}", fan_in, fan_out, moe_layers if shared else 0, split)
        return experts, config.positive(self.active_key, 1)


def _gated_mlp(h: int, i: int) -> list[tuple[str, int, int, Split]]:
    """gate and up (h -> i, split by output) and down (i -> h, split by input)."""
    return [("gate_proj", h, i, Split.COLUMN), ("up_proj", h, i, Split.COLUMN), ("down_proj", i, h, Split.ROW)]


def attention_heads(config: ConfigView) -> tuple[int, int, int]:
    """(attention heads, KV heads, head_dim). Each KV head serves a whole group of attention heads (GQA), so the
    KV heads divide the attention heads; without num_key_value_heads there are as many as attention heads (MHA)."""
    heads = config.positive("num_attention_heads")
    kv_heads = config.positive("num_key_value_heads", heads)
    if heads % kv_heads:
        raise UnsupportedModel(
            f"model config num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}"
        )
    if config.has("head_dim"):
        return heads, kv_heads, config.positive("head_dim")
    hidden = config.positive("hidden_size")
    if hidden < heads:
        raise UnsupportedModel(
            f"model config hidden_size={hidden} is smaller than num_attention_heads={heads}: head_dim "
            "(hidden_size // num_attention_heads) would be 0; set head_dim in spec.model.config"
        )
    return heads, kv_heads, hidden // heads


def add_embeddings(parts: _Parts, config: ConfigView, h: int, tied_default: bool) -> None:
    vocab = config.positive("vocab_size")
    tied = config.flag("tie_word_embeddings", tied_default)
    parts.param(EMBEDDING, vocab * h)
    parts.param("lm_head", vocab * h * (not tied))


def layer_kinds(config: ConfigView, layers: int, sliding: Callable[[ConfigView, int], bool] | None) -> list[LayerKind]:
    """Each layer's attention, as vLLM decides it: `layer_types` when the config lists them, else the family's
    pattern, else every layer slides when the config sets a sliding_window (vLLM's cache-wide window: Mistral
    v0.1, Phi-3), else full."""
    types = config.strings("layer_types")
    if types is not None:
        if len(types) < layers:
            raise UnsupportedModel(f"model config layer_types lists {len(types)} layers of {layers}")
        unknown = sorted({t for t in types[:layers] if t not in LAYER_TYPES})
        if unknown:
            raise UnsupportedModel(
                f"model config layer_types has {', '.join(map(show, unknown))}: only full and sliding attention "
                "layers are sized; set spec.model.weightsBytes and spec.kvCacheGiB to plan it"
            )
        return [LAYER_TYPES[t] for t in types[:layers]]
    if sliding is None:
        window = config.count("sliding_window")  # 0 or absent: no window
        return [LayerKind.SLIDING if window else LayerKind.FULL] * layers
    return [LayerKind.SLIDING if sliding(config, i) else LayerKind.FULL for i in range(layers)]


def kv_groups(config: ConfigView, kinds: list[LayerKind], kv_heads: int, entry: int) -> tuple[KVGroup, ...]:
    """Layers of one kind make one group. A window that with the tokens in flight covers the model's whole context
    never slides (Phi-3-mini-128k's 262144; Phi-3-mini-4k's 2047 + 2048 in 128-token blocks for a 4096 context):
    those layers keep every token, as full ones do."""
    sliding = kinds.count(LayerKind.SLIDING)
    window = config.positive("sliding_window") if sliding else None
    context = max_context(config)
    if window is not None and context is not None:
        held = min(window - 1 + c.SERVER_BATCHED_TOKENS_PER_RANK, context)
        if -(-held // c.KV_BLOCK_TOKENS) * c.KV_BLOCK_TOKENS >= context:
            sliding, window = 0, None
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


# ---------------------------------------------------------------------------------------------------------------
# Families with their own shapes
# ---------------------------------------------------------------------------------------------------------------


def _mla(family: str, config: ConfigView, moe: MoE) -> Anatomy:
    """DeepSeek V2/V3 (and Kimi K2): multi-head latent attention and MoE with shared experts after dense layers.
    Checkpoint layers beyond num_hidden_layers (V3's multi-token prediction) are not loaded for serving."""
    config.require("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "kv_lora_rank",
                   "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")  # fmt: skip
    h, layers = config.positive("hidden_size"), config.positive("num_hidden_layers")
    heads = config.positive("num_attention_heads")
    latent, rope = config.positive("kv_lora_rank"), config.positive("qk_rope_head_dim")
    nope, v = config.positive("qk_nope_head_dim"), config.positive("v_head_dim")
    q_lora = config.optional("q_lora_rank")
    parts = _Parts()
    if q_lora is None:
        parts.linear("self_attn.q_proj", h, heads * (nope + rope), layers, Split.HEADS)
    else:
        parts.linear("self_attn.q_a_proj", h, q_lora, layers, Split.REPLICATED)
        parts.linear("self_attn.q_b_proj", q_lora, heads * (nope + rope), layers, Split.HEADS)
        parts.param("q_a_layernorm", layers * q_lora)
    parts.linear("self_attn.kv_a_proj_with_mqa", h, latent + rope, layers, Split.REPLICATED)
    parts.linear("self_attn.kv_b_proj", latent, heads * (nope + v), layers, Split.HEADS)
    parts.linear("self_attn.o_proj", heads * v, h, layers, Split.ROW)
    parts.param("kv_a_layernorm and layer norms", layers * (latent + 2 * h) + h)
    moe_layers = moe.layers(config, layers)
    experts, active = moe.add(parts, config, h, moe_layers)
    if layers - moe_layers:
        for name, fan_in, fan_out, split in _gated_mlp(h, config.positive("intermediate_size")):
            parts.linear(f"mlp.{name}", fan_in, fan_out, layers - moe_layers, split)
    add_embeddings(parts, config, h, False)
    groups = (KVGroup(LayerKind.MLA, layers, 1, latent + rope),)
    return parts.anatomy(family, config, groups, heads, None, (experts, active))


def _opt(family: str, config: ConfigView) -> Anatomy:
    """OPT: learned positions (2 offset rows), LayerNorms with biases, biased projections, an fc1/fc2 MLP (ffn_dim),
    and an embedding narrower than the model behind project_in/out (word_embed_proj_dim) on some sizes."""
    config.require("hidden_size", "ffn_dim", "num_hidden_layers", "num_attention_heads", "vocab_size")
    h, layers, ffn = config.positive("hidden_size"), config.positive("num_hidden_layers"), config.positive("ffn_dim")
    heads = config.positive("num_attention_heads")
    if h % heads:
        raise UnsupportedModel(f"model config hidden_size={h} is not a multiple of num_attention_heads={heads}")
    bias = config.flag("enable_bias", True)
    embed = config.positive("word_embed_proj_dim", h)
    parts = _Parts()
    for name in ("q_proj", "k_proj", "v_proj"):
        parts.linear(f"self_attn.{name}", h, h, layers, Split.HEADS)
    parts.linear("self_attn.out_proj", h, h, layers, Split.ROW)
    parts.linear("fc1", h, ffn, layers, Split.COLUMN)
    parts.linear("fc2", ffn, h, layers, Split.ROW)
    parts.param("biases", layers * (4 * h + ffn + h) * bias)
    final_norm = config.flag("do_layer_norm_before", True) and not config.flag("_remove_final_layer_norm", False)
    parts.param("layer norms", layers * 2 * 2 * h + 2 * h * final_norm)
    parts.param("embed_positions", (config.positive("max_position_embeddings", 2048) + 2) * h)
    if embed != h:
        parts.linear("project_in", embed, h, 1, Split.REPLICATED)
        parts.linear("project_out", h, embed, 1, Split.REPLICATED)
    vocab = config.positive("vocab_size")
    parts.param(EMBEDDING, vocab * embed)
    parts.param("lm_head", vocab * embed * (not config.flag("tie_word_embeddings", True)))
    return parts.anatomy(family, config, (KVGroup(LayerKind.FULL, layers, heads, 2 * (h // heads)),), heads, heads)


def _every_other_from_first(config: ConfigView, layer: int) -> bool:
    """Gemma 2 and gpt-oss: even layers slide, odd ones attend to the whole context."""
    return layer % 2 == 0


def _all_but_every_nth(config: ConfigView, layer: int) -> bool:
    """Gemma 3: every sliding_window_pattern-th layer attends to the whole context, the others slide."""
    return (layer + 1) % config.positive("sliding_window_pattern", 6) != 0


def _qwen_sliding(config: ConfigView, layer: int) -> bool:
    """Qwen2/Qwen3: with use_sliding_window, layers from max_window_layers on slide."""
    return config.flag("use_sliding_window", False) and layer >= config.count("max_window_layers", 28)


_GEMMA3_TEXT = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 131_072,
    "sliding_window": 4096,
}
_GEMMA2 = {**_GEMMA3_TEXT, "vocab_size": 256_000, "max_position_embeddings": 8192}
_GEMMA = {
    "vocab_size": 256_000,
    "hidden_size": 3072,
    "intermediate_size": 24576,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": 256,
    "max_position_embeddings": 8192,
}
_GPT_OSS = {
    "vocab_size": 201_088,
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_hidden_layers": 36,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_local_experts": 128,
    "num_experts_per_tok": 4,
    "sliding_window": 128,
    "max_position_embeddings": 131_072,
}
_QWEN_MOE = MoE("num_experts", step_key="decoder_sparse_step")
_DEEPSEEK_MOE = MoE("n_routed_experts", shared_count_key="n_shared_experts", first_dense_key="first_k_dense_replace")


@dataclass(frozen=True)
class Family:
    build: Callable[[str, ConfigView], Anatomy]
    defaults: Mapping[str, Any] = field(default_factory=dict)


def _decoder(**options: Any) -> Family:
    decoder = Decoder(**options)
    return Family(decoder.build, decoder.defaults)


FAMILIES: dict[str, Family] = {
    "llama": _decoder(),
    "mistral": _decoder(),
    "granite": _decoder(),
    "phi3": _decoder(),  # fused qkv_proj and gate_up_proj, the same shapes
    "qwen2": _decoder(qkv_bias=True, o_bias=False, sliding=_qwen_sliding),
    "qwen3": _decoder(qk_norm=True, sliding=_qwen_sliding),
    "gemma": _decoder(defaults=_GEMMA, tied_default=True),
    "gemma2": _decoder(norms_per_layer=4, sliding=_every_other_from_first, defaults=_GEMMA2, tied_default=True),
    "gemma3_text": _decoder(
        qk_norm=True, norms_per_layer=4, sliding=_all_but_every_nth, defaults=_GEMMA3_TEXT, tied_default=True
    ),
    "mixtral": _decoder(moe=MoE("num_local_experts", expert_size_key="intermediate_size")),
    "qwen2_moe": _decoder(
        qkv_bias=True,
        o_bias=False,
        moe=MoE("num_experts", shared_size_key="shared_expert_intermediate_size", step_key="decoder_sparse_step"),
    ),
    "qwen3_moe": _decoder(qk_norm=True, moe=_QWEN_MOE),
    "gpt_oss": _decoder(
        qkv_bias=True,
        o_bias=True,
        attention_sinks=True,
        moe=MoE("num_local_experts", expert_size_key="intermediate_size", router_bias=True, expert_bias=True),
        sliding=_every_other_from_first,
        defaults=_GPT_OSS,
    ),
    "deepseek_v2": Family(lambda family, config: _mla(family, config, _DEEPSEEK_MOE)),
    "deepseek_v3": Family(
        lambda family, config: _mla(
            family,
            config,
            MoE(
                "n_routed_experts",
                shared_count_key="n_shared_experts",
                first_dense_key="first_k_dense_replace",
                score_bias=True,
            ),
        )
    ),
    "opt": Family(_opt, {"max_position_embeddings": 2048}),
}
# Multimodal configs whose language model is a family above, nested in text_config.
MULTIMODAL = {"gemma3": "gemma3_text"}


def _generic(family: str, config: ConfigView) -> Anatomy:
    """A family not in the table whose config uses the common field names: a Llama-shaped decoder, with the
    Mixtral/Qwen/DeepSeek expert fields and MLA where the config has them."""
    if config.has("kv_lora_rank"):
        return _mla(family, config, _DEEPSEEK_MOE)
    for experts_key in EXPERT_COUNT_KEYS:
        if config.count(experts_key):
            size_key = "moe_intermediate_size" if config.has("moe_intermediate_size") else "intermediate_size"
            return Decoder(moe=MoE(experts_key, expert_size_key=size_key)).build(family, config)
    missing = [key for key in COMMON_FIELDS if not config.has(key)]
    if missing:
        raise UnsupportedModel(
            f"model_type {show(family)} is not a known family and its config lacks {', '.join(missing)}; "
            "set spec.model.weightsBytes to size the weights"
        )
    return Decoder().build(family, config)


def anatomy_of(config: Mapping[str, Any], placeholders: Mapping[str, Any] | None = None) -> Anatomy:
    """The model a config.json describes, with its vision tower when it is multimodal; raises UnsupportedModel
    naming what is missing or malformed. `placeholders` stand in for fields the config lacks (beneath the
    family's own defaults)."""
    family = model_type(config)
    if family is None and config.get("model_type") is not None:
        raise UnsupportedModel(f"model config model_type={show(config.get('model_type'))} is not a name")
    text = text_config(config)
    text_family = model_type(text) if text is not config else None
    text_family = text_family or MULTIMODAL.get(family or "", family)
    entry = FAMILIES.get(text_family or "")
    defaults = {**(placeholders or {}), **(entry.defaults if entry else {})}
    view = ConfigView(text, defaults, text_family or "(missing)")
    anatomy = entry.build(text_family or "", view) if entry else _generic(text_family or "(missing)", view)
    vision = config.get("vision_config")
    if vision is None:
        return anatomy
    if not isinstance(vision, Mapping):
        raise UnsupportedModel(f"model config vision_config={show(vision)} is not an object")
    try:
        towers: tuple[Params, ...] = (
            vision_tower(ConfigView(vision, _SIGLIP, "vision_config"), view.positive("hidden_size")),
        )
        notes = anatomy.notes
    except UnsupportedModel as err:  # a vision encoder of another shape: the language model is still sized
        towers, notes = (), (*anatomy.notes, f"vision tower not counted ({err.message.split(';')[0]})")
    return replace(anatomy, family=family or anatomy.family, params=(*anatomy.params, *towers), notes=notes)


# SigLIP's defaults (transformers' SiglipVisionConfig), which Gemma 3's vision_config leaves out.
_SIGLIP = {"num_channels": 3, "image_size": 224, "patch_size": 16}


def vision_tower(config: ConfigView, text_hidden: int) -> Params:
    """A ViT encoder (SigLIP/CLIP shape: patch and position embeddings; per layer biased q, k, v, o, an fc1/fc2
    MLP and two LayerNorms; a final LayerNorm) and a projection into the language model (Gemma 3's: a norm and
    one matrix). Kept in the serving dtype: vLLM loads it whole, and quantized checkpoints leave it out."""
    layers_key = first_present(config, ("num_hidden_layers", "depth")) or "num_hidden_layers"  # Qwen-VL: depth
    config.require("hidden_size", "intermediate_size", layers_key, why="or drop vision_config")
    h, i = config.positive("hidden_size"), config.positive("intermediate_size")
    layers, patch = config.positive(layers_key), config.positive("patch_size")
    image, channels = config.positive("image_size"), config.positive("num_channels")
    embeddings = channels * patch * patch * h + h + (image // patch) ** 2 * h
    per_layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * 2 * h
    projector = h + h * text_hidden
    return Params("vision tower", embeddings + layers * per_layer + 2 * h + projector)
