import pytest

from cpullm.core import planner
from cpullm.core.children.deployment import vllm_env
from cpullm.core.constants import DTYPE_BYTES, GiB, MiB
from cpullm.core.memory import memory_budget
from cpullm.core.planner import plan_service, running_shape
from cpullm.core.sizing import size_model
from cpullm.errors import (
    InvalidTensorParallelSize,
    KVCacheTooSmall,
    ModelTooLarge,
    NoEligibleNode,
)

from .builders import AVX512_FLAGS, LLAMA_8B, QWEN25_05B, llama_8b, node, spec
from .support import EXAMPLES, direct_plan

LLAMA_SHARD_TP1 = 8_030_261_248 * 2


@pytest.mark.parametrize(
    ("numa", "tp", "cpus_per_rank", "reserved"),
    [
        (1, 1, 64, 1),
        (2, 2, 32, 1),
        (4, 4, 16, 1),
        (6, 4, 10, 1),  # TP 6 is unsupported: the largest valid size below is 4 (divides 32 and 8 heads)
        (8, 8, 8, 1),
    ],
)
def test_default_tp_is_one_rank_per_numa_node_within_vllm_limits(numa, tp, cpus_per_rank, reserved):
    plan = plan_service(spec(), llama_8b(), [node(numa=numa, cpu="64", memory="1Ti")])
    assert plan.tensor_parallel_size == tp
    assert plan.cpus_per_rank == cpus_per_rank
    assert plan.cpu == cpus_per_rank * tp
    assert plan.reserved_cpus_per_rank == reserved
    assert plan.threads_bind == "auto"
    assert plan.weight_shard_bytes == -(-LLAMA_SHARD_TP1 // tp)


def test_tp_follows_heads_of_small_models():
    qwen = size_model(QWEN25_05B, spec().model.dtype)  # 14 heads, 2 KV heads
    plan = plan_service(spec(maxModelLen=8192, kvCacheGiB=1), qwen, [node(numa=4, memory="1Ti")])
    assert plan.tensor_parallel_size == 2


@pytest.mark.parametrize(
    ("flags", "dtype", "packed"),
    [
        (("AVX2",), "bfloat16", False),  # vLLM falls back to torch's linear: no copy
        (("AVX2",), "float32", True),
        (("AVX2", "AVXNECONVERT"), "bfloat16", True),
        (AVX512_FLAGS, "bfloat16", True),
    ],
)
def test_the_packed_embeddings_follow_the_nodes_isa_and_the_dtype(flags, dtype, packed):
    """NFD's cpuid labels and spec.model.dtype decide whether the plan counts oneDNN's packed embeddings."""
    service = spec(model={"name": "meta-llama/Llama-3.1-8B-Instruct", "dtype": dtype})
    model = size_model(LLAMA_8B, service.model.dtype)
    plan = plan_service(service, model, [node(numa=2, cpu="64", memory="512Gi", flags=flags)])
    copies = 2 * 128256 * 4096 * DTYPE_BYTES[dtype] // plan.tensor_parallel_size
    assert plan.packed_embeddings_bytes == (copies if packed else 0)


def test_memory_plan_fields():
    """The plan carries the memory model's parts (core/memory.py; tests/unit/test_memory.py holds the formula)."""
    plan = plan_service(spec(), llama_8b(), [node(numa=2, cpu="96", memory="512Gi")])
    budget = memory_budget(
        llama_8b(), 2, plan.weight_shard_bytes, 4, None, rank_in_engine_core=False, embeddings_packed=True
    )
    assert plan.memory_limit_bytes == budget.limit_bytes
    assert (plan.rank_overhead_bytes, plan.server_overhead_bytes) == (budget.rank_runtime_bytes, budget.server_bytes)
    assert plan.packed_embeddings_bytes == budget.packed_embeddings_bytes > 0  # AMX: oneDNN builds bf16 matmuls
    assert (plan.page_cache_bytes, plan.shm_bytes) == (budget.page_cache_bytes, 256 * MiB + 2 * 256 * MiB)
    assert plan.kv_cache_gi_b == 4 and plan.kv_cache_source == "explicit"
    assert plan.kv_tokens_per_rank == 4 * GiB // 65536
    assert plan.image == "docker.io/vllm/vllm-openai-cpu:v0.32.0-x86_64"
    assert plan.node_profile.numa_nodes == 2 and plan.eligible_nodes == ["node-0"]


@pytest.mark.parametrize(
    ("smt", "policy", "reserved", "bind", "omp"),
    [
        (False, "static", None, "auto", None),
        (True, None, None, "auto", None),
        (True, "none", None, "nobind", 15),  # 32 CPUs per rank with SMT = 16 cores, 1 reserved
        (False, "none", 0, "nobind", 32),
        (False, "none", 4, "nobind", 28),
    ],
)
def test_thread_binding_follows_cpu_manager_policy_and_smt(smt, policy, reserved, bind, omp):
    cpu = {"reservedCpusPerRank": reserved} if reserved is not None else {}
    plan = plan_service(spec(cpu=cpu), llama_8b(), [node(numa=2, smt=smt, policy=policy)])
    assert (plan.threads_bind, plan.omp_num_threads) == (bind, omp)


def test_tiny_ranks_reserve_no_core():
    plan = plan_service(spec(), llama_8b(), [node(numa=2, cpu="4", memory="256Gi")])
    assert (plan.cpus_per_rank, plan.reserved_cpus_per_rank) == (2, 0)


def test_explicit_bind_list_sets_tp_and_allows_more_ranks_than_numa_nodes():
    plan = plan_service(spec(cpu={"threadsBind": "0|1"}), llama_8b(), [node(numa=1, cpu="2", memory="256Gi")])
    assert (plan.tensor_parallel_size, plan.threads_bind, plan.cpus_per_rank) == (2, "0|1", 1)


@pytest.mark.parametrize(
    ("fields", "numa", "message"),
    [
        ({"tensorParallelSize": 3}, 4, "does not divide the 32 attention heads"),
        ({"tensorParallelSize": 6}, 8, "6 is not supported"),
        ({"tensorParallelSize": 4}, 2, "exceeds the 2 NUMA nodes"),
        ({"tensorParallelSize": 2, "cpu": {"threadsBind": "0-3|4-7|8-11"}}, 4, "lists 3 ranks"),
    ],
)
def test_invalid_explicit_tp_is_refused(fields, numa, message):
    with pytest.raises(InvalidTensorParallelSize, match=message):
        plan_service(spec(**fields), llama_8b(), [node(numa=numa, memory="1Ti")])


def test_kv_derived_from_context_and_concurrency_rounds_up_to_whole_gib():
    fields = {"kvCacheGiB": None, "maxModelLen": 8192, "maxNumSeqs": 5}
    plan = plan_service(spec(**fields), llama_8b(), [node(numa=2, memory="1Ti")])
    # 8192 x 5 tokens x 65536 B per rank = 2.5 GiB -> 3
    assert (plan.kv_cache_gi_b, plan.kv_cache_source) == (3, "derived")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kvCacheGiB": 4, "maxModelLen": 131072}, "less than one sequence of 131072.*kvCacheGiB >= 8"),
        ({"kvCacheGiB": 1, "maxModelLen": 32768}, "holds 16384 tokens per rank"),
    ],
)
def test_kv_cache_that_cannot_hold_the_users_context_length_is_refused(fields, message):
    with pytest.raises(KVCacheTooSmall, match=message):
        plan_service(spec(**fields), llama_8b(), [node(numa=2, memory="1Ti")])


