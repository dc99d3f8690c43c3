"""Placement strategies (core/placement/): throughput, tensorParallel and the `auto` rule, as plan_service
applies them."""

import pytest

from cpullm.core.constants import GiB
from cpullm.core.memory import memory_budget
from cpullm.core.planner import plan_service
from cpullm.core.sizing import size_model
from cpullm.errors import InvalidPlacement, InvalidTensorParallelSize, ModelTooLarge

from .builders import QWEN25_05B, llama_8b, node, qwen_05b, spec

TOPOLOGY = "cpullm.io/topology-manager-policy"
# Routing through the Service: these tests are about placement (the router's room is tests/unit/test_routing.py's).
QWEN = {
    "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
    "kvCacheGiB": 1,
    "maxModelLen": 8192,
    "routing": {"mode": "service"},
}
CAPPED = "replicas capped: {} requested, {} NUMA nodes on the chosen nodes"
BEST_EFFORT = "NUMA alignment best-effort: "


def pool(count: int = 2, *, numa: int = 4, memory: str = "256Gi", topology: str | None = None, **kwargs):
    labels = {TOPOLOGY: topology} if topology else {}
    return [node(f"n{i}", numa=numa, cpu="64", memory=memory, labels=labels, **kwargs) for i in range(count)]


def note_parts(plan) -> list[str]:
    return plan.placement_note.split("; ") if plan.placement_note else []


@pytest.mark.parametrize(
    ("numa", "topology", "replicas", "planned", "capacity", "cpus_per_rank", "notes"),
    [
        pytest.param(4, None, 1, 1, 8, 16, [BEST_EFFORT], id="4numa-one-replica"),
        pytest.param(4, None, 8, 8, 8, 16, [BEST_EFFORT], id="4numa-exactly-capacity"),
        pytest.param(4, None, 10, 8, 8, 16, [CAPPED.format(10, 8), BEST_EFFORT], id="4numa-capped"),
        pytest.param(4, None, 0, 0, 8, 16, [BEST_EFFORT], id="4numa-scaled-to-zero"),
        pytest.param(4, "none", 3, 3, 8, 16, [BEST_EFFORT], id="topology-none-best-effort"),
        pytest.param(4, "best-effort", 3, 3, 8, 16, [BEST_EFFORT], id="topology-best-effort"),
        pytest.param(4, "single-numa-node", 3, 3, 8, 16, [], id="topology-single-numa-node-exact"),
        pytest.param(4, "restricted", 3, 3, 8, 16, [], id="topology-restricted-exact"),
        pytest.param(4, "single-numa-node", 10, 8, 8, 16, [CAPPED.format(10, 8)], id="capped-but-aligned"),
        pytest.param(2, None, 3, 3, 4, 32, [BEST_EFFORT], id="2numa"),
        pytest.param(1, None, 1, 1, 2, 64, [], id="1numa-no-alignment-note"),
        pytest.param(1, None, 3, 2, 2, 64, [CAPPED.format(3, 2)], id="1numa-capped"),
    ],
)
def test_throughput_runs_one_tp1_server_per_numa_node(
    numa, topology, replicas, planned, capacity, cpus_per_rank, notes
):
    model = qwen_05b()
    plan = plan_service(
        spec(placement="throughput", replicas=replicas, **QWEN), model, pool(numa=numa, topology=topology)
    )
    assert (plan.placement, plan.tensor_parallel_size) == ("throughput", 1)
    assert (plan.cpus_per_rank, plan.cpu) == (cpus_per_rank, cpus_per_rank)
    assert (plan.capacity, plan.replicas) == (capacity, planned)
    assert plan.weight_shard_bytes == model.weights_bytes
    assert plan.rank_in_engine_core and plan.engine_core_forked  # one rank per pod, the launcher's fix, on x86
    budget = memory_budget(
        model,
        1,
        model.weights_bytes,
        1,
        None,
        rank_in_engine_core=True,
        engine_core_forked=True,
        embeddings_packed=True,
    )  # the pool's nodes have AMX
    assert plan.memory_limit_bytes == budget.limit_bytes
    assert plan.memory_limit_bytes <= 256 * GiB // numa  # one pod fits one NUMA node's memory
    parts = note_parts(plan)
    assert len(parts) == len(notes)
    assert all(part.startswith(prefix) for part, prefix in zip(parts, notes, strict=True)), parts
    assert plan.eligible_nodes == ["n0", "n1"]


