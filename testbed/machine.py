"""This machine as a Node would be labelled (NFD-style and cpullm.io labels), read from its real CPU flags, CPU
topology, NUMA nodes and memory: never hard-coded, since development machines differ (AVX-512/AMX Xeons, AVX2-only
EPYCs). Used by the real node (testbed/realnode.py) and the vLLM tests' harness (testbed/vllm_server.py). Also
drops files from its page cache, for a start charged as on a node that has not read them yet, and tells how much of
a file the page cache holds."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import platform
import re
from pathlib import Path

from cpullm import launcher

# lscpu names of the flags a CpuLLMService may require, published for this machine as cpullm.io/isa.<flag>.
ISA_FLAGS = (
    "avx2",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def smt_siblings() -> bool:
    """Whether any CPU shares its core (as NFD's cpu-hardware_multithreading says): the `ht` flag only says the
    CPU model could, and is set in VMs with one thread per core too."""
    lists = Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology/thread_siblings_list")
    return any(len(launcher.parse_cpu_list(f.read_text())) > 1 for f in lists)


def memory_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def numa_node_count() -> int:
    """NUMA nodes the kernel reports (/sys/devices/system/node/nodeN); 1 on kernels without NUMA support."""
    nodes = [p for p in Path("/sys/devices/system/node").glob("node*") if re.fullmatch(r"node\d+", p.name)]
    return len(nodes) or 1


def arch() -> str:
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), "unknown")


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))


def machine_labels(numa_nodes: int | None = None) -> dict[str, str]:
    """The labels the operator reads (core/topology.py) for this machine: its NUMA count (the real one unless
    numa_nodes says otherwise), the ISA flags it has and its SMT."""
    flags = cpu_flags()
    labels = {"cpullm.io/numa-nodes": str(numa_nodes if numa_nodes is not None else numa_node_count())}
    labels.update({f"cpullm.io/isa.{flag}": "true" for flag in ISA_FLAGS if flag in flags})
    labels["feature.node.kubernetes.io/cpu-hardware_multithreading"] = str(smt_siblings()).lower()
    return labels


def drop_from_page_cache(path: Path) -> None:
    """Writes back and drops the cached pages of a file, or of every file under a directory (pages that some
    process maps stay)."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
    for file in files:
        with contextlib.suppress(OSError):  # a file that went away or cannot be opened keeps its pages
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def cached_bytes(file: Path) -> int:
    """How much of a file the page cache holds (mincore(2) over a mapping of it, which reads none of it)."""
    size = file.stat().st_size
    if size == 0:
        return 0
    pages = -(-size // mmap.PAGESIZE)
    residency = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(file, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {file}")
        try:
            if libc.mincore(address, size, residency) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {file}")
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)
    return sum(page & 1 for page in residency) * mmap.PAGESIZE
