"""NUMA-aware launcher for vLLM's CPU backend: turns the cpuset the pod really got into explicit vLLM knobs.

vLLM's `VLLM_CPU_OMP_THREADS_BIND=auto` maps rank i to the i-th allowed memory node, which the kubelet's static CPU
manager does not narrow: a pod whose CPUs sit on NUMA node 1 gets rank 0 bound to node 0, where it has no CPU
(vllm#43240). Only code inside the container knows the cpuset, so this launcher reads it, writes explicit
`VLLM_CPU_OMP_THREADS_BIND` (ranks separated by `|`) and `CPU_VISIBLE_MEMORY_NODES`, puts `--python-path` (the
fixes to vLLM, as sitecustomize.py) first on PYTHONPATH, then execs the server. A bind the pod's env already makes
explicit is left as it is. The operator ships this file in a ConfigMap and the vLLM image runs it with its own
python3, so it imports the standard library only:

    python3 /opt/cpullm/launcher.py --ranks N --reserved-cpus-per-rank R --python-path /opt/cpullm/site \
        -- python3 -m vllm.entrypoints...

`decide` is pure; its rules, and what vLLM 0.32 does with explicit lists, are in docs/planning.md ("The launcher's
rules").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

X86_ARCHS = frozenset({"x86_64", "amd64", "i386", "i686"})
REFUSAL_EXIT_CODE = 3
# cgroup v1 mounts the cpu controller either alone or joined with cpuacct.
CGROUP_V1_CPU_DIRS = ("sys/fs/cgroup/cpu,cpuacct", "sys/fs/cgroup/cpu")


class LaunchRefusal(Exception):
    """The cpuset cannot hold the plan; the message is one line saying why."""


class FactsError(Exception):
    """A file the launcher cannot do without is missing or unreadable."""


@dataclass(frozen=True)
class CpuFacts:
    """What the container sees of the host's CPUs, as read from procfs/sysfs."""

    allowed_cpus: frozenset[int]
    allowed_memory_nodes: tuple[int, ...]
    online_cpus: frozenset[int]
    # CPUs absent here count as node 0.
    cpu_node: Mapping[int, int]
    # Each CPU's SMT sibling set, itself included; CPUs absent here have no sibling.
    smt_siblings: Mapping[int, frozenset[int]]
    # CFS quota in CPUs, None when unlimited.
    cfs_quota_cpus: float | None
    arch: str


@dataclass(frozen=True)
class RankPlan:
    cpus: tuple[int, ...]
    numa_nodes: tuple[int, ...]

    @property
    def threads(self) -> int:
        return len(self.cpus)


@dataclass(frozen=True)
class LaunchPlan:
    ranks: tuple[RankPlan, ...]
    threads_bind: str
    visible_memory_nodes: str
    # Cores taken off the ranks' lists for the front end, over all ranks.
    reserved_cpus: int
    summary: str


def parse_cpu_list(text: str) -> frozenset[int]:
    """Parse the kernel's list format, e.g. `0-3,8-11`; an empty string is the empty set."""
    ids: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        ids.update(range(int(first), int(last or first) + 1))
    return frozenset(ids)


def format_cpu_list(ids: Iterable[int]) -> str:
    """The kernel's compact list format, e.g. `0-3,8-11`: what vLLM's `parse_id_list` reads back."""
    ranges: list[list[int]] = []
    for cpu in sorted(ids):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in ranges)