@pytest.mark.parametrize(
    ("kv_gib", "tp", "max_model_len", "source"),
    [
        # Llama-3.1-8B: 131072 positions; 65536 B/token per rank at TP 2 (8 KV heads / 2), 131072 B at TP 1.
        (4, 2, 65536, "kv-cache"),  # 4 GiB / 65536 B = 65536 tokens, a whole number of 128-token blocks
        (3, 1, 24576, "kv-cache"),  # 3 GiB / 131072 B = 24576 tokens
        (8, 2, None, "model"),  # holds all 131072 positions: vLLM takes the model's own length
    ],
)
def test_context_left_open_is_capped_to_what_the_kv_cache_holds(kv_gib, tp, max_model_len, source):
    fields = {"kvCacheGiB": kv_gib, "maxModelLen": None, "tensorParallelSize": tp}
    plan = plan_service(spec(**fields), llama_8b(), [node(numa=2, memory="1Ti")])
    assert (plan.max_model_len, plan.max_model_len_source) == (max_model_len, source)
    assert (f"context {max_model_len} (what the KV cache holds)" in plan.summary) is (source == "kv-cache")


@pytest.mark.parametrize(
    ("nodes", "fields", "message"),
    [
        ([node(flags=("AVX2",))], {"cpu": {"requiredISA": ["avx512f"]}}, "lacks ISA avx512f"),
        ([node(flags=AVX512_FLAGS)], {"cpu": {"requiredISA": ["amx_bf16", "avx512f"]}}, "lacks ISA amx_bf16"),
        ([node(arch="s390x")], {}, "arch s390x has no default vLLM CPU image"),
        ([node(unschedulable=True)], {}, "unschedulable"),
        ([node()], {"nodeSelector": {"pool": "llm"}}, "nodeSelector pool=llm"),
        ([node(taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])], {}, "taint dedicated=gpu"),
        (
            [node()],
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                            ]
                        }
                    }
                }
            },
            "required node affinity",
        ),
        ([], {}, "no node the planner can read"),
    ],
)
def test_no_eligible_node_names_why(nodes, fields, message):
    with pytest.raises(NoEligibleNode, match=message):
        plan_service(spec(**fields), llama_8b(), nodes)


