"""`cpullm`: plan, render and the CRD offline, for people and CI; `run` starts the operator.

The command line only: what a command does is in commands.py, imported once one is chosen, so `--help` and a
mistyped argument answer without importing the API models or the Hub client (0.5 s of a start)."""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence
from importlib.metadata import version


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cpullm", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--version", action="version", version=f"cpullm {version('cpullm-operator')}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands_of = (
        ("plan", "print the plan for a CpuLLMService"),
        ("render", "print the children the operator applies"),
    )
    for name, help_ in commands_of:
        sub = commands.add_parser(name, help=help_)
        sub.add_argument("service", help="CpuLLMService YAML file ('-' for stdin)")
        source = sub.add_mutually_exclusive_group(required=True)
        source.add_argument("--nodes", help="nodes YAML, as `kubectl get nodes -o yaml` prints ('-' for stdin)")
        source.add_argument(
            "--from-cluster",
            action="store_true",
            help="read the nodes from the cluster of the current kubeconfig context (read-only: lists nodes, "
            "DaemonSets, NodeResourceTopologies and NodePerformances)",
        )
        sub.add_argument(
            "--model-config",
            help="Hugging Face config.json, or a model directory (config.json and its safetensors files, whose headers "
            "size the weights), to size the model from when the spec has no inline config",
        )
        sub.add_argument(
            "--vllm-python",
            metavar="PYTHON",
            help="size a model the formulas do not know with vLLM itself: this python (one with vLLM, e.g. the vLLM "
            "environment's) builds it from config.json on the meta device, no weights read (10-15 s)",
        )
        if name == "plan":
            sub.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
            sub.add_argument("--svg", metavar="FILE", help="also draw the plan: NUMA nodes, ranks, CPUs, memory")
        else:
            sub.add_argument("-o", "--output", choices=("json", "yaml"), default="yaml")
            sub.add_argument(
                "--no-launcher",
                action="store_true",
                help="leave out the ConfigMap carrying the in-pod launcher's source (what remains is easier to read)",
            )
    crd = commands.add_parser("crd", help="print a CustomResourceDefinition")
    crd.add_argument("--kind", choices=("CpuLLMService", "CpuLLMGateway", "NodePerformance"), default="CpuLLMService")
    commands.add_parser(
        "chart-kinds",
        help="print the kinds the operator owns as the chart's RBAC and policies read them (files/owned-kinds.json)",
    )
    probe = commands.add_parser(
        "probe",
        help="measure this machine's memory bandwidth and vLLM's matrix kernels, per NUMA node, as a NodePerformance "
        "the planner reads (about a minute per NUMA node)",
    )
    probe.add_argument(
        "--python", default=sys.executable, help="a python with torch and vLLM: the vLLM environment's (default: this)"
    )
    probe.add_argument("--node-name", default=platform.node(), help="the Node it describes (default: the hostname)")
    probe.add_argument(
        "--with-node", action="store_true", help="also print this machine as a Node, to plan for it with --nodes"
    )
    probe.add_argument("--seconds-per-point", type=float, default=0.5, help="time spent on each measurement")
    probe.add_argument("-o", "--output", choices=("json", "yaml"), default="yaml")
    job = probe.add_mutually_exclusive_group()  # what the chart's probe Job runs, in the operator's image
    job.add_argument(
        "--save-script", metavar="PATH", help="only write the probe's script to PATH, for a vLLM image's python"
    )
    job.add_argument(
        "--publish",
        metavar="FILE",
        help="only apply the NodePerformance the script printed to FILE ('-': stdin) to the cluster",
    )
    stale = commands.add_parser(
        "node-cache-stale",
        help="list a node's cache directories (spec.modelCache.nodeLocal) whose namespace or CpuLLMService is gone, "
        "one path a line, for an admin to remove",
    )
    stale.add_argument("directory", help="the node's nodeCacheDir, as seen where this runs (e.g. /host/var/lib/cpullm)")
    stale.add_argument(
        "--cluster",
        required=True,
        help="what `kubectl get namespaces,cpullmservices -A -o yaml` printed ('-' for stdin); an entry changed "
        "within the hour before that listing is left for a later run",
    )
    launch = commands.add_parser(
        "launch-plan", help="what the in-pod launcher would bind, from a copy of a node's /proc and /sys"
    )
    launch.add_argument("--root", required=True, help="directory holding proc/self/status and sys/devices/system")
    launch.add_argument("--ranks", type=int, required=True, help="vLLM ranks in the pod (the plan's TP)")
    launch.add_argument("--reserved-cpus-per-rank", type=int, default=0, help="cores kept off each rank")
    launch.add_argument("--arch", default=platform.machine(), help="the node's arch (SMT rule on x86 only)")
    run = commands.add_parser("run", help="start the operator")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], help="watch only these namespaces")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (default)")
    run.add_argument("--peering", help="Kopf peering name (several replicas); default: standalone")
    run.add_argument("--liveness", default=None, help="health endpoint, e.g. http://0.0.0.0:8080/healthz")
    run.add_argument("--metrics-port", type=int, default=None, help="serve the operator's Prometheus metrics here")
    run.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)

    from cpullm.commands import run_command

    return run_command(args)