@pytest.mark.parametrize(
    ("labels", "numa", "noted"),
    [
        ({}, None, True),  # no label at all: planned as one NUMA node, and said so
        ({}, 2, False),
        ({"feature.node.kubernetes.io/memory-numa.node_count": "2"}, None, False),
    ],
    ids=["unlabelled", "cpullm-label", "nfd-label"],
)
def test_a_node_without_a_numa_count_is_planned_as_one_numa_node_with_a_note(labels, numa, noted):
    plan = plan_service(spec(**QWEN), qwen_05b(), [node("n0", numa=numa, cpu="64", labels=labels)])
    unknown = "NUMA count unknown: 1 assumed (no cpullm.io/numa-nodes or feature.node.kubernetes.io/memory-numa."
    assert plan.node_profile.numa_nodes == (numa or (2 if labels else 1))
    assert any(part.startswith(unknown) for part in note_parts(plan)) is noted, plan.placement_note


def test_throughput_summary_in_full():
    plan = plan_service(spec(placement="throughput", replicas=3, **QWEN), qwen_05b(), pool())
    assert plan.summary == (
        "throughput: TP 1 (one TP=1 server per NUMA node, 4 per node), KV 1 GiB/rank (explicit), launcher binding, "
        "16 CPU, 4.7 GiB on 2 amd64/4-NUMA/64-CPU nodes (n0, n1)"
    )
    assert plan.placement_note == (
        "NUMA alignment best-effort: the nodes' topology manager policy (label cpullm.io/topology-manager-policy, "
        "or their NodeResourceTopology) is not single-numa-node or restricted, so a pod's CPUs may span NUMA nodes "
        "(the launcher binds within them)"
    )


@pytest.mark.parametrize(
    ("fields", "tp"),
    [
        pytest.param({"tensorParallelSize": 1}, 1, id="explicit-tp1"),
        pytest.param({"cpu": {"threadsBind": "0-15"}}, 1, id="one-rank-bind-list"),
    ],
)
def test_throughput_accepts_an_explicit_single_rank(fields, tp):
    plan = plan_service(spec(placement="throughput", **QWEN, **fields), qwen_05b(), pool())
    assert (plan.placement, plan.tensor_parallel_size, plan.capacity) == ("throughput", tp, 8)


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"tensorParallelSize": 2}, id="explicit-tp2"),
        pytest.param({"cpu": {"threadsBind": "0-7|8-15"}}, id="two-rank-bind-list"),
    ],
)
def test_throughput_refuses_more_than_one_rank(fields):
    with pytest.raises(InvalidTensorParallelSize, match=r"^throughput placement runs one TP=1 server per NUMA node"):
        plan_service(spec(placement="throughput", **QWEN, **fields), qwen_05b(), pool())


