"""Speculative decoding as the plan chooses it (core/speculation.py): auto turns it on and off by the prediction for
the objective, a method asked for is refused where vLLM cannot run it, MTP's layers count in memory, and the
rendered server carries vLLM's --speculative-config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from cpullm.api.spec import CpuLLMServiceSpec
from cpullm.core import speculation
from cpullm.core.children.deployment import vllm_args, vllm_env
from cpullm.core.planner import forget_plans, plan_service
from cpullm.core.sizing import ModelSize, size_model
from cpullm.core.speculation import ACCEPTANCE, MTP, NGRAM, mtp_bytes
from cpullm.errors import SpeculationRefused

from .builders import LLAMA_8B, QWEN25_05B, W8A8, node, spec

MODELS = Path(__file__).parent / "fixtures" / "models"
AMX = node("spr", numa=2, cpu="224", memory="2Ti")
AVX512F_ONLY = node("skx", numa=2, cpu="96", memory="2Ti", flags=("AVX2", "AVX512F", "AVX512BW", "AVX512VL"))


def model(name: str) -> ModelSize:
    configs: dict[str, dict[str, Any]] = {
        "llama-8b": LLAMA_8B,
        "llama-8b-w8a8": {**LLAMA_8B, "quantization_config": W8A8},
        "qwen-0.5b": QWEN25_05B,
    }
    config = configs[name] if name in configs else json.loads((MODELS / f"{name}.json").read_text())
    return size_model(config, spec().model.dtype)


def deepseek_spec(**fields: Any) -> CpuLLMServiceSpec:
    raw = {"model": {"name": "deepseek-ai/DeepSeek-V3"}, "kvCacheGiB": 8, "maxModelLen": 8192, **fields}
    return CpuLLMServiceSpec.model_validate(raw)


def deepseek_on_amx(**fields: Any) -> Any:
    return plan_service(deepseek_spec(**fields), model("deepseek-v3"), [AMX])


@pytest.mark.parametrize(
    ("name", "nodes", "fields", "method", "reason"),
    [
        pytest.param("llama-8b", [AMX], {}, "off", "n-gram is for the latency objective", id="throughput, no MTP"),
        # One sequence's step is bound by memory on AMX: checking 4 rows costs about a plain step, so even n-gram's
        # modest typical acceptance pays, in bf16 and in int8.
        pytest.param("llama-8b", [AMX], {"objective": "latency"}, NGRAM, "auto: ngram, 4 tokens",
                     id="latency, AMX: n-gram on"),
        pytest.param("llama-8b-w8a8", [AMX], {"objective": "latency"}, NGRAM, "auto: ngram", id="latency, int8: on"),
        pytest.param("llama-8b", [AVX512F_ONLY], {"objective": "latency"}, "off", "under 1.1x",
                     id="latency, AVX-512 without bf16: checking costs more than it yields"),
        pytest.param("llama-8b", [AMX], {"objective": "latency", "speculative": {"method": "off"}}, "off",
                     "spec.speculative.method is off", id="off"),
        pytest.param("llama-8b", [AMX], {"speculative": {"method": "ngram", "tokens": 5}}, NGRAM, "asked for: ngram, 5",
                     id="asked for: rendered whatever its prediction"),
        pytest.param("llama-8b", [AMX], {"objective": "latency", "image": "registry.example/vllm:mine"}, "off",
                     "vLLM version is unknown", id="latency, unknown vLLM"),
        pytest.param("deepseek-v3", [AMX], {"objective": "latency", "kvCacheGiB": 8, "maxModelLen": 8192}, MTP,
                     "auto: mtp, 3 tokens", id="latency, MTP layers: on, at the best token count"),
        pytest.param("deepseek-v3", [AMX], {"kvCacheGiB": 8, "maxModelLen": 8192}, MTP, "auto: mtp, 4 tokens",
                     id="throughput, MTP layers: on at 8 sequences too"),
    ],
)  # fmt: skip
def test_auto_turns_speculation_on_where_it_is_predicted_faster_for_the_objective(name, nodes, fields, method, reason):
    plan = plan_service(spec(**fields), model(name), nodes)
    assert plan.speculative is not None, plan
    assert plan.speculative.method == method
    assert reason in plan.speculative.reason
    args = vllm_args(spec(**fields), plan)
    if method == "off":
        assert "--speculative-config" not in args
        assert plan.speculative.vllm_config is None
    else:
        config = json.loads(args[args.index("--speculative-config") + 1])
        assert config["method"] == method and config["num_speculative_tokens"] == plan.speculative.tokens
        latency = fields.get("objective") == "latency"
        gain = plan.speculative.decode_gain if latency else plan.speculative.throughput_gain
        assert "asked for" in reason or (gain or 0) >= speculation.MIN_GAIN


def test_the_gain_shrinks_as_the_weights_shrink_and_as_sequences_grow():
    """The published shape of speculation's gain on bandwidth-bound hardware: no more for int8 weights than bf16 at
    one sequence, and less at many sequences at once than at one, down to a loss where the step is bound by
    arithmetic; never more than the tokens a step yields over what speculation costs every step."""
    latency = {"objective": "latency", "speculative": {"method": "ngram", "tokens": 3}}
    bf16 = plan_service(spec(**latency), model("llama-8b"), [AMX]).speculative
    int8 = plan_service(spec(**latency), model("llama-8b-w8a8"), [AMX]).speculative
    assert bf16 and int8 and bf16.decode_gain and int8.decode_gain and bf16.throughput_gain
    assert int8.decode_gain <= bf16.decode_gain
    assert bf16.throughput_gain <= bf16.decode_gain
    # 256 sequences on 32 cores: the checking step's 1,024 rows are bound by arithmetic.
    small = node("small", numa=1, cpu="32", memory="512Gi")
    many = plan_service(spec(maxNumSeqs=256, kvCacheGiB=32, **latency), model("llama-8b"), [small]).speculative
    assert many and many.throughput_gain is not None and many.throughput_gain < 1 < bf16.throughput_gain  # a loss
    ceiling = ACCEPTANCE[NGRAM].tokens_per_step(3)
    assert bf16.decode_gain <= round(ceiling, 2)


@pytest.mark.parametrize(
    ("fields", "layer"),
    [
        pytest.param({"speculative": {"method": "ngram", "tokens": 3}}, "workqueue", id="ngram: numba's own pool"),
        pytest.param({"speculative": {"method": "off"}}, None, id="off: numba is not started"),
        pytest.param({}, None, id="auto, off here"),
    ],
)
def test_an_ngram_server_keeps_numba_off_the_openmp_runtime_torch_uses(fields, layer):
    """vLLM's n-gram proposer starts numba's parallel pool; its OpenMP layer cut torch's threads to one in the
    runtime they share (vllm_support.SPECULATIVE_ENV), so an n-gram server runs numba's own thread pool."""
    plan = plan_service(spec(**fields), model("llama-8b"), [AMX])
    env = {e["name"]: e.get("value") for e in vllm_env(spec(**fields), plan)}
    assert env.get("NUMBA_THREADING_LAYER") == layer
    with pytest.raises(ValidationError, match="NUMBA_THREADING_LAYER"):
        spec(env=[{"name": "NUMBA_THREADING_LAYER", "value": "omp"}])


