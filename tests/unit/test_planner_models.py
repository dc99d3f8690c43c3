"""The planner with the models users bring: quantized checkpoints' TP and ISA, sliding-window and MLA KV caches,
an fp8 KV cache, and the model's own context length."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cpullm.api.spec import DType
from cpullm.core.constants import GiB
from cpullm.core.planner import plan_service
from cpullm.core.sizing import ModelSize, size_model
from cpullm.errors import ContextTooLong, NoEligibleNode, UnsupportedModel

from .builders import AMX_FLAGS, AVX512_FLAGS, node, spec

MODELS = Path(__file__).parent / "fixtures" / "models"


def model(name: str, **overrides: Any) -> ModelSize:
    return size_model({**json.loads((MODELS / f"{name}.json").read_text()), **overrides}, DType.BFLOAT16)


def test_a_quantized_checkpoint_steps_tp_down_to_what_vllm_can_load():
    """GPTQ int4 Qwen2.5-1.5B on a 4-NUMA node: TP 4 splits down_proj's 8960 inputs into 2240, not whole groups of
    128; TP 2 keeps 4480 = 35 x 128."""
    plan = plan_service(spec(kvCacheGiB=1, maxModelLen=4096), model("qwen2.5-1.5b-instruct-gptq-int4"),
                        [node(numa=4)])  # fmt: skip
    assert plan.tensor_parallel_size == 2
    assert plan.sizing.quantization == "gptq int4 group 128"
    assert plan.weights_bytes < 1.2e9  # int4, not the 3.1 GB of bf16


def test_mxfp4_experts_go_only_to_amx_nodes():
    nodes = [node("amx", flags=AMX_FLAGS, memory="512Gi"), node("avx512", flags=AVX512_FLAGS, memory="512Gi")]
    plan = plan_service(spec(kvCacheGiB=2, maxModelLen=8192), model("gpt-oss-20b"), nodes)
    assert plan.eligible_nodes == ["amx"]
    with pytest.raises(NoEligibleNode, match="lacks amx_tile for mxfp4 group 32 experts only"):
        plan_service(spec(kvCacheGiB=2, maxModelLen=8192), model("gpt-oss-20b"), nodes[1:])


def test_sliding_window_layers_hold_only_their_window_in_the_derived_kv_cache():
    """gpt-oss-20b: 12 full layers grow with the context, 12 sliding ones hold 128 tokens + the 2048 in flight."""
    sized = model("gpt-oss-20b")
    plan = plan_service(spec(kvCacheGiB=None, maxModelLen=131072, maxNumSeqs=4), sized, [node(memory="512Gi")])
    per_token = 2 * 12 * 8 * 64 * 2
    window = 12 * (2176 + 128) * 2 * 8 * 64 * 2  # min(128 - 1 + 2048, context) in blocks, + one block
    assert plan.kv_bytes_per_token == per_token
    assert plan.sizing.kv_window_bytes_per_sequence == window
    assert plan.kv_cache_gi_b == -(-4 * (131072 * per_token + window) // GiB)  # 13 GiB, not 24 for all-full


def test_mla_kv_is_one_latent_per_layer_on_every_rank():
    plan = plan_service(spec(kvCacheGiB=1, maxModelLen=32768), model("deepseek-v2-lite"), [node(numa=2)])
    assert plan.tensor_parallel_size == 2
    assert plan.kv_bytes_per_token == 27 * 576 * 2
    # The same tokens on both ranks, as vLLM counts them: whole 128-token blocks of the 27 layers (an AMX node: 16
    # without it), the requests of 32,768 tokens they hold, times 32,768.
    blocks = GiB // (128 * 27 * 576 * 2)
    assert plan.kv_tokens_per_rank == int(blocks / (32768 // 128) * 32768)
    assert plan.sizing.kv_layout.startswith("27 MLA layers, latent 576")


def test_an_fp8_kv_cache_halves_the_kv_and_needs_avx512():
    llama = model("llama-3.1-8b")
    auto = plan_service(spec(), llama, [node()])
    fp8 = plan_service(spec(kvCacheDtype="fp8"), llama, [node()])
    assert fp8.kv_bytes_per_token * 2 == auto.kv_bytes_per_token
    assert fp8.kv_tokens_per_rank == 2 * auto.kv_tokens_per_rank
    assert fp8.sizing.kv_cache_dtype == "fp8"
    with pytest.raises(NoEligibleNode, match="lacks avx512f for an fp8 KV cache"):
        plan_service(spec(kvCacheDtype="fp8"), llama, [node(flags=("AVX2",))])


def test_an_fp8_kv_cache_is_refused_for_mla():
    with pytest.raises(UnsupportedModel, match="kvCacheDtype fp8 is not supported by vLLM CPU for MLA models"):
        plan_service(spec(kvCacheDtype="fp8", maxModelLen=4096), model("deepseek-v2-lite"), [node()])


def test_a_context_longer_than_the_model_is_refused_and_an_open_one_is_the_models():
    with pytest.raises(ContextTooLong, match="maxModelLen 16384 is longer than the model's context of 8192"):
        plan_service(spec(), model("gemma-2-2b"), [node()])
    plan = plan_service(spec(maxModelLen=None, kvCacheGiB=8), model("gemma-2-2b"), [node()])
    assert (plan.max_model_len, plan.max_model_len_source) == (None, "model")


def test_a_multimodal_configs_text_model_is_planned():
    plan = plan_service(spec(maxModelLen=8192), model("gemma-3-4b-it"), [node()])
    assert plan.sizing.family == "gemma3" and plan.sizing.parameters == 4_300_079_472
    assert plan.sizing.kv_layout.startswith("5 full + 29 sliding (window 1024) layers")


def test_the_plan_says_where_each_figure_came_from():
    plan = plan_service(spec(), model("mixtral-8x7b"), [node(memory="512Gi")])
    assert plan.sizing.model_dump(by_alias=True, exclude_none=True) == {
        "family": "mixtral",
        "parameters": 46_702_792_704,
        "experts": "8 experts, 2 active",
        "weightsSource": "config.json (mixtral formula)",
        "kvLayout": "32 full + 0 sliding layers, 8 KV heads x 128, 2 B/element",
        "kvCacheDtype": "auto",
        "kvWindowBytesPerSequence": 0,
        "notes": [],
    }
