"""A real container registry on this machine (Debian's docker-registry, the CNCF distribution registry) and the
images built here pushed into it, so a test can exercise a pull path (scripts/quickstart.sh --registry).

Images built here are OCI layout tars (testbed/images.py). `push_archive` copies one into the registry over the
distribution API as it is stored: its blobs are streamed straight out of the tar, uncompressed (the vLLM image's
5.5 GB layer would take minutes to gzip on two cores, and containerd pulls uncompressed OCI layers as they are),
and a blob the registry already holds is not sent again. Images in a Docker engine are pushed with `docker push`.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from testbed.images import Image, log
from testbed.tools import eventually, free_port

PACKAGE = "docker-registry"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"


@dataclass(frozen=True)
class Registry:
    """A registry listening on every interface of this machine at `port`; named `localhost:port`."""

    port: int

    @property
    def host(self) -> str:
        return f"localhost:{self.port}"

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("localhost", self.port, timeout=600)

    def answers(self) -> bool:
        connection = self.connection()
        try:
            connection.request("GET", "/v2/")
            status = connection.getresponse().status
        except OSError as error:
            raise AssertionError(f"the registry does not answer: {error}") from error
        finally:
            connection.close()
        assert status == 200, f"the registry's /v2/ answers {status}"
        return True


def ensure_package() -> Path:
    binary = shutil.which(PACKAGE)
    if binary is None:
        log(f"registry: apt-get install {PACKAGE}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "-q", PACKAGE], check=True, env=env, stdout=subprocess.DEVNULL)
        binary = shutil.which(PACKAGE)
    assert binary, f"{PACKAGE} installed no {PACKAGE} binary"
    return Path(binary)


@contextmanager
def local_registry() -> Iterator[Registry]:
    """A registry on a free port with its storage in a temporary directory, both gone on exit. It listens on every
    interface: kind's nodes reach it through their network's gateway."""
    binary = ensure_package()
    registry = Registry(free_port())
    with tempfile.TemporaryDirectory(prefix="cpullm-registry-") as storage:
        config = Path(storage) / "config.yml"
        config.write_text(
            json.dumps(
                {
                    "version": 0.1,
                    "log": {"level": "warn"},
                    "storage": {"filesystem": {"rootdirectory": f"{storage}/data"}},
                    "http": {"addr": f"0.0.0.0:{registry.port}"},
                }
            )
        )
        with (Path(storage) / "registry.log").open("w") as out:
            process = subprocess.Popen([str(binary), "serve", str(config)], stdout=out, stderr=subprocess.STDOUT)
        try:
            eventually(registry.answers, timeout=30, what=f"{PACKAGE} answering on port {registry.port}")
            yield registry
        finally:
            process.terminate()
            process.wait(timeout=30)


class _Slice:
    """`size` bytes of a file from its current position: an upload body http.client reads in blocks."""

    def __init__(self, source: BinaryIO, size: int) -> None:
        self.source, self.left = source, size

    def read(self, block: int = -1) -> bytes:
        chunk = self.source.read(self.left if block < 0 else min(block, self.left))
        self.left -= len(chunk)
        return chunk


def _request(registry: Registry, method: str, path: str, body: object = None, headers: dict[str, str] | None = None):
    connection = registry.connection()
    try:
        connection.request(method, path, body=body, headers=headers or {})  # type: ignore[arg-type]
        response = connection.getresponse()
        content = response.read()
    finally:
        connection.close()
    return response, content


def _push_blob(registry: Registry, repository: str, archive: tarfile.TarFile, digest: str) -> None:
    head, _ = _request(registry, "HEAD", f"/v2/{repository}/blobs/{digest}")
    if head.status == 200:
        return
    started, _ = _request(registry, "POST", f"/v2/{repository}/blobs/uploads/")
    assert started.status == 202, f"upload not started for {repository}: {started.status}"
    location = started.getheader("Location") or ""
    member = archive.getmember(f"blobs/sha256/{digest.removeprefix('sha256:')}")
    source = archive.fileobj
    assert source is not None
    source.seek(member.offset_data)
    separator = "&" if "?" in location else "?"
    url = location.split("://", 1)[-1].split("/", 1)[-1]
    headers = {"Content-Type": "application/octet-stream", "Content-Length": str(member.size)}
    put, content = _request(registry, "PUT", f"/{url}{separator}digest={digest}", _Slice(source, member.size), headers)
    assert put.status == 201, f"blob {digest} of {repository}: {put.status} {content[:200]!r}"


def _push_manifest(registry: Registry, repository: str, image: Image, tag: str | None) -> dict[str, object]:
    """Pushes an OCI layout tar's one image (its blobs, then its manifest under `tag`, or by digest alone);
    returns the manifest's descriptor, its platform included."""
    with tarfile.open(image.tar) as archive:
        index = json.load(archive.extractfile("index.json"))  # type: ignore[arg-type]
        (descriptor,) = index["manifests"]
        raw = archive.extractfile(f"blobs/sha256/{descriptor['digest'].removeprefix('sha256:')}").read()  # type: ignore[union-attr]
        manifest = json.loads(raw)
        assert descriptor["mediaType"] != INDEX_MEDIA_TYPE, f"{image.tar}: a nested index, not one image"
        for blob in [manifest["config"], *manifest["layers"]]:
            _push_blob(registry, repository, archive, blob["digest"])
    headers = {"Content-Type": descriptor["mediaType"]}
    reference = tag or descriptor["digest"]
    put, content = _request(registry, "PUT", f"/v2/{repository}/manifests/{reference}", raw, headers)
    assert put.status == 201, f"manifest of {repository}:{reference}: {put.status} {content[:200]!r}"
    return {key: descriptor[key] for key in ("mediaType", "digest", "size", "platform") if key in descriptor}


def push_archive(registry: Registry, image: Image, name: str) -> str:
    """Pushes an OCI layout tar's one image as `name` (repository:tag) and returns its reference there."""
    repository, tag = name.rsplit(":", 1)
    _push_manifest(registry, repository, image, tag)
    log(f"registry: pushed {image.ref} as {registry.host}/{name}")
    return f"{registry.host}/{name}"


def push_index(registry: Registry, images: list[Image], name: str) -> str:
    """Pushes images of one name built for several platforms as one multi-platform image index, `name`
    (repository:tag), and returns its reference there: what a build for those platforms pulls as its base."""
    repository, tag = name.rsplit(":", 1)
    manifests = [_push_manifest(registry, repository, image, None) for image in images]
    index = json.dumps({"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": manifests}).encode()
    put, content = _request(
        registry, "PUT", f"/v2/{repository}/manifests/{tag}", index, {"Content-Type": INDEX_MEDIA_TYPE}
    )
    assert put.status == 201, f"index of {name}: {put.status} {content[:200]!r}"
    log(f"registry: pushed {len(images)} platforms as {registry.host}/{name}")
    return f"{registry.host}/{name}"
