"""The local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK's
controller, built by scripts/build-tools.sh and started by `kwokctl --runtime binary` on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_NAME = "cpullm-e2e"


def tool_dirs(tools: list[str] | None = None) -> dict[str, Path]:
    """Builds what is missing (cold: tens of minutes; cached: seconds) and returns each tool's directory."""
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-tools.sh"), *(tools or ["kubernetes", "etcd", "kwok"])],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    dirs = dict(line.split("=", 1) for line in result.stdout.splitlines() if "_BIN_DIR=" in line)
    return {key.removesuffix("_BIN_DIR").lower(): Path(value) for key, value in dirs.items()}


def create_args(tools: dict[str, Path], kubeconfig: Path) -> list[str]:
    """`kwokctl create cluster` with the binary runtime and the locally built binaries (nothing downloaded)."""
    k8s, kwok = tools["kubernetes"], tools["kwok"]
    return [
        "create",
        "cluster",
        "--runtime",
        "binary",
        "--kubeconfig",
        str(kubeconfig),
        "--kube-apiserver-binary",
        str(k8s / "kube-apiserver"),
        "--kube-controller-manager-binary",
        str(k8s / "kube-controller-manager"),
        "--kube-scheduler-binary",
        str(k8s / "kube-scheduler"),
        "--kwok-controller-binary",
        str(kwok / "kwok"),
        "--etcd-binary",
        str(tools["etcd"] / "etcd"),
    ]


def kubernetes_version() -> str:
    for line in (ROOT / "scripts" / "tool-versions.env").read_text().splitlines():
        if line.startswith("KUBERNETES_VERSION="):
            return line.split("=", 1)[1].strip()
    raise RuntimeError("KUBERNETES_VERSION missing from scripts/tool-versions.env")


@dataclass
class LocalCluster:
    workdir: Path
    kubeconfig: Path
    kubectl: Path
    kwokctl: Path

    @classmethod
    def start(cls, workdir: Path) -> LocalCluster:
        tools = tool_dirs()
        k8s, kwok = tools["kubernetes"], tools["kwok"]
        kubeconfig = workdir / "kubeconfig"
        cluster = cls(workdir=workdir, kubeconfig=kubeconfig, kubectl=k8s / "kubectl", kwokctl=kwok / "kwokctl")
        cluster.delete()  # a cluster left over by an interrupted run
        cluster._kwokctl(*create_args(tools, kubeconfig), "--wait", "2m")
        return cluster

    def _kwokctl(self, *args: str) -> None:
        env = {
            **os.environ,
            "PATH": f"{self.kubectl.parent}:{os.environ.get('PATH', '')}",  # our kubectl first
            "KWOK_KUBE_VERSION": kubernetes_version(),
            "KWOK_WORKDIR": str(self.workdir / "kwok"),
        }
        subprocess.run([str(self.kwokctl), "--name", CLUSTER_NAME, *args], check=True, env=env, timeout=600)

    def delete(self) -> None:
        self._kwokctl("delete", "cluster")
