"""A release of this tree into a registry on this machine, by the one release path (scripts/release.sh), as a
maintainer runs it: every platform's operator image, the OCI chart naming it by digest, install.yaml, SBOMs and
cosign signatures made with a key pair of the test's own.

Our machines reach no public registry, so the Dockerfile's BASE is Debian's python3 built here for each platform
(testbed/images.py, build_python_base; arm64's under qemu-user-static) and pushed as one multi-platform image."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from testbed.cluster import tool_dirs
from testbed.images import build_python_base, log
from testbed.registry import Registry, push_index
from testbed.tools import ROOT

PLATFORMS = ("amd64", "arm64")


@dataclass(frozen=True)
class Release:
    """What scripts/release.sh printed and wrote: the image's index and the chart, each by digest."""

    version: str
    image: str  # REGISTRY/cpullm-operator@sha256:...
    chart: str  # oci://REGISTRY/charts/cpullm-operator
    chart_digest: str
    base: str  # the image it was built on, REGISTRY/REPOSITORY@sha256:... (the index's digest)
    assets: Path  # install.yaml, the chart's .tgz, sbom-ARCH.spdx.json, digests.env
    public_key: Path
    cosign: Path

    @property
    def chart_ref(self) -> str:
        """The chart as cosign names it: REGISTRY/charts/cpullm-operator@sha256:..."""
        return f"{self.chart.removeprefix('oci://')}@{self.chart_digest}"


def release_into(registry: Registry, version: str, workdir: Path) -> Release:
    """Runs scripts/release.sh VERSION into `registry` (HTTP) with a fresh cosign key pair; raises if it fails."""
    subprocess.run([str(ROOT / "scripts" / "binfmt.sh"), *PLATFORMS], check=True)
    base = push_index(registry, [build_python_base(a) for a in PLATFORMS], "cpullm-python-base:release")
    cosign = tool_dirs(["cosign"])["cosign"] / "cosign"
    keys = workdir / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "COSIGN_PASSWORD": ""}
    if not (keys / "cosign.key").exists():
        subprocess.run([str(cosign), "generate-key-pair"], cwd=keys, env=env, check=True, capture_output=True)
    assets = workdir / "dist"
    command = [
        str(ROOT / "scripts" / "release.sh"),
        version,
        *("--registry", registry.host, "--key", str(keys / "cosign.key"), "--base", base),
        *("--platforms", ",".join(f"linux/{a}" for a in PLATFORMS), "--out", str(assets)),
        *("--plain-http", "--allow-unreleased"),
    ]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    log(f"release.sh (exit {run.returncode}):\n{run.stderr}")
    assert run.returncode == 0, run.stderr[-3000:]
    printed = dict(line.split("=", 1) for line in run.stdout.splitlines() if line.startswith("RELEASE_"))
    return Release(
        version,
        printed["RELEASE_IMAGE"],
        printed["RELEASE_CHART"],
        printed["RELEASE_CHART_DIGEST"],
        printed["RELEASE_BASE"],
        assets,
        keys / "cosign.pub",
        cosign,
    )