def test_mtp_is_chosen_for_a_checkpoint_with_mtp_layers_and_counted_in_memory():
    """DeepSeek-V3 carries one MTP layer (num_nextn_predict_layers 1) that vLLM drafts from: for one sequence's
    speed the plan turns it on, and loads its ~14B parameters and caches its attention."""
    on = deepseek_on_amx(objective="latency")
    off = deepseek_on_amx(objective="latency", speculative={"method": "off"})
    assert on.speculative and on.speculative.method == MTP and on.speculative.tokens
    assert on.speculative.weights_bytes
    v3 = model("deepseek-v3")
    # One MoE layer (256 experts), its attention, the 2h x h projection and an embedding and LM head: DeepSeek
    # publishes 14B parameters for the MTP module. Its linears are stored in FP8 (1 byte), the rest in bf16.
    assert 11e9 < mtp_bytes(v3, 1) < 16e9
    assert on.memory_limit_bytes - off.memory_limit_bytes >= on.speculative.weights_bytes
    assert on.kv_bytes_per_token > off.kv_bytes_per_token  # the MTP layer's attention caches too
    assert "--speculative-config" in vllm_args(spec(), on)
    assert on.predicted and off.predicted
    assert on.predicted.decode_tokens_per_second > off.predicted.decode_tokens_per_second


@pytest.mark.parametrize(
    ("name", "fields", "message"),
    [
        ("llama-8b", {"speculative": {"method": "mtp"}}, "the checkpoint has no MTP layers"),
        ("kimi-k2.5", {"speculative": {"method": "mtp"}, "kvCacheGiB": 8}, "the checkpoint has no MTP layers"),
        ("llama-8b", {"speculative": {"method": "ngram"}, "image": "registry.example/vllm@sha256:" + "a" * 64},
         "vLLM version is unknown"),
        ("llama-8b", {"speculative": {"method": "ngram"}, "vllmVersion": "0.30.0"},
         "0.30.0 is not a version the operator"),
    ],
)  # fmt: skip
def test_a_method_vllm_cannot_run_here_is_refused_with_the_reason(name, fields, message):
    with pytest.raises(SpeculationRefused, match=message):
        plan_service(spec(**fields), model(name), [AMX])


