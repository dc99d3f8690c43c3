"""The performance model (core/performance.py): its terms one by one, the probe's object read and refused, the
estimates by ISA class, and the plan's predicted figures."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from cpullm.core import performance as perf
from cpullm.core.node_facts import refine_profiles
from cpullm.core.performance import (
    BF16,
    INT8,
    KernelRates,
    NumaPerformance,
    Serving,
    ThreadRates,
    decode_step,
    estimated_performance,
    parse_performance,
    predict,
    saturation_streams,
    step_bytes,
)
from cpullm.core.planner import plan_service
from cpullm.core.sizing import ModelSize, size_model
from cpullm.core.sizing.anatomy import Split
from cpullm.errors import NodeLabelError, NodePerformanceError

from .builders import AVX512_FLAGS, LLAMA_8B, QWEN25_05B, W8A8, llama_8b, node, probe_object, qwen_05b, spec


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        (1, 8.0),  # a point
        (0, 8.0),  # below the first: the first
        (4, math.exp((math.log(8) + math.log(2)) / 2)),  # halfway in log between 1 and 16
        (16, 2.0),
        (64, 0.5),  # past the last: the same arithmetic, so a quarter of the bytes per second at four times the batch
    ],
)
def test_kernel_rates_interpolate_in_log_log_and_fall_as_one_over_the_batch_past_the_last_point(batch, expected):
    assert KernelRates(((1, 8.0), (16, 2.0))).at(batch) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("measured", "read"),
    [
        (((1, 8.0), (8, 6.0), (32, 2.0)), ((1, 8.0), (8, 6.0), (32, 2.0))),  # falling: as measured
        (((1, 8.0), (8, 9.5), (32, 2.0)), ((1, 8.0), (8, 8.0), (32, 2.0))),  # 8 rows above 1 row's: 1 row's
        (((1, 5.0), (8, 9.0), (32, 7.0)), ((1, 5.0), (8, 5.0), (32, 5.0))),  # every later point held to the lowest
    ],
)
def test_a_kernels_rate_never_rises_with_more_rows(measured, read):
    assert KernelRates(measured).never_faster_with_more_rows().points == read


def test_a_probe_whose_8_row_point_ran_faster_predicts_no_faster_step_at_8_sequences():
    probe = probe_object()
    for threads in (probe["spec"]["numaNodes"][0]["oneThread"], probe["spec"]["numaNodes"][0]["allCores"]):
        threads["bf16WeightBytesPerSecond"]["8"] *= 1.2  # the host's noise: a faster point at more rows
    model, node = qwen_05b(), parse_performance(probe)
    serving = Serving(1, 32, BF16, 1.0)
    kv = model.kv_bytes_per_token_per_rank(1)
    one, eight = (decode_step(model, serving, node, batch, 512, kv).seconds for batch in (1, 8))
    assert eight >= one


def numa(one_read: float, all_read: float, cpus: int = 8) -> NumaPerformance:
    kernels = lambda r: ((BF16, KernelRates(((1, r),))),)  # noqa: E731
    return NumaPerformance(
        cpus, ThreadRates(1, one_read, kernels(one_read), 1e-5), ThreadRates(cpus, all_read, kernels(all_read), 2e-5)
    )


@pytest.mark.parametrize(
    ("cores", "read"),
    [(1, 10.0), (4, 40.0), (6, 50.0), (8, 50.0)],
    ids=["one core", "below saturation", "saturated", "all cores"],
)
def test_a_ranks_cores_add_bandwidth_until_the_numa_nodes_memory_saturates(cores, read):
    measured = numa(10.0, 50.0)
    assert measured.read(cores) == read
    assert measured.rate(BF16, cores, 1) == read
    assert measured.rate(INT8, cores, 1) is None  # not measured


def test_a_small_kernels_cost_moves_from_one_threads_to_all_cores_by_thread_count():
    measured = numa(10.0, 50.0, cpus=9)
    assert [measured.small_kernel_seconds(c) for c in (1, 5, 9)] == pytest.approx([1e-5, 1.5e-5, 2e-5])


def test_a_step_streams_the_ranks_linear_layers_and_the_lm_head_and_tp_splits_them():
    model = llama_8b()
    one, two = step_bytes(model, 1), step_bytes(model, 2)
    # Llama-3.1-8B: 6.98B parameters in its linear layers and a 0.53B LM head (128,256 x 4,096), bf16.
    assert one.at(1) == pytest.approx(2 * (model.anatomy.parameters - model.anatomy.embedding_parameters), rel=0.001)
    assert two.at(1) == pytest.approx(one.at(1) / 2, rel=0.001)
    assert one.at(32) == one.at(1)  # dense: the same bytes whatever the batch


MOE = {
    **LLAMA_8B,
    "model_type": "mixtral",
    "architectures": ["MixtralForCausalLM"],
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}


def test_a_moe_step_reads_the_experts_its_tokens_route_to():
    model = size_model(MOE, "bfloat16")
    bytes_ = step_bytes(model, 1)
    assert bytes_.experts_total == 8 and bytes_.experts_active == 2
    one, eight, many = bytes_.at(1), bytes_.at(8), bytes_.at(256)
    assert one == pytest.approx(bytes_.dense + bytes_.lm_head + bytes_.experts * 2 / 8)  # one token: its two experts
    assert one < eight < many <= bytes_.dense + bytes_.lm_head + bytes_.experts
    assert many == pytest.approx(
        bytes_.dense + bytes_.lm_head + bytes_.experts, rel=1e-6
    )  # a large batch touches every expert


def test_a_quantized_checkpoint_streams_fewer_bytes_through_its_own_kernel():
    w8a8 = {**LLAMA_8B, "quantization_config": W8A8}
    int8, bf16 = size_model(w8a8, "bfloat16"), llama_8b()
    assert perf.kernel_of(int8) == (INT8, 1.0) and perf.kernel_of(bf16) == (BF16, 1.0)
    assert step_bytes(int8, 1).at(1) < 0.6 * step_bytes(bf16, 1).at(1)


AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}


@pytest.mark.parametrize("config", [W8A8, AWQ], ids=["w8a8", "awq-int4"])
def test_a_quantized_checkpoints_lm_head_runs_through_bf16s_kernel_at_its_own_rate(config):
    """The formats leave the LM head in the serving dtype (step_bytes counts it so): it streams at bf16's rate, not
    at the layers' kernel's."""
    model = size_model({**QWEN25_05B, "quantization_config": config}, "bfloat16")
    kernel, factor = perf.kernel_of(model)
    numa, streamed = parse_performance(probe_object()).slowest(), step_bytes(model, 1)
    serving = Serving(1, 8, kernel, factor)
    bf16 = Serving(1, 8, BF16, 1.0)
    for rows in (1, 8, 32):
        layers = streamed.layers(rows) / perf.matrix_rate(numa, serving, rows)
        head = streamed.lm_head / perf.matrix_rate(numa, bf16, rows)
        step = decode_step(model, serving, parse_performance(probe_object()), rows, 512, 0)
        assert step.weights == pytest.approx(layers + head)


def speeds(model, tp: int = 1, cores: int = 8, kernel: str = BF16, probe: dict[str, Any] | None = None, **kw):
    node = parse_performance(probe or probe_object(numa=2))
    kv = model.kv_bytes_per_token_per_rank(tp)
    return predict(model, Serving(tp, cores, kernel, 1.0), node, kw.pop("streams", 8), kv, **kw)


def test_more_sequences_at_once_generate_more_tokens_and_a_longer_prompt_waits_longer():
    model = qwen_05b()
    figures = speeds(model)
    assert figures.throughput_tokens_per_second > 4 * figures.decode_tokens_per_second
    assert speeds(model, prompt=4096).time_to_first_token_seconds > 3 * figures.time_to_first_token_seconds
    assert speeds(model, context=8192).decode_tokens_per_second < figures.decode_tokens_per_second  # more KV read


@pytest.mark.parametrize(("cores", "most"), [(2, 256), (8, 256), (32, 256), (8, 4)])
def test_a_server_saturates_where_each_sequences_step_is_a_quarter_slower_than_alone(cores: int, most: int):
    """The gateway sends a server no more than this at once (core/gateway.py): the step at that count is within
    SATURATION_SLOWDOWN of one sequence's and one more is past it, unless maxNumSeqs comes first."""
    model, node = llama_8b(), parse_performance(probe_object(numa=2))
    serving, kv = Serving(1, cores, BF16, 1.0), model.kv_bytes_per_token_per_rank(1)

    def step(streams: int) -> float:
        return decode_step(model, serving, node, streams, perf.DECODE_CONTEXT_TOKENS, kv).seconds

    found = saturation_streams(model, serving, node, most, kv)
    assert 1 <= found <= most and step(found) <= perf.SATURATION_SLOWDOWN * step(1)
    assert found == most or step(found + 1) > perf.SATURATION_SLOWDOWN * step(1)


