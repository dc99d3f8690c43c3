"""A real node (pytest marker `node`; root; deselected by default): the kubelet with containerd, runc and the CNI
bridge joined to a local control plane of its own (cluster cpullm-node, where KWOK manages only annotated fake
nodes), e2e/realnode.py. Run: python -m pytest e2e/test_node.py -m node (first run: builds the kubelet and the
Debian test image, scripts/setup-node.sh and scripts/build-images.sh; then about half a minute)."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpullm import launcher
from e2e.cluster import LocalCluster
from e2e.helpers import eventually
from e2e.images import build_debian
from e2e.realnode import RealNode

pytestmark = [
    pytest.mark.node,
    pytest.mark.skipif(os.geteuid() != 0, reason="a real node needs root"),
    pytest.mark.skipif(bool(os.environ.get("CPULLM_E2E_KUBECONFIG")), reason="joins a local control plane only"),
]
NODE_CLUSTER_NAME = "cpullm-node"
CAP_SYS_NICE = 23
SHM = 64 * 1024 * 1024
MEMORY = 300 * 1024 * 1024


@pytest.fixture(scope="module")
def real_node() -> Iterator[RealNode]:
    workdir = Path(tempfile.mkdtemp(prefix="cpullm-node-"))  # short: the kubelet's unix sockets live under it
    cluster = LocalCluster.start(workdir, name=NODE_CLUSTER_NAME, fake_nodes_only=True)
    node = RealNode(cluster.kubeconfig, workdir / "node", kubectl=cluster.kubectl, images=("debian",))
    try:
        yield node.start()
    finally:
        node.stop()
        cluster.delete()
        shutil.rmtree(workdir, ignore_errors=True)


def probe_pod(name: str, node: str, image: str) -> dict[str, object]:
    """A Guaranteed pod shaped like the operator's vLLM pods: whole CPUs, seccomp off, SYS_NICE, memory /dev/shm."""
    script = """
grep -E '^(Cpus_allowed_list|Mems_allowed_list|Seccomp|CapEff):' /proc/self/status
echo "memory_limit: $(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max)"
echo "shm_kib: $(df -k /dev/shm | awk 'NR == 2 {print $2}')"
echo "done: 1"
exec sleep 3600
"""
    resources = {"cpu": "1", "memory": str(MEMORY)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "securityContext": {"seccompProfile": {"type": "Unconfined"}},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": ["/bin/sh", "-c", script],
                    "securityContext": {"capabilities": {"add": ["SYS_NICE"]}},
                    "resources": {"requests": resources, "limits": resources},
                    "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
                }
            ],
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": str(SHM)}}],
        },
    }


def test_guaranteed_pod_on_the_real_node_gets_its_exclusive_cpus(real_node: RealNode) -> None:
    api = real_node.api()
    name = f"probe-{uuid.uuid4().hex[:6]}"
    api.apply(probe_pod(name, real_node.name, build_debian().ref))

    def report() -> dict[str, str]:
        lines = real_node.container_log("default", name, "main").splitlines()
        fields = dict(line.split(":", 1) for line in lines if ":" in line)
        assert "done" in fields, f"pod {name} has not reported yet: {lines}"
        return {key: value.strip() for key, value in fields.items()}

    seen = eventually(report, timeout=90, interval=1, what=f"pod {name} output")
    pod = api.get("pod", name, namespace="default")
    assert pod["status"]["qosClass"] == "Guaranteed"
    # The kubelet ran it, not KWOK: its IP comes from the CNI bridge's subnet.
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(real_node.subnet)
    # The static CPU manager's exclusive CPU, as the kubelet checkpointed it, off the reserved CPU 0.
    state = json.loads((real_node.kubelet_dir / "cpu_manager_state").read_text())
    assigned = state["entries"][pod["metadata"]["uid"]]["main"]
    assert seen["Cpus_allowed_list"] == assigned
    cpus = launcher.parse_cpu_list(assigned)
    assert len(cpus) == 1 and 0 not in cpus and set(cpus) <= os.sched_getaffinity(0)
    assert seen["Seccomp"] == "0"
    assert int(seen["CapEff"], 16) >> CAP_SYS_NICE & 1
    assert int(seen["memory_limit"]) == MEMORY
    assert int(seen["shm_kib"]) * 1024 == SHM
