"""Faults: the API server and etcd going away mid-reconcile, the operator SIGKILLed while 100
services are created, children deleted en masse, the operator's connections cut. After each, every service's
status must agree with its children within a short retry, with no duplicate children, no operator restart and
no traceback in its log (a transient API error is one warning line and a short jittered retry)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from testbed.cluster import LocalCluster
from testbed.objects import fake_node
from testbed.operator import InClusterOperator, Operator
from testbed.proxy import CuttableProxy
from testbed.tools import Kubectl, eventually, free_port

from e2e.support import SETTLE_SECONDS, LogMark, NodePool, converged, create, pool

RESYNC_SECONDS = 10  # the relayed operator's listing of its children (settings.resync_seconds; default 300)


@pytest.fixture
def local(local_cluster: LocalCluster | None, operator: Operator | InClusterOperator) -> tuple[LocalCluster, Operator]:
    assert isinstance(operator, Operator), "a test of a local operator process is marked local_operator"
    if local_cluster is None:
        pytest.skip("stops control-plane processes of the local cluster; this cluster is another")
    return local_cluster, operator


@pytest.mark.local_operator
@pytest.mark.parametrize(("component", "down_seconds", "services"), [("kube-apiserver", 30, 50), ("etcd", 15, 30)])
def test_control_plane_outage_mid_reconcile(
    kubectl: Kubectl,
    local: tuple[LocalCluster, Operator],
    namespace: str,
    nodes: NodePool,
    component: str,
    down_seconds: int,
    services: int,
):
    cluster, operator = local
    selector = pool(nodes, namespace)
    log = LogMark(operator)
    assert operator.process is not None
    pid = operator.process.pid
    names = create(kubectl, namespace, "outage", services, selector)
    eventually(lambda: kubectl.get("deployment", names[0], namespace), timeout=30, what="first Deployment")
    cluster.outage(component, down_seconds)  # the others are mid-flight
    eventually(lambda: kubectl.run("get", "--raw", "/readyz", check=False).returncode == 0, what="API back")
    took = converged(kubectl, namespace, names, timeout=180, log=log)
    print(f"{component} down {down_seconds}s: {services} services settled {took:.1f}s after it was back")
    assert operator.process.pid == pid and operator.process.poll() is None, "the operator restarted"
    log.assert_quiet()


def test_sigkill_while_100_services_are_created(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str, nodes: NodePool
):
    names = create(kubectl, namespace, "burst", 100, pool(nodes, namespace))
    eventually(lambda: kubectl.get("deployment", names[0], namespace), timeout=30, what="first Deployment")
    operator.kill()  # most are mid-flight
    operator.start()
    converged(kubectl, namespace, names, timeout=180)
    assert len(kubectl.get("pods", namespace=namespace)) == len(names)


def test_children_deleted_for_many_services_at_once_come_back(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str, nodes: NodePool
):
    names = create(kubectl, namespace, "mass", 40, pool(nodes, namespace))
    converged(kubectl, namespace, names, timeout=120)
    before = {d["metadata"]["uid"] for d in kubectl.get("deployments", namespace=namespace)}
    kubectl.run("delete", "deployments,services", "--all", "-n", namespace, "--wait=false")
    eventually(
        lambda: not before & {d["metadata"]["uid"] for d in kubectl.get("deployments", namespace=namespace)},
        timeout=60,
        what="every Deployment replaced",
    )
    converged(kubectl, namespace, names)


@pytest.fixture
def proxied_operator(
    kubectl: Kubectl, operator: Operator | InClusterOperator, workdir: Path
) -> Iterator[tuple[Operator, CuttableProxy]]:
    """The suite's operator stopped and one started in its place that reaches the API server through a relay."""
    assert isinstance(operator, Operator), "a test of a local operator process is marked local_operator"
    operator.stop()
    proxy = CuttableProxy.for_kubeconfig(Path(kubectl.kubeconfig), workdir / "kubeconfig-proxied")
    relayed = Operator(
        str(workdir / "kubeconfig-proxied"),
        workdir / "operator-proxied.log",
        free_port(),
        env={"CPULLM_RESYNC_SECONDS": str(RESYNC_SECONDS)},
    )
    try:
        relayed.start()
        yield relayed, proxy
    finally:
        relayed.stop()
        proxy.close()
        operator.start()


