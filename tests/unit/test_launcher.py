"""The in-pod launcher: facts read from recorded procfs/sysfs trees, the binding decision, and the exec."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cpullm import launcher, vllm_fixes, vllm_support
from cpullm.core.children.launcher import SOURCES
from cpullm.launcher import CpuFacts, FactsError, LaunchRefusal, decide, launch_plan_json, read_facts

TREES = Path(__file__).parent / "fixtures" / "cpu-trees"
THIS_MACHINE = "this-machine-2026-11-23"
LAUNCHER = Path(launcher.__file__)
PRINT_KNOBS = (
    "import os; e = os.environ; "
    "print(e['VLLM_CPU_OMP_THREADS_BIND'], e['CPU_VISIBLE_MEMORY_NODES'], e['VLLM_CPU_NUM_OF_RESERVED_CPU'], "
    "'VLLM_CPU_SIM_MULTI_NUMA' in e)"
)


PRINT_PYTHONPATH = "import os; print(os.environ['PYTHONPATH'])"


def launch_printing(options: list[str], code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """As in the pod: the launcher run as a script, the server replaced by Python running `code`."""
    return subprocess.run(
        [sys.executable, str(LAUNCHER), *options, "--", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=30,
    )


def facts(tree: str, arch: str = "x86_64") -> CpuFacts:
    return read_facts(TREES / tree, arch)


@pytest.mark.parametrize(
    ("tree", "arch", "ranks", "reserved", "share_numa", "threads_bind", "visible_nodes"),
    [
        pytest.param("xeon-2s-smt-whole", "x86_64", 1, 0, False, "0-15", "0,1", id="tp1-spans-both-nodes"),
        pytest.param("xeon-2s-smt-whole", "x86_64", 2, 0, False, "0-7|8-15", "0,1", id="rank-per-node"),
        pytest.param("xeon-2s-smt-whole", "x86_64", 2, 1, False, "0-6|8-14", "0,1", id="reserve-high-end-per-rank"),
        pytest.param("xeon-2s-smt-whole", "aarch64", 1, 0, False, "0-31", "0,1", id="non-x86-every-cpu-a-core"),
        pytest.param("xeon-2s-smt-whole", "x86_64", 4, 0, True, "0-3|4-7|8-11|12-15", "0,1", id="share-even-groups"),
        pytest.param("xeon-2s-smt-whole", "x86_64", 3, 0, True, "0-5|6-10|11-15", "0,1", id="share-extra-core-first"),
        pytest.param("xeon-2s-snc2-whole", "x86_64", 1, 0, False, "0-15", "0,1,2,3", id="snc-tp1-all-nodes"),
        pytest.param("xeon-2s-snc2-whole", "x86_64", 2, 0, False, "0-7|8-15", "0,1,2,3", id="snc-two-nodes-a-rank"),
        pytest.param(
            "xeon-2s-snc2-whole", "x86_64", 3, 0, False, "0-7|8-11|12-15", "0,1,2,3", id="snc-extra-node-first"
        ),
        pytest.param("xeon-2s-snc2-whole", "x86_64", 4, 1, False, "0-2|4-6|8-10|12-14", "0,1,2,3", id="snc-tp4"),
        pytest.param("xeon-2s-guaranteed-node1", "x86_64", 1, 0, False, "8-11", "1", id="pod-on-node1-not-node0"),
        pytest.param("xeon-2s-guaranteed-node1", "x86_64", 1, 1, False, "8-10", "1", id="pod-on-node1-reserved"),
        pytest.param("xeon-2s-guaranteed-node1", "x86_64", 2, 0, True, "8-9|10-11", "1", id="pod-on-node1-shared"),
        pytest.param("xeon-2s-span-nodes-0-1", "x86_64", 1, 0, False, "6-9", "0,1", id="span-tp1-both-nodes"),
        pytest.param("xeon-2s-span-nodes-0-1", "x86_64", 2, 0, False, "6-7|8-9", "0,1", id="span-tp2"),
        pytest.param("xeon-2s-span-nodes-0-1", "x86_64", 2, 1, False, "6|8", "0,1", id="span-tp2-reserved"),
        pytest.param("xeon-2s-span-nodes-0-1", "x86_64", 1, 9, False, "6", "0", id="reserve-keeps-one-core"),
        pytest.param("xeon-2s-cpumanager-none-quota-4", "x86_64", 1, 0, False, "0-3", "0", id="quota-lowest-cores"),
        pytest.param("xeon-2s-cpumanager-none-quota-4", "x86_64", 2, 0, False, "0-1|8-9", "0,1", id="quota-spread"),
        pytest.param("xeon-2s-cpumanager-none-quota-4", "x86_64", 1, 1, False, "0-2", "0", id="quota-then-reserve"),
        pytest.param("xeon-2s-cpumanager-none-quota-4", "x86_64", 4, 0, True, "0|4|8|12", "0,1", id="quota-shared"),
        pytest.param("xeon-1s-offline-cpus", "x86_64", 1, 0, False, "0-5", "0", id="offline-cpus-dropped"),
        pytest.param("graviton-1n-16", "aarch64", 1, 0, False, "0-15", "0", id="arm64-tp1"),
        pytest.param("graviton-1n-16", "aarch64", 1, 2, False, "0-13", "0", id="arm64-reserved"),
        pytest.param("graviton-1n-16", "aarch64", 2, 0, True, "0-7|8-15", "0", id="arm64-shared"),
        pytest.param("graviton-1n-16", "x86_64", 1, 0, False, "0-15", "0", id="missing-siblings-no-smt"),
        pytest.param(THIS_MACHINE, "x86_64", 1, 0, False, "0-1", "0", id="this-machine-tp1"),
        pytest.param(THIS_MACHINE, "x86_64", 1, 1, False, "0", "0", id="this-machine-reserved"),
        pytest.param(THIS_MACHINE, "x86_64", 2, 0, True, "0|1", "0", id="this-machine-tp2-shared"),
    ],
)
def test_decide_on_recorded_trees(tree, arch, ranks, reserved, share_numa, threads_bind, visible_nodes):
    plan = decide(facts(tree, arch), ranks, reserved, share_numa=share_numa)
    assert (plan.threads_bind, plan.visible_memory_nodes) == (threads_bind, visible_nodes)


@pytest.mark.parametrize(
    ("tree", "change", "ranks", "threads_bind", "visible_nodes"),
    [
        # Memory Manager `Static` narrows cpuset.mems: vLLM intersects CPU_VISIBLE_MEMORY_NODES with it.
        pytest.param("xeon-2s-span-nodes-0-1", {"allowed_memory_nodes": (1,)}, 1, "6-9", "1", id="mems-narrowed"),
        pytest.param("xeon-2s-guaranteed-node1", {"allowed_memory_nodes": (0,)}, 1, "8-11", "0", id="mems-elsewhere"),
        pytest.param(
            "xeon-2s-cpumanager-none-quota-4", {"cfs_quota_cpus": 1.0}, 2, "0|8", "0,1", id="quota-below-ranks"
        ),
        pytest.param("xeon-2s-cpumanager-none-quota-4", {"cfs_quota_cpus": 2.5}, 1, "0-1", "0", id="quota-floored"),
        pytest.param("xeon-2s-cpumanager-none-quota-4", {"cfs_quota_cpus": 3.0}, 2, "0-1|8", "0,1", id="quota-uneven"),
        pytest.param(
            "xeon-2s-cpumanager-none-quota-4",
            {"allowed_cpus": frozenset({0, *range(8, 16)})},
            2,
            "0|8-10",
            "0,1",
            id="quota-left-by-small-rank-goes-to-other",
        ),
    ],
)
def test_decide_rules_on_changed_facts(tree, change, ranks, threads_bind, visible_nodes):
    plan = decide(replace(facts(tree), **change), ranks, 0)
    assert (plan.threads_bind, plan.visible_memory_nodes) == (threads_bind, visible_nodes)


@pytest.mark.parametrize(
    ("tree", "change", "ranks", "reserved", "share_numa", "message"),
    [
        pytest.param(
            "xeon-2s-guaranteed-node1",
            {},
            2,
            0,
            False,
            "cpuset 8-11,24-27 has CPUs on 1 NUMA node (1) but the plan has 2 ranks: one rank needs one NUMA node",
            id="more-ranks-than-nodes",
        ),
        pytest.param(
            "xeon-2s-smt-whole", {}, 3, 0, False, "has CPUs on 2 NUMA nodes (0,1)", id="three-ranks-two-nodes"
        ),
        pytest.param(THIS_MACHINE, {}, 3, 0, True, "has 2 usable cores but the plan has 3 ranks", id="share-too-few"),
        pytest.param("xeon-2s-smt-whole", {}, 0, 0, False, "ranks must be at least 1, got 0", id="zero-ranks"),
        pytest.param("xeon-2s-smt-whole", {}, 1, -1, False, "at least 0, got -1", id="negative-reserve"),
        pytest.param(
            "xeon-1s-offline-cpus",
            {"allowed_cpus": frozenset({6, 7})},
            1,
            0,
            False,
            "cpuset 6-7 has no online CPU (online: 0-5,8-13)",
            id="no-usable-cpu",
        ),
    ],
)
def test_decide_refuses(tree, change, ranks, reserved, share_numa, message):
    with pytest.raises(LaunchRefusal) as refusal:
        decide(replace(facts(tree), **change), ranks, reserved, share_numa=share_numa)
    assert message in str(refusal.value)
    assert "\n" not in str(refusal.value)


def test_plan_details_and_json():
    plan = decide(facts("xeon-2s-snc2-whole"), 3, 1)
    assert [(rank.cpus, rank.numa_nodes, rank.threads) for rank in plan.ranks] == [
        ((0, 1, 2, 3, 4, 5, 6), (0, 1), 7),
        ((8, 9, 10), (2,), 3),
        ((12, 13, 14), (3,), 3),
    ]
    assert plan.reserved_cpus == 3
    assert "\n" not in plan.summary
    assert "cores per NUMA node 0:4,1:4,2:4,3:4" in plan.summary
    assert launch_plan_json(plan) == {
        "threadsBind": "0-6|8-10|12-14",
        "visibleMemoryNodes": "0,1,2,3",
        "reservedCpus": 3,
        "ranks": [
            {"cpus": "0-6", "numaNodes": [0, 1], "threads": 7},
            {"cpus": "8-10", "numaNodes": [2], "threads": 3},
            {"cpus": "12-14", "numaNodes": [3], "threads": 3},
        ],
        "summary": plan.summary,
    }


def test_read_facts_of_a_guaranteed_pod_with_cgroup_v1_quota():
    pod = facts("xeon-2s-guaranteed-node1")
    assert pod.allowed_cpus == frozenset({8, 9, 10, 11, 24, 25, 26, 27})
    assert pod.allowed_memory_nodes == (0, 1)
    assert pod.online_cpus == frozenset(range(32))
    assert (pod.cpu_node[7], pod.cpu_node[24]) == (0, 1)
    assert pod.smt_siblings[8] == frozenset({8, 24})
    assert pod.cfs_quota_cpus == 8.0
    assert pod.arch == "x86_64"


@pytest.mark.parametrize(
    ("tree", "quota"),
    [
        pytest.param("xeon-2s-cpumanager-none-quota-4", 4.0, id="v2-quota"),
        pytest.param("xeon-2s-smt-whole", None, id="v2-max"),
        pytest.param(THIS_MACHINE, None, id="v1-minus-one"),
    ],
)
def test_read_cfs_quota(tree, quota):
    assert facts(tree).cfs_quota_cpus == quota


def test_read_facts_cgroup_v1_cpu_directory_and_missing_optional_files(tmp_path):
    """cgroup v1 may mount `cpu` alone; without sysfs CPU files every allowed CPU is online and on node 0."""
    status = tmp_path / "proc/self/status"
    status.parent.mkdir(parents=True)
    status.write_text("Name:\tpython3\nCpus_allowed:\t3c\nCpus_allowed_list:\t2-5\nMems_allowed_list:\t0\n")
    cgroup = tmp_path / "sys/fs/cgroup/cpu"
    cgroup.mkdir(parents=True)
    (cgroup / "cpu.cfs_quota_us").write_text("150000\n")
    (cgroup / "cpu.cfs_period_us").write_text("100000\n")
    bare = read_facts(tmp_path, "x86_64")
    assert (bare.online_cpus, bare.cpu_node, bare.smt_siblings) == (frozenset({2, 3, 4, 5}), {}, {})
    assert bare.cfs_quota_cpus == 1.5
    assert decide(bare, 1, 0).threads_bind == "2"


def test_read_facts_missing_siblings_and_offline_cpus():
    assert facts("graviton-1n-16", "aarch64").smt_siblings == {}
    offline = facts("xeon-1s-offline-cpus")
    assert offline.online_cpus == frozenset({0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13})
    assert 6 not in offline.cpu_node
    assert offline.smt_siblings[5] == frozenset({5, 13})


@pytest.mark.parametrize(
    ("status", "message"),
    [
        pytest.param(None, "proc/self/status", id="no-status"),
        pytest.param("Name:\tpython3\nCpus_allowed_list:\t0-3\n", "no Mems_allowed_list line", id="no-mems-line"),
    ],
)
def test_read_facts_requires_status(tmp_path, status, message):
    if status is not None:
        (tmp_path / "proc/self").mkdir(parents=True)
        (tmp_path / "proc/self/status").write_text(status)
    with pytest.raises(FactsError, match=message):
        read_facts(tmp_path, "x86_64")


PRINT_ONE_KNOB = (
    "import os; print(os.environ['VLLM_CPU_OMP_THREADS_BIND'], os.environ.get('CPU_VISIBLE_MEMORY_NODES', 'unset'))"
)


@pytest.fixture
def clean_env(monkeypatch):
    """main sets vLLM's knobs in os.environ; monkeypatch puts the test process's environment back."""
    for name in ("VLLM_CPU_OMP_THREADS_BIND", "CPU_VISIBLE_MEMORY_NODES", "VLLM_CPU_NUM_OF_RESERVED_CPU"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("VLLM_CPU_SIM_MULTI_NUMA", raising=False)
    monkeypatch.setattr(launcher.platform, "machine", lambda: "x86_64")
    return monkeypatch


def run_main(*args: str) -> int:
    return launcher.main(["--root", str(TREES / "xeon-2s-guaranteed-node1"), *args])


def test_main_dry_run_prints_plan_and_one_stderr_line(clean_env, capsys):
    assert run_main("--ranks", "1", "--reserved-cpus-per-rank", "1", "--dry-run") == 0
    out, err = capsys.readouterr()
    plan = json.loads(out)
    assert (plan["threadsBind"], plan["visibleMemoryNodes"], plan["reservedCpus"]) == ("8-10", "1", 1)
    assert plan["ranks"] == [{"cpus": "8-10", "numaNodes": [1], "threads": 3}]
    assert err.count("\n") == 1
    assert err.startswith("cpullm-launch: saw cpuset 8-11,24-27")
    assert "threadsBind=8-10 visibleMemoryNodes=1" in err
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ


def test_main_shares_numa_when_vllm_simulation_is_on(clean_env, capsys):
    clean_env.setenv("VLLM_CPU_SIM_MULTI_NUMA", "1")
    assert run_main("--ranks", "2", "--reserved-cpus-per-rank", "0", "--dry-run") == 0
    assert json.loads(capsys.readouterr().out)["threadsBind"] == "8-9|10-11"


def test_main_refuses_in_one_line_with_exit_3(clean_env, capsys):
    assert run_main("--ranks", "2", "--reserved-cpus-per-rank", "0", "--", "true") == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("cpullm-launch: cannot place 2 ranks: cpuset 8-11,24-27 has CPUs on 1 NUMA node (1)")
    assert err.count("\n") == 1
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ


def test_main_needs_a_command_unless_dry_run(clean_env):
    with pytest.raises(SystemExit) as usage:
        run_main("--ranks", "1", "--reserved-cpus-per-rank", "0")
    assert usage.value.code == 2


def test_main_reports_a_command_it_cannot_exec(clean_env, capsys, tmp_path):
    assert run_main("--ranks", "1", "--reserved-cpus-per-rank", "0", "--", str(tmp_path / "missing")) == 127
    assert "cpullm-launch: cannot exec" in capsys.readouterr().err


def test_main_execs_the_command_with_the_knobs_set():
    """As in the pod: the file run as a script, the server replaced by a command that prints its environment."""
    knobs = ("VLLM_CPU_OMP_THREADS_BIND", "CPU_VISIBLE_MEMORY_NODES", "VLLM_CPU_NUM_OF_RESERVED_CPU")
    env = {name: value for name, value in os.environ.items() if name not in knobs}
    env["VLLM_CPU_SIM_MULTI_NUMA"] = "1"
    root = TREES / "graviton-1n-16"  # no SMT files: the same plan on every architecture
    result = launch_printing(["--root", str(root), "--ranks", "2", "--reserved-cpus-per-rank", "1"], PRINT_KNOBS, env)
    assert result.stdout == "0-6|8-14 0 2 False\n"
    assert result.stderr.startswith("cpullm-launch: saw cpuset 0-15")


@pytest.mark.parametrize(
    "text",
    [LAUNCHER.read_text(), SOURCES["sitecustomize.py"], SOURCES["api_key_guard.py"]],
    ids=["launcher", "vllm_fixes as shipped", "api_key_guard"],
)
def test_the_in_pod_files_import_only_the_standard_library(text: str):
    """The operator ships these files alone into the stock vLLM image: no cpullm, no third-party module (the fixes'
    copy carries cpullm/vllm_support.py inline)."""
    tree = ast.parse(text)
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import"
            modules.add(node.module or "")
    assert modules, "no import found: the check is not looking at the right file"
    assert not [name for name in modules if name.split(".")[0] not in sys.stdlib_module_names]


def test_the_shipped_fixes_run_without_cpullm_and_carry_the_version_table(tmp_path: Path):
    """In a fresh interpreter that has no cpullm (isolated mode, the file alone): the table is the package's."""
    (tmp_path / "fixes.py").write_text(SOURCES["sitecustomize.py"])
    probe = (
        "import importlib.util, json, sys; spec = importlib.util.spec_from_file_location('fixes', sys.argv[1]); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
        "print(json.dumps([m.FIX_VERSIONS, 'cpullm' in sys.modules]))"
    )
    command = [sys.executable, "-I", "-c", probe, str(tmp_path / "fixes.py")]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    table, imported_cpullm = json.loads(result.stdout)
    assert {k: tuple(v) for k, v in table.items()} == vllm_support.FIX_VERSIONS
    assert imported_cpullm is False
    assert set(vllm_support.FIX_VERSIONS) >= {fix.__name__ for fix in vllm_fixes.FIXES.values()}


