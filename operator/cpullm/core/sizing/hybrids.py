"""Hybrid families: decoders whose layers mix attention with a state-space or linear-attention mixer, or with
chunked local attention, as vLLM's model classes build them (granitemoehybrid.py, falcon_h1.py, qwen3_next.py,
llama4.py here; nemotron_h.py and lfm2.py in modules of their own). One builder per family (HYBRIDS);
tests/vllm/test_oracle.py checks each against vLLM's own model and KV cache layout from the same config. The mixers'
shapes: mixers.py.

  gated DeltaNet  in_proj_qkvz: h x (2 K + 2 V)   in_proj_ba: h x 2 Hv   conv1d: (2 K + V) x kernel   A_log, dt_bias: Hv
                  norm: dv   out_proj: V x h       with K = Hk x dk, V = Hv x dv; state: conv (kernel - 1) x (2 K + V),
                  temporal Hv x dv x dk
"""

from __future__ import annotations

from dataclasses import replace

from cpullm.core.sizing.anatomy import Anatomy, LayerKind, Split, StateShape
from cpullm.core.sizing.config import ConfigView
from cpullm.core.sizing.layers import Family, MoE, Parts, add_embeddings, gated_mlp
from cpullm.core.sizing.lfm2 import LFM2_FAMILIES
from cpullm.core.sizing.mixers import (
    GATED_DELTANET_PAGES,
    Mamba2,
    attention_projections,
    hybrid_layer_kinds,
    layer_groups,
)
from cpullm.core.sizing.nemotron_h import NEMOTRON_H
from cpullm.errors import UnsupportedModel


def _mamba2(config: ConfigView, prefix: str, width: int, gated_norm: bool) -> Mamba2:
    """Mamba2's sizes under keys `<prefix>n_heads`, `<prefix>d_head` ("auto": the width over the heads), ..."""
    heads = config.positive(f"{prefix}n_heads")
    head = config.values.get(f"{prefix}d_head", "auto")
    head_dim = width // heads if head == "auto" else config.positive(f"{prefix}d_head")
    if heads * head_dim != width:
        raise UnsupportedModel(
            f"model config {prefix}n_heads={heads} x {prefix}d_head={head_dim} is not the mixer's width {width}"
        )
    return Mamba2(
        width=width,
        heads=heads,
        head_dim=head_dim,
        groups=config.positive(f"{prefix}n_groups"),
        state=config.positive(f"{prefix}d_state"),
        kernel=config.positive(f"{prefix}d_conv"),
        conv_bias=config.flag(f"{prefix}conv_bias", True),
        gated_norm=gated_norm,
    )


