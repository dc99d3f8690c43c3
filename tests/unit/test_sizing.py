"""Sizing against real models: the config.json of public models (fixtures/models), their published parameter
counts (each also what transformers counts for the same config on the meta device), their checkpoints' sizes,
and the KV cache layouts vLLM's KV specs give them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cpullm.api.spec import DType
from cpullm.core.sizing import FAMILIES, CheckpointUnreadable, size_model, summarize
from cpullm.core.sizing.anatomy import LayerKind
from cpullm.errors import UnsupportedModel

from .builders import LLAMA_8B, MISTRAL_7B_V03, QWEN3_06B, QWEN25_05B

MODELS = Path(__file__).parent / "fixtures" / "models"
GB = 10**9


def config(name: str) -> dict:
    return json.loads((MODELS / f"{name}.json").read_text())


@pytest.mark.parametrize(
    ("name", "parameters"),
    [
        ("llama-3.1-8b", 8_030_261_248),  # 8.03B
        ("qwen2.5-7b", 7_615_616_512),  # 7.61B
        ("mistral-7b-v0.1", 7_241_732_096),  # 7.24B
        ("granite-3.1-8b", 8_170_848_256),  # 8.17B
        ("phi-3-mini-4k", 3_821_079_552),  # 3.82B
        ("gemma-7b", 8_537_680_896),  # 8.54B
        ("gemma-2-2b", 2_614_341_888),  # 2.61B
        ("gemma-3-1b-it", 999_885_952),  # 1B
        ("gemma-3-4b-it", 4_300_079_472),  # 4.3B with its SigLIP vision tower; text settings nested in text_config
        ("opt-125m", 125_239_296),  # 125M
        ("opt-350m", 331_196_416),  # 331M: a 512-wide embedding behind project_in/out
        ("mixtral-8x7b", 46_702_792_704),  # 46.7B
        ("qwen1.5-moe-a2.7b", 14_315_784_192),  # 14.3B: 60 experts + a shared expert
        ("qwen3-30b-a3b", 30_532_122_624),  # 30.5B
        ("granite-3.1-1b-a400m", 1_334_628_352),  # granitemoe, no table entry: its index total_size / 4 (fp32)
        ("deepseek-v2-lite", 15_706_484_224),  # 15.7B: MLA, 2 shared experts, first layer dense
        ("deepseek-v3", 671_026_419_200),  # 671B without the 14B multi-token-prediction layer vLLM does not load
        ("gpt-oss-20b", 20_914_757_184),  # 20.9B
        ("gpt-oss-120b", 116_829_156_672),  # 116.8B
        # transformers 5.19's count on the meta device for the same configs (and vLLM 0.32's, tests/vllm/test_oracle.py)
        ("command-r7b", 8_028_033_024),  # cohere2: one LayerNorm per layer, tied embeddings
        ("exaone-4.0-32b", 32_003_216_384),  # exaone4: q/k norms, post-attention and post-MLP norms
        ("ernie-4.5-21b-a3b", 21_825_437_888),  # 64 experts of 1,536 from layer 1, 2 shared, moe_num_experts/moe_k
    ],
)
def test_parameter_count_matches_published_models(name, parameters):
    assert size_model(config(name), DType.BFLOAT16).parameters == parameters


@pytest.mark.parametrize(
    ("builder", "parameters"),
    [
        pytest.param(LLAMA_8B, 8_030_261_248, id="llama-3.1-8b fields"),
        pytest.param(QWEN25_05B, 494_032_768, id="qwen2.5-0.5b (tied, qkv bias)"),
        pytest.param(QWEN3_06B, 596_049_920, id="qwen3-0.6b (explicit head_dim, qk norm)"),
        pytest.param(MISTRAL_7B_V03, 7_248_023_552, id="mistral-7b-v0.3"),
    ],
)
def test_parameter_count_of_the_field_subsets_the_tests_use(builder, parameters):
    assert size_model(builder, DType.BFLOAT16).parameters == parameters


@pytest.mark.parametrize(
    ("name", "total_size", "stored_bytes"),
    [
        # model.safetensors.index.json metadata.total_size of the published checkpoints.
        ("gemma-2-9b-it", 18_483_411_968, 2),
        ("gemma-2b", 5_012_344_832, 2),
        ("mistral-7b-instruct-v0.2", 14_483_464_192, 2),
        ("mistral-7b-instruct-v0.3", 14_496_047_104, 2),
        ("mixtral-8x7b", 93_405_585_408, 2),
        ("phi-3-mini-128k", 7_642_159_104, 2),
        ("granite-3.1-1b-a400m", 5_338_513_408, 4),  # a float32 revision
    ],
)
def test_family_formula_equals_the_checkpoints_own_total(name, total_size, stored_bytes):
    assert size_model(config(name), DType.BFLOAT16).parameters * stored_bytes == total_size


def _share(part: int, whole: int) -> float:
    return abs(part - whole) / whole


@pytest.mark.parametrize(
    ("name", "checkpoint_bytes"),
    [
        # Published checkpoint sizes (the safetensors files): quantized weights as stored, the rest in bf16/fp16.
        ("qwen2.5-7b-instruct-awq", 5.58 * GB),  # int4, group 128, fp16 scales and packed zeros
        ("qwen2.5-1.5b-instruct-gptq-int4", 1.16 * GB),  # int4, group 128, tied embeddings in fp16
        ("gpt-oss-20b", 13.76 * GB),  # MXFP4 experts, bf16 attention
        ("gpt-oss-120b", 65.25 * GB),
        ("qwen3-30b-a3b-fp8", 31.2 * GB),  # fp8 with 128x128 fp32 block scales
        ("deepseek-v3", 673 * GB),  # fp8; the checkpoint's 689 GB include the MTP layer, not served
        ("llama-2-13b-chat-gptq", 7.26 * GB),  # int4 group 128
        ("kimi-k2.5", 595 * GB),  # compressed-tensors int4 group 32 experts, in text_config
    ],
)
def test_quantized_weights_are_the_bytes_served_not_bf16(name, checkpoint_bytes):
    size = size_model(config(name), DType.BFLOAT16)
    assert _share(size.weights_bytes, checkpoint_bytes) < 0.05, size.weights_bytes
    assert size.weights_bytes < size.parameters * 2 * 0.75  # far below bf16
    assert size.weights_source == f"config.json ({size.anatomy.family} formula)"


def test_awq_formula_counts_packed_weights_scales_and_zeros():
    """One linear of 3584 x 18944 at int4, group 128: 3584*18944/2 weight bytes, 28 groups x 18944 fp16 scales
    and int4 zeros."""
    awq = size_model(config("qwen2.5-7b-instruct-awq"), DType.BFLOAT16).quantization
    assert awq is not None and awq.describe() == "awq int4 group 128"
    gate = next(linear for linear in size_model(config("qwen2.5-7b-instruct-awq"), DType.BFLOAT16).anatomy.linears
                if linear.name == "mlp.gate_proj")  # fmt: skip
    groups = 3584 // 128
    assert awq.linear_bytes(gate) == 3584 * 18944 // 2 + groups * 18944 * 2 + groups * 18944 // 2


@pytest.mark.parametrize(
    ("name", "kv_bytes_per_token", "layout"),
    [
        ("llama-3.1-8b", 2 * 32 * 8 * 128 * 2, "32 full + 0 sliding layers, 8 KV heads x 128"),
        # MLA caches one latent of kv_lora_rank + qk_rope_head_dim = 576 per layer and token.
        ("deepseek-v2-lite", 27 * 576 * 2, "27 MLA layers, latent 576"),
        ("deepseek-v3", 61 * 576 * 2, "61 MLA layers, latent 576"),
        # Alternating sliding and full layers: only the full ones grow with the context.
        ("gemma-2-2b", 2 * 13 * 4 * 256 * 2, "13 full + 13 sliding (window 4096) layers, 4 KV heads x 256"),
        ("gpt-oss-20b", 2 * 12 * 8 * 64 * 2, "12 full + 12 sliding (window 128) layers, 8 KV heads x 64"),
        # Gemma 3: every sixth layer full; the 4B's text settings come from text_config and its defaults.
        ("gemma-3-4b-it", 2 * 5 * 4 * 256 * 2, "5 full + 29 sliding (window 1024) layers, 4 KV heads x 256"),
        ("gemma-3-1b-it", 2 * 4 * 1 * 256 * 2, "4 full + 22 sliding (window 512) layers, 1 KV heads x 256"),
        # Qwen2 configs carry a sliding_window but use_sliding_window false.
        ("qwen2.5-7b-instruct-awq", 2 * 28 * 4 * 128 * 2, "28 full + 0 sliding layers, 4 KV heads x 128"),
        ("opt-125m", 2 * 12 * 12 * 64 * 2, "12 full + 0 sliding layers, 12 KV heads x 64"),
        # A cache-wide window (no layer_types) slides every layer, as vLLM does for Mistral v0.1...
        ("mistral-7b-v0.1", 0, "32 sliding (window 4096) layers, 8 KV heads x 128"),
        # ...and a window as long as the context still slides in vLLM 0.32's accounting (tests/vllm/test_oracle.py):
        # one block more per request than the context's.
        ("phi-3-mini-4k", 0, "32 sliding (window 2047) layers, 32 KV heads x 96"),
        ("phi-3-mini-128k", 0, "32 sliding (window 262144) layers, 32 KV heads x 96"),
        # sliding_window_pattern without layer_types: every fourth layer global, as transformers derives them.
        ("command-r7b", 2 * 8 * 8 * 128 * 2, "8 full + 24 sliding (window 4096) layers, 8 KV heads x 128"),
        ("exaone-4.0-32b", 2 * 16 * 8 * 128 * 2, "16 full + 48 sliding (window 4096) layers, 8 KV heads x 128"),
    ],
)
def test_kv_cache_per_layer_kind(name, kv_bytes_per_token, layout):
    size = size_model(config(name), DType.BFLOAT16)
    assert size.kv_bytes_per_token == kv_bytes_per_token
    assert size.kv().describe().startswith(layout)


def test_sliding_layers_hold_their_window_and_the_tokens_in_flight_per_sequence():
    """vLLM's SlidingWindowSpec: min(window - 1 + max_num_batched_tokens, context) tokens in 128-token blocks, and
    one block more; the full layers hold the whole context in blocks."""
    kv = size_model(config("gemma-2-2b"), DType.BFLOAT16).kv()
    per_layer_token = 2 * 4 * 256 * 2
    assert kv.window_bytes(1, 1000) == 13 * (1024 + 128) * per_layer_token
    assert kv.window_bytes(1, 8192) == 13 * (6144 + 128) * per_layer_token  # 4096 - 1 + 2048 in flight
    assert kv.window_bytes(2, 8192) == 13 * (8192 + 128) * per_layer_token // 2  # 2048 x TP in flight
    assert kv.sequence_bytes(1, 8192) == 8192 * 13 * per_layer_token + kv.window_bytes(1, 8192)
    assert kv.longest_context(kv.sequence_bytes(1, 6000), 1, 8192) == 6016  # whole blocks


def test_hybrid_kinds_are_padded_to_whole_groups_as_vllm_allocates_them():
    """Gemma 3 4B: 5 full and 29 sliding layers make groups of 5, so the sliding kind takes 6 groups (30 slots)."""
    kv = size_model(config("gemma-3-4b-it"), DType.BFLOAT16).kv()
    per_layer_token = 2 * 4 * 256 * 2
    assert kv.bytes_per_token(1) == 5 * per_layer_token
    # min(1024 - 1 + 2048 in flight, context) in whole blocks (3072), and one block more
    assert kv.window_bytes(1, 131072) == 30 * (3072 + 128) * per_layer_token
    assert "1 padding layer" in kv.describe()


def test_kv_capacity_in_tokens_as_vllm_logs_it():
    """vLLM: num_blocks / blocks per request x max_model_len; Llama-3-8B with 4 GiB gives 32,768 tokens."""
    kv = size_model(LLAMA_8B, DType.BFLOAT16).kv()
    assert kv.tokens(4 * 2**30, 1, 8192) == 32768
    assert kv.tokens(4 * 2**30, 1, None) == 32768


@pytest.mark.parametrize(
    ("tp", "per_rank"),
    [(1, 131072), (2, 65536), (8, 16384), (16, 16384)],  # 8 KV heads: beyond TP 8 each rank holds one
)
def test_kv_bytes_per_rank_split_heads(tp, per_rank):
    assert size_model(LLAMA_8B, DType.BFLOAT16).kv_bytes_per_token_per_rank(tp) == per_rank


def test_mla_latent_is_the_same_on_every_rank():
    size = size_model(config("deepseek-v2-lite"), DType.BFLOAT16)
    assert size.kv_bytes_per_token_per_rank(1) == size.kv_bytes_per_token_per_rank(4) == 27 * 576 * 2


@pytest.mark.parametrize(
    ("name", "tp", "problem"),
    [
        # vLLM cannot load it: a GPTQ layer split by its inputs keeps whole groups of 128 on each rank.
        ("qwen2.5-1.5b-instruct-gptq-int4", 4,
         "splits mlp.down_proj's 8960 inputs into 2240 per rank, not a multiple of the gptq group size 128"),
        ("qwen2.5-1.5b-instruct-gptq-int4", 2, None),  # 4480 = 35 x 128
        ("qwen2.5-7b-instruct-awq", 8, "does not divide the 28 attention heads"),
        ("qwen2.5-7b-instruct-awq", 4, None),  # 18944 / 4 = 37 x 128
        ("qwen2.5-7b-instruct-awq", 2, None),  # 18944 / 2 = 74 x 128
        ("llama-3.1-8b", 6, "not supported by vLLM's CPU backend"),
        ("llama-3.1-8b", 16, None),  # 8 KV heads replicated
        ("deepseek-v2-lite", 4, None),  # MLA: no KV head count to divide
        ("mixtral-8x7b", 3, "does not divide the 32 attention heads"),
        ("gemma-7b", 8, None),
    ],
)  # fmt: skip
def test_tensor_parallel_sizes_vllm_can_load(name, tp, problem):
    found = size_model(config(name), DType.BFLOAT16).tensor_parallel_problem(tp)
    assert (found is None) if problem is None else (problem in (found or "")), found


@pytest.mark.parametrize(
    ("name", "isa", "problem"),
    [
        ("gpt-oss-20b", {"avx512f", "avx512_bf16"}, "lacks amx_tile for mxfp4 group 32 experts only"),
        ("gpt-oss-20b", {"avx512f", "amx_bf16", "amx_tile"}, None),
        ("qwen3-30b-a3b-fp8", {"avx2"}, "lacks amx_tile for fp8 block 128x128"),
        ("qwen2.5-7b-instruct-awq", {"avx2"}, "lacks avx512f for awq int4 group 128"),  # no 4-bit kernel in AVX2
        ("qwen2.5-7b-instruct-awq", {"avx2", "avx512f"}, None),  # 4-bit linear layers run without AMX
        ("deepseek-v2-lite-awq", {"avx512f"}, "lacks amx_tile for awq int4 group 128 experts"),
        ("llama-3.1-8b", set(), None),
    ],
)
def test_isa_the_quantized_kernels_need(name, isa, problem):
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
    model = config(name) if name in {p.stem for p in MODELS.glob("*.json")} else {
        **config("deepseek-v2-lite"), "quantization_config": awq}  # fmt: skip
    found = size_model(model, DType.BFLOAT16).node_problem(frozenset(isa))
    assert (found is None) if problem is None else (problem in (found or "")), found


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bits": 8}, "bits=8 is not a valid gptq value (one of 4: vLLM CPU runs GPTQ at 4 bits only"),
        ({"sym": False}, "sym=false is not served"),
        ({"desc_act": True}, "desc_act=true with groups is refused by vLLM"),
        ({"group_size": 256}, "group_size=256 is not a valid gptq value (one of -1, 32, 64, 128"),
    ],
)
def test_gptq_vllm_cpu_cannot_load_is_refused(change, message):
    gptq = config("qwen2.5-1.5b-instruct-gptq-int4")
    gptq["quantization_config"] = {**gptq["quantization_config"], **change}
    with pytest.raises(UnsupportedModel, match=re.escape(message)):
        size_model(gptq, DType.BFLOAT16)


def test_every_family_in_the_table_has_a_fixture_or_a_field_subset():
    covered = {size_model(config(p.stem), DType.BFLOAT16).anatomy.family for p in MODELS.glob("*.json")}
    covered |= {"qwen2", "qwen3", "mistral"}  # the builders' field subsets
    assert set(FAMILIES) <= covered | {"gemma3_text"}, set(FAMILIES) - covered


def test_an_unknown_family_with_the_common_fields_is_sized_like_llama():
    size = size_model({**LLAMA_8B, "model_type": "my_llama_fork"}, DType.BFLOAT16)
    assert size.parameters == 8_030_261_248 and size.weights_source == "config.json (my_llama_fork formula)"


def test_an_unknown_family_without_them_is_refused_naming_the_missing_fields():
    with pytest.raises(UnsupportedModel) as caught:
        size_model({"model_type": "rwkv", "hidden_size": 2048, "num_hidden_layers": 24}, DType.BFLOAT16)
    assert caught.value.message == (
        "model_type 'rwkv' is not a known family and its config lacks intermediate_size, num_attention_heads, "
        "vocab_size; set spec.model.weightsBytes to size the weights, or have vLLM size it (cpullm plan "
        "--vllm-python; the operator runs a sizing Job)"
    )


def test_a_known_family_missing_fields_names_them_all_at_once():
    partial = {k: v for k, v in config("mixtral-8x7b").items() if k not in ("num_local_experts", "vocab_size")}
    with pytest.raises(UnsupportedModel, match="lacks vocab_size"):
        size_model(partial, DType.BFLOAT16)


def test_weights_override_needs_only_what_the_kv_cache_needs():
    attention_only = {k: v for k, v in LLAMA_8B.items() if k not in ("intermediate_size", "vocab_size")}
    size = size_model(attention_only, DType.BFLOAT16, weights_bytes=10**9)
    assert (size.weights_bytes, size.weights_source, size.parameters) == (10**9, "spec.model.weightsBytes", None)
    assert size.kv_bytes_per_token == 131072


@pytest.mark.parametrize(
    ("layer_types", "message"),
    [
        (["full_attention", "linear_attention"], "layer_types has 'linear_attention'"),
        (["full_attention"], "layer_types lists 1 layers of 2"),
    ],
)
def test_layer_kinds_not_sized_are_refused(layer_types, message):
    with pytest.raises(UnsupportedModel, match=message):
        size_model({**LLAMA_8B, "num_hidden_layers": 2, "layer_types": layer_types}, DType.BFLOAT16)


def test_weight_sources_in_order_of_precedence():
    headers = summarize([("model.embed_tokens.weight", "BF16", [10, 4])], files=1)
    override = size_model(LLAMA_8B, DType.BFLOAT16, weights_bytes=123, checkpoint_total_bytes=456, tensors=headers)
    assert (override.weights_bytes, override.weights_source) == (123, "spec.model.weightsBytes")
    from_headers = size_model(LLAMA_8B, DType.BFLOAT16, checkpoint_total_bytes=456, tensors=headers)
    assert (from_headers.weights_bytes, from_headers.weights_source) == (80, "safetensors headers (1 file, 1 tensors)")
    indexed = size_model(LLAMA_8B, DType.FLOAT32, checkpoint_total_bytes=16_060_522_496)  # bf16 checkpoint
    assert indexed.weights_bytes == 8_030_261_248 * 4
    assert indexed.weights_source == "model.safetensors.index.json total_size"
    awq_indexed = size_model(config("qwen2.5-7b-instruct-awq"), DType.BFLOAT16, checkpoint_total_bytes=5_580_000_000)
    assert awq_indexed.weights_bytes == 5_580_000_000  # a quantized checkpoint is served as stored


def test_checkpoint_headers_cast_floats_keep_packed_tensors_and_skip_layers_not_served():
    tensors = summarize(
        [
            ("model.embed_tokens.weight", "F32", [100, 8]),  # cast to the serving dtype
            ("model.layers.0.mlp.down_proj.qweight", "I32", [16, 8]),  # packed int4: as stored
            ("model.layers.0.mlp.down_proj.scales", "F16", [1, 8]),
            ("model.layers.0.mlp.experts.weight", "F8_E4M3", [4, 4]),
            ("model.layers.2.eh_proj.weight", "BF16", [8, 16]),  # DeepSeek's MTP layer (num_hidden_layers 2)
            ("vision_tower.encoder.layers.5.fc1.weight", "BF16", [2, 2]),  # not a decoder layer
        ],
        files=2,
    )
    assert tensors.weights_bytes(layers=2, serving_dtype_bytes=2) == 800 * 2 + 128 * 4 + 8 * 2 + 16 + 4 * 2
    assert tensors.describe() == "safetensors headers (2 files, 6 tensors)"


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ([], "no tensors"),
        ([("a", "Q4_K", [2])], "has dtype 'Q4_K'"),
        ([("a", "F16", [-1])], "has shape"),
        ([("a", "F16", ["2"])], "has shape"),
    ],
)
def test_unreadable_headers_are_refused(tensors, message):
    with pytest.raises(CheckpointUnreadable, match=message):
        summarize(tensors, files=1)


def test_quantization_config_errors_name_the_field():
    for bad, message in (
        ({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes' is not one vLLM CPU serves"),
        ({"quant_method": "gptq", "bits": 5}, "bits=5 is not a valid gptq value"),
        ({"quant_method": "awq", "bits": 8}, "bits=8 is not a valid awq value (one of 4: vLLM CPU runs AWQ at 4"),
        ({"quant_method": "compressed-tensors", "config_groups": {}}, "config_groups is missing or empty"),
        ([1, 2], "quantization_config=[1, 2] is not an object"),
    ):
        with pytest.raises(UnsupportedModel, match=re.escape(message)):
            size_model({**LLAMA_8B, "quantization_config": bad}, DType.BFLOAT16)


@pytest.mark.parametrize(
    ("quantization", "described"),
    [
        (
            {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
                "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True},
                "input_activations": {"num_bits": 8, "type": "int", "dynamic": True}}}, "ignore": ["lm_head"]},
            "compressed-tensors int8 a8 int8 per-channel",
        ),
        (
            {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
                "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}},
            "compressed-tensors int4 group 128",
        ),
        ({"quant_method": "gptq", "bits": 4, "group_size": -1}, "gptq int4 per-channel"),
    ],
)  # fmt: skip
def test_compressed_tensors_and_gptq_schemes_are_read(quantization, described):
    size = size_model({**LLAMA_8B, "quantization_config": quantization}, DType.BFLOAT16)
    assert size.quantization is not None and size.quantization.describe() == described
    assert size.weights_bytes < 8_030_261_248 * 2 * (0.6 if "int8" in described else 0.4)


def test_layer_kinds_of_every_fixture_are_known():
    for path in MODELS.glob("*.json"):
        for group in size_model(config(path.stem), DType.BFLOAT16).anatomy.kv_groups:
            assert group.kind in LayerKind


def test_a_vision_tower_beside_top_level_text_fields_is_counted_and_an_unknown_one_noted():
    """Qwen2.5-VL writes its language model at the top level and its ViT (depth, not num_hidden_layers) in
    vision_config; Kimi K2.5's MoonViT has other names: the language model is sized, the tower left with a note."""
    text_only = size_model(LLAMA_8B, DType.BFLOAT16).parameters
    vision = {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "patch_size": 14}
    with_tower = size_model({**LLAMA_8B, "vision_config": vision}, DType.BFLOAT16)
    assert with_tower.parameters is not None and with_tower.parameters - text_only > 32 * 4 * 1280 * 1280
    kimi = size_model(config("kimi-k2.5"), DType.BFLOAT16)
    assert kimi.anatomy.notes and kimi.anatomy.notes[0].startswith("vision tower not counted")


