"""A real worker node for tests: the kubelet (scripts/build-tools.sh kubelet) with Debian's containerd 1.6, runc
and the CNI bridge plugin (scripts/setup-node.sh), joined to the local kwokctl control plane (testbed/cluster.py), its
images imported without a registry (testbed/images.py). Root only; one RealNode per machine at a time (the kubelet's
cgroups are /kubepods under each cgroup v1 controller, and the CPU manager owns the machine's CPUs).

The cluster must be started with LocalCluster.start(..., real_node=True): otherwise KWOK's controller also
manages this node and marks its pods Running with fake IPs while the kubelet is still failing.

    node = RealNode(kubeconfig=cluster.kubeconfig, workdir=workdir / "node", kubectl=cluster.kubectl)
    node.start()          # containerd, images, kubelet; returns once the Node is Ready (seconds; the vLLM image's
                          # import into an empty store takes ~160 s, see image_store)
    ...                   # pods with nodeName/nodeSelector kubernetes.io/hostname=node.name run for real
    node.stop()           # idempotent: pods, kubelet, containerd, mounts, network namespaces, bridge, cgroups, dirs

Everything it writes lives under workdir, except what the kubelet and containerd hard-code: cgroups
(/sys/fs/cgroup/<controller>/kubepods), network namespaces (/var/run/netns/cni-*), shim sockets
(/run/containerd/s/), /var/log/containers symlinks and the bridge interface; stop() removes those it made.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from testbed import machine
from testbed.cgroup import mount_unmounted_v1_hierarchies
from testbed.images import BUILDERS, Image, build_pause
from testbed.tools import ROOT, Kubectl, eventually, free_port

CAP_SYS_RESOURCE = 24
RUNC_WRAPPER = ROOT / "testbed" / "node" / "runc-wrapper"
CGROUP_ROOT = Path("/sys/fs/cgroup")
NETNS_DIR = Path("/var/run/netns")
CONTAINER_LOGS = Path("/var/log/containers")
REAL_NODE_SELECTOR = {"cpullm.io/real-node": "true"}  # the label the real node carries, for servers to select it


def lacks_cap_sys_resource() -> bool:
    """Whether this process's capability bounding set (CapBnd) lacks CAP_SYS_RESOURCE, as in some sandboxes;
    there runc cannot lower oom_score_adj nor grant the capability, and the runtime wrapper is needed."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            return not (int(line.split()[1], 16) >> CAP_SYS_RESOURCE) & 1
    raise RuntimeError("no CapBnd in /proc/self/status")