@pytest.mark.parametrize("user_value", ["nobind", "0-3|4-7"])
def test_a_bind_the_user_set_in_the_pod_env_is_left_alone(user_value):
    """The pod's env is the user's to override (spec.env wins over the operator's): only 'auto' is replaced."""
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": user_value}
    env.pop("CPU_VISIBLE_MEMORY_NODES", None)
    options = ["--root", str(TREES / "graviton-1n-16"), "--ranks", "2", "--reserved-cpus-per-rank", "1"]
    result = launch_printing(options, PRINT_ONE_KNOB, env)
    assert result.stdout == f"{user_value} unset\n"
    assert (
        result.stderr == f"cpullm-launch: VLLM_CPU_OMP_THREADS_BIND={user_value} set in the environment, left as is\n"
    )


@pytest.mark.parametrize(
    ("bind", "inherited", "expected"),
    [
        ("auto", None, "/opt/cpullm/site"),
        ("auto", "/user/lib", "/opt/cpullm/site:/user/lib"),
        ("nobind", "/user/lib", "/opt/cpullm/site:/user/lib"),  # left as it is: the path is still put first
    ],
    ids=["binding", "binding-keeps-the-users-path", "explicit-bind"],
)
def test_the_python_path_goes_first_on_the_servers_pythonpath(bind, inherited, expected):
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "CPU_VISIBLE_MEMORY_NODES")}
    env["VLLM_CPU_OMP_THREADS_BIND"] = bind
    if inherited:
        env["PYTHONPATH"] = inherited
    options = ["--root", str(TREES / "graviton-1n-16"), "--ranks", "1", "--reserved-cpus-per-rank", "0"]
    result = launch_printing([*options, "--python-path", "/opt/cpullm/site"], PRINT_PYTHONPATH, env)
    assert result.stdout == f"{expected}\n"