@pytest.mark.local_operator
def test_cut_connections_resume_watching(
    kubectl: Kubectl, proxied_operator: tuple[Operator, CuttableProxy], namespace: str, nodes: NodePool
):
    relayed, proxy = proxied_operator
    selector = pool(nodes, namespace, count=1)
    log = LogMark(relayed)
    names = create(kubectl, namespace, "cut", 5, selector)
    converged(kubectl, namespace, names)
    for attempt in range(3):
        assert proxy.cut() > 0, "the operator held no connection to cut"
        # Only a resumed watch sees these: a spec change, a new service, a deleted child.
        kubectl.run("scale", "cpullm", names[0], "-n", namespace, f"--replicas={2 - attempt % 2}")
        names += create(kubectl, namespace, f"cut-{len(names)}", 1, selector)
        kubectl.run("delete", "service", names[1], "-n", namespace)
        converged(kubectl, namespace, names)
    log.assert_quiet()


@pytest.mark.local_operator
def test_a_child_deleted_while_the_operator_was_cut_off_and_the_api_server_restarted_comes_back(
    kubectl: Kubectl,
    local: tuple[LocalCluster, Operator],
    proxied_operator: tuple[Operator, CuttableProxy],
    namespace: str,
    nodes: NodePool,
):
    """The restarted API server has forgotten the operator's watch positions, so Kopf lists again, and a listing
    says nothing of what was deleted meanwhile: only the operator's periodic listing of its children finds the
    missing Deployment (with it turned off, the Deployment was not applied again within 90 s)."""
    cluster, _ = local
    relayed, proxy = proxied_operator
    log = LogMark(relayed)
    names = create(kubectl, namespace, "unseen", 3, pool(nodes, namespace, count=1))
    converged(kubectl, namespace, names)
    gone = kubectl.get("deployment", names[0], namespace)["metadata"]["uid"]
    with proxy.down():
        kubectl.run("delete", "deployment", names[0], "-n", namespace)
        cluster.outage("kube-apiserver", 1)
        eventually(lambda: kubectl.run("get", "--raw", "/readyz", check=False).returncode == 0, what="API back")

    def replaced_and_ready() -> bool:
        deployment = kubectl.get("deployment", names[0], namespace) or {"metadata": {}}
        assert deployment["metadata"].get("uid") not in (None, gone), "not applied again"
        return bool(deployment.get("status", {}).get("readyReplicas") == 1)

    eventually(replaced_and_ready, timeout=RESYNC_SECONDS + SETTLE_SECONDS, what="the Deployment applied again")
    converged(kubectl, namespace, names, one_replica_set=False)
    assert "1 Deployment(s) deleted or changed unseen" in log.text()
    log.assert_quiet()


def test_node_churn_while_300_services_run_bumps_no_deployment(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str, nodes: NodePool
):
    """Same-shape nodes join and leave, and one node gets garbage labels and then its own back: every service is
    re-planned (its eligible nodes change) but no Deployment's generation moves, so no server restarts."""
    selector = pool(nodes, namespace, count=4)
    names = create(kubectl, namespace, "churn", 300, selector)
    converged(kubectl, namespace, names, timeout=300)
    generations = {
        d["metadata"]["name"]: d["metadata"]["generation"] for d in kubectl.get("deployments", namespace=namespace)
    }
    members = sorted(f"pool-{i}-{namespace[-5:]}" for i in range(4))

    def everyone_planned_on(expected: list[str]) -> None:
        def probe() -> bool:
            services = kubectl.get("cpullm", namespace=namespace)
            behind = [s["metadata"]["name"] for s in services if s["status"]["plan"]["eligibleNodes"] != expected]
            assert not behind, f"{len(behind)} not yet re-planned on {expected}, e.g. {behind[0]}"
            return True

        eventually(probe, timeout=120, interval=2, what=f"300 services re-planned on {expected}")
        now = {
            d["metadata"]["name"]: d["metadata"]["generation"] for d in kubectl.get("deployments", namespace=namespace)
        }
        assert now == generations, {n: (generations[n], g) for n, g in now.items() if generations.get(n) != g}

    joining = f"pool-9-{namespace[-5:]}"
    nodes.add(fake_node(joining, numa=1, cpu="256", memory="2Ti", **selector))
    everyone_planned_on(sorted([*members, joining]))
    kubectl.run("delete", "node", joining)
    everyone_planned_on(members)
    garbage = {"cpullm.io/numa-nodes": "lots", "feature.node.kubernetes.io/cpu-cpuid.AVX2": "maybe"}
    original = kubectl.get("node", members[0])["metadata"]["labels"]
    kubectl.run("label", "node", members[0], "--overwrite", *(f"{k}={v}" for k, v in garbage.items()))
    everyone_planned_on(members[1:])  # skipped by the planner, with a warning event on the node
    kubectl.run("label", "node", members[0], "--overwrite", *(f"{k}={original[k]}" for k in garbage))
    everyone_planned_on(members)
