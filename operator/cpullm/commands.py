"""What each `cpullm` command does (cli.py parses the command line, then imports this: its imports, the API
models and the Hub client among them, are most of a start, and `cpullm --help` needs none of them)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cpullm.api.crd import build_crd, build_gateway_crd, build_performance_crd
from cpullm.api.performance import KIND as PERFORMANCE_KIND
from cpullm.api.performance import PLURAL as PERFORMANCE_PLURAL
from cpullm.api.plan import Plan
from cpullm.api.spec import GROUP, VERSION, Placement
from cpullm.controller.gather import AdapterConfigSource, ModelConfigSource, gather
from cpullm.core.children import owned_kinds_document
from cpullm.core.children.model_cache import stale_node_cache
from cpullm.core.constants import LAUNCHER_FILE, GiB
from cpullm.core.daemonsets import DaemonPods
from cpullm.core.decision import Decision, decide
from cpullm.core.memory import MARGIN_FRACTION
from cpullm.core.node_facts import NODE_FACT_SOURCES, NodeFact
from cpullm.core.observation import ClusterView
from cpullm.core.performance import performance_of, validated_performance
from cpullm.core.sizing import ModelFiles
from cpullm.core.topology import NodeProfile
from cpullm.errors import CpuLLMError
from cpullm.io.files import (
    ConfigFile,
    InputFileError,
    OfflineCluster,
    cluster_uids,
    load_service,
    profile_daemonsets,
    profile_node_facts,
    profile_nodes,
    read_node_file,
    read_objects,
    scan_node_cache,
)
from cpullm.planview import plan_svg
from cpullm.settings import Settings

if TYPE_CHECKING:
    from cpullm.core.sizing.vllm_report import VllmSizer
    from cpullm.io.hub import HubClient


def _warn(message: str) -> None:
    print(f"cpullm: warning: {message}", file=sys.stderr)


class NoCluster(Exception):
    """--from-cluster or --publish without a kubeconfig or in-cluster credentials."""


def _nodes(nodes_path: str | None) -> tuple[list[NodeProfile], list[DaemonPods], list[NodeFact]]:
    """The nodes to plan on, the DaemonSets whose pods they run and what the node-fact sources say of them (their
    NodeResourceTopologies): a file's (`kubectl get nodes,daemonsets,noderesourcetopologies -A -o yaml` prints
    them), or (None) the current kubeconfig context's cluster's."""
    if nodes_path is not None:
        objects = read_node_file(nodes_path)
    else:
        from kubernetes.config import ConfigException  # the Kubernetes client: only for --from-cluster (slow import)

        from cpullm.io.kube import Kube

        try:
            kube = Kube.from_environment()
        except ConfigException as err:
            raise NoCluster(f"--from-cluster: no cluster to read ({err})") from None
        objects = [*kube.list_nodes(), *kube.list_daemonsets()]
        objects += [item for source in NODE_FACT_SOURCES for item in kube.list_node_facts(source)]
    return profile_nodes(objects, _warn), profile_daemonsets(objects, _warn), profile_node_facts(objects, _warn)


class SettingsError(Exception):
    """The environment configures the CLI in a way it cannot run (an http:// Hub endpoint not allowed, ...)."""


def _hub(settings: Settings) -> HubClient:
    from cpullm.io.hub import HubClient  # the Hub's client (huggingface_hub): a third of a plan's start, when needed

    try:
        return HubClient(
            settings.hf_endpoint,
            settings.hub_timeout_seconds,
            settings.hub_cache_seconds,
            allow_http=settings.hub_allow_http,
        )
    except ValueError as err:  # said in one line, without a traceback
        raise SettingsError(str(err)) from None


class EnvironmentToken:
    """Offline, the Hub is read with $HF_TOKEN where the spec names no hfTokenSecret (said on stderr when used), for
    the model and its adapters' ranks."""

    def __init__(self, hub: HubClient, token: str | None) -> None:
        self.hub, self.token = hub, token

    def fetch(self, name: str, revision: str | None, token: str | None) -> ModelFiles:
        return self.hub.fetch(name, revision, self._token(name, token))

    def adapter_rank(self, source: str, token: str | None) -> int | None:
        return self.hub.adapter_rank(source, self._token(source, token))

    def _token(self, name: str, token: str | None) -> str | None:
        if token is None and self.token:
            print(f"cpullm: reading {name} from the Hub with $HF_TOKEN", file=sys.stderr)
            return self.token
        return token


class InlineConfig:
    """The model source of a spec that carries its model's config: gather reads none, so no Hub client is made
    (huggingface_hub's import is a third of a plan's start)."""

    def fetch(self, name: str, revision: str | None, token: str | None) -> ModelFiles:
        raise AssertionError(f"{name}: a spec with an inline config reads no model source")


def _vllm_sizer(python: str | None) -> VllmSizer | None:
    """The seam through which sizing asks vLLM, where --vllm-python names a python (imported here: a plan without
    it pays nothing for it)."""
    if python is None:
        return None
    from cpullm.io.meta_size import local_vllm_sizer

    return local_vllm_sizer(python)


def decide_from_files(
    service_path: str, nodes_path: str | None, model_config: str | None, vllm_python: str | None = None
) -> tuple[Plan, Decision]:
    """The operator's gather and decision, fed from files (the nodes from a file, or None: from the cluster):
    what it would plan and apply for this service; a model the formulas do not know is sized by vLLM where
    `vllm_python` names a python that has it."""
    settings = Settings()
    service = load_service(service_path)
    models: ModelConfigSource
    adapters: AdapterConfigSource | None = None  # read where the Hub is: offline, the spec's ranks stand
    if model_config:
        models = ConfigFile(model_config)
    elif ((service.get("spec") or {}).get("model") or {}).get("config"):
        models = InlineConfig()
    else:
        models = adapters = EnvironmentToken(_hub(settings), settings.hf_token)
    nodes, daemons, facts = _nodes(nodes_path)
    observed = gather(
        service,
        ClusterView(nodes=nodes, node_facts=facts, daemons=daemons),
        last_status={},
        cluster=OfflineCluster(settings.hf_token),
        models=models,
        adapters=adapters,
        policy=settings.policy(),
        vllm=_vllm_sizer(vllm_python),
    )
    decision = decide(observed, datetime.now(UTC))
    if not isinstance(decision.outcome, Plan):
        assert decision.outcome is not None  # offline namespaces are never terminating
        raise decision.outcome
    return decision.outcome, decision


# How the plan table says each routing (spec.routing.mode).
ROUTING_SHOWN = {
    "service": "the Service selects the servers",
    "router": "an HAProxy router (least connections) in front of the servers",
    "inferencePool": "an InferencePool for a Gateway's endpoint picker, and the Service",
}


def _overhead_lines(plan: Plan) -> list[str]:
    """What a rank holds beside its shard and KV cache, where more than its runtime: oneDNN's packed embeddings and
    the LoRA adapters (spec.adapters)."""
    parts = []
    if plan.packed_embeddings_bytes:
        parts.append(f"oneDNN's packed embeddings {plan.packed_embeddings_bytes / GiB:.2f} GiB")
    if plan.adapter_bytes:
        parts.append(f"LoRA adapters {plan.adapter_bytes / GiB:.2f} GiB")
    if not parts:
        return []
    return [f"overhead per rank: runtime {plan.rank_overhead_bytes / GiB:.2f} GiB, " + ", ".join(parts)]


def _engine_core_note(plan: Plan) -> str:
    """Where the launcher's fix 3 runs the rank, after the server processes' memory in the plan table."""
    if not plan.rank_in_engine_core:
        return ""
    return f" (the rank runs in its engine core{', forked from the front end' if plan.engine_core_forked else ''})"


def plan_table(plan: Plan) -> str:
    """The plan for people: where the ranks go, what each holds, and why these nodes (-o json|yaml for machines)."""
    node, sizing, tp = plan.node_profile, plan.sizing, plan.tensor_parallel_size
    nodes = ", ".join(plan.eligible_nodes[:5]) + (", ..." if len(plan.eligible_nodes) > 5 else "")
    numa = {rank: str(numa_node) for rank, numa_node in enumerate(plan.rank_numa_nodes() or [])}
    if plan.placement == Placement.THROUGHPUT:  # one TP=1 server on each NUMA node: any of them
        numa = {0: f"one per pod ({node.numa_nodes} per node)"}
    shard, overhead = f"{plan.weight_shard_bytes / GiB:.2f}", f"{plan.rank_extra_bytes / GiB:.2f}"
    rows = [["rank", "NUMA node", "CPUs", "weights GiB", "KV GiB", "overhead GiB"]]
    rows += [
        [str(rank), numa.get(rank, "-"), str(plan.cpus_per_rank), shard, str(plan.kv_cache_gi_b), overhead]
        for rank in range(tp)
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    table = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    parameters = f", {sizing.parameters / 1e9:.2f}B parameters" if sizing.parameters else ""
    lines = [
        f"plan    {plan.placement}, TP {tp}: {plan.replicas} pod(s), the chosen nodes hold {plan.capacity}",
        f"nodes   {len(plan.eligible_nodes)} chosen: {nodes} ({node.arch}, {node.numa_nodes} NUMA node(s), "
        f"{node.cpus} CPUs, {node.memory_bytes / GiB:.1f} GiB)",
        f"model   {sizing.family}{parameters}, weights {plan.weights_bytes / GiB:.2f} GiB from {sizing.weights_source}"
        + (f", {sizing.quantization}" if sizing.quantization else ""),
        f"KV      {plan.kv_cache_gi_b} GiB per rank ({plan.kv_cache_source}), {plan.kv_tokens_per_rank:,} tokens; "
        f"{sizing.kv_layout}",
        "",
        *table,
        *_overhead_lines(plan),
        "",
        f"pod     {plan.cpu} CPU, memory {plan.memory_limit_bytes / GiB:.2f} GiB: the ranks above, vLLM's HTTP "
        f"front end {plan.server_overhead_bytes / GiB:.2f}"
        + _engine_core_note(plan)
        + f", page cache {plan.page_cache_bytes / GiB:.2f}, a "
        f"{MARGIN_FRACTION:.0%} margin, /dev/shm {plan.shm_bytes / GiB:.2f}; threads: "
        + ("launcher binding" if plan.binding == "launcher" else plan.binding),
        f"start   about {plan.expected_start_seconds} s once the weights are on the node (the pace measured; the "
        f"download comes first); the startup probe allows {plan.startup_seconds} s, a scheduler step "
        f"{plan.step_timeout_seconds} s",
        *_predicted_lines(plan),
        f"image   {plan.image}",
        f"vllm    {plan.vllm_version or 'version unknown'} ({plan.vllm_version_source}); the launcher's fixes counted: "
        + (", ".join(plan.fixes_credited) or "none"),
        *_node_cache_lines(plan),
        f"routing {ROUTING_SHOWN[plan.routing]}; a stopping server drains for up to {plan.drain_seconds} s",
        f"why     {plan.summary}",
        *([f"note    {plan.placement_note}"] if plan.placement_note else []),
        *[f"note    {note}" for note in sizing.notes],
        *[f"also    {shape}" for shape in plan.passed_over or []],
        *[f"caution {caution.reason}: {caution.message}" for caution in plan.cautions or []],
    ]
    return "\n".join(lines) + "\n"


def _predicted_lines(plan: Plan) -> list[str]:
    """How fast each server is predicted to serve, and on what basis (core/performance.py)."""
    p = plan.predicted
    if p is None:
        return []
    basis = "measured by a probe" if p.basis == "probe" else "estimated by ISA class, no probe of these nodes"
    return [
        f"speed   per server: {p.decode_tokens_per_second:.1f} tok/s for one sequence, "
        f"{p.throughput_tokens_per_second:.0f} tok/s for {p.throughput_streams} at once, first token of a "
        f"{p.prompt_tokens:,}-token prompt in {p.time_to_first_token_seconds:.2f} s ({basis}: {p.source})",
        *(
            [f"cost    {p.cost_per_million_tokens:.4g} per million tokens at that throughput (the nodes' price label)"]
            if p.cost_per_million_tokens is not None
            else []
        ),
        *[
            f"faster  a {f.checkpoint} checkpoint of the same model: {f.decode_speedup:.1f}x the decode, "
            f"{f.throughput_speedup:.1f}x the throughput (predicted; accuracy is the trade)"
            for f in p.faster_formats or []
        ],
        *(
            [f"spec    speculative decoding {plan.speculative.method}: {plan.speculative.reason}"]
            if plan.speculative
            else []
        ),
    ]


def _node_cache_lines(plan: Plan) -> list[str]:
    """Where spec.modelCache.nodeLocal keeps the weights and what a start compiles, and what that costs."""
    if not plan.node_cache_path:
        return []
    return [
        f"cache   on each node: weights in {plan.node_cache_path} (the namespace's, per model), what a start "
        f"compiles in {plan.node_compile_cache_path} (this service's own)",
        "        hostPaths: no size limit, kept when the namespace or the service is gone (cpullm node-cache-stale "
        "lists those)",
    ]


def _is_launcher(child: dict[str, Any]) -> bool:
    return child["kind"] == "ConfigMap" and LAUNCHER_FILE in child.get("data", {})


def _dump(obj: Any, output: str) -> str:
    if output == "json":
        return json.dumps(obj, indent=2) + "\n"
    return yaml.safe_dump(obj, sort_keys=False)


def run_command(args: argparse.Namespace) -> int:
    """The parsed command, run: 0, or 1 for a refusal (one line on stderr), 2 for a file or cluster problem."""
    try:
        if args.command == "crd":
            built = {"CpuLLMService": build_crd, "CpuLLMGateway": build_gateway_crd}.get(
                args.kind, build_performance_crd
            )()
            sys.stdout.write(yaml.safe_dump(built, sort_keys=False))
        elif args.command == "chart-kinds":
            sys.stdout.write(json.dumps(owned_kinds_document(), indent=2) + "\n")
        elif args.command == "probe":
            return _probe(args)
        elif args.command == "node-cache-stale":
            return _node_cache_stale(args)
        elif args.command == "launch-plan":
            return _launch_plan(args)
        elif args.command == "run":
            return _run(args)
        else:
            plan, decision = decide_from_files(args.service, args.nodes, args.model_config, args.vllm_python)
            if args.command == "plan" and args.svg:
                Path(args.svg).write_text(plan_svg(plan))
            if args.command == "plan" and args.output == "table":
                sys.stdout.write(plan_table(plan))
            elif args.command == "plan":
                sys.stdout.write(_dump(plan.model_dump(by_alias=True, mode="json", exclude_none=True), args.output))
            else:
                objects = [o for o in decision.children if not (args.no_launcher and _is_launcher(o))]
                if args.output == "json":
                    sys.stdout.write(
                        json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n"
                    )
                else:
                    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False))
    except CpuLLMError as err:
        print(f"cpullm: {err.reason}: {err.message}", file=sys.stderr)
        return 1
    except (InputFileError, NoCluster, SettingsError) as err:
        print(f"cpullm: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # writing --svg, or reading a model directory's files
        print(f"cpullm: {err.filename or ''}: {err.strerror or err}", file=sys.stderr)
        return 2
    return 0


# An entry changed this close to the cluster's listing, or after it, may be an object's made since: left alone.
STALE_MARGIN_SECONDS = 3600


def _probe(args: argparse.Namespace) -> int:
    """`cpullm probe`: this machine's NodePerformance (and, with --with-node, this machine as a Node); or, for the
    chart's probe Job, the probe's script saved for the vLLM image's python (--save-script), or what it printed
    applied to the cluster (--publish)."""
    from cpullm.io.local_node import ProbeError, probe, probe_script, this_node

    if args.save_script:
        Path(args.save_script).write_text(probe_script())
        return 0
    if args.publish:
        return _publish_probe(args.publish)
    try:
        measured = probe(args.python, args.node_name, args.seconds_per_point)
    except ProbeError as err:
        print(f"cpullm: {err}", file=sys.stderr)
        return 1
    objects = [this_node(args.node_name), measured] if args.with_node else [measured]
    if args.output == "json":
        shown = {"apiVersion": "v1", "kind": "List", "items": objects} if args.with_node else measured
        sys.stdout.write(json.dumps(shown, indent=1) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False))
    return 0


