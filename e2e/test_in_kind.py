"""Only on the kind cluster of e2e/kind/run.sh (CPULLM_E2E_KIND_TEST_IMAGE names the test image it loaded): the
operator's own Deployment on a real kind worker whose kubelet runs the static CPU manager (CPU 0 reserved).

The server image is the local Python base image, not vLLM (6 GB, not loaded into kind): the pod's launcher reads the
cpuset its container really got and logs it before it execs vLLM, which then fails; that log line and the pod's QoS
class are what this checks."""

from __future__ import annotations

import os
from typing import Any

import pytest

from e2e.conftest import tiny_service
from e2e.helpers import InClusterOperator, Kubectl, eventually
from e2e.machine import machine_labels

TEST_IMAGE = os.environ.get("CPULLM_E2E_KIND_TEST_IMAGE")
pytestmark = pytest.mark.skipif(not TEST_IMAGE, reason="runs on the kind cluster of e2e/kind/run.sh only")
SERVER_LABEL = "cpullm.io/e2e-kind-server"


def free_worker(kubectl: Kubectl, operator: InClusterOperator) -> str:
    """A real kind worker (run.sh labels them operator-host) the operator's pod is not on: a worker has 1
    allocatable CPU, and the operator requests some."""
    workers = [n["metadata"]["name"] for n in kubectl.get("nodes", **{"cpullm.io/operator-host": "true"})]
    taken = {p["spec"].get("nodeName") for p in kubectl.get("pods", namespace=operator.namespace)}
    free = [w for w in workers if w not in taken]
    assert free, f"every worker of {workers} hosts the operator"
    return free[0]


def test_the_operators_deployment_gets_an_exclusive_cpu_on_a_kind_worker(
    kubectl: Kubectl, operator: Any, namespace: str
) -> None:
    assert isinstance(operator, InClusterOperator)
    worker = free_worker(kubectl, operator)
    labels = {**machine_labels(), "cpullm.io/cpu-manager-policy": "static", SERVER_LABEL: "true"}
    kubectl.run("label", "node", worker, "--overwrite", *(f"{k}={v}" for k, v in labels.items()))
    try:
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

        pod, line = eventually(launcher_line, timeout=180, what="the launcher's view of its cpuset")
        assert pod["spec"]["nodeName"] == worker
        assert pod["status"]["qosClass"] == "Guaranteed"
        cpuset = line.split("saw cpuset ", 1)[1].split(" ", 1)[0]
        assert cpuset.isdigit() and cpuset != "0", f"not one exclusive CPU beside the reserved CPU 0: {line}"
    finally:
        kubectl.run("label", "node", worker, *(f"{k}-" for k in labels))