def test_every_plan_says_where_its_servers_saturate():
    for seqs in (4, 256):
        plan = plan_service(spec(maxNumSeqs=seqs), llama_8b(), [node("a", numa=1, cpu="16")])
        assert plan.predicted is not None and 1 <= (plan.predicted.saturation_streams or 0) <= seqs
    assert plan.predicted.saturation_streams < 256  # an 8B model on 16 cores is compute-bound well before 256


def test_a_machine_twice_as_fast_is_predicted_nearly_twice_as_fast():
    model = llama_8b()
    slow, fast = speeds(model), speeds(model, probe=probe_object(numa=2, scale=2.0))
    assert 1.6 < fast.decode_tokens_per_second / slow.decode_tokens_per_second <= 2.0


def test_tp_2_decodes_faster_on_a_large_model_and_pays_its_all_reduces_on_a_small_one():
    large, small = llama_8b(), size_model({**QWEN25_05B, "num_hidden_layers": 2, "intermediate_size": 64}, "bfloat16")
    assert speeds(large, tp=2).decode_tokens_per_second > 1.6 * speeds(large).decode_tokens_per_second
    assert speeds(small, tp=2).decode_tokens_per_second < 1.6 * speeds(small).decode_tokens_per_second


# The probe's attention layers at 128 and 1,024 tokens of context, seconds per sequence: the large layer (2,048 KV
# bytes a token) and a small one (256) whose time is mostly fixed.
LARGE = ((128, 2e-6), (1024, 8e-6))
SMALL = ((128, 1.5e-6), (1024, 2.0e-6))
PER_BYTE_AT_128 = (2e-6 - 1.5e-6) / (2048 - 256)