@pytest.mark.parametrize(
    ("taint", "toleration"),
    [
        ({"key": "dedicated", "value": "llm", "effect": "NoSchedule"}, {"key": "dedicated", "value": "llm"}),
        ({"key": "dedicated", "value": "llm", "effect": "NoExecute"}, {"key": "dedicated", "operator": "Exists"}),
        ({"key": "x", "effect": "NoSchedule"}, {"operator": "Exists"}),
        ({"key": "soft", "effect": "PreferNoSchedule"}, None),
    ],
)
def test_tolerated_taints_keep_nodes_eligible(taint, toleration):
    fields = {"tolerations": [toleration]} if toleration else {}
    assert plan_service(spec(**fields), llama_8b(), [node(taints=[taint])]).eligible_nodes == ["node-0"]


def test_selector_and_affinity_narrow_the_pool():
    nodes = [
        node("a", labels={"pool": "llm", "zone": "z1"}),
        node("b", labels={"pool": "llm", "zone": "z2"}),
        node("c", labels={"zone": "z1"}),
    ]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z2"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]},
                ]
            }
        }
    }
    plan = plan_service(spec(nodeSelector={"pool": "llm"}, affinity=affinity), llama_8b(), nodes)
    assert plan.eligible_nodes == ["a", "b"]


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ([node(memory="20Gi")], r"needs 24\.2 GiB per pod .* have 20\.0 GiB"),
        (
            [node(numa=2, memory="26Gi")],
            r"14\.1 GiB per NUMA node for 1 rank\(s\).*have 26\.0 GiB \(13\.0 GiB per NUMA",
        ),
    ],
)
def test_too_small_nodes_refuse_with_model_too_large(nodes, message):
    with pytest.raises(ModelTooLarge, match=message):
        plan_service(spec(), llama_8b(), nodes)


@pytest.mark.parametrize(
    ("best", "value", "steps"),
    [
        (100.0, 100.0, 0),  # the best itself
        (100.0, 91.0, 0),  # within 10%: a tie
        (100.0, 90.0, 1),  # a step below (100 / 90 = 1.11)
        (100.0, 80.0, 2),
        (1.1**5 * 1.001, 1.1**5 * 0.999, 0),  # a hair apart across a fixed step's boundary: still a tie
        (100.0, 0.0, 10**6),  # nothing predicted: below everything
    ],
)
def test_an_objective_is_counted_in_steps_below_the_best_plan(best, value, steps):
    assert planner._steps_below(best, value) == steps


