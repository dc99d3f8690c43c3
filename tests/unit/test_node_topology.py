"""NodeResourceTopology as the second node-facts source (core/node_topology.py): what is read from one, how it
refines a node's profile, plans that differ only because of it, and how pods then select nodes."""

from typing import Any

import pytest

from cpullm.core.node_facts import refine_profiles
from cpullm.core.node_topology import NUMA_SOURCE, parse_topology, with_topology
from cpullm.core.planner import plan_service
from cpullm.errors import ModelTooLarge, NodeTopologyError

from .builders import llama_8b, node, qwen_05b, spec, topology_object

GiB = 2**30
THROUGHPUT = {
    "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
    "placement": "throughput",
    "kvCacheGiB": 1,
    "maxModelLen": 8192,
    "routing": {"mode": "service"},
}


def test_a_topology_is_read_zone_by_zone():
    topology = parse_topology(topology_object("n1", cpus=(30, 32), memory_gib=(120, 128), policy="single-numa-node"))
    assert topology.node == "n1"
    assert [(z.name, z.cpus, z.memory_bytes) for z in topology.zones] == [
        ("node-0", 30, 120 * GiB),
        ("node-1", 32, 128 * GiB),
    ]
    assert topology.topology_manager_policy == "single-numa-node"


def with_zones(zones: list[Any], **fields: Any) -> dict[str, Any]:
    return {**topology_object("n1"), "zones": zones, **fields}


def zone(name: str = "node-0", type_: str = "Node", **resources: Any) -> dict[str, Any]:
    entries = [{"name": r, "capacity": v, "allocatable": v, "available": v} for r, v in resources.items()]
    return {"name": name, "type": type_, "resources": entries}


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        pytest.param(with_zones([]), "no zone of type Node", id="no-zones"),
        pytest.param(with_zones([zone(type_="Socket", cpu="8", memory="1Gi")]), "no zone of type Node", id="no-numa"),
        pytest.param({**topology_object(), "zones": "node-0"}, "zones is not a list", id="zones-not-a-list"),
        pytest.param(with_zones([zone(memory="1Gi")]), "zone node-0 has no cpu", id="no-cpu"),
        pytest.param(with_zones([zone(cpu="8")]), "zone node-0 has no memory", id="no-memory"),
        pytest.param(with_zones([zone(cpu="eight", memory="1Gi")]), "not a quantity: 'eight'", id="bad-quantity"),
        pytest.param(with_zones([zone(cpu="-1", memory="1Gi")]), "is negative", id="negative"),
        pytest.param(
            with_zones([zone(f"node-{i}", cpu="1", memory="1Gi") for i in range(65)]), "65 NUMA zones", id="too-many"
        ),
        pytest.param(
            {**topology_object(), "attributes": [{"name": "topologyManagerPolicy", "value": "strict"}]},
            "topologyManagerPolicy='strict' is not one of",
            id="unknown-policy",
        ),
    ],
)
def test_an_unusable_topology_is_a_typed_error_naming_it(obj: dict[str, Any], message: str):
    with pytest.raises(NodeTopologyError, match=message) as caught:
        parse_topology(obj)
    assert caught.value.message.startswith("NodeResourceTopology ")


def test_zones_of_other_types_are_ignored_and_millicores_are_whole_cpus():
    topology = parse_topology(
        with_zones([zone(cpu="16000m", memory="64Gi"), zone("socket-0", "Socket", cpu="32", memory="128Gi")])
    )
    assert [(z.name, z.cpus) for z in topology.zones] == [("node-0", 16)]


def test_a_topology_is_preferred_over_labels_for_numa_facts_and_the_policy():
    labelled = node("n1", numa=1, cpu="62")
    refined = with_topology(labelled, parse_topology(topology_object("n1", cpus=(30, 32), policy="restricted")))
    assert (refined.numa_nodes, refined.numa_source, refined.numa_cpus) == (2, NUMA_SOURCE, (30, 32))
    assert (refined.topology_manager_policy, refined.cpus_per_numa_node) == ("restricted", 30)
    assert refined.labels == labelled.labels and refined.cpus == 62  # the rest is the labels' and the node's
    # Without a policy attribute, the label's stays.
    labelled = node("n1", labels={"cpullm.io/topology-manager-policy": "best-effort"})
    assert with_topology(labelled, parse_topology(topology_object("n1"))).topology_manager_policy == "best-effort"


def test_topologies_are_merged_by_node_name():
    nodes = [node("a", numa=None), node("b", numa=None)]
    merged = refine_profiles(
        nodes, [parse_topology(topology_object("b", cpus=(32, 32))), parse_topology(topology_object("gone"))]
    )
    assert [(n.name, n.numa_nodes) for n in merged] == [("a", 1), ("b", 2)]
    assert refine_profiles(nodes, []) == nodes