def _read_optional(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _status_field(status: str, name: str) -> str:
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    raise FactsError(f"proc/self/status has no {name} line")


def _read_cfs_quota(root: Path) -> float | None:
    """CPUs the container may use per period: cgroup v2 `cpu.max`, else cgroup v1 `cpu.cfs_quota_us`."""
    cpu_max = _read_optional(root / "sys/fs/cgroup/cpu.max")
    if cpu_max is not None:
        quota, period = cpu_max.split()
        return None if quota == "max" else int(quota) / int(period)
    for directory in CGROUP_V1_CPU_DIRS:
        quota_us = _read_optional(root / directory / "cpu.cfs_quota_us")
        period_us = _read_optional(root / directory / "cpu.cfs_period_us")
        if quota_us is not None and period_us is not None:
            return None if int(quota_us) < 0 else int(quota_us) / int(period_us)
    return None


def read_facts(root: Path, arch: str) -> CpuFacts:
    """Read the CPU facts under `root` ("/" in the container, a copied tree in tests)."""
    status_path = root / "proc/self/status"
    try:
        status = status_path.read_text()
    except OSError as err:
        raise FactsError(f"cannot read {status_path}: {err.strerror}") from err
    allowed = parse_cpu_list(_status_field(status, "Cpus_allowed_list"))
    memory_nodes = tuple(sorted(parse_cpu_list(_status_field(status, "Mems_allowed_list"))))

    online_text = _read_optional(root / "sys/devices/system/cpu/online")
    online = allowed if online_text is None else parse_cpu_list(online_text)

    cpu_node: dict[int, int] = {}
    for cpulist in (root / "sys/devices/system/node").glob("node[0-9]*/cpulist"):
        node = int(cpulist.parent.name.removeprefix("node"))
        cpu_node.update(dict.fromkeys(parse_cpu_list(cpulist.read_text()), node))

    siblings: dict[int, frozenset[int]] = {}
    for siblings_file in (root / "sys/devices/system/cpu").glob("cpu[0-9]*/topology/thread_siblings_list"):
        cpu = int(siblings_file.parent.parent.name.removeprefix("cpu"))
        siblings[cpu] = parse_cpu_list(siblings_file.read_text())

    return CpuFacts(
        allowed_cpus=allowed,
        allowed_memory_nodes=memory_nodes,
        online_cpus=online,
        cpu_node=cpu_node,
        smt_siblings=siblings,
        cfs_quota_cpus=_read_cfs_quota(root),
        arch=arch,
    )


def _even_split(items: Sequence[int], parts: int) -> list[list[int]]:
    """Contiguous groups whose sizes differ by at most one, the larger ones first."""
    size, extra = divmod(len(items), parts)
    groups, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        groups.append(list(items[start:end]))
        start = end
    return groups


def _cores(facts: CpuFacts, usable: frozenset[int]) -> list[int]:
    """One CPU per physical core on x86, where SMT siblings share a core's execution units; every CPU elsewhere."""
    if facts.arch not in X86_ARCHS:
        return sorted(usable)
    return sorted({min((facts.smt_siblings.get(cpu, frozenset()) & usable) | {cpu}) for cpu in usable})


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _apply_quota(per_rank: list[list[int]], quota: float) -> list[list[int]]:
    """Keep floor(quota) cores (at least one per rank), dealt out one at a time so ranks stay even."""
    budget = max(int(quota), len(per_rank))
    kept = [0] * len(per_rank)
    while budget:
        for index, cores in enumerate(per_rank):
            if budget and kept[index] < len(cores):
                kept[index] += 1
                budget -= 1
    return [cores[:count] for cores, count in zip(per_rank, kept, strict=True)]


def decide(facts: CpuFacts, ranks: int, reserved_per_rank: int, *, share_numa: bool = False) -> LaunchPlan:
    """Choose each rank's CPUs and the memory nodes vLLM may use; raise LaunchRefusal when they cannot fit."""
    if ranks < 1:
        raise LaunchRefusal(f"ranks must be at least 1, got {ranks}")
    if reserved_per_rank < 0:
        raise LaunchRefusal(f"reserved CPUs per rank must be at least 0, got {reserved_per_rank}")
    cpuset = format_cpu_list(facts.allowed_cpus) or "(empty)"
    usable = facts.allowed_cpus & facts.online_cpus
    if not usable:
        raise LaunchRefusal(f"cpuset {cpuset} has no online CPU (online: {format_cpu_list(facts.online_cpus)})")

    def node_of(cpu: int) -> int:
        return facts.cpu_node.get(cpu, 0)

    cores_by_node: dict[int, list[int]] = {}
    for core in _cores(facts, usable):
        cores_by_node.setdefault(node_of(core), []).append(core)
    nodes = sorted(cores_by_node)
    node_names = ",".join(map(str, nodes))

    if ranks <= len(nodes):
        per_rank = [[core for node in group for core in cores_by_node[node]] for group in _even_split(nodes, ranks)]
    elif share_numa:
        cores = [core for node in nodes for core in cores_by_node[node]]
        if len(cores) < ranks:
            raise LaunchRefusal(
                f"cpuset {cpuset} has {_plural(len(cores), 'usable core')} but the plan has {ranks} ranks: "
                "one rank needs one core"
            )
        per_rank = _even_split(cores, ranks)
    else:
        raise LaunchRefusal(
            f"cpuset {cpuset} has CPUs on {_plural(len(nodes), 'NUMA node')} ({node_names}) but the plan has "
            f"{ranks} ranks: one rank needs one NUMA node (VLLM_CPU_SIM_MULTI_NUMA=1 lets ranks share a node)"
        )

    chosen = sum(len(cores) for cores in per_rank)
    quota = facts.cfs_quota_cpus
    if quota is not None and int(quota) < chosen:
        per_rank = _apply_quota(per_rank, quota)

    reserved = [min(reserved_per_rank, len(cores) - 1) for cores in per_rank]
    per_rank = [cores[: len(cores) - count] for cores, count in zip(per_rank, reserved, strict=True)]

    plans = tuple(
        RankPlan(cpus=tuple(cores), numa_nodes=tuple(sorted({node_of(c) for c in cores}))) for cores in per_rank
    )
    rank_nodes = list(dict.fromkeys(node for plan in plans for node in plan.numa_nodes))
    visible = [node for node in rank_nodes if node in facts.allowed_memory_nodes] or list(facts.allowed_memory_nodes)

    threads_bind = "|".join(format_cpu_list(plan.cpus) for plan in plans)
    visible_memory_nodes = ",".join(map(str, visible))
    per_node = ",".join(f"{node}:{len(cores_by_node[node])}" for node in nodes)
    quota_text = "none" if quota is None else f"{quota:g} CPUs"
    summary = (
        f"saw cpuset {cpuset} (usable {format_cpu_list(usable)}, {facts.arch}), cores per NUMA node {per_node}, "
        f"quota {quota_text}, memory nodes {format_cpu_list(facts.allowed_memory_nodes)}; "
        f"chose threadsBind={threads_bind} visibleMemoryNodes={visible_memory_nodes} "
        f"({_plural(ranks, 'rank')}, threads {'+'.join(str(plan.threads) for plan in plans)}, "
        f"reserved {sum(reserved)})"
    )
    return LaunchPlan(
        ranks=plans,
        threads_bind=threads_bind,
        visible_memory_nodes=visible_memory_nodes,
        reserved_cpus=sum(reserved),
        summary=summary,
    )


def launch_plan_json(plan: LaunchPlan) -> dict[str, Any]:
    """The plan as JSON-ready data, for `--dry-run` and the operator's CLI."""
    return {
        "threadsBind": plan.threads_bind,
        "visibleMemoryNodes": plan.visible_memory_nodes,
        "reservedCpus": plan.reserved_cpus,
        "ranks": [
            {"cpus": format_cpu_list(rank.cpus), "numaNodes": list(rank.numa_nodes), "threads": rank.threads}
            for rank in plan.ranks
        ],
        "summary": plan.summary,
    }


def _parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="launcher.py",
        description="Bind vLLM's CPU ranks to the cpuset this container got, then exec the server.",
        usage="%(prog)s --ranks N --reserved-cpus-per-rank R [--python-path DIR] [--root DIR] [--dry-run] "
        "-- COMMAND...",
    )
    parser.add_argument("--ranks", type=int, required=True, help="vLLM ranks in this pod (TP x PP)")
    parser.add_argument("--reserved-cpus-per-rank", type=int, required=True, help="cores kept off each rank")
    parser.add_argument("--root", type=Path, default=Path("/"), help="where procfs and sysfs are (tests)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan as JSON instead of exec")
    parser.add_argument(
        "--python-path",
        type=Path,
        help="a directory put first on the server's PYTHONPATH (the operator's: the fixes to vLLM)",
    )
    args = list(argv)
    split = args.index("--") if "--" in args else len(args)
    options, command = parser.parse_args(args[:split]), args[split + 1 :]
    if not command and not options.dry_run:
        parser.error("missing -- COMMAND")
    return options, command