def test_heterogeneous_pool_prefers_a_shape_with_room_for_every_replica_then_the_objectives_prediction():
    pool = [
        node("amx-0", numa=2, cpu="96", memory="512Gi"),
        node("amx-1", numa=2, cpu="96", memory="512Gi"),
        node("big-0", numa=4, cpu="128", memory="1Ti", flags=AVX512_FLAGS),
        node("small-0", numa=1, cpu="16", memory="16Gi", flags=("AVX2",)),  # too small for 8B
        node("arm-0", arch="arm64", numa=1, cpu="64", memory="256Gi", flags=()),
    ]
    # Throughput per CPU: AMX's two ranks on 96 CPUs; one sequence's speed: four NUMA nodes' memory.
    one = plan_service(spec(), llama_8b(), pool)
    assert (one.tensor_parallel_size, one.eligible_nodes) == (2, ["amx-0", "amx-1"])
    plain = {"objective": "latency", "speculative": {"method": "off"}}
    fast = plan_service(spec(**plain), llama_8b(), pool)
    assert (fast.tensor_parallel_size, fast.eligible_nodes) == (4, ["big-0"])
    assert fast.predicted and one.predicted
    assert fast.predicted.decode_tokens_per_second > one.predicted.decode_tokens_per_second
    # With speculation left to the plan, AMX checks n-gram's proposals at about a plain step's cost and big-0's
    # AVX-512 (no bf16 matrix instructions) does not: the fastest single stream is AMX's, with n-gram.
    spec_fast = plan_service(spec(objective="latency"), llama_8b(), pool)
    assert spec_fast.eligible_nodes == ["amx-0", "amx-1"] and spec_fast.speculative
    assert spec_fast.speculative.method == "ngram"
    assert (
        spec_fast.predicted and spec_fast.predicted.decode_tokens_per_second > fast.predicted.decode_tokens_per_second
    )
    # Room for every replica first, whatever the prediction.
    two = plan_service(spec(replicas=2, objective="latency"), llama_8b(), pool)
    assert (two.tensor_parallel_size, two.eligible_nodes) == (2, ["amx-0", "amx-1"])
    avx512 = plan_service(spec(cpu={"requiredISA": ["avx512_bf16"]}, objective="throughput"), llama_8b(), pool)
    assert avx512.eligible_nodes == ["amx-0", "amx-1"]


def test_nodes_of_one_shape_share_a_plan_sized_for_the_smallest():
    plan = plan_service(spec(), llama_8b(), [node("a", memory="512Gi"), node("b", memory="300Gi")])
    assert plan.eligible_nodes == ["a", "b"] and plan.node_profile.memory_bytes == 300 * GiB


def test_arm64_gets_the_arm_image_and_explicit_image_wins():
    assert plan_service(spec(), llama_8b(), [node(arch="arm64", flags=())]).image.endswith("-arm64")
    assert plan_service(spec(image="me/vllm:1"), llama_8b(), [node(arch="s390x")]).image == "me/vllm:1"


def test_every_shape_refused_for_one_reason_reports_that_reason():
    """A model too large for every node is ModelTooLarge (for the shape that came closest), not NoEligibleNode."""
    nodes = [node("a", memory="8Gi"), node("b", arch="arm64", memory="12Gi", flags=())]
    with pytest.raises(ModelTooLarge, match=r"weights alone need .* arm64/1-NUMA/64-CPU nodes \(b\) have 12\.0 GiB"):
        plan_service(spec(), llama_8b(), nodes)


def test_mixed_refusals_across_shapes_become_no_eligible_node():
    nodes = [node("a", memory="8Gi", policy="none"), node("b", numa=4, memory="1Ti")]
    with pytest.raises(NoEligibleNode, match=r"exceeds the 4 NUMA nodes .*\(1: b\); the weights alone need .*\(1: a\)"):
        plan_service(spec(tensorParallelSize=8), llama_8b(), nodes)


def test_the_shape_a_service_runs_on_stays_while_it_is_good_enough():
    """Nodes of another, equally good shape joining the pool must not move running servers (each move restarts
    them): the current plan's shape wins over more nodes elsewhere, but not over room for every replica."""
    running_pool = [node(f"a{i}", numa=2, cpu="96", memory="512Gi") for i in range(2)]
    leaner_pool = [node(f"b{i}", numa=2, cpu="64", memory="512Gi") for i in range(3)]
    fresh = plan_service(spec(replicas=2), llama_8b(), running_pool + leaner_pool)
    assert fresh.eligible_nodes == ["b0", "b1", "b2"]  # nothing runs yet: more throughput per CPU wins
    current = plan_service(spec(replicas=2), llama_8b(), running_pool).model_dump(by_alias=True, mode="json")
    kept = plan_service(spec(replicas=2), llama_8b(), running_pool + leaner_pool, current)
    assert kept.eligible_nodes == ["a0", "a1"]
    moved = plan_service(spec(replicas=3), llama_8b(), running_pool + leaner_pool, current)
    assert moved.eligible_nodes == ["b0", "b1", "b2"]  # only the other shape has room for 3 replicas