@pytest.mark.parametrize(
    ("numa", "memory", "message"),
    [
        pytest.param(
            4,
            "64Gi",
            r"^the weights alone need 20\.0 GiB per pod \(18\.8 GiB per NUMA node for 1 rank\(s\) of 15\.0 GiB "
            r"weights\); amd64/4-NUMA/64-CPU nodes \(n0, n1\) have 16\.0 GiB \(16\.0 GiB per NUMA node\); try a "
            r"quantized checkpoint \(AWQ, GPTQ\), or nodes with more memory per NUMA node$",
            id="weights-exceed-one-numa-node",
        ),
        pytest.param(
            2,
            "44Gi",
            r"^needs 24\.2 GiB per pod \(23\.0 GiB per NUMA node for 1 rank\(s\) of 15\.0 GiB weights "
            r"\+ 4\.0 GiB KV\); "
            r"amd64/2-NUMA/64-CPU nodes \(n0, n1\) have 22\.0 GiB \(22\.0 GiB per NUMA node\); try a smaller "
            r"kvCacheGiB \(or maxModelLen, maxNumSeqs\), kvCacheDtype fp8, a quantized checkpoint, or nodes with more "
            r"memory$",
            id="weights-fit-but-not-with-kv",
        ),
    ],
)
def test_throughput_refuses_a_model_too_big_for_one_numa_node(numa, memory, message):
    with pytest.raises(ModelTooLarge, match=message):
        plan_service(spec(placement="throughput"), llama_8b(), pool(numa=numa, memory=memory))


@pytest.mark.parametrize(
    ("fields", "model", "numa", "count", "tp", "cpu", "capacity"),
    [
        pytest.param({}, "llama", 2, 2, 2, 64, 2, id="default-is-tensor-parallel"),
        pytest.param({"placement": "tensorParallel"}, "llama", 4, 2, 4, 64, 2, id="4numa"),
        pytest.param({"placement": "tensorParallel"}, "llama", 2, 3, 2, 64, 3, id="3-nodes"),
        pytest.param({"placement": "tensorParallel"}, "llama", 1, 1, 1, 64, 1, id="1numa"),
        # 14 attention heads, 2 KV heads: TP 4 is invalid, so 2 ranks of 16 CPUs on the 4-NUMA node.
        pytest.param({"placement": "tensorParallel", **QWEN}, "qwen", 4, 2, 2, 32, 2, id="qwen-steps-down"),
    ],
)
def test_tensor_parallel_is_one_pod_per_node_and_never_caps_replicas(fields, model, numa, count, tp, cpu, capacity):
    sized = llama_8b() if model == "llama" else qwen_05b()
    plan = plan_service(spec(replicas=10, **fields), sized, pool(count, numa=numa))
    assert (plan.placement, plan.tensor_parallel_size, plan.cpu) == ("tensorParallel", tp, cpu)
    waiting = f"10 replicas asked, the chosen nodes hold {capacity}: {10 - capacity} stay Pending until nodes like them"
    assert (plan.capacity, plan.replicas) == (capacity, 10)  # not capped: the rest wait Pending, and the note says so
    assert plan.placement_note is not None and plan.placement_note.startswith(waiting)
    assert plan.rank_in_engine_core == plan.engine_core_forked == (tp == 1)
    budget = memory_budget(
        sized, tp, plan.weight_shard_bytes, plan.kv_cache_gi_b, None,
        rank_in_engine_core=tp == 1, engine_core_forked=tp == 1, embeddings_packed=True,
    )  # fmt: skip
    assert plan.memory_limit_bytes == budget.limit_bytes
    assert plan.summary.startswith(f"tensorParallel: TP {tp} (one rank per NUMA node of {numa})")