@pytest.mark.parametrize(
    ("changes", "full"),
    [
        pytest.param({}, 8, id="every fourth layer global"),
        pytest.param({"sliding_window_pattern": "LLLG"}, 8, id="as letters"),
        pytest.param({"sliding_window_pattern": "LG"}, 16, id="alternating letters"),
        pytest.param({"sliding_window_pattern": 1}, 32, id="1: no layer slides"),
        pytest.param({"sliding_window": None}, 32, id="no window: no layer slides"),
        pytest.param({"layer_types": ["full_attention"] * 32}, 32, id="layer_types win"),
    ],
)
def test_a_sliding_window_pattern_is_read_as_transformers_derives_layer_types(changes, full):
    cohere = {**config("command-r7b"), **changes}
    cohere = {key: value for key, value in cohere.items() if value is not None}
    groups = {g.kind: g.layers for g in size_model(cohere, DType.BFLOAT16).anatomy.kv_groups}
    assert groups.get(LayerKind.FULL, 0) == full


def test_an_unknown_family_with_a_pattern_is_sized_by_it_and_one_with_a_pattern_key_not_read_is_refused():
    generic = {**config("llama-3.1-8b"), "model_type": "newfamily", "sliding_window": 1024}
    pattern = size_model({**generic, "sliding_window_pattern": 4}, DType.BFLOAT16).kv().describe()
    assert pattern.startswith("8 full + 24 sliding (window 1024)")
    turned_off = size_model({**generic, "use_sliding_window": False}, DType.BFLOAT16).kv().describe()
    assert turned_off.startswith("32 full + 0 sliding")
    with pytest.raises(UnsupportedModel, match="global_attn_every_n_layers=3 says which layers slide"):
        size_model({**generic, "global_attn_every_n_layers": 3}, DType.BFLOAT16)
    with pytest.raises(UnsupportedModel, match="neither a count nor L/G letters"):
        size_model({**config("exaone-4.0-32b"), "sliding_window_pattern": "LXG"}, DType.BFLOAT16)


