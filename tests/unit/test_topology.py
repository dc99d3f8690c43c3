import copy
from decimal import Decimal

import pytest

from cpullm.core.topology import node_state_changed, parse_node, parse_quantity
from cpullm.errors import NodeLabelError

from .builders import NFD, node_object


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("16", 16),
        ("15900m", Decimal("15.9")),
        ("64Gi", 64 * 2**30),
        ("65536Ki", 2**26),
        ("1e9", 10**9),
        ("2G", 2 * 10**9),
    ],
)
def test_parse_quantity(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "12Q", "1.2.3"])
def test_parse_quantity_rejects_garbage(text):
    with pytest.raises(ValueError):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("labels", "numa", "source"),
    [
        ({}, 1, "default"),
        ({f"{NFD}memory-numa.node_count": "4"}, 4, f"{NFD}memory-numa.node_count"),
        ({"cpullm.io/numa-nodes": "2", f"{NFD}memory-numa.node_count": "4"}, 2, "cpullm.io/numa-nodes"),
    ],
)
def test_numa_count_sources(labels, numa, source):
    profile = parse_node(node_object(numa=None, labels=labels))
    assert (profile.numa_nodes, profile.numa_source) == (numa, source)


def test_reads_isa_smt_policy_arch_and_allocatable():
    profile = parse_node(
        node_object(
            cpu="95900m",
            memory="500Gi",
            flags=("AVX512F", "AMXBF16", "AVX512VNNI", "AVX512BF16"),
            smt=True,
            policy="none",
            labels={"cpullm.io/isa.avx512f": "false", "cpullm.io/isa.avx512_fp16": "true"},
        )
    )
    assert profile.isa == {"amx_bf16", "avx512_vnni", "avx512_bf16", "avx512_fp16"}
    assert (profile.cpus, profile.memory_bytes) == (95, 500 * 2**30)
    assert (profile.smt, profile.cpu_manager_policy, profile.arch) == (True, "none", "amd64")


def test_arch_falls_back_to_node_info():
    obj = node_object()
    del obj["metadata"]["labels"]["kubernetes.io/arch"]
    obj["status"]["nodeInfo"] = {"architecture": "arm64"}
    assert parse_node(obj).arch == "arm64"


@pytest.mark.parametrize(
    "labels",
    [
        {"cpullm.io/numa-nodes": "two"},
        {"cpullm.io/numa-nodes": "0"},
        {"cpullm.io/numa-nodes": "65"},
        {f"{NFD}memory-numa.node_count": "-1"},
        {f"{NFD}cpu-cpuid.AVX512F": "yes"},
        {"cpullm.io/isa.amx_bf16": "1"},
        {f"{NFD}cpu-hardware_multithreading": "maybe"},
        {"cpullm.io/cpu-manager-policy": "dynamic"},
    ],
)
def test_unparseable_labels_raise_node_label_error(labels):
    with pytest.raises(NodeLabelError, match="node node-0: label"):
        parse_node(node_object(numa=None, labels=labels))


def test_unparseable_allocatable_raises():
    with pytest.raises(NodeLabelError, match="allocatable"):
        parse_node(node_object(cpu="lots"))


def heartbeat(obj):
    """The same node a minute later: new resourceVersion, conditions, images, addresses; labels untouched."""
    later = copy.deepcopy(obj)
    later["metadata"]["resourceVersion"] = "1002"
    later["metadata"]["annotations"] = {"node.alpha.kubernetes.io/ttl": "0"}
    later["status"]["conditions"] = [
        {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T12:01:00Z", "reason": "KubeletReady"}
    ]
    later["status"]["images"] = [{"names": ["vllm"], "sizeBytes": 1}]
    later["status"]["addresses"] = [{"type": "InternalIP", "address": "10.0.0.7"}]
    later["status"]["capacity"] = {"cpu": "66", "memory": "260Gi", "pods": "110"}  # allocatable wins
    return later


BASE = node_object("n1", numa=2)
TAINT = {"key": "dedicated", "value": "llm", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("after", "changed"),
    [
        pytest.param(node_object("n1", numa=2), False, id="same-object"),
        pytest.param(heartbeat(BASE), False, id="heartbeat-only"),
        pytest.param(node_object("n1", numa=2, labels={"team": "llm"}), True, id="new-label"),
        pytest.param(node_object("n1", numa=2, taints=[TAINT]), True, id="new-taint"),
        pytest.param(node_object("n1", numa=2, unschedulable=True), True, id="cordoned"),
        pytest.param(node_object("n1", numa=2, memory="128Gi"), True, id="other-memory"),
        pytest.param(node_object("n1", numa=2, cpu="32"), True, id="other-cpu"),
        pytest.param(node_object("n1", numa=4), True, id="other-numa-count"),
        pytest.param(node_object("n1", numa=2, flags=("AVX2",)), True, id="other-isa"),
    ],
)
def test_node_state_changed_between_two_profiles(after, changed):
    """Only what a plan reads (shape, memory, labels, taints, cordon) counts; status noise does not."""
    assert node_state_changed(parse_node(BASE), parse_node(after)) is changed


def test_node_state_changed_for_another_taint():
    """Replacing one taint by another is a change even though there is one taint before and after."""
    other = {"key": "dedicated", "value": "batch", "effect": "NoSchedule"}
    before = parse_node(node_object("n1", taints=[TAINT]))
    assert node_state_changed(before, parse_node(node_object("n1", taints=[TAINT]))) is False
    assert node_state_changed(before, parse_node(node_object("n1", taints=[other]))) is True


PROFILE = parse_node(BASE)
BAD_LABEL = NodeLabelError("node n1: label cpullm.io/numa-nodes='two' is not a NUMA node count (1-64)")


@pytest.mark.parametrize(
    ("before", "after", "changed"),
    [
        pytest.param(None, PROFILE, True, id="new-node"),
        pytest.param(PROFILE, None, True, id="removed-node"),
        pytest.param(None, None, False, id="never-there"),
        pytest.param(BAD_LABEL, NodeLabelError(BAD_LABEL.message), False, id="same-error-message"),
        pytest.param(BAD_LABEL, NodeLabelError("node n1: allocatable: not a quantity: 'lots'"), True, id="other-error"),
        pytest.param(PROFILE, BAD_LABEL, True, id="profile-to-error"),
        pytest.param(BAD_LABEL, PROFILE, True, id="error-to-profile"),
        pytest.param(BAD_LABEL, None, True, id="error-to-removed"),
        pytest.param(None, BAD_LABEL, True, id="new-node-with-error"),
    ],
)
def test_node_state_changed_across_appearance_and_label_errors(before, after, changed):
    """A label error is a state of its own: it changes when its message does (the report would differ)."""
    assert node_state_changed(before, after) is changed


def test_node_state_changed_when_a_probe_measures_the_node_or_measures_it_again():
    """A NodePerformance is not part of the node's shape, but the plan's prediction (and the shape a service
    chooses by it) reads it: its arrival, a new measurement and its removal re-plan the node's services."""
    from cpullm.core.node_facts import with_performance
    from cpullm.core.performance import parse_performance

    from .builders import probe_object

    plain = parse_node(node_object("n1"))
    probed = with_performance(plain, parse_performance(probe_object("n1")))
    again = with_performance(plain, parse_performance(probe_object("n1", scale=1.5)))
    assert node_state_changed(plain, probed) is True
    assert node_state_changed(probed, with_performance(plain, parse_performance(probe_object("n1")))) is False
    assert node_state_changed(probed, again) is True
    assert node_state_changed(again, plain) is True
