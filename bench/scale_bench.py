"""Benchmark, not a test: the operator at scale against the API-write floor, side by side in one run.

    .venv/bin/python bench/scale_bench.py --services N [--seed S] [--steady-seconds 300] [--latency-samples 20]
        [--variant CPULLM_RECONCILE_WORKERS=32 ...]

Starts its own kwokctl cluster (the e2e suite's binaries, a /16 service CIDR, an audit log), N KWOK nodes of 36
mixed shapes and N tiny CpuLLMServices over up to 10 namespaces, then measures:

1. converge: from the first of N creates (8 threads) to every Deployment, Service and launcher ConfigMap
   existing and every status written for its generation with a Planned condition, timed by watches;
2. the floor: the same children (the operator's own gather and decide, run here) and one status patch per
   service, written by a bare client with the same 8 threads into fresh namespaces, operator stopped;
3. API requests per service by verb, from the API server's audit log, by user agent;
4. operator writes per minute over --steady-seconds with nothing changing: once every service reports its
   replicas ready and the operator and the cluster's controllers wrote nothing for 10 s;
5. p50/p99 from one kvCacheGiB change to that Deployment's new generation, one service at a time;
6. the operator's peak RSS and CPU seconds;
7. the pure planner for one service against 5,000 node profiles, best of 3.

Each `--variant` runs steps 1 and 3-6 again after the operator as shipped, with that environment added, in
fresh namespaces once the previous run's are deleted; it gets its own column (the ratio stays the shipped one's).
A variant `PYTHONPATH=<checkout>/operator` runs another commit's operator, against that checkout's CRDs.

Prints one table and ends with `converge ratio to floor at N=<N>: <x.xx>`. Everything it starts is stopped on
exit, Ctrl-C or failure; the logs are kept and their place printed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import signal
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client
from scale_support import (
    AGENT_DRIVER,
    AGENT_FLOOR,
    AGENT_WATCH,
    AUDIT_DROPPED,
    AUDIT_POLICY,
    CLUSTER_NAME,
    AuditLog,
    ResourceMonitor,
    Tracker,
    Watches,
    api_client,
    bench_node,
    bench_service,
    reconciles,
    service_keys,
    with_owner_uid,
    writes,
)
from testbed.cluster import SERVICE_CIDR, LocalCluster
from testbed.operator import Operator
from testbed.tools import ROOT, Kubectl, eventually, free_port

from cpullm.api.plan import Plan
from cpullm.api.spec import GROUP, PLURAL, VERSION, parse_spec
from cpullm.controller.gather import gather, resolve_model
from cpullm.core.decision import decide
from cpullm.core.observation import ClusterView
from cpullm.core.planner import plan_service
from cpullm.core.sizing import ModelFiles
from cpullm.core.topology import NodeProfile, parse_node
from cpullm.io.files import OfflineCluster
from cpullm.io.kube import Kube

PARALLELISM = 8
NAMESPACES = 10
PLANNER_PROFILES = 5000
PLANNER_RUNS = 3
QUIET_SECONDS = 10  # the backlog has drained once the operator and the controllers wrote nothing for this long
BACKLOG_LIMIT = 300
PLACEHOLDER_UID = "00000000-0000-4000-8000-00000000beef"


class NoHub:
    """The bench's services carry their model config inline: nothing may reach the Hub."""

    def fetch(self, name: str, revision: str | None, token: str | None) -> ModelFiles:
        raise RuntimeError(f"the benchmark would fetch {name} from the Hub")