def test_expert_fields_are_read_by_every_name_the_families_use():
    """A family not in the table with ERNIE's field names is sized with its experts, not as a dense model."""
    ernie = config("ernie-4.5-21b-a3b")
    generic = {**ernie, "model_type": "ernie_like"}
    for key in ("moe_layer_start_index",):  # the generic reader routes every layer (no ERNIE range)
        generic.pop(key)
    size = size_model(generic, DType.BFLOAT16)
    assert (size.anatomy.experts, size.anatomy.active_experts) == (64, 6)
    assert size.weights_bytes > 40 * GB


@pytest.mark.parametrize(
    ("family", "reason"),
    [
        ("falcon_mamba", "vLLM's CPU backend cannot run it: its Mamba-1 layers' prefill calls the selective-scan"),
        ("mamba", "torch.ops._C.selective_scan_fwd"),
        ("kimi_linear", "KDA linear-attention layers run as Triton kernels only"),
        ("plamo2", "vLLM removed Plamo2ForCausalLM after 0.26"),
        ("mamba2", "vLLM CPU runs but this operator does not size yet"),
    ],
)
def test_a_family_vllm_cpu_cannot_run_is_refused_with_vllms_reason_and_one_it_runs_with_ours(family, reason):
    with pytest.raises(UnsupportedModel, match=re.escape(reason)):
        size_model({**config("llama-3.1-8b"), "model_type": family}, DType.BFLOAT16)