def _granite_hybrid(family: str, config: ConfigView) -> Anatomy:
    """Granite 4.0-H (granitemoehybrid): Mamba2 layers and a few attention layers, each with an MoE of
    num_local_experts (none: dense) and a shared MLP of shared_intermediate_size."""
    config.require("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    h, layers = config.positive("hidden_size"), config.positive("num_hidden_layers")
    kinds = hybrid_layer_kinds(config, layers, lambda i: LayerKind.STATE)
    parts = Parts()
    heads, kv_heads, d = attention_projections(parts, config, h, kinds.count(LayerKind.FULL))
    mixer = _mamba2(config, "mamba_", config.positive("mamba_expand") * h, gated_norm=True)
    state = mixer.add(parts, "mamba", h, kinds.count(LayerKind.STATE))
    experts = active = None
    if config.count("num_local_experts"):
        moe = MoE("num_local_experts", expert_size_key="intermediate_size")
        experts, active = moe.add(parts, config, h, layers)
    shared = config.count("shared_intermediate_size")
    parts.linear("shared_mlp.input_linear", h, 2 * shared, layers if shared else 0, Split.COLUMN)
    parts.linear("shared_mlp.output_linear", shared, h, layers if shared else 0, Split.ROW)
    parts.param("layer norms", layers * 2 * h + h)
    add_embeddings(parts, config, h, tied_default=True)
    groups = layer_groups(kinds, kv_heads, 2 * d, state)
    return parts.anatomy(family, config, groups, heads, kv_heads, (experts, active))


def _falcon_h1(family: str, config: ConfigView) -> Anatomy:
    """Falcon-H1: every layer runs attention and a Mamba2 mixer side by side, then an MLP."""
    config.require("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    h, layers = config.positive("hidden_size"), config.positive("num_hidden_layers")
    parts = Parts()
    heads, kv_heads, d = attention_projections(parts, config, h, layers)
    width = config.optional("mamba_d_ssm") or config.positive("mamba_expand") * h
    mixer = _mamba2(config, "mamba_", width, gated_norm=config.flag("mamba_rms_norm", False))
    state = mixer.add(parts, "mamba", h, layers)
    for name, fan_in, fan_out, split in gated_mlp(h, config.positive("intermediate_size")):
        parts.linear(f"feed_forward.{name}", fan_in, fan_out, layers, split)
    parts.param("layer norms", layers * 2 * h + h)
    add_embeddings(parts, config, h, tied_default=False)
    groups = layer_groups([LayerKind.FULL] * layers + [LayerKind.STATE] * layers, kv_heads, 2 * d, state)
    return replace(parts.anatomy(family, config, groups, heads, kv_heads), decoder_layers=layers)


_QWEN3_NEXT_MOE = MoE("num_experts", shared_size_key="shared_expert_intermediate_size", step_key="decoder_sparse_step")


def _qwen3_next(family: str, config: ConfigView) -> Anatomy:
    """Qwen3-Next: gated DeltaNet layers with a gated full-attention layer every full_attention_interval, each with
    an MoE (a shared expert behind a gate) or, on mlp_only_layers, a dense MLP."""
    config.require("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    h, layers = config.positive("hidden_size"), config.positive("num_hidden_layers")
    interval = config.positive("full_attention_interval")
    kinds = hybrid_layer_kinds(config, layers, lambda i: LayerKind.FULL if (i + 1) % interval == 0 else LayerKind.STATE)
    parts = Parts()
    full = kinds.count(LayerKind.FULL)
    heads, kv_heads, d = attention_projections(parts, config, h, full, q_gate=True)
    parts.param("q/k norms", full * 2 * d)
    linear = kinds.count(LayerKind.STATE)
    k_heads, v_heads = config.positive("linear_num_key_heads"), config.positive("linear_num_value_heads")
    dk, dv = config.positive("linear_key_head_dim"), config.positive("linear_value_head_dim")
    kernel = config.positive("linear_conv_kernel_dim")
    key, value = k_heads * dk, v_heads * dv
    parts.linear("linear_attn.in_proj_qkvz", h, 2 * key + 2 * value, linear, Split.COLUMN)
    parts.linear("linear_attn.in_proj_ba", h, 2 * v_heads, linear, Split.COLUMN)
    parts.linear("linear_attn.out_proj", value, h, linear, Split.ROW)
    parts.param("linear_attn.conv1d", linear * (2 * key + value) * kernel)
    parts.param("linear_attn A_log, dt_bias, norm", linear * (2 * v_heads + dv))
    state = StateShape("gated_deltanet", kernel - 1, 2 * key + value, 0, 0, v_heads, dv, dk, GATED_DELTANET_PAGES)
    moe_layers = _QWEN3_NEXT_MOE.layers(config, layers)
    experts, active = _QWEN3_NEXT_MOE.add(parts, config, h, moe_layers)
    if layers - moe_layers:
        for name, fan_in, fan_out, split in gated_mlp(h, config.positive("intermediate_size")):
            parts.linear(f"mlp.{name}", fan_in, fan_out, layers - moe_layers, split)
    parts.param("layer norms", layers * 2 * h + h)
    add_embeddings(parts, config, h, tied_default=False)
    groups = layer_groups(kinds, kv_heads, 2 * d, state)
    return parts.anatomy(family, config, groups, heads, kv_heads, (experts, active))


def _chunk(config: ConfigView) -> int | None:
    """Llama 4's attention_chunk_size: an explicit null turns chunking off; absent, transformers' default."""
    if "attention_chunk_size" in config.values and config.values["attention_chunk_size"] is None:
        return None
    return config.optional("attention_chunk_size")


def _llama4_kinds(config: ConfigView, layers: int) -> list[LayerKind]:
    """Llama 4: a layer with RoPE (no_rope_layers 1) attends within its attention_chunk_size; a NoPE layer (0, every
    no_rope_layer_interval-th) attends to the whole context (vLLM's Llama4Attention)."""
    chunked = _chunk(config) is not None
    rope = config.values.get("no_rope_layers")
    if isinstance(rope, list) and len(rope) >= layers and config.strings("layer_types") is None:
        return [LayerKind.CHUNKED if flag and chunked else LayerKind.FULL for flag in rope[:layers]]
    interval = config.positive("no_rope_layer_interval")
    return hybrid_layer_kinds(
        config,
        layers,
        lambda i: LayerKind.CHUNKED if chunked and (i + 1) % interval != 0 else LayerKind.FULL,
    )


def _llama4(family: str, config: ConfigView) -> Anatomy:
    """Llama 4 (Scout, Maverick): chunked local attention with a global NoPE layer every few; every
    interleave_moe_layer_step-th layer an MoE of intermediate_size experts and a shared expert of the same size, the
    others a dense MLP of intermediate_size_mlp."""
    config.require("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    h, layers = config.positive("hidden_size"), config.positive("num_hidden_layers")
    kinds = _llama4_kinds(config, layers)
    parts = Parts()
    heads, kv_heads, d = attention_projections(parts, config, h, layers)
    step = config.positive("interleave_moe_layer_step")
    moe_layers = sum(1 for i in range(layers) if (i + 1) % step == 0)
    experts, size = config.positive("num_local_experts"), config.positive("intermediate_size")
    for name, fan_in, fan_out, split in gated_mlp(h, size):
        parts.linear(f"feed_forward.experts.{name}", fan_in, fan_out, moe_layers * experts, split, expert=True)
        parts.linear(f"feed_forward.shared_expert.{name}", fan_in, fan_out, moe_layers, split)
    parts.param("router", moe_layers * h * experts)
    parts.routing = "Llama4"  # top-1 then sigmoid: vLLM's custom routing for Llama 4
    if layers - moe_layers:
        for name, fan_in, fan_out, split in gated_mlp(h, config.positive("intermediate_size_mlp")):
            parts.linear(f"feed_forward.{name}", fan_in, fan_out, layers - moe_layers, split)
    parts.param("layer norms", layers * 2 * h + h)
    add_embeddings(parts, config, h, tied_default=False)
    groups = layer_groups(kinds, kv_heads, 2 * d, None, _chunk(config))
    return parts.anatomy(family, config, groups, heads, kv_heads, (experts, config.positive("num_experts_per_tok", 1)))


# transformers' defaults for the fields a config may omit (GraniteMoeHybridConfig, FalconH1Config, ...).
_MAMBA2_DEFAULTS = {"mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_expand": 2}
HYBRIDS: dict[str, Family] = {
    "granitemoehybrid": Family(
        _granite_hybrid,
        {**_MAMBA2_DEFAULTS, "mamba_n_heads": 128, "num_local_experts": 8, "shared_intermediate_size": 1024},
    ),
    "falcon_h1": Family(_falcon_h1, {**_MAMBA2_DEFAULTS, "mamba_d_ssm": 1024, "mamba_n_heads": 128}),
    "qwen3_next": Family(
        _qwen3_next,
        {
            "full_attention_interval": 4,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 32,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
            "num_experts": 512,
            "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512,
            "num_experts_per_tok": 10,
        },
    ),
    "llama4_text": Family(
        _llama4,
        {
            "attention_chunk_size": 8192,
            "no_rope_layer_interval": 4,
            "interleave_moe_layer_step": 1,
            "intermediate_size_mlp": 16384,
            "num_local_experts": 16,
        },
    ),
    "nemotron_h": NEMOTRON_H,
    **LFM2_FAMILIES,
}
# State-space and linear-attention families vLLM CPU runs that are not sized here: refused by name rather than sized as
# the Llama-shaped decoder their common fields would suggest.
NOT_SIZED = frozenset({"mamba2"})
# Families vLLM's CPU backend cannot run, with vLLM's reason, as read in its sources (0.31 to 0.33: the same there):
# the refusal says it is vLLM's limit, not this operator's.
_SELECTIVE_SCAN = (
    "its Mamba-1 layers' prefill calls the selective-scan kernel (torch.ops._C.selective_scan_fwd), which vLLM builds "
    "from CUDA sources only (csrc/mamba/selective_scan_fwd.cu): no CPU kernel library of vLLM has it"
)
VLLM_CPU_CANNOT_RUN: dict[str, str] = {
    "mamba": _SELECTIVE_SCAN,
    "falcon_mamba": _SELECTIVE_SCAN,
    "jamba": _SELECTIVE_SCAN,
    "kimi_linear": "vLLM builds it from vllm.models.kimi_k3, whose KDA linear-attention layers run as Triton kernels "
    "only",
    "bamba": "vLLM removed BambaForCausalLM after 0.23 (its registry's removed models)",
    "minimax": "vLLM removed MiniMaxText01ForCausalLM after 0.23 (its registry's removed models)",
    "plamo2": "vLLM removed Plamo2ForCausalLM after 0.26 (its registry's removed models)",
}
