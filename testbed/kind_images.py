"""kind's images, built here because no registry is reachable (the kind path, testbed/kind/run.sh):

- kind-base: an equivalent of kind's base image (`images/base/Dockerfile` of the pinned sigs.k8s.io/kind module):
  a Debian bookworm root filesystem (mmdebstrap) with systemd, Debian's containerd 1.6 and runc, the CNI plugins
  kind's nodes use (host-local, loopback, ptp, portmap) and kind's own files (entrypoint, systemd units, the
  containerd config, /kind/bin scripts) taken from the module. Differences from kind's: Debian's containerd and
  runc (kind builds containerd 2.x and runc 1.4 from source), bookworm rather than trixie, no crictl, no
  fuse-overlayfs (rootless only), no NFS/iSCSI clients. It also holds, at /kind/bin/cpullm-runc-wrapper, the
  TEST-ONLY runtime wrapper (testbed/node/runc-wrapper); it is used only where a cluster config patches containerd
  to it, which run.sh does only on hosts whose capability bounding set lacks CAP_SYS_RESOURCE.

- kind-node: kind's node image for our Kubernetes (build_kind_node): the base with kubeadm, the kubelet and kubectl
  (scripts/build-tools.sh) and, imported into its containerd under the references kubeadm and kind ask for, the
  control-plane images, kube-proxy (on the base's root filesystem: it needs iptables), our etcd build (under its own
  version; testbed/kind_cluster.py tells kubeadm), CoreDNS (built from its Go module at kubeadm's version), our pause
  as kind's sandbox image, kind's default storage (kind_storage: the local-path-provisioner built from its Go
  module, Debian's busybox-static as its helper, and kind's manifest) and kind's default CNI (kind_cni: kind's
  kindnet manifest, its image our kindnetd stand-in testbed/kindnet.py on the base's root filesystem). Kept in
  Docker's image store (~2 GB), keyed by its inputs.

The kind-base tar is an OCI image layout with a Docker manifest.json as well (`docker load` takes it); the
component images are OCI layouts imported with ctr. All are cached beside the real node's images (testbed/images.py).

Usage (root): python3 -m testbed.kind_images [kind-base]; prints KEY=value lines (kind-node needs a Docker engine:
e2e/test_kind.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.cluster import tool_dirs, tool_version
from testbed.images import (
    CACHE,
    ROOT,
    SUITE,
    Image,
    Layer,
    Rootfs,
    build_pause,
    cached_image,
    digest_of,
    file_key,
    go_module_dir,
    log,
    main,
    rootfs_layer,
    tar_command,
)

RUNC_WRAPPER = ROOT / "testbed" / "node" / "runc-wrapper"
KINDNET = ROOT / "testbed" / "kindnet.py"
KIND_BASE_PACKAGES = (
    "systemd",
    "conntrack",
    "iptables",
    "nftables",
    "iproute2",
    "ethtool",
    "util-linux",
    "mount",
    "kmod",
    "libseccomp2",
    "pigz",
    "bash",
    "ca-certificates",
    "jq",
    "procps",
    "containerd",
    "runc",
    "containernetworking-plugins",
    "python3",  # the runtime wrapper's and the kindnetd stand-in's interpreter (python3-minimal has no json module)
    "busybox-static",  # the local-path helper image's one binary (busybox_helper)
)
CNI_PLUGINS = ("host-local", "loopback", "ptp", "portmap")


def kind_module() -> Path:
    """The pinned sigs.k8s.io/kind module's source."""
    return go_module_dir("sigs.k8s.io/kind", tool_version("KIND"))