@dataclass
class OperatorRun:
    """One operator phase: the operator as shipped, or with one variant's environment (`--variant`)."""

    label: str
    env: dict[str, str]
    converge_s: float = math.nan
    backlog_writes: int = 0
    backlog_s: float = 0.0
    backlog_note: str = ""
    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    converge_writes: int = 0
    steady: Counter[tuple[str, str]] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    readiness_lags: list[float] = field(default_factory=list)
    peak_rss: int = 0
    cpu: dict[str, float] = field(default_factory=dict)
    rss: dict[str, int] = field(default_factory=dict)
    reconciles: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class Results:
    n: int
    seed: int
    steady_seconds: int
    workdir: Path
    runs: list[OperatorRun]
    planner_ms: float = math.nan
    planner_shapes: int = 0
    cluster_setup_s: float = math.nan
    floor_s: float = math.nan
    floor_writes_done_s: float = math.nan
    floor_requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)
    total_s: float = math.nan

    @property
    def ratio(self) -> float:
        """The operator as shipped (the first run) against the floor."""
        return self.runs[0].converge_s / self.floor_s


def say(message: str, log: Path | None = None) -> None:
    """Progress on stderr (stdout holds only the table), with the UTC time, also kept in the run's log."""
    line = f"[{datetime.now(UTC):%H:%M:%S}] {message}"
    print(line, file=sys.stderr, flush=True)
    if log is not None:
        with log.open("a") as out:
            out.write(line + "\n")


def planner_benchmark(results: Results) -> None:
    """plan_service alone (no I/O) for one tiny service against 5,000 parsed node profiles, best of 3."""
    profiles = [parse_node(bench_node(i)) for i in range(PLANNER_PROFILES)]
    service = bench_service("planner", "bench")
    spec = parse_spec(service["spec"])
    model = resolve_model(spec, "bench", OfflineCluster(), NoHub())
    best = math.inf
    for _ in range(PLANNER_RUNS):
        started = time.perf_counter()
        plan = plan_service(spec, model, profiles)
        best = min(best, time.perf_counter() - started)
    results.planner_ms = best * 1000
    results.planner_shapes = len({p.shape for p in profiles})
    assert plan.tensor_parallel_size == 1, plan


def precompute_floor(keys: list[tuple[str, str]], profiles: list[NodeProfile]) -> dict[tuple[str, str], Any]:
    """The operator's own decision for each floor service (owner uid a placeholder, set once created):
    exactly the children and status patch the operator would write, so the floor writes the same bytes."""
    decisions = {}
    for namespace, name in keys:
        service = bench_service(name, namespace)
        service["metadata"].update(uid=PLACEHOLDER_UID, generation=1)
        view = ClusterView(nodes=profiles, installed_crds=frozenset())
        observed = gather(service, view, last_status={}, cluster=OfflineCluster(), models=NoHub())
        decision = decide(observed, datetime.now(UTC))
        if not isinstance(decision.outcome, Plan):
            raise RuntimeError(f"{namespace}/{name} would not be planned: {decision.outcome}")
        decisions[namespace, name] = (list(decision.children), dict(decision.status_patch))
    return decisions


def create_nodes(api: client.ApiClient, kubectl: Kubectl, n: int, log: Path) -> None:
    """kubectl, not the typed client: its Node model insists on status fields a KWOK node leaves to KWOK."""
    core = client.CoreV1Api(api)
    nodes = [bench_node(i) for i in range(n)]
    batches = [nodes[i : i + 25] for i in range(0, n, 25)]
    with ThreadPoolExecutor(PARALLELISM) as pool:
        create = ("create", "--validate=false", "-f", "-")  # KWOK nodes carry only part of nodeInfo
        list(pool.map(lambda batch: kubectl.run(*create, input=json.dumps(_list(batch))), batches))

    def settled() -> bool:
        """Ready and untainted: the node lifecycle controller removes the not-ready taint a few seconds after
        KWOK marks a node Ready, and each removal is a node event the operator re-plans every service on."""
        listing = json.loads(core.list_node(_preload_content=False, _request_timeout=60).data)
        ready = sum(
            any(c["type"] == "Ready" and c["status"] == "True" for c in item.get("status", {}).get("conditions", []))
            and not item.get("spec", {}).get("taints")
            for item in listing["items"]
        )
        assert ready >= n, f"{ready}/{n} nodes Ready and untainted"
        return True

    eventually(settled, timeout=120 + n * 0.3, interval=2, what=f"{n} KWOK nodes Ready and untainted")
    say(f"{n} KWOK nodes Ready and untainted", log)


