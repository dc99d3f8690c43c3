"""Fixtures of the e2e suite. By default it starts a local control plane (KWOK, binaries from
scripts/build-tools.sh) and runs the operator as a local process. With CPULLM_E2E_KUBECONFIG=path it uses that
cluster instead, and with CPULLM_E2E_OPERATOR=namespace/deployment it drives an operator already installed
there by the chart (testbed/kind/run.sh does both)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from testbed.cluster import LocalCluster
from testbed.images import VLLM_VENV
from testbed.objects import sample_nodes
from testbed.operator import InClusterOperator, Operator
from testbed.tools import ROOT, Kubectl, eventually, free_port, published_crds

from e2e.support import NodePool, node_ready

if TYPE_CHECKING:
    from testbed.spread import QuickStart

DOCKER_SCRIPT = ROOT / "scripts" / "docker.sh"


IN_CLUSTER_OPERATOR = os.environ.get("CPULLM_E2E_OPERATOR")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked local_operator stop, restart or relay a local operator process: none runs in a cluster."""
    if IN_CLUSTER_OPERATOR and item.get_closest_marker("local_operator"):
        pytest.skip(f"drives a local operator process; the operator here is in-cluster ({IN_CLUSTER_OPERATOR})")


@pytest.fixture(scope="session")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cpullm-e2e-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def local_cluster(workdir: Path) -> Iterator[LocalCluster | None]:
    """The local control plane this suite started; None on a cluster given by CPULLM_E2E_KUBECONFIG."""
    if os.environ.get("CPULLM_E2E_KUBECONFIG"):
        yield None
        return
    cluster = LocalCluster.start(workdir)
    try:
        yield cluster
    finally:
        cluster.delete()


@pytest.fixture(scope="session")
def kubectl(local_cluster: LocalCluster | None) -> Kubectl:
    if local_cluster is None:
        return Kubectl(os.environ.get("CPULLM_E2E_KUBECTL", "kubectl"), os.environ["CPULLM_E2E_KUBECONFIG"])
    return Kubectl(str(local_cluster.kubectl), str(local_cluster.kubeconfig))


@pytest.fixture(scope="session")
def cluster_ready(kubectl: Kubectl) -> Kubectl:
    """CRD installed and established; sample nodes Ready."""
    kubectl.run("apply", "--server-side", "-f", str(ROOT / "crds"))
    kubectl.wait_established("cpullmservices.cpullm.io")
    kubectl.wait_established("cpullmgateways.cpullm.io")
    kubectl.apply(*sample_nodes())
    for node in sample_nodes():
        eventually(lambda n=node: node_ready(kubectl, n["metadata"]["name"]), timeout=60, what="sample node Ready")
    return kubectl


@pytest.fixture(scope="session")
def operator(cluster_ready: Kubectl, workdir: Path) -> Iterator[Operator | InClusterOperator]:
    if IN_CLUSTER_OPERATOR:
        namespace, deployment = IN_CLUSTER_OPERATOR.split("/", 1)
        in_cluster = InClusterOperator(cluster_ready, namespace, deployment)
        in_cluster.start()
        yield in_cluster
        return
    metrics_port = free_port()
    process = Operator(
        cluster_ready.kubeconfig, workdir / "operator.log", free_port(), ["--metrics-port", str(metrics_port)]
    )
    process.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    process.start()
    yield process
    process.stop()


@pytest.fixture
def namespace(cluster_ready: Kubectl, operator: Operator, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"e2e-{request.node.name[5:25].lower().replace('_', '-').strip('-')}-{uuid.uuid4().hex[:5]}"
    cluster_ready.run("create", "namespace", name)
    yield name
    cluster_ready.run("delete", "namespace", name, "--wait=false")


@pytest.fixture
def nodes(cluster_ready: Kubectl) -> Iterator[NodePool]:
    pool = NodePool(cluster_ready)
    yield pool
    for name in pool.names:
        cluster_ready.run("delete", "node", name, "--wait=false", check=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """On failure, attach the objects, events and the operator's log to the report."""
    report = yield
    kubectl = getattr(item, "funcargs", {}).get("kubectl")
    if report.failed and call.when == "call" and isinstance(kubectl, Kubectl):
        namespace = item.funcargs.get("namespace")
        scope = ["-n", namespace] if namespace else ["-A"]
        dump = [
            kubectl.run("get", "cpullm,deploy,rs,svc,pods", *scope, "-o", "wide", check=False).stdout,
            kubectl.run("get", "cpullm", *scope, "-o", "yaml", check=False).stdout,
            kubectl.run("get", "events", *scope, "--sort-by=.lastTimestamp", check=False).stdout,
            kubectl.run("get", "nodes", "--show-labels", check=False).stdout,
        ]
        operator = item.funcargs.get("operator")
        if isinstance(operator, Operator | InClusterOperator):
            dump.append("operator log:\n" + operator.log_tail())
        report.sections.append(("cluster state", "\n".join(dump)))
    return report


@pytest.fixture(scope="session")
def docker_env() -> Iterator[dict[str, str]]:
    """The kind tests' environment for `docker` against an engine (root): this machine's, or one scripts/docker.sh
    starts (and stops at the session's end; its `stop` leaves the machine's own engine alone)."""
    out = subprocess.run([str(DOCKER_SCRIPT), "start"], check=True, capture_output=True, text=True).stdout
    host = out.strip().splitlines()[-1].removeprefix("DOCKER_HOST=")
    try:
        yield {**os.environ, "DOCKER_HOST": host} if host else dict(os.environ)
    finally:
        subprocess.run([str(DOCKER_SCRIPT), "stop"], check=True)


@pytest.fixture(scope="session")
def quick_start(docker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuickStart]:
    """The README's quick start run from no cluster (testbed/spread.py), its kind cluster kept for the session: the
    quick start's tests and the kind tests of a cluster of the images built here share it (one cluster less to
    create and delete in the test command)."""
    if not (VLLM_VENV / ".complete").exists():
        pytest.skip("the quick start needs the vLLM environment (scripts/setup-vllm.sh)")
    from testbed.spread import quick_start_cluster  # here: testbed.spread imports test modules, which import this one

    with quick_start_cluster(docker_env, tmp_path_factory.mktemp("quickstart")) as made:
        yield made


@pytest.fixture(scope="session")
def crd_files() -> dict[str, str]:
    """The optional APIs' published CRDs (scripts/fetch-crds.sh, from their Go modules), by name."""
    return published_crds()