@pytest.mark.parametrize(
    ("kv_bytes", "context", "small", "expected"),
    [
        (2048, 128, (), 2e-6),  # the probe's layer: what it measured
        (512, 128, (), 0.5e-6),  # one small layer measured: in proportion to the KV bytes
        (2048, 576, (), 5e-6),  # linear in context between the points
        (2048, 128, SMALL, 2e-6),  # both measured: each layer's own time
        (256, 128, SMALL, 1.5e-6),
        (512, 128, SMALL, 1.5e-6 + 256 * PER_BYTE_AT_128),  # affine in the KV bytes through the two
        (0, 128, SMALL, 1.5e-6 - 256 * PER_BYTE_AT_128),  # no KV bytes: the kernel's fixed cost
        (512, 128, ((128, 3e-6), (1024, 4e-6)), 3e-6),  # the small layer slower (noise): no cost per byte
    ],
)
def test_a_layers_decode_attention_is_affine_in_its_kv_bytes_through_the_probes_two_layers(
    kv_bytes, context, small, expected
):
    attention = perf.Attention(1e12, LARGE, small)
    assert attention.decode_seconds(context, kv_bytes) == pytest.approx(expected)


def attention_probe(small: bool) -> dict[str, Any]:
    """probe_object with the attention measured on its large layer (LARGE's times on one thread, eight threads' worth
    ten times as fast), and on the small one where `small`."""
    probe = probe_object(numa=2)
    for numa in probe["spec"]["numaNodes"]:
        for threads in (numa["oneThread"], numa["allCores"]):
            faster = min(threads["threads"], 8)
            threads["attentionPrefillFlopsPerSecond"] = 50e9 * faster
            threads["attentionDecodeSecondsPerSequence"] = {str(c): 10 * s / faster for c, s in LARGE}
            if small:
                threads["attentionSmallDecodeSecondsPerSequence"] = {str(c): 10 * s / faster for c, s in SMALL}
    return probe


def test_a_small_layers_fixed_cost_slows_a_small_models_batch_and_barely_moves_a_large_models():
    """Qwen2.5-0.5B's layers hold a quarter of the probe's KV bytes: in proportion, a quarter of its time; through
    the small layer, most of it. An 8B model's layers hold twice the probe's layer's bytes, near where the two
    ways agree."""

    def ratio(model: ModelSize) -> float:
        alone, both = (speeds(model, probe=attention_probe(small), streams=32) for small in (False, True))
        return both.throughput_tokens_per_second / alone.throughput_tokens_per_second

    assert ratio(qwen_05b()) < 0.97
    assert ratio(llama_8b()) == pytest.approx(1.0, abs=0.02)


