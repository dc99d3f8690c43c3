"""DaemonSets' room on nodes: what their pods request, where they run, and what whole-node plans leave them."""

from __future__ import annotations

from typing import Any

import pytest

from cpullm.core.constants import GiB, MiB
from cpullm.core.daemonsets import NO_ROOM, DaemonSetUnreadable, Room, parse_daemonset, rooms_on
from cpullm.core.placement.base import shapes_of
from cpullm.core.planner import plan_service
from cpullm.core.sizing import size_model

from .builders import QWEN25_05B, node, spec


def daemonset(name: str = "agent", containers: list[dict[str, Any]] | None = None, **pod: Any) -> dict[str, Any]:
    """A DaemonSet of one 100m/50Mi container (kind's kindnet asks that) unless the test says otherwise."""
    one = {"name": "c", "resources": {"requests": {"cpu": "100m", "memory": "50Mi"}}}
    template = {"spec": {"containers": containers if containers is not None else [one], **pod}}
    return {"kind": "DaemonSet", "metadata": {"name": name, "namespace": "kube-system"}, "spec": {"template": template}}


def container(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None, **more: Any) -> Any:
    return {"name": "c", "resources": {"requests": requests or {}, "limits": limits or {}}, **more}


@pytest.mark.parametrize(
    ("pod", "cpu_millis", "memory"),
    [
        ({}, 100, 50 * MiB),
        ({"containers": [container({"cpu": "250m"}), container({"cpu": "0.5", "memory": "1Gi"})]}, 750, GiB),
        ({"containers": [container(limits={"cpu": "1", "memory": "64Mi"})]}, 1000, 64 * MiB),  # limit as request
        # Init containers run before the others: the largest counts if it is larger than the containers together.
        ({"containers": [container({"cpu": "100m"})], "initContainers": [container({"cpu": "2"})]}, 2000, 0),
        # A sidecar (restartable init container) runs beside them: it adds up.
        (
            {
                "containers": [container({"cpu": "100m"})],
                "initContainers": [container({"cpu": "1"}, restartPolicy="Always")],
            },
            1100,
            0,
        ),
        ({"overhead": {"cpu": "50m", "memory": "10Mi"}}, 150, 60 * MiB),
        ({"containers": [container({"cpu": "1m"})]}, 1, 0),
        ({"containers": [container({"cpu": "0.0001"})]}, 1, 0),  # rounded up: never less than it asks
    ],
)
def test_what_a_daemon_pod_requests(pod, cpu_millis, memory):
    containers = pod.pop("containers", None)
    daemons = parse_daemonset(daemonset(containers=containers, **pod))
    assert daemons is not None
    assert (daemons.cpu_millis, daemons.memory_bytes) == (cpu_millis, memory)
    assert daemons.name == "kube-system/agent"


def test_a_daemonset_requesting_nothing_takes_no_room():
    assert parse_daemonset(daemonset(containers=[container()])) is None  # kube-proxy asks for nothing


@pytest.mark.parametrize(
    "pod",
    [
        {"containers": [container({"cpu": "lots"})]},
        {"tolerations": ["not an object"]},
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": "x"}}}},
        {"containers": "not a list"},
    ],
)
def test_an_unreadable_daemonset_says_which_it_is(pod):
    containers = pod.pop("containers", None)
    with pytest.raises(DaemonSetUnreadable, match="DaemonSet kube-system/agent"):
        parse_daemonset(daemonset(containers=containers, **pod))


TAINT = {"key": "dedicated", "value": "llm", "effect": "NoSchedule"}
OS_LINUX = {"nodeSelector": {"kubernetes.io/os": "linux"}}


