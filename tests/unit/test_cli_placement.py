"""`cpullm plan` explains the placement it chose and a context length it capped, in the plan and its summary."""

import json
from pathlib import Path

import pytest
import yaml

from cpullm.cli import main

from .builders import MISTRAL_7B_V03

ROOT = Path(__file__).resolve().parents[2]
NODES = str(ROOT / "examples" / "nodes.yaml")


def plan_of(tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: dict) -> dict:
    service = {"apiVersion": "cpullm.io/v1alpha1", "kind": "CpuLLMService", "metadata": {"name": "s"}, "spec": spec}
    (tmp_path / "svc.yaml").write_text(yaml.safe_dump(service))
    assert main(["plan", str(tmp_path / "svc.yaml"), "--nodes", NODES, "-o", "json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("placement", "summary_start", "tp", "replicas", "capacity"),
    [
        ("tensorParallel", "tensorParallel: TP 4 (one rank per NUMA node of 4)", 4, 6, 1),
        ("throughput", "throughput: TP 1 (one TP=1 server per NUMA node, 4 per node)", 1, 4, 4),
        ("auto", "throughput: TP 1 (one TP=1 server per NUMA node, 4 per node)", 1, 4, 4),
    ],
)
def test_plan_names_the_placement_and_why(tmp_path, capsys, placement, summary_start, tp, replicas, capacity):
    spec = {
        "model": {"name": "mistralai/Mistral-7B-v0.3", "config": MISTRAL_7B_V03},
        "placement": placement,
        "replicas": 6,
        "kvCacheGiB": 4,
        "maxModelLen": 8192,
        "cpu": {"requiredISA": ["avx512f"]},
        "nodeSelector": {"kubernetes.io/hostname": "avx512-4numa-0"},
    }
    plan = plan_of(tmp_path, capsys, spec)
    assert plan["summary"].startswith(summary_start)
    assert (plan["placement"], plan["tensorParallelSize"]) == (summary_start.split(":")[0], tp)
    assert (plan["replicas"], plan["capacity"]) == (replicas, capacity)
    if summary_start.startswith("throughput"):  # more than one server: routed through the router, given room
        assert "replicas capped: 6 requested, 4 NUMA nodes on the chosen nodes" in plan["placementNote"]
        assert "CPU and memory left on the nodes for: the router" in plan["placementNote"]
    assert plan["routing"] == ("router" if summary_start.startswith("throughput") else "service")


def test_plan_says_it_capped_a_context_length_left_open(tmp_path, capsys):
    """Mistral-7B: 32768 positions; 1 GiB of KV per rank at TP 4 holds 32768 tokens (2 KV heads of 8 per rank),
    at TP 1 8192: the context left open is capped to that and said so."""
    spec = {
        "model": {"name": "mistralai/Mistral-7B-v0.3", "config": MISTRAL_7B_V03},
        "kvCacheGiB": 1,
        "tensorParallelSize": 1,
        "cpu": {"requiredISA": ["avx512f"]},
        "nodeSelector": {"kubernetes.io/hostname": "avx512-4numa-0"},
    }
    plan = plan_of(tmp_path, capsys, spec)
    assert (plan["maxModelLen"], plan["maxModelLenSource"], plan["kvTokensPerRank"]) == (8192, "kv-cache", 8192)
    assert ", context 8192 (what the KV cache holds)," in plan["summary"]
