"""The plan's picture (`cpullm plan --svg`): what it draws follows the plan, and the docs' pictures are the CLI's."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cpullm.api.plan import Plan
from cpullm.cli import main
from cpullm.commands import plan_table
from cpullm.planview import COLOURS, plan_svg

from .support import NODES, ROOT, direct_plan

SVG = "{http://www.w3.org/2000/svg}"
PICTURES = {
    "plan-llama-8b-amx.svg": "manifests/examples/llama-8b-amx.yaml",
    "plan-qwen-throughput.svg": "manifests/examples/qwen-throughput.yaml",
}


@pytest.mark.parametrize(
    ("example", "owners"),
    [
        ("manifests/examples/llama-8b-amx.yaml", ["rank 0", "rank 1"]),
        ("manifests/examples/qwen-throughput.yaml", ["server 0", "server 1"]),
    ],
)
def test_each_numa_node_shows_who_runs_there_and_their_cpus(example, owners):
    plan = Plan.model_validate(direct_plan(ROOT / example))
    svg = ET.fromstring(plan_svg(plan))
    texts = [t.text or "" for t in svg.iter(f"{SVG}text")]
    assert [t.split(": ", 1)[1] for t in texts if t.startswith("NUMA node ")] == owners
    fills = [r.get("fill") for r in svg.iter(f"{SVG}rect")]
    for index in range(len(owners)):  # a rank's CPUs, less its front-end core, in its colour (legend: one more)
        expected = plan.cpus_per_rank - plan.reserved_cpus_per_rank + (index == 0)
        assert fills.count(COLOURS[index]) == expected
    assert fills.count("#333333") == len(owners) * plan.reserved_cpus_per_rank + 1


@pytest.mark.parametrize(("picture", "example"), PICTURES.items())
def test_the_docs_pictures_are_what_the_cli_draws(picture, example, tmp_path, capsys):
    drawn = tmp_path / picture
    assert main(["plan", str(ROOT / example), "--nodes", NODES, "--svg", str(drawn)]) == 0
    assert "rank" in capsys.readouterr().out  # the table is printed as well
    committed = Path(ROOT / "docs" / "img" / picture).read_text()
    assert drawn.read_text() == committed, f"regenerate: cpullm plan {example} --nodes {NODES} --svg docs/img/{picture}"


def test_with_fewer_ranks_than_numa_nodes_neither_the_table_nor_the_picture_places_them():
    """Two ranks on a 4-NUMA node: the kubelet's cpuset decides which NUMA nodes they get, so the table leaves their
    NUMA node open and the picture says whose choice it is (both read Plan.rank_numa_nodes)."""
    plan = Plan.model_validate(direct_plan(ROOT / "manifests/examples/llama-8b-amx.yaml"))
    profile = plan.node_profile.model_copy(update={"numa_nodes": 4})
    plan = plan.model_copy(update={"node_profile": profile})
    assert plan.rank_numa_nodes() is None
    table = plan_table(plan).splitlines()
    ranks = [line.split() for line in table if line.split()[:1] in (["0"], ["1"])]
    assert [row[1] for row in ranks] == ["-", "-"]
    texts = [t.text or "" for t in ET.fromstring(plan_svg(plan)).iter(f"{SVG}text")]
    owners = [t.split(": ", 1)[1] for t in texts if t.startswith("NUMA node ")]
    assert owners == ["a rank (which NUMA node: the kubelet's cpuset)"] * 2 + ["not used"] * 2
