from decimal import Decimal

import pytest

from cpullm.core.topology import parse_node, parse_quantity
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