def kind_base_rootfs(kind: Path) -> Rootfs:
    """kind's base Dockerfile's `base` stage, as mmdebstrap customize hooks ($1: the root filesystem)."""
    files = kind / "images" / "base" / "files"
    hooks = (
        f'cp -R --no-preserve=ownership {files}/. "$1"/',
        'chmod 0755 "$1"/usr/local/bin/* "$1"/kind "$1"/kind/bin "$1"/kind/bin/*',
        # kind's units expect its own build under /usr/local: Debian's binaries serve.
        'for b in containerd ctr containerd-shim-runc-v2; do ln -sf /usr/bin/$b "$1"/usr/local/bin/$b; done',
        'mkdir -p "$1"/opt/cni/bin "$1"/etc/kubernetes/manifests',
        " ".join(["for p in", *CNI_PLUGINS, '; do ln -sf /usr/lib/cni/$p "$1"/opt/cni/bin/$p; done']),
        'rm -f "$1"/lib/systemd/system/sysinit.target.wants/systemd-tmpfiles-setup.service'
        ' "$1"/lib/systemd/system/multi-user.target.wants/* "$1"/etc/systemd/system/*.wants/*'
        ' "$1"/lib/systemd/system/local-fs.target.wants/* "$1"/lib/systemd/system/sockets.target.wants/*udev*'
        ' "$1"/lib/systemd/system/sockets.target.wants/*initctl* "$1"/lib/systemd/system/basic.target.wants/*',
        'echo ReadKMsg=no >> "$1"/etc/systemd/journald.conf',
        'ln -sf /usr/lib/systemd/systemd "$1"/sbin/init',
        # kind >= 0.31 no longer prepares cgroup v1 (kind PR 4077): there systemd creates kubelet.slice only in the
        # hierarchies it manages, and the kubelet refuses to start without it in every one (e.g. hugetlb).
        "printf '%s\\n' '[Service]' 'ExecStartPre=/bin/sh -c \"test -e /sys/fs/cgroup/cgroup.controllers ||"
        " for c in /sys/fs/cgroup/*/; do mkdir -p $${c}kubelet.slice; done\"'"
        ' > "$1"/etc/systemd/system/kubelet.service.d/20-cpullm-cgroup-v1.conf',
        'chroot "$1" systemctl enable kubelet.service containerd.service undo-mount-hacks.service',
        'chroot "$1" systemctl mask systemd-binfmt.service',
        # The CRI base spec: containerd's default with kind's product-files hook, and no rlimits.
        'chroot "$1" sh -c \'ctr oci spec | jq ".hooks.createContainer[.hooks.createContainer | length] |='
        ' . + {\\"path\\": \\"/kind/bin/mount-product-files.sh\\"}" | jq "del(.process.rlimits)"'
        " > /etc/containerd/cri-base.json'",
    )
    return Rootfs("kind-base", KIND_BASE_PACKAGES, hooks)


def build_kind_base(rootfs_recipe: Rootfs | None = None) -> Image:
    """`rootfs_recipe`: kind_base_rootfs's, when the caller already made it (it reads the kind module)."""
    rootfs_recipe = rootfs_recipe or kind_base_rootfs(kind_module())
    rootfs = rootfs_recipe.build()
    wrapper = CACHE / "kind-base-wrapper"
    shutil.rmtree(wrapper, ignore_errors=True)
    (wrapper / "kind" / "bin").mkdir(parents=True)
    shutil.copy2(RUNC_WRAPPER, wrapper / "kind" / "bin" / "cpullm-runc-wrapper")
    key = digest_of(rootfs_recipe.key(), RUNC_WRAPPER.read_bytes())[:12]
    ref = f"localhost/cpullm-kind-base:{key}"
    out = CACHE / f"kind-base-{key}.tar"
    config = {
        "Env": ["container=docker", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "Entrypoint": ["/usr/local/bin/entrypoint", "/sbin/init"],
        "StopSignal": "SIGRTMIN+3",
    }
    layers = [
        rootfs_layer(rootfs, f"kind base: debian {SUITE}"),
        Layer(digest_of(RUNC_WRAPPER.read_bytes())[:16], tar_command(wrapper, "./kind"), "test-only runc wrapper"),
    ]
    image = cached_image(out, ref, layers, config, docker_loadable=True)
    shutil.rmtree(wrapper)
    return image


# The references kubeadm v1.36 and kind's containerd config (sandbox_image) ask for; etcd runs under its own
# version, which the cluster config gives kubeadm (ClusterConfiguration etcd.local.imageTag).
K8S_REGISTRY = "registry.k8s.io"
SANDBOX_IMAGE = f"{K8S_REGISTRY}/pause:3.10"
BIN_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def etcd_image_tag() -> str:
    return tool_version("ETCD")


def binary_image(name: str, ref: str, binaries: list[Path], base: Rootfs | None = None, **config: Any) -> Image:
    """A component image: its static binaries in /usr/local/bin, on `base` when it needs more (kube-proxy needs
    iptables), written once per set of inputs."""
    staging = CACHE / f"{name}-staging"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "usr" / "local" / "bin").mkdir(parents=True)
    for binary in binaries:  # hard links: no copy of the ~100 MB binaries
        os.link(binary, staging / "usr" / "local" / "bin" / binary.name)
    inputs = [file_key(b) for b in binaries]
    layers = [Layer(digest_of(*inputs)[:16], tar_command(staging, "./usr"), f"{name}: {' '.join(inputs)}")]
    if base is not None:
        layers.insert(0, rootfs_layer(base.build(), f"{name}: base"))
    key = digest_of(ref, *(layer.key for layer in layers))[:12]
    out = CACHE / f"kind-{name}-{key}.tar"
    image = cached_image(out, ref, layers, {"Env": [BIN_PATH], **config})
    shutil.rmtree(staging)
    return image


