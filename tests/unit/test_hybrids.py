"""Hybrid models (core/sizing/hybrids.py) and the KV layout of their state-space and chunked layers (sizing/model.py
KVLayout), against what vLLM 0.32 builds for the same configs (tests/vllm/test_oracle.py compares them with vLLM
itself; the figures here are its results on an AVX-512 BF16 machine), and the FP8 MoE checkpoints vLLM CPU cannot
load on any CPU."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from cpullm.api.spec import DType
from cpullm.core.sizing import size_model
from cpullm.core.sizing.anatomy import StateShape
from cpullm.errors import UnsupportedModel

MODELS = Path(__file__).parent / "fixtures" / "models"
BF16_NODE = frozenset({"avx512f", "avx512_bf16"})
AVX2_NODE = frozenset({"avx2"})
GiB = 1 << 30


def config(name: str, **changes: Any) -> dict[str, Any]:
    found = json.loads((MODELS / f"{name}.json").read_text())
    return {**found, **changes}


@pytest.mark.parametrize(
    ("name", "parameters", "layout", "block", "tokens"),
    [
        # Mamba2 layers with an attention layer every ten, 72 experts and a shared MLP: 32B as published.
        (
            "granite-4.0-h-small",
            31_955_679_744,
            "4 full + 36 mamba2 state layers, 8 KV heads x 128, 1152-token blocks",
            1152,
            53_130,
        ),
        ("granite-4.0-h-micro", 3_191_396_096, "4 full + 36 mamba2 state layers, 8 KV heads x 64", 1152, 106_496),
        # Gated DeltaNet with gated full attention every fourth layer, 512 experts and a shared expert: 80B.
        (
            "qwen3-next-80b-a3b",
            79_674_391_296,
            "12 full + 36 gated_deltanet state layers, 2 KV heads x 256",
            1152,
            88_356,
        ),
        # Attention and a Mamba2 mixer side by side in each of 32 layers.
        ("falcon-h1-7b", 8_514_961_408, "32 full + 32 mamba2 state layers, 8 KV heads x 128, 384-token", 384, 27_852),
        # Chunked local attention with a NoPE global layer every fourth, 16 experts and a shared expert: 109B.
        ("llama-4-scout-text", 107_769_861_120, "36 chunked (chunk 8192) + 12 full layers", 128, 21_824),
        # Mamba2, attention and MLP layers (hybrid_override_pattern); the SSM state in float32, as the config asks.
        (
            "nemotron-h-8b-base-8k",
            8_100_852_736,
            "4 full + 24 mamba2 state layers, 8 KV heads x 128, 1152-token blocks",
            1152,
            71_522,
        ),
        (
            "nvidia-nemotron-nano-9b-v2",
            8_888_227_328,
            "4 full + 27 mamba2 state layers, 8 KV heads x 128, 1 padding layer, 1408-token blocks",
            1408,
            56_433,
        ),
        # Short convolutions (a 2 x 2048 state) with attention in six layers; dense, and with 32 experts.
        ("lfm2-1.2b", 1_170_340_608, "6 full + 10 short_conv state layers, 8 KV heads x 64, 2 padding", 128, 328_884),
        ("lfm2-8b-a1b", 8_339_930_560, "6 full + 18 short_conv state layers, 8 KV heads x 64, 128-token", 128, 319_488),
    ],
)  # fmt: skip
def test_hybrids_are_sized_as_vllm_builds_them(name, parameters, layout, block, tokens):
    """Parameters as vLLM holds them; a 4 GiB KV cache's block size and capacity for 8,192-token requests as vLLM
    0.32 reports them on a node with bf16 arithmetic (its states' temporal part in float32)."""
    size = size_model(config(name), DType.BFLOAT16)
    kv = size.kv(None, BF16_NODE)
    assert size.parameters == parameters
    assert kv.describe().startswith(layout), kv.describe()
    assert (kv.block_tokens(1), kv.tokens(4 * GiB, 1, 8192)) == (block, tokens)


def test_a_state_is_padded_to_the_page_of_the_smallest_block_that_holds_it():
    """Granite 4.0-H small's Mamba2 state: a conv state of 3 x (8192 + 2 x 128) and a temporal state of
    128 x 64 x 128, float32 where the CPU has bf16 arithmetic (vLLM CPU resets the SSM cache dtype there), the
    serving dtype elsewhere; an attention token of a layer is 2 x 8 x 128 x 2 bytes."""
    kv_bf16 = size_model(config("granite-4.0-h-small"), DType.BFLOAT16).kv(None, BF16_NODE)
    kv_avx2 = size_model(config("granite-4.0-h-small"), DType.BFLOAT16).kv(None, AVX2_NODE)
    token = 2 * 8 * 128 * 2
    state_bf16, state_avx2 = 3 * 8448 * 2 + 128 * 64 * 128 * 4, 3 * 8448 * 2 + 128 * 64 * 128 * 2
    assert kv_bf16.block_tokens(1) == 128 * -(-state_bf16 // (128 * token)) == 1152
    assert kv_avx2.block_tokens(1) == 128 * -(-state_avx2 // (128 * token)) == 640
    assert kv_bf16.page_bytes(1) == 1152 * token
    # Groups of the 4 attention layers: 9 of Mamba2 (3 pages each per request: align mode's two and the prefill
    # checkpoint) and 1 of attention (its tokens in blocks).
    assert kv_bf16.group_size == 4
    assert kv_bf16.sequence_bytes(1, 8192) == 1152 * token * 4 * (9 * 3 + -(-8192 // 1152))


def test_the_states_split_between_ranks_with_mamba2_groups_extended_to_the_ranks():
    state = StateShape("mamba2", 3, 8192, 1, 128, 128, 64, 128, 3)
    assert state.bytes(1, 2, 4) == 3 * (8192 + 2 * 128) * 2 + 128 * 64 * 128 * 4
    # One group is replicated to each of two ranks: (8192 + 2 x 2 x 128) / 2 channels per rank.
    assert state.bytes(2, 2, 4) == 3 * (8192 + 4 * 128) // 2 * 2 + 64 * 64 * 128 * 4


@pytest.mark.parametrize(
    ("state", "problem"),
    [
        (StateShape("mamba2", 3, 4096, 1, 128, 64, 64, 128, 3), None),  # one group: replicated to each rank
        (StateShape("mamba2", 3, 4032, 1, 128, 63, 64, 128, 3), "does not divide the 63 heads of the mamba2 layers"),
        (StateShape("mamba2", 3, 4096, 3, 128, 64, 64, 128, 3), "does not divide the 3 groups of the mamba2 layers"),
        (
            StateShape("gated_deltanet", 3, 8193, 0, 0, 32, 128, 128, 2),
            "does not divide the 8193 channels of the gated_deltanet layers",
        ),
    ],
)
def test_tensor_parallelism_splits_the_mixers_heads_channels_and_groups(state, problem):
    assert state.tensor_parallel_problem(2) == (None if problem is None else f"tensor parallel size 2 {problem}")


def test_a_hybrid_at_two_ranks_splits_as_vllm_does():
    assert size_model(config("granite-4.0-h-micro"), DType.BFLOAT16).tensor_parallel_problem(2) is None


def test_transformers_old_and_new_layer_names_are_the_same_layers():
    old = config("granite-4.0-h-small")
    renamed = [{"mamba": "linear_attention", "attention": "full_attention"}[t] for t in old["layer_types"]]
    new = config("granite-4.0-h-small", layer_types=renamed)
    assert size_model(new, DType.BFLOAT16).anatomy == size_model(old, DType.BFLOAT16).anatomy


def test_qwen3_next_without_layer_types_follows_its_full_attention_interval():
    without = {k: v for k, v in config("qwen3-next-80b-a3b").items() if k != "layer_types"}
    size = size_model({**without, "full_attention_interval": 2}, DType.BFLOAT16)
    assert size.kv().describe().startswith("24 full + 24 gated_deltanet state layers")


def test_llama4_nope_layers_attend_to_the_whole_context_and_the_others_within_their_chunk():
    scout = config("llama-4-scout-text")
    kv = size_model(scout, DType.BFLOAT16).kv(None, BF16_NODE)
    token = 2 * 8 * 128 * 2
    # At 32k: a full layer's 256 blocks, a chunked layer's chunk and the 2,048 tokens in flight (80 blocks).
    assert kv.sequence_bytes(1, 32768) == 128 * token * 12 * (256 + 3 * 80)
    no_chunk = size_model({**scout, "attention_chunk_size": None, "layer_types": None}, DType.BFLOAT16)
    assert no_chunk.kv().describe().startswith("48 full + 0 sliding layers")


def test_a_state_space_family_not_sized_here_is_refused_by_name():
    with pytest.raises(UnsupportedModel, match="model_type 'mamba2' has state-space or linear-attention layers"):
        size_model({**config("llama-3.1-8b"), "model_type": "mamba2"}, DType.BFLOAT16)


@pytest.mark.parametrize(
    ("ssm_dtype", "isa", "temporal"),
    [
        ("float32", BF16_NODE, 4),  # NemotronHConfig's default
        ("float32", AVX2_NODE, 4),
        ("bfloat16", BF16_NODE, 2),  # kept: the accelerated GDN backend takes a 16-bit state
        ("bfloat16", AVX2_NODE, 2),
        ("auto", BF16_NODE, 4),  # vLLM CPU resets it to float32 where the CPU has bf16 arithmetic
        ("auto", AVX2_NODE, 2),  # the serving dtype
    ],
)
def test_nemotron_h_keeps_its_ssm_state_in_the_dtype_its_config_asks_as_vllm_cpu_settles_it(ssm_dtype, isa, temporal):
    """Nemotron-H 8B's state: a conv state of 3 x (8192 + 2 x 8 x 128) in bf16 and a temporal state of 128 x 64 x 128
    in the SSM cache dtype; tests/vllm/test_oracle.py checks the float32 and bfloat16 cases against vLLM."""
    kv = size_model(config("nemotron-h-8b-base-8k", mamba_ssm_cache_dtype=ssm_dtype), DType.BFLOAT16).kv(None, isa)
    state = 3 * (8192 + 2 * 8 * 128) * 2 + 128 * 64 * 128 * temporal
    token = 2 * 8 * 128 * 2
    assert kv.block_tokens(1) == 128 * -(-state // (128 * token))


@pytest.mark.parametrize(
    ("changes", "refusal"),
    [
        # Nemotron 3 Nano and Super: vLLM's own reason, not ours.
        ({"hybrid_override_pattern": "MEM*EM"}, "vLLM's CPU backend cannot run its MoE (E) layers"),
        ({"hybrid_override_pattern": "M-M*Q-"}, "hybrid_override_pattern has 'Q': vLLM's Nemotron-H builds M"),
        ({"hybrid_override_pattern": None}, "has neither hybrid_override_pattern nor layers_block_type"),
        ({"layers_block_type": ["mamba", "mlp", "sliding_attention"]}, "layers_block_type has 'sliding_attention'"),
        ({"intermediate_size": [21504, 10752]}, "intermediate_size"),  # transformers 5 takes one size
        ({"mamba_ssm_cache_dtype": "float8"}, "mamba_ssm_cache_dtype='float8' is not one of auto, float32"),
        ({"num_key_value_heads": 5}, "num_attention_heads=32 is not a multiple of num_key_value_heads=5"),
    ],
)
def test_a_nemotron_h_vllm_cpu_cannot_build_is_refused_with_the_reason(changes, refusal):
    with pytest.raises(UnsupportedModel, match=re.escape(refusal)):
        size_model(config("nemotron-h-8b-base-8k", **changes), DType.BFLOAT16)


def test_nemotron_h_reads_its_blocks_by_name_and_slides_every_attention_layer_where_the_config_says():
    listed = config(
        "nemotron-h-8b-base-8k", hybrid_override_pattern=None, sliding_window=4096,
        layers_block_type=["mamba", "mlp", "full_attention", "mlp"] * 3,
    )  # fmt: skip
    size = size_model(listed, DType.BFLOAT16)
    assert size.anatomy.layers == 12
    assert size.kv(None, BF16_NODE).describe().startswith("3 sliding (window 4096) + 3 mamba2 state layers")


@pytest.mark.parametrize(
    ("name", "changes", "refusal"),
    [
        ("lfm2-8b-a1b", {"layer_types": None}, "(model_type lfm2_moe) lacks layer_types"),
        ("lfm2-1.2b", {"conv_dim": None}, "lacks conv_dim"),
        ("lfm2-1.2b", {"layer_types": ["conv", "mamba"] * 8}, "layer_types has 'mamba': LFM2 layers are conv and"),
    ],
)
def test_an_lfm2_config_vllm_cannot_build_is_refused(name, changes, refusal):
    with pytest.raises(UnsupportedModel, match=re.escape(refusal)):
        size_model(config(name, **changes), DType.BFLOAT16)


def test_lfm2_adjusts_its_mlp_width_and_attends_where_full_attn_idxs_says():
    """block_ff_dim 12288 adjusted: 2/3 of it, times 1.0, up to a multiple of 256 = 8192; unadjusted: 12288."""
    lfm2 = config("lfm2-1.2b", layer_types=None, full_attn_idxs=[0, 15])
    adjusted, unadjusted = (
        size_model({**lfm2, "block_auto_adjust_ff_dim": flag}, DType.BFLOAT16) for flag in (True, False)
    )
    assert unadjusted.parameters - adjusted.parameters == 16 * 3 * 2048 * (12288 - 8192)
    assert adjusted.kv().describe().startswith("2 full + 14 short_conv state layers")


def test_linear_attention_in_a_family_without_a_state_mixer_is_refused():
    llama = config("llama-3.1-8b")
    with pytest.raises(UnsupportedModel, match="sized with full and sliding attention layers only"):
        size_model({**llama, "layer_types": ["linear_attention"] * 32}, DType.BFLOAT16)


FP8_BLOCK = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


@pytest.mark.parametrize(
    ("name", "changes", "refusal"),
    [
        pytest.param("qwen3-30b-a3b-fp8", {}, None, id="softmax top-k renormalized: served"),
        pytest.param("deepseek-v3", {}, None, id="DeepSeek's grouped sigmoid with a bias: served"),
        pytest.param(
            "qwen3-30b-a3b-fp8",
            {"scoring_func": "sigmoid", "use_routing_bias": True},
            "does not route as this model does (MiniMax2 routing",
            id="sigmoid with a bias and no groups (MiniMax-M2)",
        ),
        pytest.param("qwen3-30b-a3b-fp8", {"scoring_func": "sigmoid"}, "(SigmoidRenorm routing", id="sigmoid, no bias"),
        pytest.param(
            "qwen3-30b-a3b-fp8",
            {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}},
            "FP8 experts quantized in 128x128 blocks only",
            id="per-tensor FP8 experts",
        ),
        pytest.param("qwen3-30b-a3b-fp8", {"hidden_act": "gelu"}, "runs SiLU experts only", id="GELU experts"),
        pytest.param(
            "llama-4-scout-text", {"quantization_config": FP8_BLOCK}, "(Llama4 routing", id="Llama 4's top-1 sigmoid"
        ),
    ],
)
def test_fp8_moe_checkpoints_vllm_cpu_cannot_load_are_refused_on_every_node(name, changes, refusal):
    model = config(name, **changes)
    if refusal is None:
        assert size_model(model, DType.BFLOAT16).quantization is not None
        return
    with pytest.raises(UnsupportedModel, match=re.escape(refusal)) as raised:
        size_model(model, DType.BFLOAT16)
    assert "a BF16 checkpoint of the same model serves on CPU instead" in raised.value.message
