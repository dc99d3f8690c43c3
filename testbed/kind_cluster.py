"""A kind cluster from the node image built here (testbed/kind_images.py), with what kind's pulled images would give:

- kind's default CNI (its kindnet DaemonSet, applied by `kind create cluster`), whose image is our stand-in for
  kindnetd (testbed/kindnet.py: kindnetd's source, github.com/aojea/kindnet, is refused by the module proxy here: 403);
- kind's default StorageClass (`standard`, rancher.io/local-path) as kind's node image has it, from images built
  here (local-path-provisioner v0.0.30, the newest the module proxy here serves; kind v0.32 ships v0.0.34);
- etcd runs our build at its own version (ClusterConfiguration etcd.local.imageTag);
- every kubelet runs the static CPU manager with 100m reserved for the system (kubeReserved), which it rounds up to
  a reserved CPU 0, so a Guaranteed pod gets an exclusive cpuset; a 2-CPU host's worker then allocates 1.9 CPUs,
  room for kindnet's 100m beside a server's whole CPU (reservedSystemCPUs would leave it 1);
- only on a cgroup v1 host: the kubelet's `failCgroupV1: false` and kubeadm skipping SystemVerification;
- only where CAP_SYS_RESOURCE is missing from the bounding set: the node's containerd runs the TEST-ONLY runc
  wrapper and leaves oom_score_adj alone (restrict_oom_score_adj), as the real node does (testbed/realnode.py).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.cgroup import mount_unmounted_v1_hierarchies
from testbed.cluster import tool_version
from testbed.realnode import lacks_cap_sys_resource
from testbed.tools import eventually

WRAPPER_IN_NODE = "/kind/bin/cpullm-runc-wrapper"


def cgroup_v1_host() -> bool:
    return not Path("/sys/fs/cgroup/cgroup.controllers").exists()


def cluster_config(name: str, workers: int, *, cgroup_v1: bool, lacks_cap: bool) -> dict[str, Any]:
    """kind's Cluster config for this host (JSON is YAML)."""
    kubelet: dict[str, Any] = {
        "kind": "KubeletConfiguration",
        "cpuManagerPolicy": "static",
        "kubeReserved": {"cpu": "100m"},
    }
    patches = [f"kind: ClusterConfiguration\netcd:\n  local:\n    imageTag: {tool_version('ETCD')}\n"]
    if cgroup_v1:
        kubelet["failCgroupV1"] = False
        for kind in ("InitConfiguration", "JoinConfiguration"):
            patches.append(f"kind: {kind}\nnodeRegistration:\n  ignorePreflightErrors: [SystemVerification]\n")
    patches.append(json.dumps(kubelet))
    config: dict[str, Any] = {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "name": name,
        "kubeadmConfigPatches": patches,
        "nodes": [{"role": "control-plane"}] + [{"role": "worker"} for _ in range(workers)],
    }
    if lacks_cap:
        config["containerdConfigPatches"] = [
            '[plugins."io.containerd.grpc.v1.cri"]\n  restrict_oom_score_adj = true\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
            f'  BinaryName = "{WRAPPER_IN_NODE}"\n'
        ]
    return config


@dataclass
class KindCluster:
    name: str
    kind: Path
    kubectl: Path
    workdir: Path
    docker_env: dict[str, str]

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def create(self, node_image: str, workers: int) -> KindCluster:
        mount_unmounted_v1_hierarchies()  # the nodes' containerd sees them: kills for memory read as OOMKilled
        config = cluster_config(self.name, workers, cgroup_v1=cgroup_v1_host(), lacks_cap=lacks_cap_sys_resource())
        path = self.workdir / "kind-config.yaml"
        path.write_text(json.dumps(config, indent=1))
        self._kind(
            "create", "cluster", "--image", node_image, "--config", str(path), "--kubeconfig", str(self.kubeconfig)
        )
        eventually(self._nodes_ready, timeout=120, what="every kind node Ready")
        return self

    def delete(self) -> None:
        self._kind("delete", "cluster", "--name", self.name)

    def load_archive(self, tar: Path, node: str | None = None) -> None:
        """Imports an image archive into every node's containerd, or into `node`'s only."""
        self._kind("load", "image-archive", str(tar), "--name", self.name, *(("--nodes", node) if node else ()))

    def workers(self) -> list[str]:
        """kind's worker nodes (before any KWOK node joins), by name."""
        nodes = self.kubectl_json("get", "nodes", "-l", "!node-role.kubernetes.io/control-plane")["items"]
        return sorted(n["metadata"]["name"] for n in nodes)

    def copy_to_node(self, node: str, source: Path, destination: str) -> None:
        """Copies a host directory's contents to a directory of the node container (which it creates)."""
        self._node_exec(node, "mkdir", "-p", destination)
        subprocess.run(["docker", "cp", f"{source}/.", f"{node}:{destination}"], check=True, env=self.docker_env)

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.run_kubectl(*args, "-o", "json").stdout)

    def run_kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.kubectl), "--kubeconfig", str(self.kubeconfig), *args]
        return subprocess.run(command, check=check, capture_output=True, text=True, input=stdin)

    def _nodes_ready(self) -> bool:
        for node in self.kubectl_json("get", "nodes")["items"]:
            ready = [c for c in node["status"].get("conditions", []) if c["type"] == "Ready"]
            assert ready and ready[0]["status"] == "True", f"{node['metadata']['name']} not Ready"
        return True

    def _node_exec(self, node: str, *command: str, stdin: str | None = None) -> None:
        subprocess.run(
            ["docker", "exec", "-i", node, *command], check=True, env=self.docker_env, input=stdin, text=True
        )

    def _kind(self, *args: str) -> None:
        subprocess.run([str(self.kind), *args], check=True, env=self.docker_env)
