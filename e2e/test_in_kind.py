"""Only on the kind cluster of testbed/kind/run.sh (it names the worker kept for servers, CPULLM_E2E_KIND_SERVER_NODE):
the operator's own Deployment on a real kind worker whose kubelet runs the static CPU manager (CPU 0 reserved).

With the local Python base as the server image, the pod's launcher reads the cpuset its container really got and
logs it before it execs vLLM (missing there, so it then fails); that line and the QoS class are checked.
Real vLLM served on kind, checked from inside its container, is e2e/test_quickstart.py's (the quick start's
cluster, its images pulled from a registry)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from testbed.machine import machine_labels
from testbed.objects import tiny_service
from testbed.operator import InClusterOperator
from testbed.tools import Kubectl, eventually

SERVER_NODE = os.environ.get("CPULLM_E2E_KIND_SERVER_NODE")
TEST_IMAGE = os.environ.get("CPULLM_E2E_KIND_TEST_IMAGE")
pytestmark = pytest.mark.skipif(not SERVER_NODE, reason="runs on the kind cluster of testbed/kind/run.sh only")
SERVER_LABEL = "cpullm.io/e2e-kind-server"


@pytest.fixture
def server_node(kubectl: Kubectl, operator: Any) -> Iterator[str]:
    """The kept worker, labelled as this machine with the static CPU manager, for the test's servers alone."""
    assert isinstance(operator, InClusterOperator) and SERVER_NODE
    labels = {**machine_labels(), "cpullm.io/cpu-manager-policy": "static", SERVER_LABEL: "true"}
    kubectl.run("label", "node", SERVER_NODE, "--overwrite", *(f"{k}={v}" for k, v in labels.items()))
    try:
        yield SERVER_NODE
    finally:
        kubectl.run("label", "node", SERVER_NODE, *(f"{k}-" for k in labels))


def test_the_operators_deployment_gets_an_exclusive_cpu_on_a_kind_worker(
    kubectl: Kubectl, server_node: str, namespace: str
) -> None:
    service = tiny_service(
        "exclusive", namespace, image=TEST_IMAGE, cpu={"cpusPerRank": 1}, nodeSelector={SERVER_LABEL: "true"}
    )
    kubectl.apply(service)

    def launcher_line() -> tuple[dict[str, Any], str]:
        pods = kubectl.get("pods", namespace=namespace, **{"cpullm.io/service": "exclusive"})
        assert pods, "no server pod yet"
        pod = pods[0]
        logs = kubectl.run("logs", pod["metadata"]["name"], "-n", namespace, check=False).stdout
        previous = kubectl.run("logs", "--previous", pod["metadata"]["name"], "-n", namespace, check=False).stdout
        lines = [line for line in (logs + previous).splitlines() if line.startswith("cpullm-launch: saw cpuset")]
        assert lines, f"no launcher line yet (pod {pod['status'].get('phase')})"
        return pod, lines[0]

    try:
        pod, line = eventually(launcher_line, timeout=180, what="the launcher's view of its cpuset")
    finally:  # the worker's one allocatable CPU, for the next test's server
        kubectl.run("delete", "cpullm", "exclusive", "-n", namespace, "--wait=false")
    assert pod["spec"]["nodeName"] == server_node
    assert pod["status"]["qosClass"] == "Guaranteed"
    cpuset = line.split("saw cpuset ", 1)[1].split(" ", 1)[0]
    assert cpuset.isdigit() and cpuset != "0", f"not one exclusive CPU beside the reserved CPU 0: {line}"