def test_a_plan_made_before_the_operator_chose_speculation_keeps_it_off_under_auto():
    """Upgrading the operator does not restart a fleet to turn speculation on: auto keeps the running plan's."""
    raw = {"model": {"name": "deepseek-ai/DeepSeek-V3"}, "kvCacheGiB": 8, "maxModelLen": 8192, "objective": "latency"}
    latency, v3 = CpuLLMServiceSpec.model_validate(raw), model("deepseek-v3")
    fresh = plan_service(latency, v3, [AMX])
    assert fresh.speculative and fresh.speculative.method == MTP
    before = fresh.model_dump(by_alias=True, mode="json", exclude={"speculative"})
    kept = plan_service(latency, v3, [AMX], before)
    assert kept.speculative and kept.speculative.method == "off" and "kept" in kept.speculative.reason
    assert "--speculative-config" not in vllm_args(latency, kept)
    still = plan_service(latency, v3, [AMX], kept.model_dump(by_alias=True, mode="json"))
    assert still.speculative == kept.speculative  # the kept plan stays kept
    asked = CpuLLMServiceSpec.model_validate({**raw, "speculative": {"method": "mtp"}})
    chosen = plan_service(asked, v3, [AMX], before)
    assert chosen.speculative and chosen.speculative.method == MTP  # the spec chooses
    again = plan_service(latency, v3, [AMX], fresh.model_dump(by_alias=True, mode="json"))
    assert again.speculative == fresh.speculative


def test_auto_keeps_what_the_running_servers_use_while_it_is_predicted_about_as_good(monkeypatch):
    """A prediction that moves a little (a node's probe arriving after its estimate) restarts no server for a few
    percent: the running token count stays while within KEEP_BAND of the best (DeepSeek-V3 MTP on AMX, latency:
    1.50x at 3 tokens, 1.48x at 4, 1.34x at 1), and a method auto turned on stays on down to MIN_GAIN x KEEP_BAND."""
    latency, v3 = deepseek_spec(objective="latency"), model("deepseek-v3")
    fresh = plan_service(latency, v3, [AMX])
    assert fresh.speculative and (fresh.speculative.method, fresh.speculative.tokens) == (MTP, 3)

    def running(tokens: int) -> dict[str, Any]:
        status = fresh.model_dump(by_alias=True, mode="json")
        status["speculative"] = {**status["speculative"], "tokens": tokens}
        return status

    at_4 = plan_service(latency, v3, [AMX], running(4)).speculative
    assert at_4 and (at_4.method, at_4.tokens, at_4.decode_gain) == (MTP, 4, 1.48)  # 1.48 >= 0.95 x 1.50: kept
    at_1 = plan_service(latency, v3, [AMX], running(1)).speculative
    assert at_1 and at_1.tokens == 3  # 1.34 < 0.95 x 1.50: the best count
    monkeypatch.setattr(speculation, "MIN_GAIN", 1.55)  # 1.50x no longer turns it on, but keeps it on (>= 1.4725)
    forget_plans()  # the plans made under the constant as it was
    assert plan_service(latency, v3, [AMX]).speculative.method == "off"  # type: ignore[union-attr]
    kept = plan_service(latency, v3, [AMX], running(3)).speculative
    assert kept and (kept.method, kept.tokens) == (MTP, 3)
    monkeypatch.setattr(speculation, "MIN_GAIN", 1.6)  # under 1.52 = 1.6 x 0.95: off after all
    forget_plans()
    dropped = plan_service(latency, v3, [AMX], running(3)).speculative
    assert dropped and dropped.method == "off" and "under 1.52" in dropped.reason


@pytest.mark.parametrize(
    "args",
    [
        ["--speculative-config", '{"method":"ngram"}'],
        ['--speculative_config={"method":"ngram"}'],
        ["-sc", "{}"],
        ["--speculative-con", "{}"],
    ],
)
def test_extra_args_cannot_set_what_spec_speculative_owns(args):
    with pytest.raises(ValidationError, match="speculative"):
        spec(extraArgs=args)


@pytest.mark.parametrize("tokens", [0, 9, -1])
def test_a_token_count_out_of_range_is_refused(tokens):
    with pytest.raises(ValidationError):
        spec(speculative={"method": "ngram", "tokens": tokens})


@pytest.mark.parametrize(
    ("proposed", "trained", "expected"),
    [
        pytest.param(4, None, 1 + 0.85 + 0.85**2 + 0.85**3 + 0.85**4, id="every proposal alike"),
        pytest.param(4, 4, 1 + 0.85 + 0.85**2 + 0.85**3 + 0.85**4, id="a layer for each"),
        pytest.param(4, 1, 1 + 0.85 + 0.85 * 0.8 + 0.85 * 0.8**2 + 0.85 * 0.8**3, id="one layer run again"),
        pytest.param(1, 1, 1.85, id="one token of one layer"),
        pytest.param(0, 1, 1.0, id="nothing proposed: the step's own token"),
    ],
)
def test_tokens_past_the_drafters_layers_are_accepted_at_its_reused_rate(proposed, trained, expected):
    """vLLM drafts MTP tokens past a checkpoint's MTP layers by running its last layer again, and those accept less
    (its own warning); a step yields the accepted run of the proposals plus its own token."""
    mtp = speculation.ACCEPTANCE[MTP]
    assert (mtp.rate, mtp.reused) == (0.85, 0.8)
    assert mtp.tokens_per_step(proposed, trained) == pytest.approx(expected)