def _list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": items}


def delete_namespaces(kubectl: Kubectl, names: set[str], n: int, log: Path) -> None:
    """Deleted with everything in them; kubectl waits until the namespace controller has emptied them."""
    started = time.monotonic()
    limit = 120 + n * 0.3
    kubectl.run("delete", "namespace", *sorted(names), f"--timeout={limit:.0f}s", timeout=limit + 10)
    say(f"previous run's namespaces deleted in {time.monotonic() - started:.0f} s", log)


def create_namespaces(api: client.ApiClient, names: set[str]) -> None:
    core = client.CoreV1Api(api)
    for name in sorted(names):
        core.create_namespace({"metadata": {"name": name}}, _preload_content=False)


def converge_timeout(n: int) -> float:
    return 120 + n * 0.6


def operator_phase(
    cluster: LocalCluster,
    results: OperatorRun,
    keys: list[tuple[str, str]],
    tracker: Tracker,
    audit: AuditLog,
    stack: ExitStack,
    args: argparse.Namespace,
    rng: random.Random,
    log: Path,
) -> None:
    driver = api_client(cluster.kubeconfig, AGENT_DRIVER)
    custom = client.CustomObjectsApi(driver)
    create_namespaces(driver, {ns for ns, _ in keys})
    metrics_port = free_port()
    operator = Operator(
        str(cluster.kubeconfig),
        log.parent / f"operator-{re.sub(r'[^A-Za-z0-9=.,_-]+', '-', results.label)}.log",
        free_port(),
        ["--metrics-port", str(metrics_port)],
        env=results.env,
    )
    operator.start()
    stack.callback(operator.stop)
    assert operator.process is not None
    monitor = ResourceMonitor(operator.process.pid)
    stack.callback(monitor.close)
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"

    def checkpoint(name: str) -> None:
        results.cpu[name] = monitor.cpu_seconds()
        results.rss[name] = monitor.rss_bytes()
        with urllib.request.urlopen(metrics_url, timeout=10) as response:
            results.reconciles[name] = reconciles(response.read().decode())

    eventually(lambda: operator_idle(audit), timeout=120, interval=1, what="operator start-up requests done")
    checkpoint("idle")
    say(f"operator ({results.label}) started and idle; creating services", log)

    tracker.set_target(keys)
    order = list(keys)
    rng.shuffle(order)
    start_wall, start = time.time(), time.monotonic()
    with ThreadPoolExecutor(PARALLELISM) as pool:
        list(
            pool.map(
                lambda key: custom.create_namespaced_custom_object(
                    GROUP, VERSION, key[0], PLURAL, bench_service(key[1], key[0]), _preload_content=False
                ),
                order,
            )
        )
    timeout = converge_timeout(len(keys))
    try:
        tracker.wait(lambda: tracker.done_at is not None, timeout, "operator convergence")
    except TimeoutError as err:
        raise TimeoutError(f"{err}: {tracker.missing()}") from err
    assert tracker.done_at is not None
    results.converge_s = tracker.done_at - start
    converged_wall = start_wall + results.converge_s
    say(f"operator converged in {results.converge_s:.1f} s; waiting for its and the controllers' writes to stop", log)

    def drained() -> bool:
        """Every service reports its replicas ready, and the operator and the controllers it follows are quiet:
        at N=1,000 on 2 CPUs Deployments became available minutes after convergence, and the operator reported
        that readiness up to ~2 minutes after the controllers went quiet; neither is a steady state."""
        unready = len(tracker.target - tracker.ready)
        assert not unready, f"{unready} services not yet reported ready"
        audit.read_new()
        for who in ("operator", "controllers"):
            last = audit.last_write(who) or start_wall
            assert time.time() - last >= QUIET_SECONDS, f"{who} wrote {time.time() - last:.1f} s ago"
        return True

    try:
        eventually(drained, timeout=BACKLOG_LIMIT, interval=1, what="operator writes to stop")
    except AssertionError as err:  # a figure in itself: go on and count the steady window anyway
        results.backlog_note = f" (still writing after {BACKLOG_LIMIT} s)"
        say(str(err), log)
    quiet_wall = time.time()
    last = audit.last_write("operator") or converged_wall
    results.converge_writes = writes(audit.count("operator", start_wall, converged_wall + 0.001))
    results.backlog_writes = writes(audit.count("operator", converged_wall + 0.001, quiet_wall))
    results.backlog_s = max(0.0, last - converged_wall)
    results.requests = audit.count("operator", start_wall, quiet_wall)
    results.readiness_lags = tracker.readiness_lags(keys)
    checkpoint("converged")
    say(f"backlog drained; steady state for {args.steady_seconds} s", log)

    steady_start = time.time()
    time.sleep(args.steady_seconds)  # one wait, nothing to poll: the audit log is counted afterwards
    steady_end = time.time()
    time.sleep(2)  # the last requests reach the log
    audit.read_new()
    results.steady = audit.count("operator", steady_start, steady_end)
    checkpoint("steady")
    say(f"steady: {writes(results.steady)} operator writes; {args.latency_samples} latency samples", log)

    for key in rng.sample(keys, min(args.latency_samples, len(keys))):
        results.latencies.append(spec_change_latency(custom, tracker, key))
    checkpoint("latency")
    results.peak_rss = monitor.peak_rss_bytes()
    operator.stop()
    monitor.close()
    say(f"operator stopped; p50 latency {percentile(results.latencies, 0.5):.3f} s", log)


