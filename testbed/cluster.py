"""The local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK's
controller, built by scripts/build-tools.sh and started by `kwokctl --runtime binary` on 127.0.0.1."""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.images import tool_dirs
from testbed.tools import eventually

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_NAME = "cpullm-e2e"
# kube-apiserver's default (/24) runs out at ~251 Services; the scale tests and benchmark need more.
SERVICE_CIDR = "10.96.0.0/16"
# With real_node, KWOK's controller manages only nodes with this annotation (examples/nodes.yaml has it), so
# a real kubelet's node (testbed/realnode.py) and its pods are left to the kubelet.
FAKE_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
# KWOK starts every pod at once (kwokctl's default "fast" stages: Ready within a second), except the pods whose name
# starts with SLOW_READY_PREFIX, the pods of a CpuLLMService of that name (its Deployment bears its name): they turn
# Ready SLOW_READY_SECONDS after they are bound, as a CPU server takes a while to start, so a rollout of such a
# service takes real time (e2e/test_upgrade.py's pacing test needs one tenant's rollouts to last).
SLOW_READY_PREFIX = "slow-ready-"
SLOW_READY_SECONDS = 15


def create_args(tools: dict[str, Path], kubeconfig: Path) -> list[str]:
    """`kwokctl create cluster` with the binary runtime and the locally built binaries (nothing downloaded) and
    room for many Services."""
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
        "--extra-args",
        f"kube-apiserver=service-cluster-ip-range={SERVICE_CIDR}",
        # One instance of each, nothing to elect: without this they exit when the API server or etcd is away
        # longer than the lease's renew deadline, and nothing here restarts them (a kubelet would).
        "--extra-args",
        "kube-controller-manager=leader-elect=false",
        "--extra-args",
        "kube-scheduler=leader-elect=false",
    ]


def slow_ready_stage() -> dict[str, Any]:
    """KWOK's pod-ready step for the pods named SLOW_READY_PREFIX...: a Stage like kwokctl's default pod-ready one
    (which matches these pods too, at weight 0: this one, at weight 1, is chosen), delayed by SLOW_READY_SECONDS.
    kwokctl keeps its default stages only when its --config carries no Stage at all (then it writes them into the
    controller's own config), so this one reaches KWOK's controller as a second --config file of its own
    (kwokctl_config); KWOK's controller reads every file it is given."""
    status = """\
{{ $now := Now | Quote }}
phase: Running
startTime: {{ $now }}
conditions:
- {type: Initialized, status: "True", lastTransitionTime: {{ $now }}}
- {type: ContainersReady, status: "True", lastTransitionTime: {{ $now }}}
- {type: Ready, status: "True", lastTransitionTime: {{ $now }}}
{{ range .spec.readinessGates }}
- {type: {{ .conditionType | Quote }}, status: "True", lastTransitionTime: {{ $now }}}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, started: true, restartCount: 0,
   state: {running: {startedAt: {{ $now }}}}}
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
{{ if eq .restartPolicy "Always" }}
- {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, started: true, restartCount: 0,
   state: {running: {startedAt: {{ $now }}}}}
{{ else }}
- {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, restartCount: 0,
   state: {terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now }}, finishedAt: {{ $now }}}}}
{{ end }}
{{ end }}
{{ with NodeIPsWith .spec.nodeName }}
hostIP: {{ index . 0 | Quote }}
hostIPs:
{{ range . }}
- {ip: {{ . | Quote }}}
{{ end }}
{{ end }}
{{ $hostNetwork := or .spec.hostNetwork false }}
{{ with PodIPsWith .spec.nodeName $hostNetwork .metadata.uid .metadata.name .metadata.namespace }}
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- {ip: {{ . | Quote }}}
{{ end }}
{{ end }}
"""
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": "pod-ready-slow"},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": {
                "matchExpressions": [
                    {
                        "key": f'.metadata.name | startswith("{SLOW_READY_PREFIX}")',
                        "operator": "In",
                        "values": ["true"],
                    },
                    {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                    {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
                    {
                        "key": '.status.conditions.[] | select(.type == "Ready") | .status',
                        "operator": "NotIn",
                        "values": ["True"],
                    },
                ]
            },
            "weight": 1,
            "delay": {"durationMilliseconds": SLOW_READY_SECONDS * 1000},
            "next": {"statusTemplate": status},
        },
    }


def kwokctl_config(stages: Path, real_node: bool) -> dict[str, Any]:
    """The kwokctl --config document: KWOK's controller also reads `stages` (slow_ready_stage), and with real_node
    the changes real_node_config makes."""
    config: dict[str, Any] = (
        real_node_config()
        if real_node
        else {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokctlConfiguration",
            "componentsPatches": [{"name": "kwok-controller", "extraArgs": []}],
        }
    )
    (kwok,) = [p for p in config["componentsPatches"] if p["name"] == "kwok-controller"]
    kwok["extraArgs"].append({"key": "config", "value": str(stages)})  # after kwokctl's own --config, not over it
    return config


