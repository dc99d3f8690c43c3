"""LFM2 (lfm2) and LFM2-MoE (lfm2_moe): short-convolution layers with a few attention layers, as vLLM's lfm2.py and
lfm2_moe.py build them with transformers' configs:
  layers      layer_types ("conv", "full_attention"), else full_attn_idxs (transformers' rule: absent, every layer
              attends)
  attention   q, k, v, out without biases, head_dim = hidden over heads (whatever head_dim says), q and k norms
  conv        a short convolution (mixers.short_conv) of conv_dim channels (LFM2-MoE: hidden_size)
  LFM2 MLP    gated, block_dim wide, of block_ff_dim (transformers' intermediate_size) adjusted where
              block_auto_adjust_ff_dim: 2/3 of it, times block_ffn_dim_multiplier, up to a multiple of block_multiple_of
  LFM2-MoE    the first num_dense_layers a gated MLP of intermediate_size, the others num_experts gated experts of
              moe_intermediate_size behind a sigmoid router (with an expert bias where use_expert_bias)
Two norms a layer and one after the last; vLLM ties the LM head to the embedding."""

from __future__ import annotations

from dataclasses import replace

from cpullm.core.sizing.anatomy import EMBEDDING, Anatomy, LayerKind
from cpullm.core.sizing.config import ConfigView
from cpullm.core.sizing.layers import (
    Family,
    MoE,
    Parts,
    attention_heads,
    gated_mlp,
    listed_layer_kinds,
    routing_method,
)
from cpullm.core.sizing.mixers import add_attention, layer_groups, short_conv
from cpullm.errors import UnsupportedModel

LAYER_NAMES = {"conv": LayerKind.STATE, "full_attention": LayerKind.FULL}


def _kinds(config: ConfigView, layers: int) -> list[LayerKind]:
    sized = "LFM2 layers are conv and full_attention"
    listed = listed_layer_kinds(config, layers, LAYER_NAMES, sized)
    if listed is not None:
        return listed
    if config.family == "lfm2_moe":  # Lfm2MoeConfig derives no layer_types: vLLM cannot build it without them
        raise UnsupportedModel("model config (model_type lfm2_moe) lacks layer_types: which layer is which is unknown")
    attending = config.layer_numbers("full_attn_idxs") if config.has("full_attn_idxs") else range(layers)
    return [LayerKind.FULL if i in attending else LayerKind.STATE for i in range(layers)]


def _ff_dim(config: ConfigView) -> int:
    """The LFM2 MLP's width (Lfm2MLP): block_ff_dim, adjusted as block_auto_adjust_ff_dim says."""
    size = config.positive("block_ff_dim") if config.has("block_ff_dim") else config.positive("intermediate_size")
    if not config.flag("block_auto_adjust_ff_dim", True):
        return size
    size = int(2 * size / 3)
    multiplier = config.number("block_ffn_dim_multiplier")
    if multiplier is not None:
        size = int(multiplier * size)
    multiple = config.positive("block_multiple_of")
    return multiple * -(-size // multiple)


def _lfm2(family: str, config: ConfigView) -> Anatomy:
    config.require("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    moe = family == "lfm2_moe"
    if not moe:  # vLLM's Lfm2 reads both; transformers' config has no default for them
        config.require("conv_dim", "block_dim")
    h, layers = config.positive("hidden_size"), config.positive("num_hidden_layers")
    kinds = _kinds(config, layers)
    parts = Parts()
    heads, kv_heads, d = shape = attention_heads(config, reads_head_dim=False)
    attention = kinds.count(LayerKind.FULL)
    add_attention(parts, h, shape, attention, out="out_proj")
    parts.param("q/k norms", attention * 2 * d)
    convs, width = kinds.count(LayerKind.STATE), h if moe else config.positive("conv_dim")
    kernel = config.positive("conv_L_cache")
    state = short_conv(parts, "short_conv", width, kernel, config.flag("conv_bias", False), convs) if convs else None
    experts: tuple[int | None, int | None] = (None, None)
    if moe:
        dense = min(config.count("num_dense_layers"), layers)
        for name, fan_in, fan_out, split in gated_mlp(h, config.positive("intermediate_size")):
            parts.linear(f"feed_forward.{name}", fan_in, fan_out, dense, split)
        bias = config.flag("use_expert_bias", True)
        experts = MoE("num_experts", score_bias=bias).add(parts, config, h, layers - dense)
        sigmoid = replace(config, values={**config.values, "scoring_func": "sigmoid"})
        parts.routing = routing_method(sigmoid, bias)
    else:
        block = config.positive("block_dim")
        for name, fan_in, fan_out, split in gated_mlp(block, _ff_dim(config)):
            parts.linear(f"feed_forward.{name}", fan_in, fan_out, layers, split)
    parts.param("layer norms", layers * 2 * h + h)
    parts.param(EMBEDDING, config.positive("vocab_size") * h)  # the LM head is tied to it, whatever the config says
    groups = layer_groups(kinds, kv_heads, 2 * d, state)
    return parts.anatomy(family, config, groups, heads, kv_heads, experts)


# transformers' Lfm2Config and Lfm2MoeConfig defaults (5.x) for the fields a config may omit.
_COMMON = {"num_key_value_heads": 8, "max_position_embeddings": 128_000, "conv_L_cache": 3}
LFM2_FAMILIES = {
    "lfm2": Family(
        _lfm2, {**_COMMON, "intermediate_size": 12288, "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0}
    ),
    "lfm2_moe": Family(
        _lfm2,
        {
            **_COMMON,
            "intermediate_size": 7168,
            "moe_intermediate_size": 1792,
            "num_dense_layers": 2,
            "num_experts": 32,
            "num_experts_per_tok": 4,
        },
    ),
}