def operator_idle(audit: AuditLog) -> bool:
    """The operator's start-up lists and watches are in: nothing from it for 3 s."""
    audit.read_new()
    last = max((r.at for r in audit.requests if r.who == "operator" and r.verb != "watch"), default=None)
    assert last is not None, "no operator request yet"
    assert time.time() - last >= 3, "operator still starting"
    return True


def spec_change_latency(custom: client.CustomObjectsApi, tracker: Tracker, key: tuple[str, str]) -> float:
    """kvCacheGiB 1 -> 2 on one service: seconds until the watch sees its Deployment's next generation; then
    waits for that service's status, so the next sample starts with the operator idle."""
    namespace, name = key
    before = tracker.deployment_generation[key][0]
    started = time.monotonic()
    response = custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        name,
        {"spec": {"kvCacheGiB": 2}},
        _content_type="application/merge-patch+json",
        _preload_content=False,
    )
    generation = json.loads(response.data)["metadata"]["generation"]
    tracker.wait(lambda: tracker.deployment_generation[key][0] > before, 60, f"{namespace}/{name} Deployment")
    latency = tracker.deployment_generation[key][1] - started
    tracker.wait(lambda: tracker.planned_generation.get(key, 0) >= generation, 60, f"{namespace}/{name} status")
    return latency


def floor_phase(
    cluster: LocalCluster,
    results: Results,
    keys: list[tuple[str, str]],
    decisions: dict[tuple[str, str], Any],
    tracker: Tracker,
    audit: AuditLog,
    rng: random.Random,
    log: Path,
) -> None:
    say("floor: writing", log)
    api = api_client(cluster.kubeconfig, AGENT_FLOOR)
    custom, kube = client.CustomObjectsApi(api), Kube(api)
    create_namespaces(api_client(cluster.kubeconfig, AGENT_DRIVER), {ns for ns, _ in keys})

    def write(key: tuple[str, str]) -> None:
        namespace, name = key
        response = custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, bench_service(name, namespace), _preload_content=False
        )
        uid = json.loads(response.data)["metadata"]["uid"]
        children, status_patch = decisions[key]
        for child in with_owner_uid(children, PLACEHOLDER_UID, uid):
            kube.apply(child, None)  # each one new
        kube.patch_service_status(namespace, name, status_patch)

    tracker.set_target(keys)
    order = list(keys)
    rng.shuffle(order)
    start_wall, start = time.time(), time.monotonic()
    with ThreadPoolExecutor(PARALLELISM) as pool:
        list(pool.map(write, order))
    results.floor_writes_done_s = time.monotonic() - start
    try:
        tracker.wait(lambda: tracker.done_at is not None, converge_timeout(results.n), "floor convergence")
    except TimeoutError as err:
        raise TimeoutError(f"{err}: {tracker.missing()}") from err
    assert tracker.done_at is not None
    results.floor_s = tracker.done_at - start
    time.sleep(2)  # the last requests reach the log
    audit.read_new()
    results.floor_requests = audit.count("floor", start_wall, time.time())
    say(f"floor converged in {results.floor_s:.1f} s", log)