def _publish_probe(path: str) -> int:
    """Applies the NodePerformance in `path` (what the probe printed) to the cluster, once the planner can read it
    (core/performance.py's parse_performance: a measurement it could not use is refused here, not published)."""
    from kubernetes.config import ConfigException  # the Kubernetes client: only for a cluster's command (slow import)

    from cpullm.io.kube import Kube

    found = [o for o in read_objects(path, "--publish") if o.get("kind") == PERFORMANCE_KIND]
    if len(found) != 1:
        raise InputFileError(f"--publish {path}: {len(found)} {PERFORMANCE_KIND} objects in it, not one")
    parsed = validated_performance(found[0])
    performance_of(parsed)  # its rates as the planner reads them
    name = str(parsed.metadata.get("name") or "")
    if not name:
        raise InputFileError(f"--publish {path}: the {PERFORMANCE_KIND} has no name (its node's)")
    spec = parsed.spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    manifest = {"apiVersion": f"{GROUP}/{VERSION}", "kind": PERFORMANCE_KIND, "metadata": {"name": name}, "spec": spec}
    try:
        kube = Kube.from_environment()
    except ConfigException as err:
        raise NoCluster(f"--publish: no cluster to write to ({err})") from None
    kube.publish_node_performance(manifest)
    print(f"{PERFORMANCE_PLURAL}.{GROUP}/{name} published", file=sys.stderr)
    return 0


