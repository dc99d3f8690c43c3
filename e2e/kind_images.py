"""kind's images, built here because no registry is reachable (the kind path, e2e/kind/run.sh):

- kind-base: an equivalent of kind's base image (`images/base/Dockerfile` of the pinned sigs.k8s.io/kind module):
  a Debian bookworm root filesystem (mmdebstrap) with systemd, Debian's containerd 1.6 and runc, the CNI plugins
  kind's nodes use (host-local, loopback, ptp, portmap) and kind's own files (entrypoint, systemd units, the
  containerd config, /kind/bin scripts) taken from the module. Differences from kind's: Debian's containerd and
  runc (kind builds containerd 2.x and runc 1.4 from source), bookworm rather than trixie, no crictl, no
  fuse-overlayfs (rootless only), no NFS/iSCSI clients. It also holds, at /kind/bin/cpullm-runc-wrapper, the
  TEST-ONLY runtime wrapper (e2e/node/runc-wrapper); it is used only where a cluster config patches containerd
  to it, which run.sh does only on hosts whose capability bounding set lacks CAP_SYS_RESOURCE.

The tars are OCI image layouts with a Docker manifest.json as well (`docker load` takes them), cached beside the
real node's images (e2e/images.py), keyed by their inputs.

Usage (root): python3 -m e2e.kind_images [kind-base]; prints KEY=value lines.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from e2e.cluster import tool_version
from e2e.images import (
    CACHE,
    ROOT,
    SUITE,
    Image,
    Layer,
    Rootfs,
    digest_of,
    drop_superseded,
    log,
    tar_command,
    up_to_date,
    write_image,
)

RUNC_WRAPPER = ROOT / "e2e" / "node" / "runc-wrapper"
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
    "python3-minimal",  # the runtime wrapper's interpreter
)
CNI_PLUGINS = ("host-local", "loopback", "ptp", "portmap")


def kind_module() -> Path:
    """The pinned sigs.k8s.io/kind module's source (Go's module cache; scripts/build-tools.sh kind fetched it)."""
    result = subprocess.run(
        ["go", "mod", "download", "-json", f"sigs.k8s.io/kind@{tool_version('KIND')}"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(json.loads(result.stdout)["Dir"])


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
        'chroot "$1" systemctl enable kubelet.service containerd.service undo-mount-hacks.service',
        'chroot "$1" systemctl mask systemd-binfmt.service',
        # The CRI base spec: containerd's default with kind's product-files hook, and no rlimits.
        'chroot "$1" sh -c \'ctr oci spec | jq ".hooks.createContainer[.hooks.createContainer | length] |='
        ' . + {\\"path\\": \\"/kind/bin/mount-product-files.sh\\"}" | jq "del(.process.rlimits)"'
        " > /etc/containerd/cri-base.json'",
    )
    return Rootfs("kind-base", KIND_BASE_PACKAGES, hooks)


def build_kind_base() -> Image:
    kind = kind_module()
    rootfs_recipe = kind_base_rootfs(kind)
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
        Layer(rootfs.name, tar_command(rootfs, ".", exclude=("./.complete",)), f"kind base: debian {SUITE}"),
        Layer(digest_of(RUNC_WRAPPER.read_bytes())[:16], tar_command(wrapper, "./kind"), "test-only runc wrapper"),
    ]
    if not up_to_date(out, layers, config):
        log(f"kind-base: writing {out}")
        write_image(out, ref, layers, config, docker_loadable=True)
    shutil.rmtree(wrapper)
    drop_superseded(out)
    return Image(ref, out)


BUILDERS = {"kind-base": build_kind_base}


def main(argv: list[str]) -> int:
    CACHE.mkdir(parents=True, exist_ok=True)
    for name in argv or list(BUILDERS):
        if name not in BUILDERS:
            log(f"unknown image {name!r} ({' '.join(BUILDERS)})")
            return 2
        image = BUILDERS[name]()
        print(f"{name.upper().replace('-', '_')}_IMAGE_REF={image.ref}")
        print(f"{name.upper().replace('-', '_')}_IMAGE_TAR={image.tar}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