def test_reserved_cpus_on_one_numa_node_shrink_each_throughput_server_only_with_a_topology():
    """Two CPUs reserved on NUMA node 0 of 64: 62 allocatable. From labels, each NUMA node's server gets 31;
    NUMA node 0 has 30, so with single-numa-node alignment the second server could never be admitted there."""
    nodes = [node(f"n{i}", numa=2, cpu="62") for i in range(2)]
    topologies = [parse_topology(topology_object(f"n{i}", cpus=(30, 32))) for i in range(2)]
    by_labels = plan_service(spec(**THROUGHPUT), qwen_05b(), nodes)
    by_topology = plan_service(spec(**THROUGHPUT), qwen_05b(), refine_profiles(nodes, topologies))
    assert (by_labels.cpus_per_rank, by_topology.cpus_per_rank) == (31, 30)
    assert (by_labels.node_profile.numa_cpus, by_topology.node_profile.numa_cpus) == ((), (30, 32))
    assert by_topology.node_profile.numa_source == NUMA_SOURCE
    differing = {k for k, v in by_labels.model_dump().items() if by_topology.model_dump()[k] != v}
    assert differing == {"cpus_per_rank", "cpu", "node_profile", "summary"}


def test_a_numa_count_only_a_topology_reports_gives_tensor_parallelism():
    nodes = [node("n1", numa=None)]  # no NUMA label: 1 assumed
    topologies = [parse_topology(topology_object("n1", cpus=(32, 32)))]
    assert plan_service(spec(), llama_8b(), nodes).tensor_parallel_size == 1
    plan = plan_service(spec(), llama_8b(), refine_profiles(nodes, topologies))
    assert (plan.tensor_parallel_size, plan.cpus_per_rank, plan.node_profile.numa_source) == (2, 32, NUMA_SOURCE)
    assert "NUMA count unknown" not in (plan.placement_note or "")


def test_a_reported_policy_that_aligns_numa_nodes_drops_the_best_effort_note():
    nodes = [node("n1", numa=2)]
    aligned = [parse_topology(topology_object("n1", policy="single-numa-node"))]
    assert "best-effort" in (plan_service(spec(**THROUGHPUT), qwen_05b(), nodes).placement_note or "")
    assert plan_service(spec(**THROUGHPUT), qwen_05b(), refine_profiles(nodes, aligned)).placement_note is None


def test_the_smallest_reported_numa_memory_bounds_a_server():
    nodes = [node("n1", numa=2, memory="64Gi")]
    small = [parse_topology(topology_object("n1", memory_gib=(3, 61)))]
    assert plan_service(spec(**THROUGHPUT), qwen_05b(), nodes).replicas == 1
    with pytest.raises(ModelTooLarge, match=r"\(3\.0 GiB per NUMA node\)"):
        plan_service(spec(**THROUGHPUT), qwen_05b(), refine_profiles(nodes, small))


def name_requirements(plan) -> list[tuple[str, list[str]]]:
    return [(f["operator"], f["values"]) for term in plan.node_selector_terms for f in term.get("matchFields") or []]


def test_nodes_labelled_like_the_chosen_ones_but_too_small_per_numa_node_are_excluded_by_name():
    """n0-n2 (31+31 CPUs) are chosen, 31 CPUs a server; n3, labelled the same, has 30 on NUMA node 0: the labels'
    term would select it, so it is excluded by name. Without topologies nothing is named."""
    nodes = [node(f"n{i}", numa=2, cpu="62") for i in range(4)]
    topologies = [parse_topology(topology_object(f"n{i}", cpus=(31, 31))) for i in range(3)]
    topologies.append(parse_topology(topology_object("n3", cpus=(30, 32))))
    plan = plan_service(spec(**THROUGHPUT), qwen_05b(), refine_profiles(nodes, topologies))
    assert (plan.eligible_nodes, plan.cpus_per_rank) == (["n0", "n1", "n2"], 31)
    assert len(plan.node_selector_terms) == 1
    assert name_requirements(plan) == [("NotIn", ["n3"])]
    assert name_requirements(plan_service(spec(**THROUGHPUT), qwen_05b(), nodes)) == []


def test_nodes_of_another_numa_count_labelled_alike_are_excluded_and_roomier_ones_are_not():
    nodes = [node(f"n{i}", numa=None) for i in range(4)]
    topologies = [parse_topology(topology_object(f"n{i}", cpus=(32, 32))) for i in range(2)]
    topologies.append(parse_topology(topology_object("n2", cpus=(32, 32), memory_gib=(200, 200))))
    plan = plan_service(spec(), llama_8b(), refine_profiles(nodes, topologies))
    # n3 has no topology: one NUMA node, as its labels say; TP 2 pods must not land there.
    assert plan.tensor_parallel_size == 2
    assert name_requirements(plan) == [("NotIn", ["n3"])]
