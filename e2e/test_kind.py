"""The kind path's parts built here (pytest marker `kind`; root; deselected by default): a Docker engine set up by
scripts/docker.sh and kind's base image built by e2e/kind_images.py from a Debian root filesystem. Checked as kind
uses them: a privileged node container of that image boots systemd with kind's entrypoint, its containerd serves,
and a container runs inside it (the nesting every kind pod relies on). Run: python -m pytest e2e/test_kind.py -m kind
(first run: apt-get install docker.io, mmdebstrap of the base, ~1 min)."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.helpers import eventually
from e2e.images import build_debian
from e2e.kind_images import build_kind_base

pytestmark = [pytest.mark.kind, pytest.mark.skipif(os.geteuid() != 0, reason="a Docker engine of our own needs root")]
DOCKER_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "docker.sh"


@pytest.fixture(scope="module")
def docker_env() -> Iterator[dict[str, str]]:
    """The environment for `docker` against an engine: this machine's, or one scripts/docker.sh starts (and stops
    afterwards)."""
    out = subprocess.run([str(DOCKER_SCRIPT), "start"], check=True, capture_output=True, text=True).stdout
    host = out.strip().splitlines()[-1].removeprefix("DOCKER_HOST=")
    ours = host.startswith("unix:///run/cpullm-docker/")
    try:
        yield {**os.environ, "DOCKER_HOST": host} if host else dict(os.environ)
    finally:
        if ours:
            subprocess.run([str(DOCKER_SCRIPT), "stop"], check=True)


def docker(env: dict[str, str], *args: str, stdin: Path | None = None) -> subprocess.CompletedProcess[str]:
    with (stdin or Path(os.devnull)).open("rb") as source:
        result = subprocess.run(["docker", *args], env=env, stdin=source, capture_output=True)
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode(), result.stderr.decode())


def test_a_kind_node_container_of_the_local_base_image_boots_and_runs_a_nested_container(docker_env):
    base = build_kind_base()
    loaded = docker(docker_env, "load", "--input", str(base.tar))
    assert loaded.returncode == 0 and base.ref in loaded.stdout, loaded.stderr
    name = f"cpullm-kind-base-{uuid.uuid4().hex[:6]}"
    # As kind runs a node: privileged, tmpfs /tmp and /run, an anonymous volume for /var, the host's modules.
    started = docker(
        docker_env,
        *("run", "--detach", "--privileged", "--name", name, "--tmpfs", "/tmp", "--tmpfs", "/run"),
        *("--volume", "/var", "--volume", "/lib/modules:/lib/modules:ro", base.ref),
    )
    assert started.returncode == 0, started.stderr
    try:

        def systemd_state() -> str:
            state = docker(docker_env, "exec", name, "systemctl", "is-system-running").stdout.strip()
            assert state in ("running", "degraded"), f"systemd is {state!r}"
            return state

        eventually(systemd_state, timeout=60, what="systemd up in the node container")
        active = docker(docker_env, "exec", name, "systemctl", "is-active", "containerd").stdout.strip()
        assert active == "active"
        entrypoint_log = docker(docker_env, "logs", name)
        assert "INFO: starting init" in entrypoint_log.stdout + entrypoint_log.stderr  # kind's entrypoint ran

        inner = build_debian()
        imported = docker(
            docker_env,
            "exec",
            "-i",
            name,
            "ctr",
            "-n",
            "k8s.io",
            "images",
            "import",
            "--index-name",
            inner.ref,
            "-",
            stdin=inner.tar,
        )
        assert imported.returncode == 0, imported.stderr
        nested = docker(
            docker_env,
            "exec",
            name,
            "ctr",
            "-n",
            "k8s.io",
            "run",
            "--rm",
            inner.ref,
            "nested",
            "sh",
            "-c",
            "grep -c . /etc/os-release && echo nested-ok",
        )
        assert nested.returncode == 0 and nested.stdout.strip().endswith("nested-ok"), nested.stderr
    finally:
        docker(docker_env, "rm", "--force", "--volumes", name)
