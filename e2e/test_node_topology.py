"""NodeResourceTopology, the second node-facts source, against the real API server with the real CRD (from its Go
module, scripts/fetch-crds.sh): installed after the operator started (Kopf's resource scanning then watches it),
a node's topology refines the plan where its labels cannot, and its going puts the labels' plan back."""

from __future__ import annotations

from typing import Any

from testbed.objects import fake_node, tiny_service, topology_object
from testbed.operator import InClusterOperator, Operator
from testbed.tools import Kubectl, eventually

from e2e.support import NodePool, container, install, ready

NODE_RESOURCE_TOPOLOGY_CRD = "noderesourcetopologies.topology.node.k8s.io"


def test_a_topology_installed_after_the_operator_shrinks_each_server_to_its_numa_node(
    kubectl: Kubectl,
    operator: Operator | InClusterOperator,
    namespace: str,
    nodes: NodePool,
    crd_files: dict[str, str],
):
    """Two CPUs reserved on NUMA node 0 of 64: the labels say 2 NUMA nodes and 62 CPUs, so each throughput server
    would take 31; the node's NodeResourceTopology says NUMA node 0 has 30, and the plan follows it."""
    name = f"nrt-{namespace[-5:]}"
    nodes.add(fake_node(name, numa=2, cpu="62", memory="128Gi", pool=namespace))
    service = tiny_service(
        "nrt", namespace, nodeSelector={"pool": namespace}, placement="throughput", cpu={}, routing={"mode": "service"}
    )
    kubectl.apply(service)
    assert ready(kubectl, namespace, "nrt", 1)["status"]["plan"]["cpusPerRank"] == 31

    install(kubectl, crd_files["NODERESOURCETOPOLOGY_CRD"], NODE_RESOURCE_TOPOLOGY_CRD)
    topology = topology_object(name, cpus=(30, 32), memory_gib=(64, 64), policy="single-numa-node")

    def planned(cpus: int, source: str) -> dict[str, Any]:
        plan = ready(kubectl, namespace, "nrt", 1)["status"]["plan"]
        assert (plan["cpusPerRank"], plan["nodeProfile"]["numaSource"]) == (cpus, source), plan["nodeProfile"]
        requested = container(kubectl.get("deployment", "nrt", namespace))["resources"]["requests"]["cpu"]
        assert requested == str(cpus)
        return plan

    try:
        kubectl.apply(topology)  # Kopf notices the CRD (its scanning watches CRDs) and starts watching its objects
        plan = eventually(lambda: planned(30, "NodeResourceTopology"), timeout=90, what="a plan of 30 CPUs a server")
        assert plan["nodeProfile"]["numaCpus"] == [30, 32]
        assert plan["nodeProfile"]["topologyManagerPolicy"] == "single-numa-node"
        assert "NUMA alignment best-effort" not in (plan.get("placementNote") or "")
        kubectl.run("delete", NODE_RESOURCE_TOPOLOGY_CRD, name)
        eventually(lambda: planned(31, "cpullm.io/numa-nodes"), timeout=90, what="the labels' plan again")
    finally:
        kubectl.run("delete", NODE_RESOURCE_TOPOLOGY_CRD, name, "--ignore-not-found", check=False)