def setup_node() -> dict[str, str]:
    """scripts/setup-node.sh's KEY=value lines (apt packages when missing, the kubelet build; cached: seconds)."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup-node.sh")], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def resolve(name: str) -> str | None:
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


@dataclass
class RealNode:
    """A kubelet + containerd node joined to the cluster of `kubeconfig`, working under `workdir`.

    name: the Node's name; by default this machine's hostname, so the API server can reach the kubelet for logs
      and exec when the name resolves (it dials the node's Hostname address first). Otherwise read logs with
      container_log().
    images: which of testbed/images.py's images to build (cached) and import besides the pause image: "debian"
      (~180 MB, a shell and procps; seconds) and "vllm" (the stand-in vLLM CPU image, ~6 GB; ~160 s to import
      into an empty store).
    image_store: containerd's root directory (content store, snapshots, metadata). By default under workdir, so
      every start imports its images again; a persistent directory (e.g. testbed.images.CACHE / "containerd-root") keeps
      them, and an image is imported again only when its tar's manifest changes. stop() removes the node's
      containers from it but keeps the images.
    subnet: the pods' CNI bridge subnet (host-local IPAM); away from KWOK's fake pod IPs (10.0.0.x).
    labels: extra node labels on top of this machine's (testbed/machine.py).
    """

    kubeconfig: Path
    workdir: Path
    kubectl: Path | None = None
    name: str = field(default_factory=lambda: socket.gethostname().lower())
    images: tuple[str, ...] = ("debian", "vllm")
    image_store: Path | None = None
    subnet: str = "10.88.0.0/24"
    bridge: str = "cpullm0"
    labels: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    _kube_proxy_binary: Path | None = field(default=None, init=False, repr=False)
    _processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    _logs: list[IO[bytes]] = field(default_factory=list, repr=False)
    _netns_before: set[str] = field(default_factory=set, repr=False)

    # Layout under workdir.
    @property
    def containerd_dir(self) -> Path:
        return self.workdir / "containerd"

    @property
    def containerd_root(self) -> Path:
        """containerd's persistent store: the images' content and their unpacked layers (snapshots)."""
        return self.image_store or self.containerd_dir / "root"

    @property
    def socket(self) -> Path:
        return self.containerd_dir / "containerd.sock"

    @property
    def kubelet_dir(self) -> Path:
        return self.workdir / "kubelet"

    @property
    def pod_logs_dir(self) -> Path:
        return self.workdir / "pod-logs"

    @property
    def cni_dir(self) -> Path:
        return self.workdir / "cni"

    def start(self) -> RealNode:
        if os.geteuid() != 0:
            raise RuntimeError("RealNode needs root (containerd, the kubelet, mounts and cgroups)")
        self.workdir = self.workdir.resolve()
        if len(str(self.kubelet_dir / "pod-resources" / "kubelet.sock")) > 100:
            raise RuntimeError(f"workdir {self.workdir} is too long for the kubelet's unix sockets")
        self._clear_an_earlier_run()
        mount_unmounted_v1_hierarchies()  # else containerd's shim reports no container killed for memory
        self._netns_before = {p.name for p in NETNS_DIR.glob("cni-*")}
        started = time.monotonic()
        tools = setup_node()
        self.timings["setup"] = time.monotonic() - started
        if self.kubectl is None:
            from testbed.cluster import tool_dirs

            self.kubectl = tool_dirs(["kubernetes"])["kubernetes"] / "kubectl"
        mark = time.monotonic()
        wanted = [build_pause()] + [BUILDERS[name]() for name in self.images if name != "pause"]
        self.timings["images"] = time.monotonic() - mark
        for directory in (self.containerd_dir, self.kubelet_dir, self.pod_logs_dir, self.cni_dir / "net.d"):
            directory.mkdir(parents=True, exist_ok=True)
        self._start_containerd(tools["CONTAINERD"], sandbox_image=wanted[0].ref)
        mark = time.monotonic()
        for image in wanted:
            self._import(tools["CTR"], image)
        self.timings["import"] = time.monotonic() - mark
        mark = time.monotonic()
        self._start_kubelet(Path(tools["KUBELET_BIN_DIR"]) / "kubelet")
        eventually(self.ready, timeout=120, interval=1, what=f"node {self.name} Ready")
        self.timings["kubelet_ready"] = time.monotonic() - mark
        self._start_kube_proxy(Path(tools["KUBELET_BIN_DIR"]) / "kube-proxy")
        return self

    def __enter__(self) -> RealNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def api(self) -> Kubectl:
        assert self.kubectl is not None, "start() first"
        return Kubectl(str(self.kubectl), str(self.kubeconfig))

    def ready(self) -> bool:
        node = self.api().get("node", self.name)
        conditions = {c["type"]: c["status"] for c in (node or {}).get("status", {}).get("conditions", [])}
        return conditions.get("Ready") == "True"

    # containerd
    def containerd_config(self, sandbox_image: str) -> str:
        runc_options: dict[str, Any] = {"SystemdCgroup": False}
        if lacks_cap_sys_resource():
            runc_options["BinaryName"] = str(RUNC_WRAPPER)
        config = {
            "version": 2,
            "root": str(self.containerd_root),
            "state": str(self.containerd_dir / "state"),
            "grpc": {"address": str(self.socket)},
            "ttrpc": {"address": str(self.socket) + ".ttrpc"},
            "plugins": {
                "io.containerd.grpc.v1.cri": {
                    "sandbox_image": sandbox_image,
                    "stream_server_address": "127.0.0.1",
                    "stream_server_port": "0",
                    "cni": {"bin_dir": "/usr/lib/cni", "conf_dir": str(self.cni_dir / "net.d"), "max_conf_num": 1},
                    "containerd": {
                        "snapshotter": "overlayfs",
                        "default_runtime_name": "runc",
                        "runtimes": {"runc": {"runtime_type": "io.containerd.runc.v2", "options": runc_options}},
                    },
                }
            },
        }
        return toml(config)

    def cni_conflist(self) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": "cpullm-node",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": False,  # pods need no way out (there is none here), and iptables stays untouched
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.subnet}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.cni_dir / "ipam"),
                    },
                }
            ],
        }

    def _start_containerd(self, binary: str, sandbox_image: str) -> None:
        config = self.containerd_dir / "config.toml"
        config.write_text(self.containerd_config(sandbox_image))
        (self.cni_dir / "net.d" / "10-cpullm.conflist").write_text(json.dumps(self.cni_conflist(), indent=1))
        self._spawn("containerd", [binary, "--config", str(config)])
        eventually(lambda: self._ctr("version", check=False).returncode == 0, timeout=30, what="containerd serving")

    def _ctr(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", "--address", str(self.socket), "-n", "k8s.io", *args],
            check=check,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def _import(self, ctr: str, image: Image) -> None:
        """ctr images import, unless this store already holds this build of the image (marker file); then the
        store's older builds of it go."""
        marker = Path(self.image_store or self.containerd_dir / "root") / "cpullm-imported" / image.manifest
        present = image.ref in self._ctr("images", "ls", "-q").stdout.split()
        if not (marker.exists() and present):
            self._import_tar(ctr, image, present, marker)
        self._drop_older_builds(image)

    def _import_tar(self, ctr: str, image: Image, present: bool, marker: Path) -> None:
        if present:
            # An older build under the same reference (the vLLM stand-in's is fixed): its record goes first, so
            # the import makes a new one rather than updating it.
            self._ctr("images", "rm", image.ref)
        address = ["--address", str(self.socket), "-n", "k8s.io"]
        # Named by the tar's index (testbed/images.py says why not --index-name as well).
        command = [ctr, *address, "images", "import", str(image.tar)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if result.returncode != 0:
            raise RuntimeError(f"ctr images import {image.tar} failed: {result.stderr.strip()}")
        if image.ctr_tag():
            self._ctr(*image.ctr_tag())
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()

    def _drop_older_builds(self, image: Image) -> None:
        """Older builds of the image's repository (the operator's is tagged by its sources' digest) go, content and
        snapshots with them: a persistent store would otherwise grow by an image (~220 MB unpacked) at every change of
        the sources. A build goes under every name: its other tag, and the CRI's sha256:ID (which outlives the tag
        and pins the content too); then containerd's garbage collection (--sync) frees it."""
        rows = [line.split() for line in self._ctr("images", "ls").stdout.splitlines()[1:] if line.strip()]
        target = {row[0]: row[2] for row in rows if len(row) > 2}  # name -> the manifest it names
        repository = image.ref.rsplit(":", 1)[0]
        stale = {n for n, d in target.items() if n.rsplit(":", 1)[0] == repository and d != target.get(image.ref)}
        named = {d for n, d in target.items() if not n.startswith("sha256:") and n not in stale}
        for name, digest in target.items():
            if name in stale or (name.startswith("sha256:") and digest not in named):
                self._ctr("images", "rm", "--sync", name, check=False, timeout=300)

    # kubelet
    def kubelet_config(self) -> dict[str, Any]:
        address = resolve(self.name)
        self.kubelet_port = free_port()
        resolv = Path("/etc/resolv.conf")
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # This machine kind: cgroup v1 (refused by default since 1.35), no systemd, swap allowed.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "failSwapOn": False,
            # What the operator's Guaranteed pods rely on: exclusive CPUs; CPU 0 stays for the system.
            "cpuManagerPolicy": "static",
            "reservedSystemCPUs": "0",
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            # The API server dials the node's Hostname address (the name) for logs/exec: listen where it resolves.
            "address": address if address and address.startswith("127.") else "127.0.0.1",
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            # kwokctl's API server presents no client certificate to kubelets: anonymous, allowed (loopback only).
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "podLogsDir": str(self.pod_logs_dir),
            "resolvConf": str(resolv) if resolv.exists() else "",
            # A shared development disk: never evict test pods nor collect the imported images for disk usage.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
        }

    def node_labels(self) -> dict[str, str]:
        return {
            **machine.machine_labels(),
            "cpullm.io/cpu-manager-policy": "static",
            **REAL_NODE_SELECTOR,
            **self.labels,
        }

    def _start_kubelet(self, binary: Path) -> None:
        config = self.workdir / "kubelet.yaml"
        config.write_text(yaml.safe_dump(self.kubelet_config()))
        labels = ",".join(f"{k}={v}" for k, v in self.node_labels().items())
        self._spawn(
            "kubelet",
            [
                str(binary),
                f"--config={config}",
                f"--kubeconfig={self.kubeconfig}",
                f"--root-dir={self.kubelet_dir}",
                f"--cert-dir={self.kubelet_dir / 'pki'}",
                f"--hostname-override={self.name}",
                f"--node-labels={labels}",
                "--v=2",
            ],
        )

    # kube-proxy: Services' ClusterIPs work on this node, for its pods (the API server's own `kubernetes` Service,
    # which in-cluster clients dial) and for this host's processes (the tests).
    def kube_proxy_config(self) -> dict[str, Any]:
        return {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.kubeconfig)},
            "hostnameOverride": self.name,
            "mode": "iptables",
            "clusterCIDR": self.subnet,  # traffic from the pods is not masqueraded
            "healthzBindAddress": f"127.0.0.1:{free_port()}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            # Leave the host's conntrack sysctls and route_localnet alone: a shared development machine.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            "iptables": {"localhostNodePorts": False},
        }

    def _start_kube_proxy(self, binary: Path) -> None:
        self._kube_proxy_binary = binary
        config = self.workdir / "kube-proxy.yaml"
        config.write_text(yaml.safe_dump(self.kube_proxy_config()))
        self._spawn("kube-proxy", [str(binary), f"--config={config}", "--v=2"])
        eventually(self._service_rules, timeout=60, interval=1, what="kube-proxy's rules for the kubernetes Service")

    def _service_rules(self) -> bool:
        rules = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True, check=True).stdout
        return "default/kubernetes:https" in rules

    def _spawn(self, name: str, command: list[str]) -> None:
        log = (self.workdir / f"{name}.log").open("ab")
        self._logs.append(log)
        self._processes[name] = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.workdir
        )

    def log_tail(self, name: str = "kubelet", lines: int = 40) -> str:
        path = self.workdir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def container_log_files(self, pod: Mapping[str, Any], container: str) -> list[Path]:
        """A pod's container's log files as the kubelet keeps them, <restart count>.log: the last ended container's,
        then the running one's."""
        meta = pod["metadata"]
        directory = self.pod_logs_dir / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / container
        return sorted(directory.glob("*.log"), key=lambda path: int(path.stem))

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """A container's output as the kubelet wrote it (its pod log dir), without the CRI line prefixes."""
        lines = []
        for path in sorted(self.pod_logs_dir.glob(f"{namespace}_{pod}_*/{container}/*.log")):
            for line in path.read_text(errors="replace").splitlines():
                parts = line.split(" ", 3)  # <time> <stream> <P|F> <text>
                lines.append(parts[3] if len(parts) == 4 else "")
        return "\n".join(lines)

    # teardown
    def stop(self) -> None:
        """Removes everything start() made; safe to call twice, after a failed start, or with the cluster gone."""
        if self.kubectl is not None and self.kubeconfig.exists():
            self._drain()
        self._terminate("kube-proxy")
        if self._kube_proxy_binary is not None:  # its iptables chains and rules, which outlive it
            subprocess.run([str(self._kube_proxy_binary), "--cleanup"], capture_output=True, check=False, timeout=60)
        self._terminate("kubelet")
        if self.socket.exists():
            self._remove_containers()
        self._terminate("containerd")
        for log in self._logs:
            log.close()
        self._logs.clear()
        self._unmount_under(self.workdir)
        for name in {p.name for p in NETNS_DIR.glob("cni-*")} - self._netns_before:
            _unmount(NETNS_DIR / name)
            (NETNS_DIR / name).unlink(missing_ok=True)
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, check=False)
        _remove_cgroups("kubepods")
        for link in CONTAINER_LOGS.glob("*.log") if CONTAINER_LOGS.exists() else ():
            if link.is_symlink() and str(os.readlink(link)).startswith(str(self.pod_logs_dir)):
                link.unlink()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _drain(self) -> None:
        """Cordon, delete the DaemonSets and the node's pods and wait until the kubelet has stopped their sandboxes
        (so CNI releases their network namespaces), then delete the Node."""
        api = self.api()
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            if api.get("node", self.name) is None:
                return
            api.run("cordon", self.name, check=False)
            # A DaemonSet's pods ignore the cordon and come back as soon as they are deleted (the chart's NUMA
            # seccomp profile's did: the wait below ran out its 90 s at every run's end): they go first.
            api.run("delete", "daemonsets", "-A", "--all", "--wait=false", check=False)
            on_node = f"--field-selector=spec.nodeName={self.name}"
            api.run("delete", "pods", "-A", on_node, "--grace-period=1", "--wait=false", check=False)
            if "kubelet" in self._processes and self._processes["kubelet"].poll() is None:
                eventually(self._no_running_tasks, timeout=90, interval=1, what="the node's containers stopped")
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            api.run("delete", "node", self.name, "--wait=false", check=False)

    def _no_running_tasks(self) -> bool:
        if not self.socket.exists():
            return True
        listing = self._ctr("tasks", "ls", check=False).stdout.splitlines()[1:]
        return not [line for line in listing if "RUNNING" in line]

    def _remove_containers(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            for task in self._ctr("tasks", "ls", "-q", check=False).stdout.split():
                self._ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
            for task in self._ctr("tasks", "ls", "-q", check=False).stdout.split():
                self._ctr("tasks", "delete", "-f", task, check=False)
            for container in self._ctr("containers", "ls", "-q", check=False).stdout.split():
                self._ctr("containers", "delete", container, check=False)

    def _clear_an_earlier_run(self) -> None:
        """What a run that never reached stop() (killed, or its session restarted) left: its bridge is the sign.
        Its processes, its pods' network namespaces (their addresses would be handed out again on the same
        bridge) and the mounts under its work directory go; the node's CRI is the only one on this host."""
        if subprocess.run(["ip", "link", "show", self.bridge], capture_output=True, check=False).returncode != 0:
            return
        ours, temp = str(self.workdir), tempfile.gettempdir() + "/"
        earlier = {
            mount.split("/node/", 1)[0]
            for mount in (line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines())
            if mount.startswith(temp) and "/node/" in mount and not mount.startswith(ours)
        }
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError, ProcessLookupError):
                if any(directory.encode() in cmdline.read_bytes() for directory in earlier):
                    os.kill(int(cmdline.parent.name), signal.SIGKILL)
        for directory in earlier:
            self._unmount_under(Path(directory))
            shutil.rmtree(directory, ignore_errors=True)
        for namespace in NETNS_DIR.glob("cni-*"):
            _unmount(namespace)
            namespace.unlink(missing_ok=True)
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, check=False)
        print(f"real node: cleared an earlier run's bridge, namespaces and mounts ({sorted(earlier)})", file=sys.stderr)

    def _terminate(self, name: str) -> None:
        process = self._processes.pop(name, None)
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    @staticmethod
    def _unmount_under(directory: Path) -> None:
        prefix = str(directory) + "/"
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
            _unmount(Path(mount.encode().decode("unicode_escape")))


def _unmount(path: Path) -> None:
    subprocess.run(["umount", "--lazy", str(path)], capture_output=True, check=False)


def _remove_cgroups(name: str) -> None:
    """rmdir /sys/fs/cgroup/<controller>/<name> and its children, deepest first (empty cgroups only)."""
    for controller in CGROUP_ROOT.iterdir() if CGROUP_ROOT.exists() else ():
        top = controller / name
        if not top.is_dir() or top.is_symlink():
            continue
        for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def toml(document: dict[str, Any], prefix: str = "") -> str:
    """The little TOML containerd's config needs: strings, booleans, integers, tables (nested keys quoted)."""
    scalars, tables = [], []
    for key, value in document.items():
        if isinstance(value, dict):
            name = f"{prefix}.{_key(key)}" if prefix else _key(key)
            tables.append(f"\n[{name}]\n" + toml(value, name))
        else:
            scalars.append(f"{_key(key)} = {json.dumps(value)}")
    return "\n".join(scalars) + "".join(tables) + "\n"


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)