def real_node_config() -> dict[str, Any]:
    """A kwokctl --config document for a cluster a real kubelet joins (testbed/realnode.py):

    - KWOK's controller manages only nodes annotated kwok.x-k8s.io/node=fake. kwokctl's binary runtime starts it
      with --manage-all-nodes=true on its command line, which wins over a KwokConfiguration's options (and a
      KwokConfiguration given without all of kwokctl's defaults leaves e.g. nodeLeaseParallelism at 0, and the
      controller exits), so the flags themselves are patched;
    - the API server's certificate also names its in-cluster address (the `kubernetes` Service's ClusterIP and
      DNS names), which pods on the real node dial through kube-proxy; kwokctl's names only the host's IPs."""
    key, value = FAKE_NODE_ANNOTATION
    cluster_ip = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokctlConfiguration",
        "options": {
            "kubeApiserverCertSANs": [
                cluster_ip,
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ]
        },
        "componentsPatches": [
            {
                "name": "kwok-controller",
                "extraArgs": [
                    {"key": "manage-all-nodes", "value": "false", "override": True},
                    {"key": "manage-nodes-with-annotation-selector", "value": f"{key}={value}"},
                ],
            }
        ],
    }


def tool_version(tool: str) -> str:
    """A pinned version from scripts/tool-versions.env, e.g. tool_version("KIND") for KIND_VERSION."""
    for line in (ROOT / "scripts" / "tool-versions.env").read_text().splitlines():
        if line.startswith(f"{tool}_VERSION="):
            return line.split("=", 1)[1].strip()
    raise RuntimeError(f"{tool}_VERSION missing from scripts/tool-versions.env")


def kubernetes_version() -> str:
    return tool_version("KUBERNETES")


@dataclass
class LocalCluster:
    workdir: Path
    kubeconfig: Path
    kubectl: Path
    kwokctl: Path
    name: str = CLUSTER_NAME
    _restarted: list[subprocess.Popen[bytes]] = field(default_factory=list)  # components outage() restarted

    @classmethod
    def start(
        cls,
        workdir: Path,
        *,
        name: str = CLUSTER_NAME,
        real_node: bool = False,
        audit_policy: dict[str, Any] | None = None,
    ) -> LocalCluster:
        """real_node: configured for a real kubelet to join (real_node_config); every KWOK node must then carry
        FAKE_NODE_ANNOTATION. audit_policy: the API server writes its audit log (`audit_log`) by that policy (the
        scale benchmark counts requests by client). A cluster that fails to start is deleted."""
        tools = tool_dirs()
        k8s, kwok = tools["kubernetes"], tools["kwok"]
        kubeconfig = workdir / "kubeconfig"
        cluster = cls(
            workdir=workdir, kubeconfig=kubeconfig, kubectl=k8s / "kubectl", kwokctl=kwok / "kwokctl", name=name
        )
        cluster.delete()  # a cluster left over by an interrupted run
        args = create_args(tools, kubeconfig)
        stages = workdir / "kwok-stages.yaml"
        stages.write_text(yaml.safe_dump(slow_ready_stage(), sort_keys=False))
        config = workdir / "kwokctl.yaml"
        config.write_text(yaml.safe_dump(kwokctl_config(stages, real_node), sort_keys=False))
        args += ["--config", str(config)]
        if audit_policy is not None:
            policy = workdir / "audit-policy.yaml"
            policy.write_text(yaml.safe_dump(audit_policy, sort_keys=False))
            args += ["--kube-audit-policy", str(policy)]
        try:
            cluster._kwokctl(*args, "--wait", "2m")
        except BaseException:
            cluster.delete()
            raise
        return cluster

    @property
    def logs(self) -> Path:
        return self._cluster_dir / "logs"

    @property
    def audit_log(self) -> Path:
        return self.logs / "audit.log"

    def _kwokctl(self, *args: str) -> None:
        env = {
            **os.environ,
            "PATH": f"{self.kubectl.parent}:{os.environ.get('PATH', '')}",  # our kubectl first
            "KWOK_KUBE_VERSION": kubernetes_version(),
            "KWOK_WORKDIR": str(self.workdir / "kwok"),
        }
        subprocess.run([str(self.kwokctl), "--name", self.name, *args], check=True, env=env, timeout=600)

    def delete(self, keep_logs: Path | None = None) -> None:
        """Stops every component; its logs (an audit log included) are moved to keep_logs first."""
        if keep_logs is not None and self.logs.exists():
            shutil.move(str(self.logs), str(keep_logs))
        self._kwokctl("delete", "cluster")
        for process in self._restarted:  # stopped by the delete (their pid files); reaped here
            process.wait(timeout=60)

    @property
    def _cluster_dir(self) -> Path:
        return self.workdir / "kwok" / "clusters" / self.name

    def outage(self, component: str, seconds: float) -> None:
        """Stops one control-plane process (kube-apiserver, etcd, ...) for `seconds`, then starts it again with
        the same command line, working directory and log, as a crash and restart of that component would.
        kwokctl has no per-component stop, so this goes through the pid file its binary runtime keeps."""
        pid_file = self._cluster_dir / "pids" / f"{component}.pid"
        pid = int(pid_file.read_text())
        command = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        os.kill(pid, signal.SIGKILL)
        try:
            for process in [p for p in self._restarted if p.pid == pid]:  # restarted here before: our child to reap
                process.wait(timeout=10)
                self._restarted.remove(process)
            eventually(lambda: _process_state(pid) in ("gone", "z (zombie)"), timeout=10, what=f"{component} stopped")
            time.sleep(seconds)  # the outage itself
        finally:  # started again even if the wait failed: one failed test must not leave the cluster down
            with (self._cluster_dir / "logs" / f"{component}.log").open("ab") as log:
                process = subprocess.Popen(
                    command, cwd=self._cluster_dir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            pid_file.write_text(str(process.pid))  # so `kwokctl delete cluster` stops the new process
            self._restarted.append(process)


def _process_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].splitlines()[0].strip().lower()
    except (OSError, IndexError):
        return "gone"
