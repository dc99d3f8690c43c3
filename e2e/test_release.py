"""The release path end to end (pytest marker `kind`; root): scripts/release.sh released this tree into a registry on
localhost (testbed/release.py) before the quick start installed its chart from there (testbed/spread.py), so the quick
start's served completion is the released chart's. Here: what the release holds, and that cosign tells it apart
from an image re-tagged over it."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml
from testbed.images import build_python_base
from testbed.registry import push_archive
from testbed.release import PLATFORMS, Release
from testbed.spread import QuickStart

pytestmark = [pytest.mark.kind, pytest.mark.skipif(os.geteuid() != 0, reason="a Docker engine of our own needs root")]
OPERATOR_NAMESPACE = "cpullm-operator"


def cosign(release: Release, *args: str) -> subprocess.CompletedProcess[str]:
    """cosign against the plain-HTTP registry, with the release's public key and no transparency log (the key
    pair signed without one)."""
    command = [str(release.cosign), *args, "--key", str(release.public_key), "--allow-http-registry"]
    return subprocess.run([*command, "--insecure-ignore-tlog"], capture_output=True, text=True, timeout=300)


def platform_digests(quick_start: QuickStart) -> dict[str, str]:
    """The released index's manifests, by architecture, read from the registry."""
    repository, digest = quick_start.release.image.split("/", 1)[1].split("@")
    connection = quick_start.registry.connection()
    try:
        accept = "application/vnd.oci.image.index.v1+json"
        connection.request("GET", f"/v2/{repository}/manifests/{digest}", headers={"Accept": accept})
        index = json.loads(connection.getresponse().read())
    finally:
        connection.close()
    return {m["platform"]["architecture"]: m["digest"] for m in index["manifests"]}


def test_the_release_names_its_base_by_the_digest_its_tag_had(quick_start: QuickStart) -> None:
    """release.sh reads the base's tag once and builds every platform FROM that index digest, recorded in
    digests.env: a base retagged later changes nothing the release names."""
    release = quick_start.release
    repository, digest = release.base.split("/", 1)[1].split("@")
    connection = quick_start.registry.connection()
    try:
        accept = "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json"
        connection.request("HEAD", f"/v2/{repository}/manifests/release", headers={"Accept": accept})
        tagged = connection.getresponse().getheader("Docker-Content-Digest")
    finally:
        connection.close()
    assert release.base.startswith(f"{quick_start.registry.host}/cpullm-python-base@sha256:")
    assert digest == tagged
    assert f"RELEASE_BASE={release.base}\n" in (release.assets / "digests.env").read_text()


def test_the_quick_start_runs_the_released_chart_and_its_image_by_digest(quick_start: QuickStart) -> None:
    release, kubectl = quick_start.release, quick_start.kubectl
    (deployment,) = kubectl.get("deployments", namespace=OPERATOR_NAMESPACE)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == release.image
    # The chart's labels say which chart and version made the Deployment.
    labels = deployment["metadata"]["labels"]
    assert labels["helm.sh/chart"] == f"cpullm-operator-{release.version}"
    assert labels["app.kubernetes.io/version"] == release.version
    assert deployment["status"].get("readyReplicas") == 1
    # Under it, the quick start's service came to Ready and answered (its service may be gone by now: the router's
    # test replaces it).
    assert any(line.startswith('{"id"') for line in quick_start.run.stdout.splitlines()), quick_start.run.stdout