def main(argv: Sequence[str] | None = None) -> int:
    """Read, decide, report one line on stderr, then exec the command with vLLM's knobs set."""
    options, command = _parse_args(sys.argv[1:] if argv is None else argv)
    if options.python_path is not None and not options.dry_run:
        _prepend_python_path(options.python_path)
    chosen = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
    if chosen != "auto" and not options.dry_run:  # the user set it in the pod's env: theirs wins
        print(f"cpullm-launch: VLLM_CPU_OMP_THREADS_BIND={chosen} set in the environment, left as is", file=sys.stderr)
        return _exec(command)
    # vLLM's own test: any value but "0" turns simulation on (vllm/utils/ompmultiprocessing.py).
    share_numa = os.environ.get("VLLM_CPU_SIM_MULTI_NUMA", "0") != "0"
    try:
        facts = read_facts(options.root, platform.machine())
        plan = decide(facts, options.ranks, options.reserved_cpus_per_rank, share_numa=share_numa)
    except FactsError as err:
        print(f"cpullm-launch: cannot read CPU facts: {err}", file=sys.stderr)
        return REFUSAL_EXIT_CODE
    except LaunchRefusal as err:
        print(f"cpullm-launch: cannot place {options.ranks} ranks: {err}", file=sys.stderr)
        return REFUSAL_EXIT_CODE
    print(f"cpullm-launch: {plan.summary}", file=sys.stderr, flush=True)
    if options.dry_run:
        print(json.dumps(launch_plan_json(plan), indent=2))
        return 0
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = plan.threads_bind
    os.environ["CPU_VISIBLE_MEMORY_NODES"] = plan.visible_memory_nodes
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(plan.reserved_cpus)
    # vLLM 0.32 asserts with it set and an explicit list, and ignores CPU_VISIBLE_MEMORY_NODES while it is set.
    os.environ.pop("VLLM_CPU_SIM_MULTI_NUMA", None)
    return _exec(command)


def _prepend_python_path(directory: Path) -> None:
    """The directory first on PYTHONPATH, before whatever the pod's env put there (the user's stays)."""
    current = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(directory), *([current] if current else [])])


def _exec(command: Sequence[str]) -> int:
    """Replace this process with the server; returns only when that fails."""
    try:
        os.execvp(command[0], list(command))
    except OSError as err:
        print(f"cpullm-launch: cannot exec {command[0]}: {err.strerror}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main())
