"""The memory model (core/memory.py) and the time budgets (core/timing.py): each term scales with what it stands
for, and nothing else."""

import math

import pytest

from cpullm.api.spec import DType
from cpullm.core import memory, timing
from cpullm.core.constants import GiB, MiB
from cpullm.core.memory import memory_budget
from cpullm.core.sizing import size_model

from .builders import LLAMA_8B, QWEN25_05B


def model(**config):
    return size_model({**QWEN25_05B, **config}, DType.BFLOAT16)


def budget_of(sized, shard_bytes=0, tp=1, in_engine_core=False, packed=False):
    return memory_budget(sized, tp, shard_bytes, 1, None, rank_in_engine_core=in_engine_core, embeddings_packed=packed)


def test_the_limit_is_its_parts_rounded_up_to_a_mib():
    qwen = model()
    budget = budget_of(qwen, qwen.weights_bytes)
    server = memory.SERVER_BASE_BYTES + memory.SERVER_BYTES_PER_VOCAB_ENTRY * 151936
    runtime = memory.RANK_BASE_BYTES + memory.RANK_BYTES_PER_LAYER * 24
    assert (budget.server_bytes, budget.rank_runtime_bytes) == (server, runtime)
    margin = 1 + memory.MARGIN_FRACTION
    assert budget.per_rank_bytes == math.ceil((qwen.weights_bytes + GiB + runtime) * margin)
    measured = server + qwen.weights_bytes + GiB + runtime + memory.PAGE_CACHE_BYTES
    parts = measured * margin + memory.SHM_CHARGED_BASE_BYTES
    assert budget.limit_bytes == math.ceil(parts / MiB) * MiB  # to the byte but for rounding


@pytest.mark.parametrize(
    ("change", "term", "by"),
    [
        pytest.param({"vocab_size": 151936 + 1000}, "server_bytes", 1000 * memory.SERVER_BYTES_PER_VOCAB_ENTRY,
                     id="vocabulary-the-server-processes"),
        pytest.param({"num_hidden_layers": 24 + 4}, "rank_runtime_bytes", 4 * memory.RANK_BYTES_PER_LAYER,
                     id="layers-the-rank-runtime"),
        pytest.param({"hidden_size": 896 * 2, "num_attention_heads": 28}, "rank_runtime_bytes", 0,
                     id="width-only-the-weights"),
    ],
)  # fmt: skip
def test_each_term_grows_with_what_it_stands_for(change, term, by):
    before, after = model(), model(**change)
    grown = getattr(budget_of(after), term) - getattr(budget_of(before), term)
    assert grown == by