def test_the_release_holds_every_platform_an_sbom_and_an_install_yaml_pinned_by_digest(
    quick_start: QuickStart, docker_env: dict[str, str]
) -> None:
    release = quick_start.release
    digests = platform_digests(quick_start)
    assert sorted(digests) == sorted(PLATFORMS)
    repository = release.image.split("@")[0]
    # Each platform's image runs on its own architecture's Python (arm64's under qemu-user-static), loads its native
    # dependencies (a CRD is pydantic's schema: pydantic_core's extension) and names the release's version. The
    # Dockerfile's build stage installs them natively for the target: a wrong wheel or base shows here.
    machines = {"amd64": "x86_64", "arm64": "aarch64"}
    for arch in PLATFORMS:
        image = f"{repository}@{digests[arch]}"

        def run(*args: str, image: str = image, arch: str = arch) -> str:
            done = subprocess.run(
                ["docker", "run", "--rm", "--platform", f"linux/{arch}", *args],
                env=docker_env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, (arch, args, done.stderr[-1000:])
            return done.stdout

        assert run(image, "--version").split() == ["cpullm", release.version], arch
        assert run(image, "crd", "--kind", "NodePerformance").startswith("apiVersion: apiextensions.k8s.io/v1"), arch
        machine = run("--entrypoint", "python3", image, "-c", "import platform; print(platform.machine())")
        assert machine.strip() == machines[arch]
        # Its SBOM, attached and signed, lists the operator's own dependencies.
        sbom = json.loads((release.assets / f"sbom-{arch}.spdx.json").read_text())
        names = {package["name"] for package in sbom["packages"]}
        assert {"kopf", "pydantic", "cpullm-operator"} <= names, sorted(names)[:40]
        attested = cosign(
            release, "verify-attestation", "--type", "spdxjson", f"{release.image.split('@')[0]}@{digests[arch]}"
        )
        assert attested.returncode == 0, attested.stderr[-1000:]
    # install.yaml, a release asset, installs the same image by digest, and the CRD with it.
    documents = [d for d in yaml.safe_load_all((release.assets / "install.yaml").read_text()) if d]
    kinds = {d["kind"] for d in documents}
    assert {"Namespace", "CustomResourceDefinition", "Deployment"} <= kinds
    (deployment,) = (d for d in documents if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == release.image
    # The chart's package names the same image, and its version is the release's.
    with tarfile.open(release.assets / f"cpullm-operator-{release.version}.tgz") as package:
        chart = yaml.safe_load(package.extractfile("cpullm-operator/Chart.yaml"))  # type: ignore[arg-type]
        values = yaml.safe_load(package.extractfile("cpullm-operator/values.yaml"))  # type: ignore[arg-type]
    assert (chart["version"], chart["appVersion"]) == (release.version, release.version)
    assert (values["image"]["repository"], values["image"]["digest"]) == tuple(release.image.split("@"))


def test_cosign_verifies_the_released_install_yaml_and_refuses_one_changed_after_signing(
    quick_start: QuickStart, tmp_path: Path
) -> None:
    """install.yaml is signed as a blob (its bundle a release asset): it verifies, and a copy with one byte more
    (an image swapped in by whoever hosts the file) does not."""
    release = quick_start.release
    bundle = release.assets / "install.yaml.sigstore.json"

    def verify(blob: Path) -> subprocess.CompletedProcess[str]:
        key = ("--key", str(release.public_key), "--insecure-ignore-tlog")  # signed without a transparency log
        command = [str(release.cosign), "verify-blob", str(blob), "--bundle", str(bundle), *key]
        return subprocess.run(command, capture_output=True, text=True, timeout=300)

    signed = verify(release.assets / "install.yaml")
    assert signed.returncode == 0, signed.stderr
    changed = tmp_path / "install.yaml"
    changed.write_text((release.assets / "install.yaml").read_text() + "\n")
    refused = verify(changed)
    assert refused.returncode != 0 and "invalid signature" in refused.stderr, refused.stderr


def test_cosign_verifies_the_image_and_the_chart_and_refuses_an_image_retagged_over_the_signed_one(
    quick_start: QuickStart,
) -> None:
    release = quick_start.release
    repository = release.image.split("@")[0]
    tag = f"{repository}:{release.version}"
    for signed in (release.image, tag, release.chart_ref):
        verified = cosign(release, "verify", signed)
        assert verified.returncode == 0, (signed, verified.stderr[-1000:])
    # Someone with push rights moves the tag to another image: the tag no longer verifies, the digest still does.
    push_archive(quick_start.registry, build_python_base(), f"cpullm-operator:{release.version}")
    moved = cosign(release, "verify", tag)
    assert moved.returncode != 0 and "no signatures found" in moved.stderr.lower(), moved.stderr[-1000:]
    assert cosign(release, "verify", release.image).returncode == 0
