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

from cpullm.core.sizing.anatomy import EMBEDDING, Anatomy, KVGroup, LayerKind, Params, Split
from cpullm.core.sizing.config import ConfigView, first_present, model_type, show, text_config
from cpullm.core.sizing.hybrids import HYBRIDS, NOT_SIZED, VLLM_CPU_CANNOT_RUN
from cpullm.core.sizing.layers import (
    EXPERT_ACTIVE_KEYS,
    EXPERT_COUNT_KEYS,
    Family,
    MoE,
    Parts,
    add_embeddings,
    attention_heads,
    gated_mlp,
    kv_groups,
    layer_kinds,
    sliding_by_pattern,
)
from cpullm.errors import NotSizedHere, UnsupportedModel, VllmCannotServe

COMMON_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


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
        parts = Parts()
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
            for name, fan_in, fan_out, split in gated_mlp(h, i):
                parts.linear(f"mlp.{name}", fan_in, fan_out, layers - moe_layers, split)
            parts.param("mlp biases", (layers - moe_layers) * (2 * i + h) * mlp_bias)
        add_embeddings(parts, config, h, self.tied_default)
        kinds = layer_kinds(config, layers, self.sliding)
        groups = kv_groups(config, kinds, kv_heads, 2 * d)
        return parts.anatomy(family, config, groups, heads, kv_heads, (experts, active))


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
    parts = Parts()
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
        for name, fan_in, fan_out, split in gated_mlp(h, config.positive("intermediate_size")):
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
    parts = Parts()
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


def _three_slide_then_one_full(config: ConfigView, layer: int) -> bool:
    """Cohere2 (Command R7B) and EXAONE 4.0: as transformers derives layer_types where a config has none, every
    sliding_window_pattern-th layer (default 4) attends to the whole context; EXAONE's pattern may be spelt as
    letters ("LLLG": L slides, G is global); no sliding_window: no layer slides."""
    return sliding_by_pattern(config, layer, 4)


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
    # One LayerNorm (weight only) per layer: attention and MLP in parallel on its output.
    "cohere2": _decoder(norms_per_layer=1, sliding=_three_slide_then_one_full, tied_default=True),
    # q/k norms, and norms after attention and after the MLP (none before them).
    "exaone4": _decoder(qk_norm=True, sliding=_three_slide_then_one_full),
    # ERNIE 4.5 MoE: experts (and shared experts of moe_num_shared_experts x their size) from
    # moe_layer_start_index to moe_layer_end_index every moe_layer_interval layers; the router's score correction
    # bias (moe_statics, loaded as the gate's e_score_correction_bias).
    "ernie4_5_moe": _decoder(
        moe=MoE(
            "moe_num_experts",
            active_key="moe_k",
            shared_count_key="moe_num_shared_experts",
            score_bias=True,
            range_keys=("moe_layer_start_index", "moe_layer_end_index", "moe_layer_interval"),
        )
    ),
    **HYBRIDS,
}
# Multimodal configs whose language model is a family above, nested in text_config.
MULTIMODAL = {"gemma3": "gemma3_text", "llama4": "llama4_text"}


# Keys by which a config says some of its layers are not attention (a state-space, convolution or linear-attention
# mixer, or a pattern of layer kinds): a family not in the table with one is refused, not sized as a Llama.
STATE_KEYS = (
    "hybrid_override_pattern",
    "layers_block_type",
    "ssm_state_size",
    "state_size",
    "mamba_d_state",
    "mamba_num_heads",
    "conv_L_cache",
    "linear_num_key_heads",
    "linear_conv_kernel_dim",
    "attn_layer_period",
    "full_attn_idxs",
)


def _generic(family: str, config: ConfigView) -> Anatomy:
    """A family not in the table whose config uses the common field names: a Llama-shaped decoder, with the
    Mixtral/Qwen/DeepSeek expert fields and MLA where the config has them. A state-space family not sized here is
    refused by name: its common fields would size it as a Llama."""
    if family in VLLM_CPU_CANNOT_RUN:
        raise VllmCannotServe(
            f"model_type {show(family)}: vLLM's CPU backend cannot run it: {VLLM_CPU_CANNOT_RUN[family]}; serve "
            "another model"
        )
    if family in NOT_SIZED:
        raise NotSizedHere(
            f"model_type {show(family)} has state-space or linear-attention layers vLLM CPU runs but this operator "
            f"does not size yet (sized: {', '.join(sorted(HYBRIDS))}); vLLM sizes it: the operator's sizing Job, or "
            "cpullm plan --vllm-python"
        )
    state = [key for key in STATE_KEYS if config.has(key)]
    if state:
        raise NotSizedHere(
            f"model_type {show(family)} is not a known family and its config has {state[0]}: layers that are not "
            "attention, which the common-field formula (a Llama) would size wrongly; vLLM sizes it (the operator's "
            "sizing Job, or cpullm plan --vllm-python), or set spec.model.weightsBytes and an explicit kvCacheGiB"
        )
    if config.has("kv_lora_rank"):
        return _mla(family, config, _DEEPSEEK_MOE)
    for experts_key in EXPERT_COUNT_KEYS:
        if config.count(experts_key):
            size_key = "moe_intermediate_size" if config.has("moe_intermediate_size") else "intermediate_size"
            active_key = first_present(config, EXPERT_ACTIVE_KEYS) or EXPERT_ACTIVE_KEYS[0]
            return Decoder(moe=MoE(experts_key, expert_size_key=size_key, active_key=active_key)).build(family, config)
    missing = [key for key in COMMON_FIELDS if not config.has(key)]
    if missing:
        raise NotSizedHere(
            f"model_type {show(family)} is not a known family and its config lacks {', '.join(missing)}; "
            "set spec.model.weightsBytes to size the weights, or have vLLM size it (cpullm plan --vllm-python; the "
            "operator runs a sizing Job)"
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