def test_speculation_kept_off_for_servers_planned_before_it_holds_on_their_shape_alone():
    """A plan from an operator that did not choose speculation (no status.plan.speculative) keeps auto off where its
    servers run, rather than restart them for it; a shape they do not run on is weighed as a fresh plan (n-gram on
    AMX for latency), since moving there restarts them anyway."""
    latency = spec(objective="latency")
    amx = [node("amx-0", numa=2, cpu="96", memory="512Gi")]
    other = [node("amx-wide-0", numa=2, cpu="128", memory="512Gi")]
    fresh = plan_service(latency, llama_8b(), amx)
    assert fresh.speculative is not None and fresh.speculative.method == "ngram"
    older = {k: v for k, v in fresh.model_dump(by_alias=True, mode="json").items() if k != "speculative"}
    kept = plan_service(latency, llama_8b(), amx + other, older)
    assert kept.eligible_nodes == ["amx-0"]
    assert kept.speculative is not None and (kept.speculative.method, kept.speculative.kept_off) == ("off", True)
    moved = plan_service(latency, llama_8b(), other, older)
    assert moved.speculative is not None and moved.speculative.method == "ngram" and not moved.speculative.kept_off


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_a_running_service_is_planned_again_exactly_as_first(example):
    """The operator plans a running service again with its status.plan; on unchanged nodes that plan must read as
    the first did, and as `cpullm plan` prints it: what the running servers keep (their speculation) is weighed
    on their shape alone, not lent to the shapes passed over (a kind run found passedOver's reason changed)."""
    first = direct_plan(example)
    assert direct_plan(example, current=first) == first


@pytest.mark.parametrize(
    ("stored", "same"),
    [
        pytest.param(lambda profile: profile, True, id="as-written"),
        pytest.param(lambda profile: {k: v for k, v in profile.items() if k != "numaCpus"}, True, id="before-numaCpus"),
        pytest.param(lambda profile: {**profile, "memoryBytes": 1}, True, id="memory-is-not-shape"),
        pytest.param(lambda profile: {**profile, "isa": profile["isa"][::-1]}, True, id="isa-in-any-order"),
        pytest.param(lambda profile: {**profile, "isa": [*profile["isa"], "amx_tile"]}, False, id="isa"),
        pytest.param(lambda profile: {**profile, "cpus": profile["cpus"] + 1}, False, id="cpus"),
        pytest.param(lambda profile: {"arch": "amd64"}, False, id="unreadable"),
    ],
)
def test_one_node_shape_from_the_node_to_the_stored_plan_and_back(stored, same):
    """A node's shape is one value: the planner groups nodes by it, status.plan stores it whole, and the plan a
    service runs is read back into the same value (memory aside, older plans included)."""
    nodes = [node("a", numa=2, cpu="96", memory="512Gi")]
    plan = plan_service(spec(), llama_8b(), nodes)
    assert plan.node_profile.shape == nodes[0].shape
    profile = plan.model_dump(by_alias=True, mode="json")["nodeProfile"]
    current = {"nodeProfile": stored(profile)}
    assert (running_shape(current) == nodes[0].shape) is same


CLAIM = {"persistentVolumeClaim": {"claimName": "models"}}


@pytest.mark.parametrize(
    ("fields", "aot"),
    [
        pytest.param({"modelCache": CLAIM}, True, id="claim"),
        pytest.param({"modelCache": {"nodeLocal": True}}, True, id="node-local"),
        pytest.param({}, False, id="default-pod-local-cache"),
        pytest.param({"modelCache": {"emptyDir": {}}}, False, id="pod-local-cache"),
        pytest.param({"modelCache": CLAIM, "cpu": {"launcher": False}}, False, id="no-launcher-no-fix"),
        pytest.param({"modelCache": CLAIM, "env": [{"name": "CPULLM_VLLM_FIXES_OFF", "value": "aot_cache_loads"}]},
                     False, id="fix-turned-off"),
        pytest.param({"modelCache": CLAIM, "env": [{"name": "CPULLM_VLLM_FIXES_OFF", "value": "short_warm_up"}]},
                     True, id="another-fix-turned-off"),
        pytest.param({"modelCache": CLAIM, "env": [{"name": "CPULLM_VLLM_FIXES_OFF", "valueFrom": {
                     "configMapKeyRef": {"name": "f", "key": "off"}}}]}, False, id="turned-off-by-reference-unknown"),
    ],
)  # fmt: skip
def test_vllms_aot_compile_cache_is_on_where_a_new_pod_finds_it_and_the_launchers_fix_loads_it(fields, aot):
    """On a pod-local cache every pod's start is a first start, which the AOT cache makes longer; without the fix
    vLLM cannot load the cache on CPU, and would compile and save again at every start."""
    plan = plan_service(spec(**fields), llama_8b(), [node(numa=2, cpu="64", memory="1Ti")])
    assert plan.aot_compile_cache is aot
    env = {e["name"]: e.get("value") for e in vllm_env(spec(**fields), plan)}
    assert env["VLLM_USE_AOT_COMPILE"] == ("1" if aot else "0")