def percentile(values: list[float], p: float) -> float:
    """Nearest rank (with 20 samples p99 is the slowest)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


def run(args: argparse.Namespace, results: Results, log: Path) -> None:
    rng = random.Random(args.seed)
    say("planner: one service against 5,000 node profiles", log)
    planner_benchmark(results)
    namespaces = min(NAMESPACES, args.services)
    floor_keys = service_keys(args.services, "floor", namespaces)
    started = time.monotonic()
    profiles = [parse_node(bench_node(i)) for i in range(args.services)]
    decisions = precompute_floor(floor_keys, profiles)  # before the cluster: the phases measured run alone
    say(f"floor: {len(floor_keys)} decisions precomputed in {time.monotonic() - started:.1f} s", log)
    stack = ExitStack()
    try:
        say(f"starting the kwokctl cluster in {results.workdir}", log)
        started = time.monotonic()
        cluster = LocalCluster.start(results.workdir, name=CLUSTER_NAME, audit_policy=AUDIT_POLICY)
        stack.callback(cluster.delete, results.workdir / "cluster-logs")
        kubectl = Kubectl(str(cluster.kubectl), str(cluster.kubeconfig))
        create_nodes(api_client(cluster.kubeconfig, AGENT_DRIVER), kubectl, args.services, log)
        results.cluster_setup_s = time.monotonic() - started
        tracker = Tracker()
        watches = Watches(api_client(cluster.kubeconfig, AGENT_WATCH, pool=8), tracker)
        watches.start()
        stack.callback(watches.close)
        audit = AuditLog(cluster.audit_log)
        keys: list[tuple[str, str]] = []
        for index, operator_run in enumerate(results.runs):
            if keys:  # the next operator must not find the previous run's services and children
                delete_namespaces(kubectl, {ns for ns, _ in keys}, args.services, log)
            keys = service_keys(args.services, f"op{index}", namespaces)
            install_crds(kubectl, crds_of(operator_run))
            operator_phase(cluster, operator_run, keys, tracker, audit, stack, args, rng, log)
        install_crds(kubectl, ROOT / "crds")
        floor_phase(cluster, results, floor_keys, decisions, tracker, audit, rng, log)
    finally:
        say("stopping the operator and the cluster", log)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave them running
        try:
            stack.close()
        finally:
            signal.signal(signal.SIGINT, previous)
    results.total_s = time.monotonic() - results.started


def crds_of(operator_run: OperatorRun) -> Path:
    """The CRDs a run's operator was made with: another checkout's, when its PYTHONPATH names one (another commit's
    spec model may refuse the fields this tree's CRD defaults), else this tree's."""
    source = Path(operator_run.env.get("PYTHONPATH", str(ROOT / "operator")))
    return source.parent / "crds" if (source.parent / "crds").is_dir() else ROOT / "crds"


def install_crds(kubectl: Kubectl, crds: Path) -> None:
    kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    kubectl.wait_established("cpullmservices.cpullm.io")


def table(results: Results) -> str:
    """One column per operator run, then the floor, then the first run's ratio to the floor."""
    n, runs = results.n, results.runs
    rows: list[list[str]] = []

    def row(metric: str, per_run: Callable[[OperatorRun], str] | None = None, floor: str = "", ratio: str = "") -> None:
        rows.append([metric, *(per_run(r) if per_run else "" for r in runs), floor, ratio])

    def per_service(count: float) -> str:
        return f"{count / n:.2f}"

    def verbs(counts: Counter[tuple[str, str]]) -> Counter[str]:
        by_verb = Counter[str]()
        for (verb, _), count in counts.items():
            by_verb[verb] += count
        return by_verb

    converge = "converge: create N -> all children + status (s)"
    row(converge, lambda r: f"{r.converge_s:.2f}", f"{results.floor_s:.2f}", f"{results.ratio:.2f}x")
    row("  floor: its own writes returned (s)", None, f"{results.floor_writes_done_s:.2f}")
    row(
        "  operator writes after converge, until all ready and quiet",
        lambda r: f"{r.backlog_writes} in {r.backlog_s:.1f} s{r.backlog_note}",
    )
    row(
        "  readiness reported after the Deployment was, p50 / p99 / max (s)",
        lambda r: " / ".join(f"{percentile(r.readiness_lags, p):.2f}" for p in (0.5, 0.99, 1.0)),
    )
    row("API requests per service, converge + backlog (by verb)")
    floor_verbs = verbs(results.floor_requests)
    for verb in sorted(set(floor_verbs).union(*(verbs(r.requests) for r in runs))):
        row(f"  {verb}", lambda r, v=verb: per_service(verbs(r.requests)[v]), per_service(floor_verbs[verb]))
    floor_writes = writes(results.floor_requests)
    ratio_writes = f"{writes(runs[0].requests) / floor_writes:.2f}x" if floor_writes else ""
    row(
        "  writes (create/update/patch/delete)",
        lambda r: per_service(writes(r.requests)),
        per_service(floor_writes),
        ratio_writes,
    )
    row("    of which before converge was reached", lambda r: per_service(r.converge_writes))
    row("API requests per service by verb and resource")
    pairs = set(results.floor_requests).union(*(r.requests for r in runs))
    for verb, resource in sorted(pairs, key=lambda p: (p[1], p[0])):
        row(
            f"  {verb} {resource}",
            lambda r, p=(verb, resource): per_service(r.requests[p]),
            per_service(results.floor_requests[verb, resource]),
        )
    minutes = results.steady_seconds / 60
    row(f"steady state, nothing changing, {results.steady_seconds} s")
    row("  operator writes per minute (goal 0)", lambda r: f"{writes(r.steady) / minutes:.2f}")
    row("  operator requests per minute, all verbs", lambda r: f"{sum(r.steady.values()) / minutes:.2f}")
    for pair in sorted(set().union(*(r.steady for r in runs))):
        row(f"    {pair[0]} {pair[1]}", lambda r, p=pair: f"{r.steady[p]}")
    samples = len(runs[0].latencies)
    row(f"spec change -> Deployment updated, {samples} samples, N-1 idle")
    row("  p50 (s)", lambda r: f"{percentile(r.latencies, 0.5):.3f}")
    row("  p99 (s)", lambda r: f"{percentile(r.latencies, 0.99):.3f}")
    row("operator peak RSS (MB)", lambda r: f"{r.peak_rss / 1e6:.0f}")
    row("  RSS once started, N nodes indexed (MB)", lambda r: f"{r.rss.get('idle', math.nan) / 1e6:.0f}")
    row("  RSS at the end of the steady state (MB)", lambda r: f"{r.rss.get('steady', math.nan) / 1e6:.0f}")

    def cpu(phase: str, before: str | None = None) -> Callable[[OperatorRun], str]:
        return lambda r: f"{r.cpu.get(phase, math.nan) - (r.cpu.get(before, math.nan) if before else 0):.1f}"

    row("operator CPU seconds, total", cpu("latency"))
    row("  start-up (0 services)", cpu("idle"))
    row("  converge + backlog", cpu("converged", "idle"))
    row(f"  steady state ({results.steady_seconds} s)", cpu("steady", "converged"))
    row(f"  {samples} spec changes", cpu("latency", "steady"))

    def reconciled(phase: str, before: str) -> Callable[[OperatorRun], str]:
        return lambda r: per_service(
            sum(r.reconciles.get(phase, {}).values()) - sum(r.reconciles.get(before, {}).values())
        )

    row("operator reconciles per service, converge + backlog", reconciled("converged", "idle"))
    row(
        "  of which superseded by a newer one",
        lambda r: per_service(
            r.reconciles.get("converged", {}).get("superseded", 0) - r.reconciles.get("idle", {}).get("superseded", 0)
        ),
    )
    row("operator reconciles per service, steady state", reconciled("steady", "converged"))
    planner = f"planner: plan_service vs {PLANNER_PROFILES} profiles, best of {PLANNER_RUNS} (ms)"
    row(planner, lambda r: f"{results.planner_ms:.1f}" if r is runs[0] else "")
    header = ["metric", *("operator" + (f" {r.label}" if r.env else "") for r in runs), "floor", "ratio"]
    widths = [max(len(cells[i]) for cells in [*rows, header]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join([cells[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))])

    lines = [line(header), "-" * len(line(header)), *(line(cells) for cells in rows)]
    return "\n".join(lines)


def header(results: Results) -> str:
    return "\n".join(
        [
            f"cpullm-operator scale benchmark, N={results.n}: {results.n} CpuLLMServices (Qwen2.5-0.5B, TP 1, "
            f"2 CPUs/rank, KV 1 GiB) in {min(NAMESPACES, results.n)} namespaces",
            f"over {results.n} KWOK nodes (1/2/4 NUMA x 32-128 CPUs x AMX/AVX-512/AVX2; the planner bench: "
            f"{results.planner_shapes} shapes), seed {results.seed}, {PARALLELISM} writer threads",
            f"machine: {os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}; "
            f"kwokctl binary runtime, service CIDR {SERVICE_CIDR}",
            "API requests: kube-apiserver audit log (one line per request at ResponseComplete), by user agent:",
            f"operator = kopf/* + OpenAPI-Generator/* (its kubernetes client), floor = {AGENT_FLOOR};",
            f"the policy drops {AUDIT_DROPPED}, which neither touches; watches count once they end",
            f"run time {results.total_s:.0f} s (cluster + {results.n} nodes {results.cluster_setup_s:.0f} s)",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, required=True, help="N: services and KWOK nodes")
    parser.add_argument("--seed", type=int, default=0, help="order of creates and latency samples")
    parser.add_argument("--steady-seconds", type=int, default=300, help="idle window counted for writes")
    parser.add_argument("--latency-samples", type=int, default=20, help="spec changes, one service at a time")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=VALUE[,NAME=VALUE]",
        help="also run the operator with this environment (e.g. CPULLM_RECONCILE_WORKERS=32), after the "
        "operator as shipped, in its own column; repeatable",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix=f"cpullm-scale-{args.services}-"))
    log = workdir / "bench.log"
    runs = [OperatorRun("as shipped", {})]
    for variant in args.variant:
        runs.append(
            OperatorRun(variant.replace("CPULLM_", ""), dict(pair.split("=", 1) for pair in variant.split(",")))
        )
    results = Results(n=args.services, seed=args.seed, steady_seconds=args.steady_seconds, workdir=workdir, runs=runs)

    def terminate(signum: int, _: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminate)
    try:
        run(args, results, log)
    except (Exception, KeyboardInterrupt) as err:
        say(f"failed: {type(err).__name__}: {err}", log)
        print(f"benchmark failed: {type(err).__name__}: {err}")
        print(f"logs: {workdir} (operator-*.log, cluster-logs/ with audit.log, bench.log)")
        return 1
    print(header(results))
    print()
    print(table(results))
    print()
    print(f"logs: {workdir} (operator-*.log, cluster-logs/ with audit.log and the components' logs, bench.log)")
    print(f"converge ratio to floor at N={results.n}: {results.ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