@pytest.mark.parametrize(
    ("node_shape", "pod", "runs"),
    [
        ({}, {}, True),
        ({"labels": {"kubernetes.io/os": "linux"}}, OS_LINUX, True),
        ({}, OS_LINUX, False),
        ({"taints": [TAINT]}, {}, False),
        ({"taints": [TAINT]}, {"tolerations": [{"operator": "Exists"}]}, True),
        ({"taints": [TAINT]}, {"tolerations": [{"key": "dedicated", "value": "llm", "effect": "NoSchedule"}]}, True),
        ({"taints": [{**TAINT, "effect": "PreferNoSchedule"}]}, {}, True),  # a preference keeps no pod off
        # The DaemonSet controller's own tolerations: a cordoned or not-ready node still runs its daemons.
        (
            {"unschedulable": True, "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]},
            {},
            True,
        ),
        ({"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]}, {}, True),
        ({"taints": [{"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}]}, {}, False),
        (
            {"taints": [{"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}]},
            {"hostNetwork": True},
            True,
        ),
        (
            {"labels": {"type": "kwok"}},
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "type", "operator": "NotIn", "values": ["kwok"]}]}
                            ]
                        }
                    }
                }
            },
            False,
        ),
    ],
)
def test_where_a_daemonset_runs(node_shape, pod, runs):
    daemons = parse_daemonset(daemonset(**pod))
    assert daemons is not None
    assert daemons.runs_on(node(**node_shape)) is runs


@pytest.mark.parametrize(
    ("allocatable", "requests", "cpus", "memory_left"),
    [
        ("8", ["100m"], 7, 16 * GiB - 50 * MiB),  # kind's node: kindnet's 100m takes a whole CPU from a plan
        ("1900m", ["100m"], 1, 16 * GiB - 50 * MiB),  # 1.9 - 0.1 = 1.8: one whole CPU
        ("2", ["500m", "500m"], 1, 16 * GiB - 100 * MiB),
        ("1", ["1500m"], 0, 16 * GiB - 50 * MiB),  # never below zero
    ],
)
def test_room_is_left_on_the_nodes_the_daemons_run_on(allocatable, requests, cpus, memory_left):
    daemons = [
        parse_daemonset(daemonset(f"d{i}", containers=[container({"cpu": cpu, "memory": "50Mi"})]))
        for i, cpu in enumerate(requests)
    ]
    (shape,) = shapes_of([node(cpu=allocatable, memory="16Gi")], [d for d in daemons if d])
    assert (shape.node.cpus, shape.node.memory_bytes, shape.memory_bytes) == (cpus, memory_left, memory_left)
    assert shape.room.takers == tuple(f"kube-system/d{i}" for i in range(len(requests)))


def test_nodes_no_daemon_runs_on_keep_what_they_have():
    daemons = parse_daemonset(daemonset(nodeSelector={"pool": "gpu"}))
    assert daemons is not None
    before = node(cpu="8", memory="16Gi")
    assert rooms_on([before], [daemons]) == [NO_ROOM]
    for given in ([daemons], []):
        (shape,) = shapes_of([before], given)
        assert shape.node is before and shape.memory_bytes == before.memory_bytes


def test_nodes_that_keep_different_whole_cpus_are_different_shapes():
    """64.5 and 64 allocatable CPUs plan alike; less kindnet's 100m, one keeps 64 and the other 63."""
    kindnet = parse_daemonset(daemonset("kindnet"))
    assert kindnet is not None
    nodes = [node("a", cpu="64500m"), node("b", cpu="64"), node("c", cpu="64")]
    assert len(shapes_of(nodes)) == 1
    shapes = sorted(shapes_of(nodes, [kindnet]), key=lambda s: s.node.cpus)
    assert [(s.node.cpus, s.names) for s in shapes] == [(63, ["b", "c"]), (64, ["a"])]
    assert all(s.room == Room(100, 50 * MiB, ("kube-system/kindnet",)) for s in shapes)


def test_a_whole_node_plan_leaves_room_for_the_daemonsets_and_says_so():
    """A stock kind node: 8 allocatable CPUs and kindnet's 100m. The plan takes 7, not 8 (which stays Pending)."""
    qwen = size_model(QWEN25_05B, spec().model.dtype)
    kind_node = node("kind-worker", cpu="8", memory="16Gi", numa=None)
    kindnet = parse_daemonset(daemonset("kindnet", tolerations=[{"operator": "Exists"}]))
    assert kindnet is not None
    service = spec(model={"name": "Qwen/Qwen2.5-0.5B-Instruct"}, kvCacheGiB=1, maxModelLen=4096)
    alone = plan_service(service, qwen, [kind_node])
    beside = plan_service(service, qwen, [kind_node], daemons=[kindnet])
    assert (alone.cpu, beside.cpu) == (8, 7)
    assert beside.node_profile.cpus == 7 and beside.node_profile.memory_bytes == 16 * GiB - 50 * MiB
    assert beside.placement_note is not None
    assert "CPU and memory left on the nodes for: kube-system/kindnet" in beside.placement_note
    assert "DaemonSets" not in (alone.placement_note or "")
