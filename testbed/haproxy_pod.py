"""An HAProxy pod's container, a CpuLLMGateway's or a router's, run on this machine as its image runs it (root): the
files of its ConfigMap at their mount, a gateway's team keys at /var/run/cpullm-gateway/keys, the image's own root
filesystem (testbed.images HAPROXY_ROOTFS: Debian's haproxy, the router's and gateway's image here) under an
overlay, so its /bin/sh, sha256sum and haproxy run the container's command as the pod's user (nobody), all in a
mount namespace of their own and on this machine's network. The keys directory is bind-mounted from the host, so a
test rotates a key as the kubelet does: a new file renamed over the old one.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from testbed.images import HAPROXY_ROOTFS

GATEWAY_CONFIG_DIR, KEYS_DIR, RUN_DIR = "etc/cpullm-gateway", "run/cpullm-gateway/keys", "run/cpullm-gateway"
GATEWAY_COMMAND = f"/bin/sh /{GATEWAY_CONFIG_DIR}/start.sh"
NOBODY = 65534  # the user the gateway's container runs as (core/children/router.py)


class HAProxyPod:
    """`files`: the ConfigMap's data, mounted at `config_dir` (relative to /); `command`: the container's, run by
    /bin/sh -c; `keys`: team -> key; `env`: the container's environment (services' keys). The defaults are a
    gateway's."""

    def __init__(
        self,
        files: Mapping[str, str],
        keys: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        config_dir: str = GATEWAY_CONFIG_DIR,
        command: str = GATEWAY_COMMAND,
    ) -> None:
        self.command = command
        self.dir = Path(tempfile.mkdtemp(prefix="cpullm-haproxy-"))
        self.keys = self.dir / "keys"
        self.keys.mkdir()
        upper = self.dir / "upper"
        (upper / config_dir).mkdir(parents=True)
        (upper / KEYS_DIR).mkdir(parents=True)
        for name, text in files.items():
            (upper / config_dir / name).write_text(text)
        shutil.copy("/etc/resolv.conf", upper / "etc" / "resolv.conf")
        (upper / RUN_DIR).chmod(0o777)  # an emptyDir: writable by the pod's user
        for team, key in (keys or {}).items():
            self.rotate(team, key)
        self.env = dict(env or {})
        self.log = self.dir / "haproxy.log"
        self.process: subprocess.Popen[bytes] | None = None

    def rotate(self, team: str, key: str) -> None:
        """The team's key file replaced at once (a rename), as the kubelet swaps a Secret's files."""
        fresh = self.keys / f".{team}.new"
        fresh.write_text(key)
        fresh.chmod(0o644)  # a Secret volume's files: readable by the pod's user
        fresh.rename(self.keys / team)

    def start(self) -> None:
        rootfs, merged, work = HAPROXY_ROOTFS.build(), self.dir / "merged", self.dir / "work"
        merged.mkdir()
        work.mkdir()
        script = (
            f"mount -t overlay overlay -o lowerdir={rootfs},upperdir={self.dir / 'upper'},workdir={work} {merged}"
            f" && mount --bind {self.keys} {merged / KEYS_DIR}"
            f" && exec chroot --userspec={NOBODY}:{NOBODY} {merged} /bin/sh -c {shlex.quote(self.command)}"
        )
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", **self.env}
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
