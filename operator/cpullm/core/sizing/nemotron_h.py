"""Nemotron-H (nemotron_h): a decoder whose layers are each one of four blocks, named by hybrid_override_pattern
("M" Mamba2, "*" attention, "-" MLP, "E" MoE) or listed by layers_block_type, as vLLM's nemotron_h.py builds them
with transformers' NemotronHConfig (5.x):
  M   a Mamba2 mixer of mamba_num_heads x mamba_head_dim channels (use_bias on its projections, a gated norm)
  *   attention without biases, head_dim from the config (transformers' default 128; null: hidden over heads),
      every layer sliding where the config sets sliding_window
  -   an MLP of up and down projections (relu2, no gate) of intermediate_size
  E   experts of up and down projections with no gate: vLLM's CPU backend cannot run them (UNGATED_EXPERTS), so a
      pattern with an E (Nemotron 3 Nano, Super) is refused with vLLM's reason
Each layer has one norm; the LM head is never tied to the embedding. vLLM keeps the Mamba2 layers' temporal state in
the config's mamba_ssm_cache_dtype (float32 by default: vllm/model_executor/models/config.py,
NemotronHForCausalLMConfig)."""

from __future__ import annotations

from dataclasses import replace

from cpullm.core.sizing.anatomy import EMBEDDING, SSM_DTYPE_BYTES, Anatomy, LayerKind, Split
from cpullm.core.sizing.config import ConfigView, first_present, show
from cpullm.core.sizing.layers import Family, Parts, attention_heads
from cpullm.core.sizing.mixers import Mamba2, add_attention, layer_groups
from cpullm.errors import UnsupportedModel, VllmCannotServe

# A block's letter, by each name a config may give it (layers_block_type's, and the legacy names transformers remaps).
BLOCKS = {
    "linear_attention": "M",
    "mamba": "M",
    "full_attention": "*",
    "attention": "*",
    "mlp": "-",
    "moe": "E",
}
SSM_DTYPES = ("auto", *SSM_DTYPE_BYTES)


def _pattern(config: ConfigView) -> str:
    """The blocks, one letter a layer: layers_block_type (or layer_types) where listed, else hybrid_override_pattern,
    as transformers reads them; the layer count is theirs (num_hidden_layers is ignored, as transformers does)."""
    listed = config.strings("layers_block_type") or config.strings("layer_types")
    if listed is not None:
        unknown = sorted({name for name in listed if name not in BLOCKS})
        if unknown:
            raise UnsupportedModel(
                f"model config layers_block_type has {', '.join(map(show, unknown))}: Nemotron-H layers are "
                f"{', '.join(sorted(BLOCKS))}"
            )
        pattern = "".join(BLOCKS[name] for name in listed)
    else:
        value = config.values.get("hybrid_override_pattern")
        if not isinstance(value, str):
            raise UnsupportedModel(
                "model config (model_type nemotron_h) has neither hybrid_override_pattern nor layers_block_type: "
                "which layer is which block is unknown"
            )
        pattern = value
        unknown = sorted(set(pattern) - set(BLOCKS.values()))
        if unknown:
            raise UnsupportedModel(
                f"model config hybrid_override_pattern has {', '.join(map(show, unknown))}: vLLM's Nemotron-H "
                "builds M (Mamba2), * (attention), - (MLP) and E (MoE) layers only"
            )
    if not pattern:
        raise UnsupportedModel("model config (model_type nemotron_h) lists no layers")
    return pattern