def narrow_probe(share: float | None) -> dict[str, Any]:
    """probe_object whose 1,024-input products kept `share` of the wide ones' rates at every batch (None: not
    measured)."""
    probe = probe_object(numa=2)
    if share is not None:
        for numa in probe["spec"]["numaNodes"]:
            for threads in (numa["oneThread"], numa["allCores"]):
                wide = threads["bf16WeightBytesPerSecond"]
                threads["bf16NarrowWeightBytesPerSecond"] = {batch: rate * share for batch, rate in wide.items()}
    return probe


@pytest.mark.parametrize(
    ("width", "share", "rows", "prefill", "expected"),
    [
        (896, None, 1024, True, (896 / 1536) ** 0.75),  # not measured: in a prefill, the exponent fitted on AMX
        (896, None, 8, False, 1.0),  # and none in a decode step
        (1536, None, 1024, True, 1.0),
        (4096, None, 1024, True, 1.0),
        (896, 0.94, 1024, True, (896 / 1536) ** (math.log(0.94) / math.log(1024 / 1536))),  # 0.92
        (896, 0.77, 8, False, (896 / 1536) ** (math.log(0.77) / math.log(1024 / 1536))),  # a decode step's too
        (1024, 0.5, 32, False, 0.5),  # the probe's own width keeps what the probe measured
        (896, 1.2, 1024, True, 1.0),  # a narrow product faster than the wide one: no discount, never a bonus
        (2048, 0.5, 1024, True, 1.0),
    ],
)
def test_narrow_layers_keep_the_share_the_probes_narrow_product_kept_at_that_batch(
    width, share, rows, prefill, expected
):
    # Heads of 64 and an MLP as wide as the model: every layer's inputs are `width`.
    shape = {"hidden_size": width, "intermediate_size": width, "num_attention_heads": width // 64}
    model = size_model({**QWEN25_05B, **shape}, "bfloat16")
    numa = parse_performance(narrow_probe(share)).slowest()
    efficiency = perf.width_efficiency(model, numa, Serving(1, 8, BF16, 1.0), rows, prefill)
    assert efficiency == pytest.approx(expected)


def test_a_probe_whose_narrow_product_keeps_the_wide_rate_predicts_a_small_models_first_token_sooner():
    model = qwen_05b()
    fitted, measured = (speeds(model, probe=narrow_probe(share)) for share in (None, 1.0))
    assert measured.time_to_first_token_seconds < 0.9 * fitted.time_to_first_token_seconds
    assert measured.decode_tokens_per_second == fitted.decode_tokens_per_second  # unmeasured: no decode discount


def test_a_slow_narrow_product_slows_a_small_model_and_leaves_a_wide_one_as_it_was():
    small, wide = qwen_05b(), llama_8b()
    for model, slower in ((small, True), (wide, False)):
        fast, slow = (speeds(model, probe=narrow_probe(share)) for share in (1.0, 0.5))
        assert (slow.decode_tokens_per_second < 0.9 * fast.decode_tokens_per_second) is slower
        assert (slow.throughput_tokens_per_second < 0.9 * fast.throughput_tokens_per_second) is slower


@pytest.mark.parametrize(
    ("tp", "row_width"),
    [
        (1, 2048),  # every layer 2,048 wide: the probe's wide rate
        (2, 1024),  # o_proj and down_proj split their inputs: as narrow as the probe's narrow product on a rank
        (4, 512),
    ],
)
def test_a_row_parallel_layer_is_as_narrow_as_its_inputs_on_a_rank_and_counts_by_its_bytes(tp, row_width):
    model = size_model(
        {**QWEN25_05B, "hidden_size": 2048, "intermediate_size": 2048, "num_attention_heads": 32}, "bfloat16"
    )
    linears = model.anatomy.linears
    row_share = sum(x.parameters for x in linears if x.split == Split.ROW) / sum(x.parameters for x in linears)
    row = min(1.0, row_width / 1536) ** (math.log(0.5) / math.log(1024 / 1536))  # the probe's narrow share: 0.5
    numa_node = parse_performance(narrow_probe(0.5)).slowest()
    efficiency = perf.width_efficiency(model, numa_node, Serving(tp, 2, BF16, 1.0), 256, prefill=True)
    assert efficiency == pytest.approx(1 / (1 - row_share + row_share / row))
    assert (efficiency < 1) is (tp > 1)


def test_the_probes_object_is_read_and_says_where_it_came_from():
    node = parse_performance(probe_object("n7", numa=2))
    assert (node.node, len(node.numa), node.basis) == ("n7", 2, "probe")
    assert node.source == "probe of n7 (Test CPU), 2026-11-28T00:00:00Z"


def _broken(path: str, value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(probe_object())
    *parents, last = path.split(".")
    target: Any = obj
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    if value is None:
        del target[last]
    else:
        target[last] = value
    return obj


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("spec.numaNodes", [], "spec.numaNodes: List should have at least 1 item"),
        ("spec.pythonSeconds", None, "spec.pythonSeconds: Field required"),
        ("spec.numaNodes.0.oneThread.bf16WeightBytesPerSecond", None, "bf16WeightBytesPerSecond: Field required"),
        ("spec.numaNodes.0.oneThread.bf16WeightBytesPerSecond", {"one": 5.0}, "are not whole numbers"),
        ("spec.numaNodes.0.allCores.bf16WeightBytesPerSecond", {"1": 0.0}, "are not positive"),
        ("spec.numaNodes.0.allCores.readBytesPerSecond", "fast", "readBytesPerSecond: Input should be a valid number"),
    ],
)
def test_a_probe_object_that_cannot_be_read_is_refused_naming_the_field(path, value, message):
    with pytest.raises(NodePerformanceError, match=message):
        parse_performance(_broken(path, value))


