"""A memory cgroup of its own for a local process tree, read as the kubelet reads a pod's (and as
e2e/test_node.py reads one from inside the container), on cgroup v1 or v2 as the machine has it:

    measure        v1 (memory controller's hierarchy)          v2 (unified hierarchy)
    limit          memory.limit_in_bytes                       memory.max
    usage          memory.usage_in_bytes                       memory.current
    kernel peak    memory.max_usage_in_bytes                   memory.peak (kernel 5.19+; else none)
    inactive file  memory.stat total_inactive_file             memory.stat inactive_file
    OOM kills      memory.oom_control oom_kill                 memory.events oom_kill

Working set = usage - inactive file, what the kubelet's eviction and `kubectl top` use. The cgroup is made
inside the memory cgroup this process runs in (so whatever accounts for this process still accounts for the
tree); on v2, where a cgroup holding processes cannot hand the memory controller to its children, inside the
hierarchy's root instead. Root, or a delegated subtree, is needed: without it `create` raises
CgroupUnavailable, never a silent fallback to another measure.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


class CgroupUnavailable(RuntimeError):
    """No memory cgroup could be made here (no memory controller mounted, or no permission)."""


@dataclass(frozen=True)
class Hierarchy:
    """Where the memory controller is mounted and where this process sits in it."""

    version: int  # 1 or 2
    mount: Path
    own: Path  # this process's memory cgroup, as a directory under `mount`


# Where a container finds its own memory cgroup (its runtime mounts it there).
CONTAINER_VIEW = {1: "/sys/fs/cgroup/memory", 2: "/sys/fs/cgroup"}
# memory.stat's names for the parts of usage reported next to the peaks (v1's hierarchical totals, v2's own).
PARTS = {
    1: {"anon": "total_rss", "shmem": "total_shmem", "active_file": "total_active_file"},
    2: {"anon": "anon", "shmem": "shmem", "active_file": "active_file"},
}


@dataclass(frozen=True)
class Reading:
    usage: int
    inactive_file: int
    anon: int = 0  # anonymous memory (v1 rss, which includes transparent huge pages)
    shmem: int = 0  # tmpfs and shared anonymous memory, /dev/shm included
    active_file: int = 0  # page cache recently used twice: in the working set, yet reclaimable

    @property
    def working_set(self) -> int:
        return max(0, self.usage - self.inactive_file)

    @property
    def other(self) -> int:
        """Kernel memory and whatever else the cgroup is charged for beyond the LRU lists above."""
        return max(0, self.usage - self.anon - self.shmem - self.active_file - self.inactive_file)


def find_hierarchy(proc: Path = PROC) -> Hierarchy:
    """The memory controller's hierarchy from /proc/self/mountinfo and /proc/self/cgroup: a v1 mount whose
    options name `memory`, else a cgroup2 mount whose cgroup.controllers lists `memory` (on a hybrid host the
    controller is on v1 and the v2 mount has no memory files)."""
    v1: tuple[Path, str] | None = None
    v2: tuple[Path, str] | None = None
    for line in (proc / "self" / "mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        parts, fs = fields.split(), tail.split()
        if len(parts) < 5 or len(fs) < 3:
            continue
        root, mount = parts[3], Path(parts[4].replace("\\040", " "))
        if fs[0] == "cgroup" and "memory" in fs[2].split(",") and v1 is None:
            v1 = (mount, root)
        elif fs[0] == "cgroup2" and v2 is None:
            controllers = mount / "cgroup.controllers"
            if controllers.exists() and "memory" in controllers.read_text().split():
                v2 = (mount, root)
    memberships = [line.split(":", 2) for line in (proc / "self" / "cgroup").read_text().splitlines()]
    if v1 is not None:
        version, (mount, root) = 1, v1
        paths = [path for _, controllers, path in memberships if "memory" in controllers.split(",")]
    elif v2 is not None:
        version, (mount, root) = 2, v2
        paths = [path for hierarchy_id, controllers, path in memberships if hierarchy_id == "0" and not controllers]
    else:
        raise CgroupUnavailable("no memory cgroup controller is mounted (neither a v1 `memory` nor a v2 one)")
    own = mount
    if paths:
        # Without a cgroup namespace a container sees its own cgroup as the mount's root: strip that prefix.
        relative = paths[0][len(root) :] if root != "/" and paths[0].startswith(root) else paths[0]
        if (mount / relative.lstrip("/")).is_dir():
            own = mount / relative.lstrip("/")
    return Hierarchy(version, mount, own)


@dataclass
class MemoryCgroup:
    """One memory cgroup made for one process tree; `join` (from the child, before it execs) puts a process in."""

    path: Path
    version: int

    @classmethod
    def create(cls, name: str, limit_bytes: int | None, proc: Path = PROC) -> MemoryCgroup:
        hierarchy = find_hierarchy(proc)
        parents = [hierarchy.own] if hierarchy.version == 1 else [hierarchy.own, hierarchy.mount]
        problems = []
        for parent in dict.fromkeys(parents):
            try:
                if hierarchy.version == 2:
                    _delegate_memory(parent)
                path = parent / name
                path.mkdir()
            except OSError as error:
                problems.append(f"{parent}: {error.strerror or error}")
                continue
            cgroup = cls(path, hierarchy.version)
            try:
                if limit_bytes is not None:
                    cgroup.set_limit(limit_bytes)
            except OSError as error:
                cgroup.remove()
                problems.append(f"{path}: setting the limit: {error.strerror or error}")
                continue
            return cgroup
        raise CgroupUnavailable(
            f"cannot make a memory cgroup (v{hierarchy.version}) for the server: {'; '.join(problems)}. The vLLM "
            "tests measure memory as the kubelet does, in a cgroup of the server's own: run them as root or in a "
            "delegated cgroup subtree"
        )

    def _file(self, name: str) -> Path:
        return self.path / name

    def set_limit(self, limit_bytes: int) -> None:
        """The memory limit, and no swap beyond it (a kubelet node runs pods without swap by default)."""
        self._file("memory.limit_in_bytes" if self.version == 1 else "memory.max").write_text(str(limit_bytes))
        swap = self._file("memory.memsw.limit_in_bytes" if self.version == 1 else "memory.swap.max")
        if swap.exists():
            swap.write_text(str(limit_bytes) if self.version == 1 else "0")

    def join(self) -> None:
        """Moves the calling process in. Safe in subprocess's preexec_fn: no allocation-heavy work, raw os calls."""
        fd = os.open(self._file("cgroup.procs"), os.O_WRONLY)
        try:
            os.write(fd, b"0")  # "0" is the writing process itself (v1 and v2 alike)
        finally:
            os.close(fd)

    def seen_as_a_containers(self, command: Sequence[str]) -> list[str]:
        """`command` run where it finds this cgroup at the paths a container finds its own (/sys/fs/cgroup on v2,
        /sys/fs/cgroup/memory on v1), bound there in a mount namespace of its own: what reads the container's
        limit and usage from those paths (vLLM's memory checks) reads this cgroup's, as in a pod."""
        target = CONTAINER_VIEW[self.version]
        mount_then_exec = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
        unshare = ["unshare", "--mount", "--propagation", "private", "--"]
        return [*unshare, "sh", "-c", mount_then_exec, "sh", str(self.path), target, *command]

    def limit(self) -> int | None:
        text = self._file("memory.limit_in_bytes" if self.version == 1 else "memory.max").read_text().strip()
        value = None if text == "max" else int(text)
        return None if value is None or value >= 2**62 else value  # v1 says "no limit" with a huge number

    def reading(self) -> Reading:
        usage = int(self._file("memory.usage_in_bytes" if self.version == 1 else "memory.current").read_text())
        stat = self._stats(self._file("memory.stat"))
        parts = {part: stat.get(key, 0) for part, key in PARTS[self.version].items()}
        return Reading(usage, stat.get("total_inactive_file" if self.version == 1 else "inactive_file", 0), **parts)

    def kernel_peak(self) -> int | None:
        """The kernel's own high-water mark of usage since the cgroup was made (None on v2 before memory.peak)."""
        peak = self._file("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak")
        return int(peak.read_text()) if peak.exists() else None

    def oom_kills(self) -> int:
        return self._stats(self._file("memory.oom_control" if self.version == 1 else "memory.events")).get(
            "oom_kill", 0
        )

    def pids(self) -> list[int]:
        try:
            return [int(pid) for pid in self._file("cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    def remove(self, timeout: float = 30) -> None:
        """SIGKILLs whatever is still inside, waits for it to leave, and removes the cgroup."""
        deadline = time.monotonic() + timeout
        while True:
            pids = self.pids()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as error:
                if error.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise RuntimeError(f"cannot remove {self.path} (still holds {pids}): {error}") from error
            time.sleep(0.1)  # killed processes leave the cgroup once they are reaped

    @staticmethod
    def _stats(path: Path) -> dict[str, int]:
        """A flat-keyed cgroup file ("name value" per line)."""
        stats = {}
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if value.strip().lstrip("-").isdigit():
                stats[name] = int(value)
        return stats


def _delegate_memory(parent: Path) -> None:
    """On v2, a cgroup's children get the memory controller only if the parent lists it in subtree_control."""
    control = parent / "cgroup.subtree_control"
    if "memory" not in control.read_text().split():
        control.write_text("+memory")


def container_cgroup(container_id: str, controller: str) -> Path:
    """A running container's cgroup directory of `controller` as this host sees it, wherever its kubelet put it (the
    real node's kubepods tree, or a kind node's under its Docker container's cgroup), named by the bare ID
    (cgroupfs driver) or inside a systemd scope's name; v1's controller hierarchy, else v2's unified tree."""
    v1 = Path("/sys/fs/cgroup") / controller
    root = v1 if v1.is_dir() else Path("/sys/fs/cgroup")
    found = [path for path in root.rglob(f"*{container_id}*") if path.is_dir()]
    assert len(found) == 1, (container_id, found)
    return found[0]


def hold_cpu_to(cgroup: Path, cpus: float) -> None:
    """Cut a container's CFS quota to `cpus` CPUs, behind its kubelet's back (as a node agent or a resize might)."""
    if (cgroup / "cpu.max").exists():
        (cgroup / "cpu.max").write_text(f"{int(cpus * 100_000)} 100000")
    else:
        (cgroup / "cpu.cfs_period_us").write_text("100000")
        (cgroup / "cpu.cfs_quota_us").write_text(str(int(cpus * 100_000)))


def hold_memory_to_usage(cgroup: Path, margin: int = 16 << 20) -> None:
    """Limit a container to the memory it uses now and `margin` more, behind its kubelet's back: a process still
    growing (a server starting) is killed for memory within seconds. OSError where the limit cannot be set (v1
    refuses one below what it cannot reclaim) or the container is gone."""
    if (cgroup / "memory.max").exists():
        (cgroup / "memory.max").write_text(str(int((cgroup / "memory.current").read_text()) + margin))
    else:
        (cgroup / "memory.limit_in_bytes").write_text(str(int((cgroup / "memory.usage_in_bytes").read_text()) + margin))


def hold_new_containers_to_usage(pods: Sequence[dict[str, object]], held: set[str]) -> None:
    """Each running container of `pods` not in `held` (container IDs) limited to what it uses now
    (hold_memory_to_usage) and added to `held`: called again and again, every restart is held as it starts."""
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:  # type: ignore[union-attr]
            if "running" not in (status.get("state") or {}) or status.get("containerID") in held:
                continue
            with contextlib.suppress(OSError, AssertionError):  # ended meanwhile, or its cgroup not there yet
                hold_memory_to_usage(container_cgroup(status["containerID"].split("://", 1)[1], "memory"))
                held.add(status["containerID"])


def mount_unmounted_v1_hierarchies(proc: Path = PROC, root: Path = Path("/sys/fs/cgroup")) -> list[str]:
    """Mounts each cgroup v1 hierarchy this process is in that nothing mounts, at `root`/<its controllers>, as a
    distribution's init mounts them all (some VMs leave a few out: hugetlb, net_cls,net_prio, perf_event here).
    containerd's shim loads a container's cgroup through every hierarchy of /proc/PID/cgroup; with one unmounted
    ("loading cgroup for PID: cannot find cgroup mount destination") the shim has no OOM monitor, and a container
    killed for memory ends as Error, never OOMKilled. A kind node sees the mounts the host had when it was created
    (runc mounts those). Returns the hierarchies mounted: none on a v2 host or one that mounts them all."""
    if (root / "cgroup.controllers").exists():
        return []
    mounted: list[set[str]] = []
    for line in (proc / "self" / "mountinfo").read_text().splitlines():
        _, _, tail = line.partition(" - ")
        fs = tail.split()
        if len(fs) >= 3 and fs[0] == "cgroup":
            mounted.append(set(fs[2].split(",")))
    done = []
    for line in (proc / "self" / "cgroup").read_text().splitlines():
        number, controllers, _ = line.split(":", 2)
        wanted = set(controllers.split(","))
        if number == "0" or not controllers or any(wanted <= options for options in mounted):
            continue
        target = root / controllers.removeprefix("name=")
        target.mkdir(exist_ok=True)
        options = f"none,{controllers}" if controllers.startswith("name=") else controllers
        subprocess.run(["mount", "-t", "cgroup", "-o", options, "cgroup", str(target)], check=True)
        done.append(controllers)
    return done