@dataclass(frozen=True)
class KindManifest:
    """A manifest kind's node-image builder bakes into the node (a pkg/build/nodeimage/const_*.go of the pinned
    module) at /kind/manifests/, which `kind create cluster` applies, and the image references it names (the
    module's string constants, by name)."""

    path: str
    text: str
    refs: dict[str, str]

    @classmethod
    def read(cls, kind: Path, source: str, constant: str, path: str) -> KindManifest:
        """`constant`: the manifest's Go constant, raw strings and string constants joined by `+`."""
        go = (kind / "pkg" / "build" / "nodeimage" / source).read_text()
        refs = dict(re.findall(r'^const (\w+) = "([^"]*)"$', go, re.MULTILINE))
        expression = go.split(f"const {constant} = ", 1)[1]
        parts, position = [], 0
        for token in re.finditer(r"\s*(?:`([^`]*)`|(\w+))\s*(\+?)", expression):
            assert token.start() == position, f"unexpected Go in {constant}: {expression[position:][:80]}"
            parts.append(token[1] if token[1] is not None else refs[token[2]])
            position = token.end()
            if not token[3]:
                break
        return cls(path, "".join(parts), refs)


def kind_storage(kind: Path) -> KindManifest:
    """kind's default storage: the local-path-provisioner and its helper (without it, kind falls back to a
    host-path StorageClass with no provisioner)."""
    return KindManifest.read(kind, "const_storage.go", "defaultStorageManifest", "/kind/manifests/default-storage.yaml")


def kind_cni(kind: Path) -> KindManifest:
    """kind's default CNI: the kindnet DaemonSet (a template kind fills with the pod subnet), whose image here is
    our stand-in for kindnetd (testbed/kindnet.py)."""
    return KindManifest.read(kind, "const_cni.go", "defaultCNIManifest", "/kind/manifests/default-cni.yaml")


def busybox_helper(ref: str, base: Rootfs) -> Image:
    """The local-path-provisioner's helper pod runs kind's setup and teardown scripts with /bin/sh, mkdir and rm;
    kind's helper has Debian's on a distroless base, this one Debian's busybox-static from the base's root
    filesystem (2 MB; the e2e tests call its other applets, e.g. `busybox nslookup`)."""
    busybox = base.build() / "bin" / "busybox"
    staging = CACHE / "busybox-helper-staging"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "bin").mkdir(parents=True)
    shutil.copy2(busybox, staging / "bin" / "busybox")
    for applet in ("sh", "mkdir", "rm"):
        (staging / "bin" / applet).symlink_to("busybox")
    layer = Layer(digest_of(busybox.read_bytes())[:16], tar_command(staging, "./bin"), "busybox-static: sh, mkdir, rm")
    key = digest_of(ref, layer.key)[:12]
    image = cached_image(CACHE / f"kind-busybox-helper-{key}.tar", ref, [layer], {"Env": ["PATH=/bin"]})
    shutil.rmtree(staging)
    return image


def node_images(tools: dict[str, Path], base: Rootfs, storage: KindManifest, cni: KindManifest) -> list[Image]:
    """Every image a kind node would pull, built here under the reference it would pull."""
    v = tool_version("KUBERNETES")
    k8s, node = tools["kubernetes"], tools["kubelet"]
    images = [
        binary_image(component, f"{K8S_REGISTRY}/{component}:{v}", [k8s / component])
        for component in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
    ]
    images.append(binary_image("kube-proxy", f"{K8S_REGISTRY}/kube-proxy:{v}", [node / "kube-proxy"], base))
    etcd = tools["etcd"]
    images.append(binary_image("etcd", f"{K8S_REGISTRY}/etcd:{etcd_image_tag()}", [etcd / "etcd", etcd / "etcdctl"]))
    coredns_ref = f"{K8S_REGISTRY}/coredns/coredns:{tool_version('COREDNS')}"
    images.append(
        binary_image("coredns", coredns_ref, [tools["coredns"] / "coredns"], Entrypoint=["/usr/local/bin/coredns"])
    )
    pause = build_pause()
    images.append(Image(SANDBOX_IMAGE, pause.tar))  # imported under kind's sandbox_image reference
    provisioner = tools["local_path_provisioner"] / "local-path-provisioner"
    images.append(binary_image("local-path-provisioner", storage.refs["storageProvisionerImage"], [provisioner]))
    images.append(busybox_helper(storage.refs["storageHelperImage"], base))
    # On the base's root filesystem (python3, iproute2), whose layer kube-proxy's image has already.
    kindnet = ["/usr/bin/python3", "-I", f"/usr/local/bin/{KINDNET.name}"]
    images.append(binary_image("kindnetd", cni.refs["kindnetdImage"], [KINDNET], base, Entrypoint=kindnet))
    return images