@pytest.mark.parametrize(
    ("arch", "isa", "row"),
    [
        ("amd64", {"avx2", "avx512f", "avx512_bf16", "amx_tile"}, "amx_tile"),
        ("amd64", {"avx2", "avx512f", "avx512_bf16"}, "avx512_bf16"),
        ("amd64", {"avx2", "avx512f"}, "avx512f"),
        ("amd64", {"avx2"}, ""),
        ("arm64", {"bf16", "sve"}, ""),
    ],
    ids=["AMX", "AVX-512 BF16", "AVX-512 without bf16", "AVX2", "arm64"],
)
def test_a_node_no_probe_measured_is_estimated_by_its_isa_class(arch, isa, row):
    estimate = estimated_performance("n", arch, frozenset(isa), 2, 48)
    expected = next(r for r in perf.ESTIMATES if r.flag == row)
    assert (estimate.basis, estimate.source, len(estimate.numa)) == ("estimate", expected.source, 2)
    numa = estimate.numa[0]
    assert numa.one.read == expected.read
    assert numa.every.read == min(48 * expected.read, perf.NUMA_READ_ESTIMATE)


def test_every_plan_says_how_fast_it_serves_and_on_what_basis():
    nodes = [node("n1", numa=2)]
    estimated = plan_service(spec(), llama_8b(), nodes).predicted
    assert estimated is not None and estimated.basis == "estimate"
    probed = refine_profiles(nodes, [parse_performance(probe_object("n1", numa=2))])
    measured = plan_service(spec(), llama_8b(), probed).predicted
    assert measured is not None and measured.basis == "probe" and measured.source.startswith("probe of n1")
    assert measured.throughput_streams == 8 and measured.prompt_tokens == 1024
    slower = refine_profiles(nodes, [parse_performance(probe_object("n1", numa=2, scale=0.5))])
    assert plan_service(spec(), llama_8b(), slower).predicted.decode_tokens_per_second < (  # type: ignore[union-attr]
        measured.decode_tokens_per_second
    )


def test_a_shape_is_predicted_by_its_slowest_measured_member():
    nodes = [node("n1", numa=2), node("n2", numa=2)]
    probed = refine_profiles(
        nodes, [parse_performance(probe_object("n1", numa=2)), parse_performance(probe_object("n2", numa=2, scale=0.5))]
    )
    plan = plan_service(spec(), llama_8b(), probed)
    assert plan.predicted is not None and plan.predicted.source.startswith("probe of n2")


def test_a_node_without_avx512_is_estimated_slower_than_one_with_amx():
    amx = plan_service(spec(), llama_8b(), [node("n1", numa=2)]).predicted
    avx512 = plan_service(spec(), llama_8b(), [node("n1", numa=2, flags=AVX512_FLAGS)]).predicted
    assert amx is not None and avx512 is not None
    assert amx.time_to_first_token_seconds < avx512.time_to_first_token_seconds