def _node_cache_stale(args: argparse.Namespace) -> int:
    """The node cache directories whose namespace or service the listing no longer has (children/model_cache.py's
    stale_node_cache); entries not of the operator's layout are named on stderr and never listed."""
    listed_at = time.time() if args.cluster == "-" else Path(args.cluster).stat().st_mtime
    namespaces, services = cluster_uids(args.cluster)
    stale, foreign = stale_node_cache(
        scan_node_cache(args.directory), namespaces, services, listed_at - STALE_MARGIN_SECONDS
    )
    for entry in foreign:
        _warn(f"{Path(args.directory) / entry}: not of the operator's layout (ns.<namespace uid>), left alone")
    sys.stdout.writelines(f"{Path(args.directory) / entry}\n" for entry in stale)
    return 0


def _launch_plan(args: argparse.Namespace) -> int:
    """The launcher's own decision on recorded trees, for people debugging a node's binding."""
    from cpullm import launcher  # the in-pod launcher, imported by this command alone

    try:
        facts = launcher.read_facts(Path(args.root), args.arch)
        plan = launcher.decide(facts, args.ranks, args.reserved_cpus_per_rank)
    except (launcher.FactsError, launcher.LaunchRefusal) as err:
        print(f"cpullm: cannot place {args.ranks} ranks: {err}", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(launcher.launch_plan_json(plan), indent=2) + "\n")
    return 0


def _run(args: argparse.Namespace) -> int:
    import logging

    import kopf

    import cpullm.controller.handlers  # noqa: F401  (registers the handlers)
    from cpullm import metrics  # prometheus_client: the operator's, not a plan's

    flags = {
        "namespaces": args.namespace,
        "peering": args.peering,
        "liveness": args.liveness,
        "verbose": args.verbose,
        "metrics_port": args.metrics_port,
    }
    settings = Settings(**{key: value for key, value in flags.items() if value not in (None, [], False)})
    logging.basicConfig(
        level=logging.DEBUG if settings.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not settings.verbose:
        # Kopf logs every handler run at INFO, and its liveness endpoint (aiohttp) every probe the kubelet makes;
        # our own lines say what changed.
        for chatty in ("kopf.objects", "aiohttp.access"):
            logging.getLogger(chatty).setLevel(logging.WARNING)
    if settings.metrics_port is not None:
        metrics.serve(settings.metrics_port)
    kopf.run(
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        standalone=settings.peering is None,
        peering_name=settings.peering,
        liveness_endpoint=settings.liveness,
        memo=kopf.Memo(settings=settings),
    )
    return 0