# How _assemble makes a node image, in the image's key: a change to it must not reuse an image made the old way.
ASSEMBLY = "2: each image imported under its tar's own name, then tagged with its reference where that differs"


def build_kind_node(docker_env: dict[str, str]) -> str:
    """kind's node image for our Kubernetes, assembled as kind's builder does (a container of the base image gets
    kubeadm, the kubelet and kubectl, /kind/version and every image imported into its containerd, then is
    committed) but from images built here: the builder fetches what is not in a release tarball, and imports with
    a ctr flag Debian's ctr lacks. Returns the image reference (kept in Docker's image store)."""
    tools = tool_dirs(["kubernetes", "etcd", "kubelet", "kubeadm", "coredns", "local-path-provisioner"])
    kind = kind_module()
    base_recipe = kind_base_rootfs(kind)
    base = build_kind_base(base_recipe)
    manifests = [kind_storage(kind), kind_cni(kind)]
    images = node_images(tools, base_recipe, *manifests)
    binaries = [tools["kubeadm"] / "kubeadm", tools["kubelet"] / "kubelet", tools["kubernetes"] / "kubectl"]
    inputs = [ASSEMBLY, base.ref, *(f"{i.ref}={i.manifest}" for i in images), *(m.text for m in manifests)]
    inputs += [file_key(b) for b in binaries]
    ref = f"localhost/cpullm-kind-node:{digest_of(*inputs)[:12]}"
    if _docker(docker_env, "image", "inspect", ref, check=False).returncode != 0:
        _assemble(docker_env, ref, base, binaries, images, manifests)
    drop_other_tags(docker_env, ref)
    drop_other_tags(docker_env, base.ref)
    return ref


def _assemble(
    docker_env: dict[str, str],
    ref: str,
    base: Image,
    binaries: list[Path],
    images: list[Image],
    manifests: list[KindManifest],
) -> None:
    log(f"kind-node: assembling {ref}")
    _docker(docker_env, "load", "--input", str(base.tar))
    builder = f"cpullm-kind-build-{digest_of(ref)[:6]}"
    _docker(docker_env, "rm", "--force", builder, check=False)
    _docker(
        docker_env, "run", "--detach", "--privileged", "--name", builder, "--entrypoint", "sleep", base.ref, "infinity"
    )
    try:
        for binary in binaries:
            _docker(docker_env, "cp", str(binary), f"{builder}:/usr/bin/{binary.name}")
        version = tool_version("KUBERNETES")
        _docker(docker_env, "exec", builder, "sh", "-c", f"echo {version} > /kind/version")
        for manifest in manifests:
            write = f"mkdir -p {Path(manifest.path).parent} && cat > {manifest.path}"
            _docker(docker_env, "exec", "-i", builder, "sh", "-c", write, data=manifest.text.encode())
        _docker(docker_env, "exec", "--detach", builder, "containerd")
        _docker(docker_env, "exec", builder, "sh", "-c", "for i in $(seq 50); do ctr version && break; sleep 0.2; done")
        import_into_node = ("exec", "-i", builder, "ctr", "-n", "k8s.io", "images", "import", "--all-platforms")
        for image in images:
            with image.tar.open("rb") as tar:
                _docker(docker_env, *import_into_node, "-", stdin=tar)  # named by its index: see testbed/images.py
            if image.ctr_tag():
                _docker(docker_env, "exec", builder, "ctr", "-n", "k8s.io", *image.ctr_tag())
        _docker(docker_env, "exec", builder, "sh", "-c", "pkill containerd; while pgrep containerd; do sleep 0.2; done")
        # The base's Env and StopSignal carry over; the entrypoint and command the build overrode are restored.
        changes = ['ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]', "CMD []"]
        _docker(docker_env, "commit", *(f"--change={c}" for c in changes), builder, ref)
    finally:
        _docker(docker_env, "rm", "--force", builder, check=False)


def drop_other_tags(docker_env: dict[str, str], ref: str) -> None:
    """Removes Docker's other tags of ref's repository: each new input would otherwise leave a ~2 GB node image."""
    repository = ref.rsplit(":", 1)[0]
    listed = subprocess.run(
        ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", repository],
        env=docker_env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for other in set(listed) - {ref}:
        log(f"docker: removing superseded {other}")
        _docker(docker_env, "rmi", other, check=False)


def _docker(
    env: dict[str, str], *args: str, check: bool = True, stdin: Any = None, data: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """`stdin`: a file to read from; `data`: bytes to send instead."""
    return subprocess.run(["docker", *args], env=env, check=check, stdin=stdin, input=data, stdout=sys.stderr)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], {"kind-base": build_kind_base}))
