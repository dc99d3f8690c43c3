"""The scale benchmark's parts (bench/scale_bench.py): the shapes of nodes and services, watches that time
convergence, the API server's audit log counted by client, and the operator's resources. Its cluster is the e2e
suite's (testbed/cluster.py's LocalCluster) with an audit policy, under a name of its own so it never touches an
e2e cluster running beside it.
"""

from __future__ import annotations

import copy
import functools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client, config
from kubernetes.watch.watch import iter_resp_lines
from testbed.objects import fake_node, tiny_service
from testbed.tools import parse_metrics

from cpullm.api.spec import GROUP, PLURAL, VERSION
from cpullm.core.children.common import MANAGED_BY, MANAGED_BY_LABEL, SERVICE_LABEL

CLUSTER_NAME = "cpullm-scale"
# Who made a request, by user agent: the operator's two clients (Kopf's watches and its handlers' kubernetes
# client), and the benchmark's own clients, each named so they never count as the operator.
OPERATOR_AGENTS = ("kopf/", "OpenAPI-Generator/")
# The cluster's own controllers: the operator follows what they write (Deployment status, pods being scheduled).
CONTROLLER_AGENTS = ("kube-controller-manager/", "kube-scheduler/")
AGENT_DRIVER = "cpullm-scale-bench/driver"
AGENT_FLOOR = "cpullm-scale-bench/floor"
AGENT_WATCH = "cpullm-scale-bench/watch"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
# Only requests at ResponseComplete (one line per request); the kube-controller-manager's, the scheduler's
# and KWOK's high-volume traffic on kinds the operator never touches is dropped to keep the log small.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {
            "level": "None",
            "resources": [
                {"group": "coordination.k8s.io", "resources": ["leases"]},
                {"group": "", "resources": ["pods", "pods/status", "pods/binding", "nodes/status", "endpoints"]},
                {"group": "discovery.k8s.io", "resources": ["endpointslices"]},
                {"group": "apps", "resources": ["replicasets", "replicasets/status"]},
            ],
        },
        {"level": "None", "nonResourceURLs": ["/healthz*", "/readyz*", "/livez*", "/metrics"]},
        {"level": "Metadata"},
    ],
}
AUDIT_DROPPED = "leases, pods, replicasets, endpoints(lices), nodes/status"