@pytest.mark.parametrize(
    ("fields", "numa", "arch", "in_engine_core", "forked"),
    [
        pytest.param({}, 1, "amd64", True, True, id="one-rank"),
        pytest.param({}, 1, "arm64", True, False, id="one-rank-gnu-openmp-spawned"),
        pytest.param({}, 2, "amd64", False, False, id="two-ranks"),
        pytest.param({"cpu": {"launcher": False}}, 1, "amd64", False, False, id="no-launcher-no-fix"),
        pytest.param({"env": [{"name": "CPULLM_VLLM_FIXES_OFF", "value": "short_warm_up, rank_in_engine_core"}]}, 1,
                     "amd64", False, False, id="fix-turned-off"),
        pytest.param({"env": [{"name": "CPULLM_VLLM_FIXES_OFF", "value": "engine_core_forked"}]}, 1, "amd64", True,
                     False, id="fork-turned-off"),
        pytest.param({"env": [{"name": "CPULLM_VLLM_FIXES_OFF", "value": "short_warm_up"}]}, 1, "amd64", True, True,
                     id="another-fix-turned-off"),
        pytest.param({"env": [{"name": "CPULLM_VLLM_FIXES_OFF", "valueFrom": {"configMapKeyRef": {"name": "f",
                     "key": "off"}}}]}, 1, "amd64", False, False, id="turned-off-by-reference-unknown"),
        pytest.param({"env": [{"name": "VLLM_ENABLE_V1_MULTIPROCESSING", "value": "1"}]}, 1, "amd64", False, False,
                     id="multiprocess-executor-asked-for"),
        pytest.param({"env": [{"name": "VLLM_ENABLE_V1_MULTIPROCESSING", "value": "0"}]}, 1, "amd64", True, True,
                     id="one-process-executor-asked-for"),
    ],
)  # fmt: skip
def test_the_rank_runs_in_the_engine_core_only_where_the_launchers_fix_does_it(
    fields, numa, arch, in_engine_core, forked
):
    """The memory limit counts the engine core's process once where the rank runs in it, and the imports it shares
    with the API server once where it is forked (cpullm/vllm_fixes.py)."""
    flags = () if arch == "arm64" else ("avx2",)
    plan = plan_service(spec(**fields), llama_8b(), [node(numa=numa, cpu="64", memory="1Ti", arch=arch, flags=flags)])
    assert (plan.rank_in_engine_core, plan.engine_core_forked) == (in_engine_core, forked)
    budget = memory_budget(
        llama_8b(), plan.tensor_parallel_size, plan.weight_shard_bytes, plan.kv_cache_gi_b, None,
        rank_in_engine_core=in_engine_core, engine_core_forked=forked, embeddings_packed=arch == "arm64",
    )  # fmt: skip  # x86 here has AVX2 alone: bf16 falls back to torch's linear
    assert plan.memory_limit_bytes == budget.limit_bytes


def test_passed_over_reads_the_same_offline_and_once_the_service_runs():
    """The shape a service runs on wins ties; a shape that lost on its own merits is said to, in the operator as
    offline."""
    nodes = [node("big", numa=4, cpu="128", memory="512Gi"), node("small", numa=2, cpu="64", memory="512Gi")]
    offline = plan_service(spec(), llama_8b(), nodes)
    running = plan_service(spec(), llama_8b(), nodes, offline.model_dump(by_alias=True, mode="json"))
    assert (
        offline.passed_over
        == running.passed_over
        == [
            "tensorParallel TP 4 on amd64/4-NUMA/128-CPU nodes (big): predicted 1.76 tok/s per CPU at 8 sequences "
            "there, 2.33 tok/s per CPU at 8 sequences for the chosen plan (objective throughput)"
        ]
    )