def fixture(name: str) -> ModelSize:
    return size_model(json.loads((MODELS / f"{name}.json").read_text()), "bfloat16")


MODELS = Path(__file__).parent / "fixtures" / "models"


@pytest.mark.parametrize(
    ("nodes", "model", "fields", "tp", "basis"),
    [
        pytest.param(
            [node("spr-0", numa=2, cpu="224", memory="1Ti"), node("genoa-0", numa=8, cpu="384", memory="1536Gi",
             flags=AVX512_FLAGS)],
            "llama-3.1-8b", {}, 2, "amx_tile", id="mixed pool: SPR and Genoa NPS4",
        ),
        pytest.param([node("nps4", numa=4, cpu="96", memory="768Gi", flags=AVX512_FLAGS)], "llama-3.1-8b", {}, 4,
                     "avx512_bf16", id="NPS4"),
        pytest.param([node("snc", numa=4, cpu="112", memory="512Gi")], "llama-3.1-8b", {}, 4, "amx_tile", id="SNC"),
        pytest.param([node("avx2", numa=1, cpu="32", memory="128Gi", flags=("AVX2", "FMA3"))], "llama-3.1-8b", {}, 1,
                     "", id="AVX2"),
        pytest.param([node("arm", arch="arm64", numa=1, cpu="64", memory="256Gi", flags=())], "llama-3.1-8b", {}, 1,
                     "", id="arm64"),
        pytest.param([node("spr", numa=2, cpu="224", memory="1Ti")], "qwen3-next-80b-a3b", {}, 2, "amx_tile",
                     id="a hybrid MoE"),
        pytest.param([node("spr", numa=2, cpu="224", memory="1Ti")], "granite-4.0-h-small", {"kvCacheGiB": 4}, 2,
                     "amx_tile", id="Mamba2 hybrid MoE"),
    ],
)  # fmt: skip
def test_every_plan_is_predicted_on_every_kind_of_node(nodes, model, fields, tp, basis):
    plan = plan_service(spec(**fields), fixture(model), nodes)
    assert plan.tensor_parallel_size == tp
    p = plan.predicted
    assert p is not None and p.basis == "estimate"
    assert p.source == next(r.source for r in perf.ESTIMATES if r.flag == basis)
    assert 0 < p.decode_tokens_per_second < p.throughput_tokens_per_second
    assert 0 < p.time_to_first_token_seconds < 60


def test_a_moe_decodes_faster_than_a_dense_model_of_its_size_and_a_hybrids_state_is_read_per_sequence():
    """Qwen3-Next (80B, 3B active) against an 8B dense model on the same nodes: it reads its active experts."""
    nodes = [node("spr", numa=2, cpu="224", memory="1Ti")]
    moe = plan_service(spec(), fixture("qwen3-next-80b-a3b"), nodes).predicted
    dense = plan_service(spec(), llama_8b(), nodes).predicted
    assert moe is not None and dense is not None
    assert moe.decode_tokens_per_second > 0.5 * dense.decode_tokens_per_second  # ~3B active against 8B


def test_the_objective_flips_the_choice_in_a_mixed_pool_where_the_model_says_it_should():
    """Genoa NPS4 (8 NUMA nodes of memory) against two-socket SPR (AMX): one sequence's speed favours the eight
    NUMA nodes' bandwidth; tokens per CPU favour SPR's fewer, AMX cores. The plan says why it passed the other."""
    pool = [
        node("spr-0", numa=2, cpu="224", memory="1Ti"),
        node("genoa-0", numa=8, cpu="384", memory="1536Gi", flags=AVX512_FLAGS),
    ]
    per_cpu = plan_service(spec(), llama_8b(), pool)
    fastest = plan_service(spec(objective="latency"), llama_8b(), pool)
    assert (per_cpu.eligible_nodes, fastest.eligible_nodes) == (["spr-0"], ["genoa-0"])
    assert "objective throughput" in (per_cpu.passed_over or [""])[0]
    assert "objective latency" in (fastest.passed_over or [""])[0]


