"""`cpullm launch-plan`: the in-pod launcher's decision on recorded /proc and /sys trees, for people debugging
a node's binding. Exact values per tree; a cpuset that cannot hold the ranks is one line and exit 1."""

import json
from pathlib import Path

import pytest

from cpullm.cli import main

TREES = Path(__file__).parent / "fixtures" / "cpu-trees"


@pytest.mark.parametrize(
    ("tree", "arch", "ranks", "reserved", "bind", "memory_nodes"),
    [
        ("xeon-2s-smt-whole", "x86_64", 2, 1, "0-6|8-14", "0,1"),
        ("xeon-2s-smt-whole", "x86_64", 1, 0, "0-15", "0,1"),
        ("xeon-2s-snc2-whole", "x86_64", 4, 0, "0-3|4-7|8-11|12-15", "0,1,2,3"),
        ("xeon-2s-guaranteed-node1", "x86_64", 1, 0, "8-11", "1"),
        ("xeon-2s-span-nodes-0-1", "x86_64", 1, 0, "6-9", "0,1"),
        ("graviton-1n-16", "aarch64", 1, 1, "0-14", "0"),
    ],
    ids=["2s-tp2", "2s-tp1-both-nodes", "snc-tp4", "node1-only", "span-tp1", "arm64-no-smt-rule"],
)
def test_launch_plan_prints_the_exact_knobs(capsys, tree, arch, ranks, reserved, bind, memory_nodes):
    args = ["launch-plan", "--root", str(TREES / tree), "--ranks", str(ranks), "--arch", arch]
    assert main([*args, "--reserved-cpus-per-rank", str(reserved)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["threadsBind"], printed["visibleMemoryNodes"]) == (bind, memory_nodes)
    assert len(printed["ranks"]) == ranks


def test_a_cpuset_that_cannot_hold_the_ranks_is_one_line_and_exit_1(capsys):
    root = TREES / "xeon-2s-guaranteed-node1"
    assert main(["launch-plan", "--root", str(root), "--ranks", "2", "--arch", "x86_64"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "cpullm: cannot place 2 ranks: cpuset 8-11,24-27 has CPUs on 1 NUMA node (1) but the plan has 2 ranks: "
        "one rank needs one NUMA node (VLLM_CPU_SIM_MULTI_NUMA=1 lets ranks share a node)\n"
    )