@pytest.mark.parametrize(
    ("config", "dtype", "tp", "copies_of"),
    [
        pytest.param({}, DType.BFLOAT16, 1, 151936 * 896 * 2, id="tied-bf16"),
        pytest.param({"tie_word_embeddings": False}, DType.BFLOAT16, 1, 151936 * 896 * 2, id="untied-the-same"),
        pytest.param({}, DType.FLOAT32, 1, 151936 * 896 * 4, id="float32-twice-the-bytes"),
        pytest.param({}, DType.BFLOAT16, 2, 151936 * 896 * 2 // 2, id="tp2-a-vocabulary-slice-per-rank"),
        pytest.param({"vocab_size": 32000, "hidden_size": 1792, "num_attention_heads": 28}, DType.BFLOAT16, 1,
                     32000 * 1792 * 2, id="vocabulary-times-width"),
    ],
)  # fmt: skip
def test_packed_embeddings_are_two_copies_of_the_vocabulary_matrix_per_rank(config, dtype, tp, copies_of):
    """The input embedding and the LM head each keep a oneDNN-packed copy, tied or not (vocab_parallel_embedding)."""
    sized = size_model({**QWEN25_05B, **config}, dtype)
    packed, unpacked = budget_of(sized, tp=tp, packed=True), budget_of(sized, tp=tp)
    assert packed.packed_embeddings_bytes == memory.PACKED_EMBEDDING_COPIES * copies_of and copies_of > 0
    assert unpacked.packed_embeddings_bytes == 0
    grown = packed.per_rank_bytes - unpacked.per_rank_bytes
    assert grown == pytest.approx(packed.packed_embeddings_bytes * (1 + memory.MARGIN_FRACTION), abs=1)


@pytest.mark.parametrize(
    ("arch", "isa", "dtype", "packs"),
    [
        ("amd64", {"avx2"}, "float32", True),  # measured: the copies are there
        ("amd64", {"avx2"}, "bfloat16", False),  # measured: "Failed to create oneDNN linear", torch's linear
        ("amd64", {"avx2"}, "float16", False),
        ("amd64", {"avx2", "avx512f"}, "bfloat16", True),
        ("amd64", {"avx2", "avx512f", "amx_bf16"}, "float16", True),
        ("amd64", {"avx2", "avx_ne_convert"}, "bfloat16", True),
        ("arm64", set(), "bfloat16", True),  # not measured: counted
    ],
)
def test_onednn_packs_the_embeddings_where_it_builds_a_matmul_for_the_dtype(arch, isa, dtype, packs):
    assert memory.onednn_packs_embeddings(arch, frozenset(isa), dtype) is packs


def test_a_rank_in_the_engine_core_process_counts_that_process_once():
    qwen = model()
    apart, together = budget_of(qwen, qwen.weights_bytes), budget_of(qwen, qwen.weights_bytes, in_engine_core=True)
    assert apart.server_bytes - together.server_bytes == memory.ENGINE_CORE_PROCESS_BYTES > 0
    assert (apart.rank_runtime_bytes, apart.shm_bytes) == (together.rank_runtime_bytes, together.shm_bytes)


def test_a_config_without_its_vocabulary_is_not_assumed_to_have_a_small_one():
    config = {k: v for k, v in QWEN25_05B.items() if k != "vocab_size"}
    sized = size_model(config, DType.BFLOAT16, weights_bytes=10**9)
    assert sized.anatomy.vocabulary is None
    expected = memory.SERVER_BASE_BYTES + memory.SERVER_BYTES_PER_VOCAB_ENTRY * memory.UNKNOWN_VOCABULARY
    assert budget_of(sized, 10**9).server_bytes == expected


@pytest.mark.parametrize(
    ("tp", "size", "counted"), [(1, 256 * MiB, 256 * MiB), (2, 768 * MiB, 512 * MiB), (4, 1280 * MiB, 768 * MiB)]
)
def test_shared_memory_is_sized_for_vllms_checks_and_counted_for_what_it_writes(tp, size, counted):
    assert (memory.shm_size_bytes(tp), budget_of(model(), tp=tp).shm_bytes) == (size, counted)


def test_the_ranks_share_nothing_but_the_server_and_the_page_cache():
    qwen = model()
    one, two = budget_of(qwen, 100 * MiB), budget_of(qwen, 100 * MiB, tp=2)
    shm_grew = two.shm_bytes - one.shm_bytes
    assert two.limit_bytes - one.limit_bytes == pytest.approx(one.per_rank_bytes + shm_grew, abs=MiB)


def test_a_step_is_the_models_prefill_of_the_batched_tokens_at_the_slowest_pace_per_cpu():
    llama = size_model(LLAMA_8B, DType.BFLOAT16)
    flops = 2 * llama.parameters * 2048
    assert timing.step_seconds(llama, 4) == pytest.approx(flops / (4 * timing.PREFILL_FLOPS_PER_CPU))
    assert timing.step_seconds(llama, 8) == pytest.approx(timing.step_seconds(llama, 4) / 2)


@pytest.mark.parametrize(
    ("sized", "cpus", "timeout"),
    [
        pytest.param(model(), 16, 300, id="small-model-many-cpus-vllms-default"),
        # 2 x 8.03e9 x 2048 / (2 x 15e9) = 1096 s a step; twice that.
        pytest.param(size_model(LLAMA_8B, DType.BFLOAT16), 2, 2193, id="8b-on-two-cpus"),
        pytest.param(size_model(LLAMA_8B, DType.BFLOAT16), 47, 300, id="8b-on-a-numa-node"),
    ],
)
def test_the_step_timeout_never_goes_below_vllms_own(sized, cpus, timeout):
    assert timing.step_timeout_seconds(sized, cpus) == timeout


def test_the_startup_budget_is_twice_a_cold_start_and_the_download():
    qwen = model()
    gib = qwen.weights_bytes / GiB
    cold = timing.START_FIXED_SECONDS + timing.LOAD_SECONDS_PER_WEIGHT_GIB * gib + timing.step_seconds(qwen, 2)
    expected = math.ceil(2 * cold + timing.DOWNLOAD_SECONDS_PER_WEIGHT_GIB * gib)
    assert timing.startup_seconds(qwen, 2, qwen.weights_bytes) == expected
    assert timing.startup_seconds(qwen, 1, qwen.weights_bytes) > expected  # fewer CPUs: a slower warm-up
