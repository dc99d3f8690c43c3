import pytest

from cpullm.api.spec import DType
from cpullm.core.sizing import count_parameters, size_model
from cpullm.errors import UnsupportedModel

from .builders import LLAMA_8B, MISTRAL_7B_V03, QWEN3_06B, QWEN25_05B


@pytest.mark.parametrize(
    ("config", "parameters"),
    [
        pytest.param(LLAMA_8B, 8_030_261_248, id="llama-3.1-8b"),  # published: 8.03B
        pytest.param(QWEN25_05B, 494_032_768, id="qwen2.5-0.5b (tied, qkv bias)"),  # published: 0.49B
        pytest.param(QWEN3_06B, 596_049_920, id="qwen3-0.6b (explicit head_dim, qk norm)"),  # published: 0.6B
        pytest.param(MISTRAL_7B_V03, 7_248_023_552, id="mistral-7b-v0.3"),  # published: 7.25B
    ],
)
def test_parameter_count_matches_published_models(config, parameters):
    assert count_parameters(config) == parameters


@pytest.mark.parametrize(
    ("config", "dtype", "kv_bytes_per_token", "weights_bytes"),
    [
        (LLAMA_8B, DType.BFLOAT16, 2 * 32 * 8 * 128 * 2, 8_030_261_248 * 2),
        (LLAMA_8B, DType.FLOAT32, 2 * 32 * 8 * 128 * 4, 8_030_261_248 * 4),
        (QWEN25_05B, DType.BFLOAT16, 2 * 24 * 2 * 64 * 2, 494_032_768 * 2),
    ],
)
def test_kv_and_weight_bytes(config, dtype, kv_bytes_per_token, weights_bytes):
    size = size_model(config, dtype)
    assert size.kv_bytes_per_token == kv_bytes_per_token
    assert size.weights_bytes == weights_bytes
    assert size.weights_source == "config.json"


@pytest.mark.parametrize(
    ("tp", "per_rank"),
    [(1, 131072), (2, 65536), (8, 16384), (16, 16384)],  # 8 KV heads: beyond TP 8 each rank holds one
)
def test_kv_bytes_per_rank_split_heads(tp, per_rank):
    assert size_model(LLAMA_8B, DType.BFLOAT16).kv_bytes_per_token_per_rank(tp) == per_rank


def test_weight_sources_in_order_of_precedence():
    override = size_model(LLAMA_8B, DType.BFLOAT16, weights_bytes=123, checkpoint_total_bytes=456)
    assert (override.weights_bytes, override.weights_source) == (123, "spec.model.weightsBytes")
    indexed = size_model(LLAMA_8B, DType.FLOAT32, checkpoint_total_bytes=16_060_522_496)  # bf16 checkpoint
    assert indexed.parameters == 8_030_261_248
    assert indexed.weights_bytes == 8_030_261_248 * 4


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**LLAMA_8B, "model_type": "mixtral"}, "not a supported dense family"),
        ({k: v for k, v in LLAMA_8B.items() if k != "hidden_size"}, "lacks 'hidden_size'"),
        ({**LLAMA_8B, "num_hidden_layers": "32"}, "not a positive integer"),
    ],
)
def test_unsupported_configs_are_refused(config, message):
    with pytest.raises(UnsupportedModel, match=message):
        count_parameters(config)


def test_unsupported_family_sizes_with_weights_override():
    size = size_model({**LLAMA_8B, "model_type": "phi3"}, DType.BFLOAT16, weights_bytes=10**9)
    assert size.weights_bytes == 10**9
    assert size.kv_bytes_per_token == 131072