def api_client(kubeconfig: Path, user_agent: str, pool: int = 16) -> client.ApiClient:
    """A client of the benchmark's own, named by its user agent (the audit log counts requests by client)."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = pool
    api = client.ApiClient(configuration)
    api.user_agent = user_agent
    return api


# --- what the cluster holds --------------------------------------------------------------------------------

_AMX = ("AMXTILE", "AMXBF16", "AMXINT8")
_AVX512 = ("AVX512F", "AVX512BW", "AVX512VL", "AVX512VNNI", "AVX512BF16")
ISAS = {"amx": (), "avx512": _AMX, "avx2": _AMX + _AVX512}  # the CPUID labels each ISA class lacks
NUMA_NODES = (1, 2, 4)
CPUS = (32, 64, 96, 128)


def bench_node(index: int) -> dict[str, Any]:
    """Node `index` cycles 1/2/4 NUMA nodes, 32-128 CPUs (4 GiB each) and AMX/AVX-512/AVX2: 36 shapes."""
    cpus = CPUS[index % len(CPUS)]
    isa = list(ISAS)[(index // len(NUMA_NODES)) % len(ISAS)]
    node = copy.deepcopy(_shaped_node(NUMA_NODES[index % len(NUMA_NODES)], cpus, isa))
    name = f"node-{index:05d}"
    node["metadata"]["name"] = name
    node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    return node


@functools.cache
def _shaped_node(numa: int, cpus: int, isa: str) -> dict[str, Any]:
    """One e2e fake_node per shape (it parses the sample nodes' YAML on every call: too slow 5,000 times)."""
    node = fake_node("shape", numa=numa, cpu=str(cpus), memory=f"{cpus * 4}Gi")
    labels = node["metadata"]["labels"]
    for flag in ISAS[isa]:
        labels.pop(f"feature.node.kubernetes.io/cpu-cpuid.{flag}", None)
    labels["cpullm.io/bench-isa"] = isa
    return node


def bench_service(name: str, namespace: str) -> dict[str, Any]:
    """The e2e suite's tiny service (Qwen2.5-0.5B, 2 CPUs per rank, KV 1 GiB), TP 1, on any node."""
    return tiny_service(name, namespace, nodeSelector=None, tensorParallelSize=1)


def service_keys(count: int, prefix: str, namespaces: int) -> list[tuple[str, str]]:
    """(namespace, name) of each service, spread round-robin over the namespaces."""
    return [(f"{prefix}-{i % namespaces}", f"svc-{i:05d}") for i in range(count)]


# --- convergence, timed by watches ------------------------------------------------------------------------

CHILD_KINDS = ("deployments", "services", "configmaps")


@dataclass
class Tracker:
    """What the watches saw, per (namespace, service): which children exist, whether status is written for
    the current generation, and the Deployment's generation with when it was first seen. A target set is
    converged at the moment the last of its services has all four; the watch event's arrival time is used,
    not a poll's, so the figure does not depend on a polling interval."""

    children: dict[str, set[tuple[str, str]]] = field(default_factory=lambda: {k: set() for k in CHILD_KINDS})
    planned: set[tuple[str, str]] = field(default_factory=set)
    ready: set[tuple[str, str]] = field(default_factory=set)  # status reports every replica ready
    planned_generation: dict[tuple[str, str], int] = field(default_factory=dict)
    deployment_generation: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    # When the watches first saw each Deployment with all its replicas ready, and its service report that.
    deployment_ready_at: dict[tuple[str, str], float] = field(default_factory=dict)
    reported_ready_at: dict[tuple[str, str], float] = field(default_factory=dict)
    satisfied: set[tuple[str, str]] = field(default_factory=set)
    target: frozenset[tuple[str, str]] = frozenset()
    target_count: int = 0
    done_at: float | None = None
    watch_error: str = ""
    changed: threading.Condition = field(default_factory=threading.Condition)

    def set_target(self, keys: Iterable[tuple[str, str]]) -> None:
        with self.changed:
            self.target = frozenset(keys)
            self.target_count = len(self.satisfied & self.target)
            self.done_at = None

    def child_event(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        owner = (meta.get("labels") or {}).get(SERVICE_LABEL)
        if owner is None:
            return
        key = (meta.get("namespace", ""), owner)
        with self.changed:
            if type_ == "DELETED":
                self.children[kind].discard(key)
            else:
                self.children[kind].add(key)
                if kind == "deployments":
                    generation = int(meta.get("generation") or 0)
                    if self.deployment_generation.get(key, (-1, 0.0))[0] != generation:
                        self.deployment_generation[key] = (generation, time.monotonic())
                    wanted = int((obj.get("spec") or {}).get("replicas") or 1)
                    if int((obj.get("status") or {}).get("readyReplicas") or 0) >= wanted:
                        self.deployment_ready_at.setdefault(key, time.monotonic())
            self._update(key)

    def service_event(self, type_: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        status = obj.get("status") or {}
        conditions = {c.get("type") for c in status.get("conditions") or []}
        ok = (
            type_ != "DELETED"
            and status.get("observedGeneration") == meta.get("generation")
            and "Planned" in conditions
        )
        replicas = int((obj.get("spec") or {}).get("replicas") or 1)
        with self.changed:
            if ok and status.get("readyReplicas") == replicas:
                self.ready.add(key)
                self.reported_ready_at.setdefault(key, time.monotonic())
            else:
                self.ready.discard(key)
            if ok:
                self.planned.add(key)
                self.planned_generation[key] = int(status["observedGeneration"])
            else:
                self.planned.discard(key)
            self._update(key)

    def _update(self, key: tuple[str, str]) -> None:
        now_ok = key in self.planned and all(key in seen for seen in self.children.values())
        was_ok = key in self.satisfied
        if now_ok and not was_ok:
            self.satisfied.add(key)
            self.target_count += key in self.target
        elif was_ok and not now_ok:
            self.satisfied.discard(key)
            self.target_count -= key in self.target
        if self.target and self.done_at is None and self.target_count == len(self.target):
            self.done_at = time.monotonic()
        self.changed.notify_all()

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Blocks until predicate (evaluated under the lock at every watch event) holds, or raises."""
        with self.changed:
            if not self.changed.wait_for(predicate, timeout=timeout):
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")

    def readiness_lags(self, keys: Iterable[tuple[str, str]]) -> list[float]:
        """Per service, seconds from its Deployment first seen ready to its status first reporting it."""
        with self.changed:
            return [
                self.reported_ready_at[key] - self.deployment_ready_at[key]
                for key in keys
                if key in self.reported_ready_at and key in self.deployment_ready_at
            ]

    def missing(self) -> str:
        """Why the target is not converged, for a timeout's message."""
        with self.changed:
            lacking = {kind: len(self.target - seen) for kind, seen in self.children.items()}
            lacking["status"] = len(self.target - self.planned)
        return ", ".join(f"{count} without {kind}" for kind, count in lacking.items() if count) + (
            f"; last watch error: {self.watch_error}" if self.watch_error else ""
        )


class Watches:
    """One list+watch per kind over all namespaces (raw JSON: the client's models cost CPU the API server and
    the operator need on a 2-core machine), feeding a Tracker until stopped."""

    def __init__(self, api: client.ApiClient, tracker: Tracker) -> None:
        self.tracker = tracker
        self.stop = threading.Event()
        apps, core, custom = client.AppsV1Api(api), client.CoreV1Api(api), client.CustomObjectsApi(api)
        selector = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
        sources: list[tuple[Callable[..., Any], dict[str, Any], Callable[[str, dict[str, Any]], None]]] = [
            (
                apps.list_deployment_for_all_namespaces,
                {"label_selector": selector},
                lambda t, o: tracker.child_event("deployments", t, o),
            ),
            (
                core.list_service_for_all_namespaces,
                {"label_selector": selector},
                lambda t, o: tracker.child_event("services", t, o),
            ),
            (
                core.list_config_map_for_all_namespaces,
                {"label_selector": selector},
                lambda t, o: tracker.child_event("configmaps", t, o),
            ),
            (
                lambda **kw: custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **kw),
                {},
                tracker.service_event,
            ),
        ]
        self.threads = [
            threading.Thread(target=self._run, args=source, daemon=True, name=f"watch-{i}")
            for i, source in enumerate(sources)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        self.stop.set()

    def _run(
        self, list_fn: Callable[..., Any], kwargs: dict[str, Any], handle: Callable[[str, dict[str, Any]], None]
    ) -> None:
        while not self.stop.is_set():
            try:
                listing = json.loads(list_fn(**kwargs, _preload_content=False, _request_timeout=60).data)
                for item in listing.get("items") or []:
                    handle("ADDED", item)
                version = listing["metadata"]["resourceVersion"]
                while not self.stop.is_set():
                    version = self._watch(list_fn, kwargs, handle, version)
            except _Expired:
                continue  # too old a resourceVersion: list again
            except Exception as err:  # a dropped connection: list again after a pause
                self.tracker.watch_error = f"{type(err).__name__}: {err}"[:300]
                self.stop.wait(1.0)

    def _watch(
        self,
        list_fn: Callable[..., Any],
        kwargs: dict[str, Any],
        handle: Callable[[str, dict[str, Any]], None],
        version: str,
    ) -> str:
        response = list_fn(
            **kwargs,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=60,
            _preload_content=False,
            _request_timeout=(10, 90),
        )
        try:
            for line in iter_resp_lines(response):
                if self.stop.is_set():
                    break
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    raise _Expired(str(obj.get("message")))
                version = (obj.get("metadata") or {}).get("resourceVersion", version)
                if event.get("type") != "BOOKMARK":
                    handle(event["type"], obj)
        finally:
            response.release_conn()
        return version


class _Expired(Exception):
    """The watch's resourceVersion is gone (410): list again."""


# --- the audit log, counted by client ---------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    at: float  # epoch seconds the API server received it
    who: str  # operator, controllers, floor, driver, watch
    verb: str
    resource: str  # plural, with /subresource


class AuditLog:
    """Reads the API server's audit log as it grows, keeping only requests of the operator, the cluster's
    controllers and the bench."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.requests: list[Request] = []

    def read_new(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as log:
            log.seek(self.offset)
            data = log.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            who = classify(entry.get("userAgent", ""))
            if who is None:
                continue
            ref = entry.get("objectRef") or {}
            resource = ref.get("resource", entry.get("requestURI", "?"))
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            at = datetime.fromisoformat(entry["requestReceivedTimestamp"]).timestamp()
            self.requests.append(Request(at, who, entry.get("verb", "?"), resource))

    def count(self, who: str, start: float, end: float) -> Counter[tuple[str, str]]:
        """(verb, resource) -> requests by `who` received in [start, end)."""
        return Counter((r.verb, r.resource) for r in self.requests if r.who == who and start <= r.at < end)

    def last_write(self, who: str) -> float | None:
        return max((r.at for r in self.requests if r.who == who and r.verb in WRITE_VERBS), default=None)


def classify(user_agent: str) -> str | None:
    if user_agent.startswith(OPERATOR_AGENTS):
        return "operator"
    if user_agent.startswith(CONTROLLER_AGENTS):
        return "controllers"
    for agent, who in ((AGENT_FLOOR, "floor"), (AGENT_DRIVER, "driver"), (AGENT_WATCH, "watch")):
        if user_agent.startswith(agent):
            return who
    return None


def writes(counts: Counter[tuple[str, str]]) -> int:
    return sum(n for (verb, _), n in counts.items() if verb in WRITE_VERBS)


# --- the operator's own resources -------------------------------------------------------------------------


class ResourceMonitor:
    """Peak RSS (the kernel's VmHWM, with 0.2 s samples as a fallback) and CPU seconds of one process."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak_rss = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True, name="rss")
        self.thread.start()

    def _sample(self) -> None:
        while not self.stop.wait(0.2):
            try:
                self.peak_rss = max(self.peak_rss, self.process.memory_info().rss)
            except psutil.Error:
                return

    def cpu_seconds(self) -> float:
        times = self.process.cpu_times()
        return float(times.user + times.system)

    def rss_bytes(self) -> int:
        return int(self.process.memory_info().rss)

    def peak_rss_bytes(self) -> int:
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return max(self.peak_rss, int(line.split()[1]) * 1024)
        except OSError:
            pass
        return self.peak_rss

    def close(self) -> None:
        self.stop.set()


def reconciles(metrics_text: str) -> dict[str, float]:
    """cpullm_reconciles_total by outcome, from the operator's /metrics."""
    return {
        series.split('outcome="', 1)[1].split('"', 1)[0]: value
        for series, value in parse_metrics(metrics_text).items()
        if series.startswith("cpullm_reconciles_total{")
    }


def with_owner_uid(objects: Any, placeholder: str, uid: str) -> Any:
    """A copy of precomputed children whose ownerReferences name the service actually created."""
    return json.loads(json.dumps(objects).replace(placeholder, uid)) if placeholder else copy.deepcopy(objects)