@pytest.mark.parametrize(
    ("fields", "model", "numa", "memory", "placement", "tp"),
    [
        pytest.param(QWEN, "qwen", 2, "512Gi", "throughput", 1, id="qwen-fits-a-numa-node"),
        # Llama-8B at TP 1 with 4 GiB KV needs 24.2 GiB: 22 GiB per NUMA node cannot hold it, 44 GiB holds TP 2.
        pytest.param({}, "llama", 2, "44Gi", "tensorParallel", 2, id="llama-too-big-for-a-numa-node"),
        pytest.param({}, "llama", 2, "64Gi", "throughput", 1, id="llama-fits-32gi-numa-nodes"),
        pytest.param({}, "llama", 1, "256Gi", "throughput", 1, id="1numa-node"),
        # One TP=1 server's KV cache (1 GiB = 87381 tokens at TP 1) cannot hold 131072 tokens; TP 2 halves the
        # KV heads per rank and can.
        pytest.param({**QWEN, "maxModelLen": 131072}, "qwen-128k", 2, "512Gi", "tensorParallel", 2, id="kv-needs-tp2"),
    ],
)
def test_auto_picks_throughput_when_one_tp1_server_fits_a_numa_node(fields, model, numa, memory, placement, tp):
    """The `auto` rule: throughput when one TP=1 server (weights, KV cache for the context, runtime, server
    processes and /dev/shm) fits one NUMA node's memory; otherwise tensorParallel across the node."""
    sized = {
        "llama": llama_8b,
        "qwen": qwen_05b,
        "qwen-128k": lambda: size_model({**QWEN25_05B, "max_position_embeddings": 131072}, spec().model.dtype),
    }[model]()
    plan = plan_service(spec(placement="auto", **fields), sized, pool(numa=numa, memory=memory))
    assert (plan.placement, plan.tensor_parallel_size) == (placement, tp)
    assert plan.summary.startswith(f"{placement}: TP {tp} (")


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"tensorParallelSize": 2}, id="explicit-tp2"),
        pytest.param({"cpu": {"threadsBind": "0-7|8-15"}}, id="two-rank-bind-list"),
    ],
)
def test_auto_with_an_explicit_multi_rank_tp_plans_tensor_parallel(fields):
    plan = plan_service(spec(placement="auto", **QWEN, **fields), qwen_05b(), pool(numa=2, memory="512Gi"))
    assert (plan.placement, plan.tensor_parallel_size) == ("tensorParallel", 2)


def test_throughput_refuses_a_server_bigger_than_one_numa_node():
    """A throughput server is sized to one NUMA node: 32 CPUs per server on 16-CPU NUMA nodes would span two
    (and a single-numa-node kubelet would refuse the pod), so the plan refuses and names the way out."""
    fields = {**QWEN, "replicas": 10, "cpu": {"cpusPerRank": 32}}
    with pytest.raises(InvalidPlacement, match=r"one NUMA node \(16 CPUs on .*cpu.cpusPerRank is 32: lower it"):
        plan_service(spec(placement="throughput", **fields), qwen_05b(), pool(topology="single-numa-node"))


@pytest.mark.parametrize(
    ("placement", "model", "numa", "chosen"),
    [
        pytest.param("tensorParallel", "llama", 2, "tensorParallel", id="tensor-parallel"),
        pytest.param("throughput", "qwen", 4, "throughput", id="throughput"),
        pytest.param("auto", "qwen", 2, "throughput", id="auto-throughput"),
        pytest.param("auto", "llama", 2, "tensorParallel", id="auto-tensor-parallel"),
    ],
)
def test_summary_starts_with_the_strategy_name(placement, model, numa, chosen):
    sized, fields, memory = (llama_8b(), {}, "44Gi") if model == "llama" else (qwen_05b(), QWEN, "256Gi")
    plan = plan_service(spec(placement=placement, **fields), sized, pool(numa=numa, memory=memory))
    assert plan.placement == chosen
    assert plan.summary.split(": ")[0] == chosen


@pytest.mark.parametrize("placement", ["tensorParallel", "throughput", "auto"])
def test_weights_that_do_not_fit_are_model_too_large_before_the_kv_cache_is_judged(placement):
    """Memory is checked most fundamental first: a 1 GiB KV cache cannot hold 131072 tokens either, but a
    node that cannot hold the weights is what the user must hear about."""
    fields = {"placement": placement, "kvCacheGiB": 1, "maxModelLen": 131072}
    with pytest.raises(ModelTooLarge, match=r"^the weights alone need 20\.0 GiB per pod .* have 8\.0 GiB"):
        plan_service(spec(**fields), llama_8b(), [node(memory="8Gi")])