def test_with_placement_auto_the_objective_chooses_a_server_per_numa_node_or_tp():
    """An 8B model fits one NUMA node: a server on each serves more tokens per CPU, TP 2 one sequence faster. A
    0.5B model is faster alone on one NUMA node either way: TP's all-reduces cost more than its weights save."""
    nodes = [node("spr", numa=2, cpu="224", memory="1Ti")]
    many = plan_service(spec(placement="auto"), llama_8b(), nodes)
    one = plan_service(spec(placement="auto", objective="latency"), llama_8b(), nodes)
    assert (many.placement, many.tensor_parallel_size, many.capacity) == ("throughput", 1, 2)
    assert (one.placement, one.tensor_parallel_size) == ("tensorParallel", 2)
    small = plan_service(spec(placement="auto", objective="latency"), qwen_05b(), nodes)
    assert (small.placement, small.tensor_parallel_size) == ("throughput", 1)


PRICE = "cpullm.io/price-per-hour"


@pytest.mark.parametrize(
    ("prices", "cost"),
    [
        pytest.param([None, None], None, id="no-price-no-cost"),
        pytest.param(["3.6", "3.6"], 1.0, id="one-price"),
        pytest.param(["3.6", None], 1.0, id="unlabelled-member"),
        pytest.param(["3.6", "7.2"], 2.0, id="the-dearest-member"),
    ],
)
def test_a_price_per_node_hour_gives_a_cost_per_million_tokens(prices, cost):
    """cost = the node's price x the server's share of it / tokens per hour: a server taking a whole node at price
    P per hour and generating T tok/s costs P / (3600 T) per token; here in units of that figure."""
    nodes = [
        node(f"n{i}", numa=1, cpu="16", memory="64Gi", labels={PRICE: price} if price else {})
        for i, price in enumerate(prices)
    ]
    plan = plan_service(spec(model={"name": "Qwen/Qwen2.5-0.5B-Instruct"}, kvCacheGiB=1), qwen_05b(), nodes)
    p = plan.predicted
    assert p is not None
    if cost is None:
        assert p.cost_per_million_tokens is None
        return
    share = max(plan.cpu / plan.node_profile.cpus, plan.memory_limit_bytes / plan.node_profile.memory_bytes)
    whole_node = 3.6 / (p.throughput_tokens_per_second * 3600) * 1e6
    assert p.cost_per_million_tokens == pytest.approx(cost * share * whole_node, rel=1e-3)


@pytest.mark.parametrize("value", ["cheap", "-1", "NaN", "Infinity", "1e7", ""])
def test_a_price_label_that_is_no_price_is_refused_naming_the_label(value):
    with pytest.raises(NodeLabelError, match=f"label {PRICE}=.* is not a price per hour of the node"):
        node(labels={PRICE: value})


@pytest.mark.parametrize(("reserved", "threads", "shares"), [(0, 4, True), (1, 3, False)])
def test_a_rank_sharing_its_cores_with_the_front_end_pays_the_front_ends_work_each_step(reserved, threads, shares):
    """Where no CPU is reserved for them (reservedCpusPerRank 0, the default at 2 CPUs a rank), the API server and
    the engine core take each step's output work from the ranks: SHARED_CORES_PYTHON_MULTIPLE more of the probe's
    Python a step, and nothing else moves. A plan's figures are the model's with what the plan reserved."""
    model, probed = qwen_05b(), parse_performance(probe_object(cpus=4))
    kv = model.kv_bytes_per_token_per_rank(1)
    alone = decode_step(model, Serving(1, 2, BF16, 1.0), probed, 8, 512, kv)
    shared = decode_step(model, Serving(1, 2, BF16, 1.0, shares_cores=True), probed, 8, 512, kv)
    assert shared.python - alone.python == pytest.approx(perf.SHARED_CORES_PYTHON_MULTIPLE * probed.python_seconds)
    assert dataclasses.replace(shared, python=alone.python) == alone

    nodes = refine_profiles([node("n1", cpu="4")], [probed])
    cpu = {"cpusPerRank": 4, "reservedCpusPerRank": reserved}
    plan = plan_service(spec(placement="throughput", kvCacheGiB=1, maxModelLen=4096, cpu=cpu), model, nodes)
    assert plan.predicted is not None and plan.reserved_cpus_per_rank == reserved
    serving = Serving(1, threads, BF16, 1.0, shares_cores=shares)
    expected = predict(model, serving, probed, plan.predicted.throughput_streams, kv)
    assert plan.predicted.decode_tokens_per_second == pytest.approx(expected.decode_tokens_per_second, abs=0.01)
