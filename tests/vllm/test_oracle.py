"""Sizing against vLLM itself as the oracle, from config.json alone (tests/vllm/oracle.py): for every model config
fixture (tests/unit/fixtures/models) and configs made by varying the fields that decide the layout, vLLM builds its
model on the meta device as vLLM CPU would serve it on this machine at TP 1, and lays out a 4 GiB KV cache for the
context. Sizing must agree: weights within 1%, and exactly vLLM's block size and token capacity ("CPU KV cache
size: N tokens"). A config vLLM refuses on this machine must be refused by sizing on this machine's CPU flags too.
One vLLM process runs them all (a few seconds each)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from testbed import machine

from cpullm.api.spec import DType
from cpullm.core.sizing import ModelSize, size_model
from cpullm.errors import UnsupportedModel
from cpullm.io.meta_size import local_vllm_sizer
from tests.vllm.oracle import RESULT

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "models"
KV_BYTES = 4 << 30
CONTEXT = 8192
WEIGHTS_TOLERANCE = 0.01
# Configs vLLM cannot build here for a reason that is not about serving them (each is asserted to still fail, so
# that the day it builds, it is compared).
NOT_BUILT_HERE = {
    "gemma-3-4b-it": "the multimodal Gemma3ForConditionalGeneration is inspected through its processor, which "
    "transformers cannot load offline",
    "kimi-k2.5": "vLLM's Kimi K2.5 model copies a tensor while it is built, which the meta device refuses",
}


def _variant(base: str, **changes: Any) -> dict[str, Any]:
    config = json.loads((FIXTURES / f"{base}.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return config


# The fields that decide a hybrid's layout, varied: groups and state of Mamba2, where the attention layers are, the
# full-attention interval of Qwen3-Next without layer_types, Llama 4's chunk (shorter than the context, so it
# chunks) and MoE interleave, a sliding window shorter than the context; Nemotron-H's SSM cache dtype, its
# blocks listed by name, biases, MLP sizes listed (transformers 5 refuses them) and MoE layers (vLLM CPU
# refuses them); LFM2's attention by index, an unadjusted MLP, conv biases, and an LFM2-MoE without an expert bias.
VARIANTS: dict[str, dict[str, Any]] = {
    "granite-h-micro-groups2-state64": _variant(
        "granite-4.0-h-micro", mamba_n_groups=2, mamba_d_state=64,
        layer_types=["attention" if i % 8 == 7 else "mamba" for i in range(40)],
    ),
    "granite-h-small-heads64": _variant("granite-4.0-h-small", mamba_n_heads=64, mamba_d_head=128),
    "qwen3-next-interval2": _variant(
        "qwen3-next-80b-a3b", layer_types=None, full_attention_interval=2, linear_num_value_heads=16
    ),
    "falcon-h1-expand": _variant(
        "falcon-h1-7b", mamba_d_ssm=8192, mamba_n_heads=64, mamba_d_head=128, mamba_d_state=128
    ),
    "llama4-chunk2048-interleave2": _variant(
        "llama-4-scout-text", attention_chunk_size=2048, interleave_moe_layer_step=2, moe_layers=None
    ),
    "gemma-2-2b": _variant("gemma-2-2b"),
    "nemotron-h-ssm-bf16": _variant("nemotron-h-8b-base-8k", mamba_ssm_cache_dtype="bfloat16"),
    "nemotron-h-listed-sliding": _variant(
        "nvidia-nemotron-nano-9b-v2", hybrid_override_pattern=None, sliding_window=2048, head_dim=None,
        layers_block_type=["mamba", "mlp", "attention", "mlp", "mamba", "mlp"] * 4,
    ),
    "nemotron-h-biases": _variant("nemotron-h-8b-base-8k", use_bias=True, mlp_bias=True, mamba_conv_bias=False),
    "nemotron-h-mlp-sizes-listed": _variant("nvidia-nemotron-nano-9b-v2", intermediate_size=[15680, 12544]),
    "nemotron-3-nano-moe": _variant(  # Nemotron 3 Nano 30B-A3B's MoE (E) layers: vLLM CPU cannot run them
        "nemotron-h-8b-base-8k", hybrid_override_pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
        hidden_size=2688, num_key_value_heads=2, mamba_num_heads=64, n_routed_experts=128, n_shared_experts=1,
        moe_intermediate_size=1856, moe_shared_expert_intermediate_size=3712, num_experts_per_tok=6,
    ),
    "lfm2-attention-idxs-unadjusted": _variant(
        "lfm2-1.2b", layer_types=None, full_attn_idxs=[1, 3, 5, 7], block_auto_adjust_ff_dim=False,
        block_ff_dim=8192, conv_bias=True,
    ),
    "lfm2-moe-no-expert-bias": _variant("lfm2-8b-a1b", use_expert_bias=False, num_dense_layers=5),
}  # fmt: skip


# Configs no formula here knows, which vLLM CPU serves: sized through vLLM's meta-device build (core/sizing/
# vllm_report.py, cpullm/meta_size.py), with the context vLLM derives for them. GPT-2 writes its fields under its own
# names (n_embd, n_layer), which sizing's common-field formula does not read; Mamba2 (pure state-space) has no
# builder here.
VLLM_SIZED: dict[str, tuple[dict[str, Any], int]] = {
    "gpt2": (
        {
            "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
            "n_positions": 1024, "n_ctx": 1024, "vocab_size": 50257, "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-05, "bos_token_id": 50256, "eos_token_id": 50256,
        },
        1024,
    ),
    "mamba2-2.7b": (
        {
            "architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "hidden_size": 2560,
            "num_hidden_layers": 64, "num_heads": 80, "head_dim": 64, "expand": 2, "n_groups": 1, "state_size": 128,
            "conv_kernel": 4, "vocab_size": 50288, "use_bias": False, "use_conv_bias": True,
            "tie_word_embeddings": True, "layer_norm_epsilon": 1e-05, "residual_in_fp32": True, "rms_norm": True,
            "chunk_size": 256, "time_step_rank": 160, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
        },
        2048,
    ),
}  # fmt: skip


def cases(workdir: Path) -> dict[str, tuple[dict[str, Any], Path]]:
    """Every fixture, variant and config vLLM sizes, each written as a model directory of its config.json."""
    configs = {path.stem: json.loads(path.read_text()) for path in sorted(FIXTURES.glob("*.json"))}
    configs |= VARIANTS | {name: config for name, (config, _) in VLLM_SIZED.items()}
    out = {}
    for name, config in configs.items():
        directory = workdir / name
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(config))
        out[name] = (config, directory)
    return out


def ours(config: dict[str, Any]) -> ModelSize | str:
    """Sizing's model, or why it refuses it on this machine's CPU."""
    try:
        size = size_model(config, DType.BFLOAT16)
    except UnsupportedModel as refused:
        return refused.message
    return size.node_problem(frozenset(machine.cpu_flags())) or size


def context_of(size: ModelSize | str) -> int:
    limit = size.max_position_embeddings if isinstance(size, ModelSize) else None
    return min(CONTEXT, limit or CONTEXT)


@pytest.fixture(scope="module")
def oracle(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("oracle")
    found = cases(workdir)
    requests = [
        {
            "config": str(directory),
            "dtype": "bfloat16",
            "max_model_len": VLLM_SIZED[name][1] if name in VLLM_SIZED else context_of(ours(config)),
            "kv_bytes": KV_BYTES,
        }
        for name, (config, directory) in found.items()
    ]
    (workdir / "requests.json").write_text(json.dumps(requests))
    run = subprocess.run(
        [str(vllm_python), str(Path(__file__).parent / "oracle.py"), str(workdir / "requests.json")],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    results = [json.loads(line[len(RESULT) :]) for line in run.stdout.splitlines() if line.startswith(RESULT)]
    assert len(results) == len(requests), run.stderr[-3000:]
    return {Path(result["config"]).name: result for result in results}


def layout_seen(result: dict[str, Any]) -> str:
    groups = ", ".join(f"{g['layers']} x {g['spec']}" for g in result["groups"])
    return f"vLLM: block {result['block_size']} tokens, page {result['page_bytes']} B, groups [{groups}]"


@pytest.mark.parametrize("name", [p.stem for p in sorted(FIXTURES.glob("*.json"))] + list(VARIANTS))
def test_sizing_agrees_with_vllm_built_from_the_config(name: str, oracle: dict[str, dict[str, Any]]) -> None:
    config = VARIANTS.get(name) or json.loads((FIXTURES / f"{name}.json").read_text())
    result, size = oracle[name], ours(config)
    if name in NOT_BUILT_HERE:
        assert "error" in result, f"vLLM builds {name} now: drop it from NOT_BUILT_HERE ({NOT_BUILT_HERE[name]})"
        return
    if "error" in result:
        assert isinstance(size, str), f"vLLM refuses {name} on this machine ({result['error'][:300]}); sizing plans it"
        return
    assert isinstance(size, ModelSize), f"sizing refuses {name} ({size}), which vLLM builds here"
    served = result["weights_bytes"]
    assert abs(size.weights_bytes - served) <= WEIGHTS_TOLERANCE * served, (
        f"weights: sizing {size.weights_bytes:,} B, vLLM {served:,} B"
    )
    kv = size.kv(None, frozenset(machine.cpu_flags()))
    context = context_of(size)
    planned = (kv.block_tokens(1), kv.page_bytes(1), kv.tokens(KV_BYTES, 1, context))
    assert planned == (result["block_size"], result["page_bytes"], result["kv_tokens"]), (
        f"sizing: block {planned[0]} tokens, page {planned[1]} B, {planned[2]:,} tokens ({kv.describe()}); "
        f"{layout_seen(result)}, {result['kv_tokens']:,} tokens of {context}"
    )


@pytest.mark.parametrize("name", list(VLLM_SIZED))
def test_a_config_no_formula_knows_is_sized_by_vllm_as_vllm_builds_it(
    name: str, oracle: dict[str, dict[str, Any]], vllm_python: Path
) -> None:
    """The formulas refuse it; asked through the seam the CLI's --vllm-python uses (io/meta_size.py runs
    cpullm/meta_size.py), vLLM sizes it, and the plan's weights and KV layout agree with vLLM's own count."""
    config, context = VLLM_SIZED[name]
    with pytest.raises(UnsupportedModel):
        size_model(config, DType.BFLOAT16)
    size = size_model(config, DType.BFLOAT16, vllm=local_vllm_sizer(str(vllm_python)))
    result = oracle[name]
    assert size.weights_source.startswith("vLLM ") and size.weights_source.endswith("(meta device)")
    assert abs(size.weights_bytes - result["weights_bytes"]) <= WEIGHTS_TOLERANCE * result["weights_bytes"]
    assert size.max_position_embeddings == context
    kv = size.kv(None, frozenset(machine.cpu_flags()))
    planned = (kv.block_tokens(1), kv.page_bytes(1), kv.tokens(KV_BYTES, 1, context))
    assert planned == (result["block_size"], result["page_bytes"], result["kv_tokens"]), (
        f"sizing: block {planned[0]} tokens, page {planned[1]} B, {planned[2]:,} tokens ({kv.describe()}); "
        f"{layout_seen(result)}, {result['kv_tokens']:,} tokens of {context}"
    )