def _mamba(config: ConfigView) -> Mamba2:
    """The Mamba2 mixer, under NemotronHConfig's keys or the legacy ones its __post_init__ maps."""
    ssm_dtype = config.raw("mamba_ssm_cache_dtype")
    if ssm_dtype not in SSM_DTYPES:
        raise UnsupportedModel(
            f"model config mamba_ssm_cache_dtype={show(ssm_dtype)} is not one of {', '.join(SSM_DTYPES)}"
        )
    heads, head_dim = config.positive("mamba_num_heads"), config.positive("mamba_head_dim")
    return Mamba2(
        width=heads * head_dim,
        heads=heads,
        head_dim=head_dim,
        groups=config.positive(first_present(config, ("mamba_n_groups", "n_groups")) or "n_groups"),
        state=config.positive("ssm_state_size"),
        kernel=config.positive(first_present(config, ("mamba_d_conv", "conv_kernel")) or "conv_kernel"),
        conv_bias=config.flag(first_present(config, ("mamba_conv_bias", "use_conv_bias")) or "use_conv_bias", True),
        gated_norm=True,
        bias=config.flag("use_bias", False),
        ssm_dtype=str(ssm_dtype),
    )


# vLLM's reason it cannot run an E layer on CPU (fused_moe/config.py of 0.31 and 0.32: FusedMoEConfig raises
# NotImplementedError for an activation without a gate on any platform but CUDA, ROCm and XPU).
UNGATED_EXPERTS = (
    "vLLM's CPU backend cannot run its MoE (E) layers: their experts have no gate projection (up_proj then "
    "{act}), and vLLM's fused MoE runs ungated experts (is_act_and_mul=False) on CUDA, ROCm and XPU only"
)


def _nemotron_h(family: str, config: ConfigView) -> Anatomy:
    config.require("hidden_size", "num_attention_heads", "vocab_size")
    h = config.positive("hidden_size")
    pattern = _pattern(config)
    if "E" in pattern:
        raise VllmCannotServe(
            f"model_type nemotron_h: {UNGATED_EXPERTS.format(act=config.raw('mlp_hidden_act'))}; serve a Nemotron-H "
            "without E layers, or another model"
        )
    parts = Parts()
    # head_dim: the config's (transformers' default 128); an explicit null is hidden over the heads (vLLM's
    # NemotronHAttention). No biases, whatever attention_bias says.
    null_head_dim = "head_dim" in config.values and config.values["head_dim"] is None
    heads, kv_heads, d = shape = attention_heads(config, reads_head_dim=not null_head_dim)
    add_attention(parts, h, shape, pattern.count("*"), prefix="mixer")
    state = _mamba(config).add(parts, "mixer", h, pattern.count("M")) if "M" in pattern else None
    mlps, size = pattern.count("-"), config.positive("intermediate_size")  # transformers 5 takes one size
    parts.linear("mixer.up_proj", h, size, mlps, Split.COLUMN)
    parts.linear("mixer.down_proj", size, h, mlps, Split.ROW)
    parts.param("MLP biases", mlps * (size + h) * config.flag("mlp_bias", False))
    parts.param("layer norms", len(pattern) * h + h)
    vocab = config.positive("vocab_size")
    parts.param(EMBEDDING, vocab * h)
    parts.param("lm_head", vocab * h)  # a ParallelLMHead of its own, whatever tie_word_embeddings says
    window = config.optional("sliding_window")
    kinds = [
        LayerKind.STATE if block == "M" else (LayerKind.SLIDING if window else LayerKind.FULL)
        for block in pattern
        if block in "M*"
    ]
    groups = layer_groups(kinds, kv_heads, 2 * d, state, window)
    anatomy = parts.anatomy(family, config, groups, heads, kv_heads)
    return replace(anatomy, decoder_layers=len(pattern), activation=str(config.raw("mlp_hidden_act")))


# transformers' NemotronHConfig defaults (5.x) for the fields a config may omit.
NEMOTRON_H = Family(
    _nemotron_h,
    {
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 4096,
        "intermediate_size": 21504,
        "mlp_hidden_act": "relu2",
        "ssm_state_size": 128,
        "mamba_num_heads": 128,
        "mamba_head_dim": 64,
        "n_groups": 8,
        "conv_kernel": 4,
        "mamba_ssm_cache_dtype": "float32",
    },
)
