"""Kopf handlers called as Kopf would, with the reconciler's API module stubbed."""

import asyncio
import contextlib
import threading
import time
from typing import Any

import kopf
import pytest
from kopf._cogs.structs.references import Selector  # Kopf's, to log what Kopf logs
from kopf._core.engines.indexing import Index as KopfIndex  # Kopf's index, to test against its semantics
from kopf._core.reactor import observation  # Kopf's handler of CRD events, which configure() wraps

from cpullm.controller import discovery_wait, dispatch, handlers, kopf_settings
from cpullm.controller.indexes import KopfIndexes, indexed, seen_index
from cpullm.controller.pacing import RolloutPacer
from cpullm.controller.state import ControllerState
from cpullm.controller.workers import ReconcileWorkers
from cpullm.core import node_topology
from cpullm.core.children import WATCHED_KINDS
from cpullm.core.node_facts import NODE_FACT_SOURCES
from cpullm.core.observation import ChildSeen, ClusterView, Ownership
from cpullm.core.rollout import TEMPLATE_DIGEST
from cpullm.errors import TransientApiError
from cpullm.settings import Settings

from .builders import LLAMA_8B, node, node_object, planned_service, topology_object


class RecordingReconciler:
    """Each reconcile's service and the facts it was handed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.unschedulable: list[str | None] = []  # each reconcile's pod trouble's message
        self.deployments: list[Any] = []
        self.daemons: list[Any] = []
        self.topologies: list[Any] = []  # the NodeResourceTopologies each reconcile was handed
        self.exits: list[Any] = []  # the server exits each reconcile was handed
        self.forgotten: list[str] = []
        self.gateways: list[Any] = []  # the gateways in front of the service, as each reconcile was handed them

    def reconcile(self, service: dict[str, Any], view: ClusterView, ticket: int | None = None) -> None:
        self.exits.append(view.server_exits)
        self.gateways.append(view.gateways)
        self.calls.append((service["metadata"]["name"], sorted(n.name for n in view.nodes)))
        self.daemons.append(view.daemons)
        self.topologies.append(view.node_facts)
        self.deployments.append(view.deployment)
        self.unschedulable.append(view.pod_trouble.message if view.pod_trouble else None)

    def forget(self, namespace: str, name: str) -> None:
        self.forgotten.append(name)


class RecordingMemory:
    """The operator's memory as dispatch asks it, answering from what a test puts in."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []
        self.changed_while_away: set[str] = set()
        self.own_writes: set[str] = set()  # children whose events child_event finds to need no reconcile
        self.specs_read: set[str] = set()  # services whose events service_event finds to need no reconcile
        self.forgotten: list[str] = []
        self.vanished: dict[str, Any] = {}  # by kind: the owners drifted returns, or the error it raises
        self.listed: list[str] = []  # the kinds the resync listed, in order

    def begin(self, service, deployment):
        return 0

    def service_event(self, service):
        return service["metadata"]["name"] not in self.specs_read

    def forget(self, namespace, name, uid):
        self.forgotten.append(name)

    def child_event(self, kind, namespace, name, event, body, owner):
        self.seen.append((kind, name, event))
        return name in self.changed_while_away if event is None else name not in self.own_writes

    def drifted(self, kind, listing, exists):
        self.listed.append(kind)
        found = self.vanished.get(kind, [])
        if isinstance(found, Exception):
            raise found
        return found, []


class RecordingEvents:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def emit_event(self, regarding, type_, reason, message):
        self.events.append((regarding["kind"], type_, reason))


def handler_memo(reconciler: Any, workers: int = 2) -> kopf.Memo:
    """What configure() puts in Kopf's memo, with the reconciler given and recording fakes for the rest."""
    state = ControllerState(
        reconciler, ReconcileWorkers(workers), RecordingMemory(), RolloutPacer(None), RecordingEvents()
    )
    return kopf.Memo(state=state)


# Kopf passes every index to every handler; these tests fill only the one they are about.
OTHER_INDEXES: dict[str, Any] = {
    "owned_deployments": {},
    "gateways": {},
    "installed_crds": {},
    "pod_troubles": {},
    "server_exits": {},
    "server_addresses": {},
    "server_replicasets": {},
    "daemonset_pods": {},
    **{source.index: {} for source in NODE_FACT_SOURCES},
    **{seen_index(kind.plural): {} for kind in WATCHED_KINDS},
}
INDEXES = {"node_profiles": {}, **OTHER_INDEXES}
INSUFFICIENT = {"status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient cpu."}


# A server pod's controller, its ReplicaSet, and the service's Deployment that controls that (as the indexes hold
# them): a pod's facts reach its service's reconcile only through them.
RS_REF = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "a-5d8f", "uid": "rs-a", "controller": True}
POD_OWNERS = {
    "owned_deployments": {("ns", "a"): [{"metadata": {"uid": "deploy-a"}, "spec": {}, "status": {}}]},
    "server_replicasets": {("ns", "rs-a"): ["deploy-a"]},
}


def pod(name: str, scheduled: dict[str, str] | None, owner: dict[str, Any] = RS_REF) -> dict[str, Any]:
    conditions = [{"type": "PodScheduled", **scheduled}] if scheduled else []
    status = {"conditions": conditions}
    meta = {"ownerReferences": [owner]}
    labels = {"cpullm.io/service": "a"}
    return {"name": name, "namespace": "ns", "labels": labels, "meta": meta, "spec": {}, "status": status}


def kopf_indexes(given: dict[str, Any]) -> KopfIndexes:
    """What a handler hands dispatch: every index, those given filled."""
    return KopfIndexes.of({"services": {}, **INDEXES, **given})


DEPLOYMENTS = kopf.Resource("apps", "v1", "deployments", kind="Deployment")
NRT = kopf.Resource(node_topology.GROUP, node_topology.VERSION, node_topology.PLURAL, kind=node_topology.KIND)


def child(
    name: str, controller: tuple[str, str] | None = ("a", "uid-a"), kind: str = "CpuLLMService"
) -> dict[str, Any]:
    """What Kopf passes a child's event handler about the child: its name, metadata and body (with the controller
    owner reference the operator writes, to the service `controller` = (name, uid))."""
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "labels": {"cpullm.io/service": "a"}}
    if controller is not None:
        owner = {"apiVersion": "cpullm.io/v1alpha1", "kind": kind, "name": controller[0], "uid": controller[1]}
        meta["ownerReferences"] = [{**owner, "controller": True}]
    return {"name": name, "meta": meta, "body": kopf.Body({"metadata": meta})}


SERVICES = {
    ("ns", "a"): [{"metadata": {"name": "a", "namespace": "ns", "uid": "uid-a"}}],
    ("ns", "gone"): [{"metadata": {"name": "gone", "namespace": "ns", "deletionTimestamp": "now"}}],
}


def kopf_call(handler: Any, memo: kopf.Memo, **given: Any) -> Any:
    """An event handler's call as Kopf makes it: every index passed (the services SERVICES, the others empty), those
    `given` filled, beside the event's own arguments."""
    return handler(memo=memo, **{"services": SERVICES, **INDEXES, **given})


def call_node_changed(
    memo: kopf.Memo, type_: str | None, obj: dict[str, Any], index: dict[str, list[Any]], topologies: Any = None
) -> None:
    """As Kopf does: the node index is updated from the event first, then the event handler runs."""
    name = obj["metadata"]["name"]
    index.pop(name, None)
    if type_ != "DELETED":
        index.update(
            {n: [p] for n, p in (asyncio.run(handlers.node_profiles(name=name, body=kopf.Body(obj))) or {}).items()}
        )
    topologies = {} if topologies is None else topologies
    run = kopf_call(
        handlers.node_changed,
        memo,
        name=name,
        type=type_,
        body=kopf.Body(obj),
        node_profiles=index,
        node_topologies=topologies,
    )
    asyncio.run(run)


def test_node_events_replan_only_when_the_profile_changes():
    memo = handler_memo(RecordingReconciler())
    rec = memo["state"].reconciler
    index = {"n1": [node("n1")], "n2": [node("n2")]}
    call_node_changed(memo, None, node_object("n1"), index)  # initial listing: resume handlers cover it
    assert rec.calls == []
    heartbeat = node_object("n1")
    heartbeat["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    call_node_changed(memo, "MODIFIED", heartbeat, index)
    assert rec.calls == []
    call_node_changed(memo, "MODIFIED", node_object("n1", numa=2), index)
    assert rec.calls == [("a", ["n1", "n2"])]  # the service being deleted is skipped
    call_node_changed(memo, "DELETED", node_object("n1", numa=2), index)
    assert rec.calls[-1] == ("a", ["n2"])


def call_daemonset_changed(
    memo: kopf.Memo, type_: str | None, obj: dict[str, Any], index: dict[Any, list[Any]]
) -> None:
    """As Kopf does: the DaemonSet index is updated from the event first, then the event handler runs."""
    key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
    index.pop(key, None)
    if type_ != "DELETED":
        found = asyncio.run(handlers.daemonset_pods(namespace=key[0], name=key[1], body=kopf.Body(obj)))
        index.update({k: [v] for k, v in found.items()})
    run = kopf_call(handlers.daemonset_changed, memo, namespace=key[0], name=key[1], type=type_, daemonset_pods=index)
    asyncio.run(run)


def agent(cpu: str = "100m", **status: Any) -> dict[str, Any]:
    pod = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
    meta = {"name": "agent", "namespace": "kube-system"}
    return {"metadata": meta, "spec": {"template": {"spec": pod}}, "status": status}


def test_daemonset_events_replan_every_service_only_when_their_pods_change():
    memo = handler_memo(RecordingReconciler())
    rec = memo["state"].reconciler
    index: dict[Any, list[Any]] = {}
    call_daemonset_changed(memo, None, agent(), index)  # initial listing: the services' own listing plans them
    call_daemonset_changed(memo, "MODIFIED", agent(numberReady=3), index)  # rolling pods: status noise
    assert rec.calls == []
    call_daemonset_changed(memo, "MODIFIED", agent("200m"), index)
    assert [call[0] for call in rec.calls] == ["a"]  # the service being deleted is skipped
    assert [d.cpu_millis for d in rec.daemons[-1]] == [200]  # the reconcile reads the new requests
    call_daemonset_changed(memo, "DELETED", agent("200m"), index)
    assert len(rec.calls) == 2 and rec.daemons[-1] == []


def test_an_unreadable_daemonset_is_left_out_of_the_index():
    broken = agent()
    broken["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    assert asyncio.run(handlers.daemonset_pods(namespace="kube-system", name="agent", body=kopf.Body(broken))) == {}


def test_unparseable_node_is_skipped_with_a_warning_event():
    memo = handler_memo(RecordingReconciler())
    index = {"n1": [node("n1")], "n2": [node("n2")]}
    call_node_changed(memo, None, node_object("n1"), index)
    call_node_changed(memo, "MODIFIED", node_object("n1", labels={"cpullm.io/numa-nodes": "two"}), index)
    rec = memo["state"].reconciler
    assert memo["state"].kube.events == [("Node", "Warning", "InvalidNodeLabels")]
    assert rec.calls == [("a", ["n2"])]


def test_child_events_reconcile_their_owner_only_when_the_memory_finds_the_event_matters():
    memo = handler_memo(RecordingReconciler())
    rec, memory = memo["state"].reconciler, memo["state"].memory
    index = {"n1": [node("n1")]}

    def child_event(type_: str | None, name: str = "a", controller: Any = ("a", "uid-a"), kind: str = "CpuLLMService"):
        event = {"namespace": "ns", "type": type_, **child(name, controller, kind), "resource": DEPLOYMENTS}
        asyncio.run(kopf_call(handlers.child_changed, memo, node_profiles=index, **event))

    child_event("MODIFIED")
    child_event("DELETED", controller=("other", "uid-o"))  # no such service
    child_event("MODIFIED", controller=None)  # our labels, no owner: not ours
    child_event("MODIFIED", controller=("a", "uid-old"))  # left by a service of the same name, deleted since
    child_event("MODIFIED", kind="ReplicaSet")  # controlled by something else
    child_event(None)  # in a listing, unchanged
    memory.own_writes.add("a-own")
    child_event("MODIFIED", name="a-own")  # nothing the reconcile would change
    assert rec.calls == [("a", ["n1"])]
    assert memory.seen == [
        ("Deployment", "a", "MODIFIED"),
        ("Deployment", "a", None),
        ("Deployment", "a-own", "MODIFIED"),
    ]


def test_node_index_keeps_label_errors_out_of_planning():
    """Through Kopf's own index: a node whose labels break after it was indexed leaves the index (Kopf keeps an
    object's previous entry when the index function answers None, so ours answer {})."""
    index = KopfIndex()  # Kopf's: what handlers receive as `node_profiles`
    for n, labels in [("n1", {}), ("n2", {}), ("n2", {"cpullm.io/numa-nodes": "x"})]:
        body = kopf.Body(node_object(n, labels=labels))
        index._replace((None, n, n), asyncio.run(handlers.node_profiles(name=n, body=body)))
    assert [p.name for p in indexed(index)] == ["n1"]


@pytest.mark.parametrize(
    ("owner", "indexes", "seen"),
    [
        (RS_REF, POD_OWNERS, True),  # the service's Deployment's ReplicaSet
        # the service's label on a pod of another ReplicaSet, of a Deployment not the service's
        (
            {**RS_REF, "uid": "rs-mine"},
            {**POD_OWNERS, "server_replicasets": {("ns", "rs-mine"): ["deploy-mine"]}},
            False,
        ),
        # a ReplicaSet the index does not hold (not the operator's: its labels are not the children's)
        ({**RS_REF, "uid": "rs-unknown"}, POD_OWNERS, False),
        # no Deployment of the service yet
        (RS_REF, {**POD_OWNERS, "owned_deployments": {}}, False),
        # a pod made directly, labelled as a server
        ({"kind": "Job", "uid": "job-1", "controller": True}, POD_OWNERS, False),
    ],
)
def test_a_pods_facts_reach_its_service_only_through_the_services_own_replicasets(owner, indexes, seen):
    """Anyone who may create pods in the namespace can copy a server's labels: the trouble of a pod whose
    ReplicaSet the service's Deployment does not control never becomes the service's Ready reason."""
    memo = handler_memo(RecordingReconciler())
    event = pod("a-1", INSUFFICIENT, owner)
    entry = asyncio.run(handlers.pod_troubles(**event)) or {}
    index = {key: [value] for key, value in entry.items()}
    asyncio.run(kopf_call(handlers.pod_changed, memo, **event, type="MODIFIED", **{**indexes, "pod_troubles": index}))
    found = memo["state"].reconciler.unschedulable  # what each reconcile the event caused saw (a forged pod's
    # event may still wake one: it changes nothing)
    assert found == [f"a pod cannot be scheduled: {INSUFFICIENT['message']}" if seen else None]


def test_a_replicaset_is_indexed_by_the_deployment_that_controls_it():
    controlled = {"uid": "rs-a", "ownerReferences": [{"kind": "Deployment", "uid": "deploy-a", "controller": True}]}
    assert asyncio.run(handlers.server_replicasets(namespace="ns", meta=controlled)) == {("ns", "rs-a"): "deploy-a"}
    for meta in ({"uid": "rs-b"}, {"uid": "rs-c", "ownerReferences": [{"kind": "Deployment", "uid": "d"}]}):
        assert asyncio.run(handlers.server_replicasets(namespace="ns", meta=meta)) == {}


def test_a_pod_scheduled_at_last_leaves_the_pod_troubles_index():
    index = KopfIndex()
    for scheduled in [INSUFFICIENT, {"status": "True"}]:
        index._replace(("ns", "a-1", "u"), asyncio.run(handlers.pod_troubles(**pod("a-1", scheduled))))
    assert ("ns", "a") not in index


class FlakyReconciler(RecordingReconciler):
    """Answers the first `failures` reconciles with a transient API error, then plans."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def reconcile(self, service: dict[str, Any], view: ClusterView, ticket: int | None = None) -> Any:
        super().reconcile(service, view, ticket)
        if len(self.calls) <= self.failures:
            return TransientApiError("cannot apply Deployment ns/a: HTTP 503")
        return None


async def retries_settled(memo: kopf.Memo) -> None:
    """Waits until every event retry task has run to its end, with any retry it scheduled in turn (the pending map
    empties before a retry's reconcile runs, so it cannot tell)."""
    while running := [task for task in memo["state"].retries.running if not task.done()]:
        await asyncio.wait(running)


def test_an_event_triggered_reconcile_that_hit_a_transient_error_is_retried(monkeypatch):
    """A child event's reconcile that could not reach the API server is tried again (with the latest service),
    so a status cannot stay stale after a fault; retries stop once it succeeds."""
    monkeypatch.setattr(dispatch, "retry_delay", lambda outcome, attempt, **_: 0.01 if outcome is not None else None)
    memo = handler_memo(FlakyReconciler(failures=2))

    async def scenario() -> None:
        event = {"namespace": "ns", "type": "MODIFIED", **child("a"), "resource": DEPLOYMENTS}
        await kopf_call(handlers.child_changed, memo, node_profiles={"n1": [node("n1")]}, **event)
        await retries_settled(memo)

    asyncio.run(scenario())
    assert memo["state"].reconciler.calls == [("a", ["n1"])] * 3  # failed, failed, then planned: no more


def crd_event(type_: str | None, established: bool) -> dict[str, Any]:
    conditions = [{"type": "Established", "status": "True" if established else "False"}]
    return {"name": "podmonitors.monitoring.coreos.com", "type": type_, "status": {"conditions": conditions}}


def test_services_asking_for_an_optional_api_are_reconciled_when_it_becomes_served():
    """A CRD is ADDED before it is Established (an apply would get 404 then): act on the change of what is
    served, once, and not on every edit of the CRD."""
    memo = handler_memo(RecordingReconciler())
    wants = {("ns", "m"): [planned_service("m", monitoring={"podMonitor": True})]}
    indexes = {**OTHER_INDEXES, "node_profiles": {"n1": [node("n1")]}}
    for type_, established in [
        (None, False),
        ("ADDED", False),
        ("MODIFIED", True),
        ("MODIFIED", True),
        ("DELETED", True),
    ]:
        asyncio.run(
            handlers.optional_api_changed(**crd_event(type_, established), memo=memo, services=wants, **indexes)
        )
    assert memo["state"].reconciler.calls == [("m", ["n1"]), ("m", ["n1"])]  # once served, once gone


@pytest.fixture
def kopf_scanning(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Kopf's module whose handler of CRD events configure() wraps, put back as it was after the test."""
    monkeypatch.setattr(observation, "process_discovered_resource_event", observation.process_discovered_resource_event)
    return observation


def test_children_are_watched_with_a_server_side_label_selector(kopf_scanning: Any):
    """Only what the operator owns comes down the child watches (not every Deployment of the cluster)."""
    settings = kopf.OperatorSettings()
    memo = handler_memo(RecordingReconciler())
    handlers.configure(settings=settings, memo=memo)
    selectors = {(s.group, s.version, s.any_name): v for s, v in settings.watching.label_selectors.items()}
    owned = "app.kubernetes.io/managed-by=cpullm-operator"
    assert selectors == {
        ("apps", "v1", "deployments"): owned,
        ("", "v1", "services"): owned,
        ("", "v1", "configmaps"): owned,
        ("", "v1", "pods"): owned,
        ("apps", "v1", "replicasets"): owned,
    }


def test_kopf_waits_for_discovery_before_it_scans_a_new_crd(kopf_scanning: Any):
    """A CRD installed after the operator (NodeResourceTopology) is watched even when its Established event comes
    before the API server's discovery lists it (controller/discovery_wait.py)."""
    original = kopf_scanning.process_discovered_resource_event
    handlers.configure(settings=kopf.OperatorSettings(), memo=handler_memo(RecordingReconciler()))
    wrapped = kopf_scanning.process_discovered_resource_event
    assert wrapped is not original and getattr(wrapped, discovery_wait.WRAPPED_MARK)


def test_a_node_event_replans_only_the_services_it_can_affect():
    """A node that neither runs a service's plan nor could run it (another pool, missing ISA) does not touch it."""
    memo = handler_memo(RecordingReconciler())
    base = {"model": {"name": "m", "config": LLAMA_8B}, "kvCacheGiB": 4, "maxModelLen": 8192}
    services = {
        ("ns", "pool-a"): [
            {"metadata": {"name": "pool-a", "namespace": "ns"}, "spec": {**base, "nodeSelector": {"pool": "a"}}}
        ],
        ("ns", "planned-on-n1"): [
            {
                "metadata": {"name": "planned-on-n1", "namespace": "ns"},
                "spec": {**base, "nodeSelector": {"pool": "b"}},
                "status": {"plan": {"eligibleNodes": ["n1"]}},
            }
        ],
        ("ns", "needs-sve"): [
            {"metadata": {"name": "needs-sve", "namespace": "ns"}, "spec": {**base, "cpu": {"requiredISA": ["sve"]}}}
        ],
        ("ns", "bad-affinity"): [  # parses, but its affinity is no object: its reconcile reports an InvalidSpec
            {
                "metadata": {"name": "bad-affinity", "namespace": "ns"},
                "spec": {**base, "affinity": {"nodeAffinity": "x"}},
            }
        ],
    }
    index = {"n1": [node("n1", labels={"pool": "a"})]}
    listed = kopf.Body(node_object("n1", labels={"pool": "a"}))
    call = kopf_call(
        handlers.node_changed, memo, name="n1", type=None, body=listed, node_profiles=index, services=services
    )
    asyncio.run(call)  # the initial listing: remembered
    changed = node_object("n1", numa=2, labels={"pool": "a"})
    index["n1"] = [node("n1", numa=2, labels={"pool": "a"})]
    call = kopf_call(
        handlers.node_changed,
        memo,
        name="n1",
        type="MODIFIED",
        body=kopf.Body(changed),
        node_profiles=index,
        services=services,
    )
    asyncio.run(call)
    # pool-a: n1 can run it; planned-on-n1: its plan runs there; needs-sve: n1 lacks the ISA, so it is left alone;
    # bad-affinity: its spec cannot be judged, so it is reconciled (and reports why).
    assert sorted(name for name, _ in memo["state"].reconciler.calls) == ["bad-affinity", "planned-on-n1", "pool-a"]


def pod_event(memo: kopf.Memo, type_: str | None, event: dict[str, Any], index_name: str, indexer: Any) -> None:
    """As Kopf does for a server pod's event: the index `index_name` is updated from the event by its `indexer`
    first (the pod's entry; none once deleted), then pod_changed runs."""
    entry = asyncio.run(indexer(**event)) if type_ != "DELETED" else None
    index = {key: [value] for key, value in (entry or {}).items()}  # as Kopf keeps it
    asyncio.run(kopf_call(handlers.pod_changed, memo, **event, type=type_, **{**POD_OWNERS, index_name: index}))


def test_a_pod_the_scheduler_cannot_place_reconciles_its_service_with_the_schedulers_message():
    """Only a change in whether (and why) a pod cannot be scheduled reconciles; its message reaches the reconcile
    through the index, and the many other pod events (phase, IPs, probes) do nothing."""
    memo = handler_memo(RecordingReconciler())
    for type_, scheduled in [
        (None, None),  # the initial listing
        ("ADDED", None),
        ("MODIFIED", INSUFFICIENT),
        ("MODIFIED", INSUFFICIENT),  # the same failure again (a scheduler retry): nothing new
        ("MODIFIED", {"status": "True"}),
        ("MODIFIED", {"status": "True"}),
        ("MODIFIED", INSUFFICIENT),
        ("DELETED", INSUFFICIENT),
    ]:
        pod_event(memo, type_, pod("a-1", scheduled), "pod_troubles", handlers.pod_troubles)
    rec = memo["state"].reconciler
    message = f"a pod cannot be scheduled: {INSUFFICIENT['message']}"
    assert rec.unschedulable == [message, None, message, None]


def ended(message: str | None) -> dict[str, Any]:
    """A server pod whose vLLM container last ended with `message` as its termination message (None: running)."""
    last = {"terminated": {"reason": "OOMKilled", "exitCode": 137, "message": message}} if message else {}
    status = {"containerStatuses": [{"name": "vllm", "state": {"running": {}}, "lastState": last}]}
    meta = {"ownerReferences": [RS_REF]}
    return {
        "name": "a-1",
        "namespace": "ns",
        "labels": {"cpullm.io/service": "a"},
        "meta": meta,
        "spec": {},
        "status": status,
    }


def test_a_pod_whose_server_ended_without_a_fix_reconciles_its_service_with_that_end():
    """Only a change in what the last end reports reconciles (a restart that reports the same does not)."""
    memo = handler_memo(RecordingReconciler())
    not_loaded = "cpullm-vllm-fix rank_in_engine_core nothing-to-patch\n"
    for type_, message in [
        ("ADDED", None),
        ("MODIFIED", "cpullm-vllm-fix rank_in_engine_core loaded\n"),  # ended with every fix: nothing to say
        ("MODIFIED", not_loaded),
        ("MODIFIED", not_loaded),
        ("DELETED", not_loaded),
    ]:
        pod_event(memo, type_, ended(message), "server_exits", handlers.server_exits)
    exits = memo["state"].reconciler.exits
    assert [[e.not_loaded for e in handed] for handed in exits] == [
        [(("rank_in_engine_core", "nothing-to-patch"),)],
        [],
    ]


def test_a_child_that_changed_while_the_watch_was_down_is_found_in_the_relisting():
    """Kopf lists again (type None) after a watch failed; the first listing and unchanged children do nothing."""
    memo = handler_memo(RecordingReconciler())
    listing = {"namespace": "ns", "type": None, **child("a"), "resource": DEPLOYMENTS}
    asyncio.run(kopf_call(handlers.child_changed, memo, **listing))
    assert memo["state"].reconciler.calls == []
    memo["state"].memory.changed_while_away.add("a")
    asyncio.run(kopf_call(handlers.child_changed, memo, **listing))
    assert memo["state"].reconciler.calls == [("a", [])]


def test_a_node_changed_while_the_watch_was_down_is_replanned_from_the_relisting():
    memo = handler_memo(RecordingReconciler())
    index = {"n1": [node("n1")]}
    call_node_changed(memo, None, node_object("n1"), index)  # the first listing
    call_node_changed(memo, None, node_object("n1"), index)  # re-listed, unchanged
    assert memo["state"].reconciler.calls == []
    call_node_changed(memo, None, node_object("n1", numa=2), index)  # re-listed, changed meanwhile
    assert memo["state"].reconciler.calls == [("a", ["n1"])]


def test_a_pod_that_failed_while_the_watch_was_down_is_found_in_the_relisting():
    memo = handler_memo(RecordingReconciler())
    for type_, scheduled in [(None, {"status": "True"}), (None, INSUFFICIENT), (None, INSUFFICIENT)]:
        event = pod("a-1", scheduled)
        entry = asyncio.run(handlers.pod_troubles(**event)) or {}
        troubles = {key: [trouble] for key, trouble in entry.items()}
        asyncio.run(kopf_call(handlers.pod_changed, memo, **event, type=type_, **POD_OWNERS, pod_troubles=troubles))
    message = f"a pod cannot be scheduled: {INSUFFICIENT['message']}"
    assert memo["state"].reconciler.unschedulable == [message]  # once: when it changed


def test_a_resync_lists_the_optional_kinds_whose_crds_are_served():
    state = handler_memo(RecordingReconciler())["state"]
    indexes = {
        **OTHER_INDEXES,
        "services": SERVICES,
        "installed_crds": {"inferencepools.inference.networking.k8s.io": [True]},
    }
    asyncio.run(dispatch.resync(state, kopf_indexes(indexes), []))
    listed = state.memory.listed
    assert "InferencePool" in listed and "HTTPRoute" not in listed and "PodMonitor" not in listed


def test_a_resync_reconciles_each_owner_of_children_deleted_unseen_once(caplog):
    rec = RecordingReconciler()
    memo = handler_memo(rec)
    memo["state"].memory.vanished = {
        "Deployment": [("ns", "a")],
        "Service": TransientApiError("cannot list Services: HTTP 503"),  # skipped; the others still run
        "ConfigMap": [("ns", "a"), ("ns", "b"), ("ns", "deleted-meanwhile")],  # one no longer in the index: skipped
    }
    last_seen = {"a": {"status": {"readyReplicas": 1}}, "b": {"status": {"readyReplicas": 2}}}
    services = {**SERVICES, ("ns", "b"): [{"metadata": {"name": "b", "namespace": "ns", "uid": "uid-b"}}]}
    indexes = {
        "services": services,
        "node_profiles": {},
        **OTHER_INDEXES,
        "owned_deployments": {("ns", name): [seen] for name, seen in last_seen.items()},
    }
    asyncio.run(dispatch.resync(memo["state"], kopf_indexes(indexes), []))
    # Every kind that is served: the built-in ones, not those whose CRD is not installed.
    assert memo["state"].memory.listed == [
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "HorizontalPodAutoscaler",
    ]
    # Once each, whatever number of its kinds drifted. A vanished Deployment's last status (still in Kopf's index)
    # is not reported as its replacement's; a service whose Deployment is there keeps its status.
    assert sorted(zip((name for name, _ in rec.calls), rec.deployments, strict=True)) == [
        ("a", None),
        ("b", last_seen["b"]),
    ]
    assert "resync of Services skipped: cannot list Services: HTTP 503" in caplog.text


class MeetingReconciler(RecordingReconciler):
    """Each reconcile waits until `parties` of them run at once (a reconcile at a time would wait for good)."""

    def __init__(self, parties: int) -> None:
        super().__init__()
        self.meeting = threading.Barrier(parties, timeout=5)

    def reconcile(self, service: dict[str, Any], view: ClusterView, ticket: int | None = None) -> None:
        self.meeting.wait()
        super().reconcile(service, view, ticket)


@pytest.mark.parametrize("workers", [2, 4])
def test_the_services_one_event_affects_are_reconciled_as_many_at_once_as_there_are_workers(workers):
    rec = MeetingReconciler(parties=workers)
    services = {("ns", f"s{i}"): [{"metadata": {"name": f"s{i}", "namespace": "ns"}}] for i in range(2 * workers)}
    indexes = {**OTHER_INDEXES, "services": services, "node_profiles": {}}
    memo = handler_memo(rec, workers=workers)
    asyncio.run(dispatch.reconcile_quietly(memo["state"], indexed(services), kopf_indexes(indexes)))
    assert sorted(name for name, _ in rec.calls) == sorted(name for _, name in services)


def test_the_resync_runs_in_the_background_until_cleanup():
    async def scenario() -> tuple[bool, bool]:
        memo = handler_memo(RecordingReconciler(), workers=1)
        memo["settings"] = Settings(resync_seconds=300)
        await handlers.start_resync(memo=memo, services=SERVICES, **INDEXES)
        task = memo["state"].resync
        await handlers.shut_down(memo=memo)
        with contextlib.suppress(asyncio.CancelledError):
            await task
        disabled = handler_memo(RecordingReconciler(), workers=1)
        disabled["settings"] = Settings(resync_seconds=0)
        await handlers.start_resync(memo=disabled, services=SERVICES, **INDEXES)
        return task.cancelled(), disabled["state"].resync is not None

    assert asyncio.run(scenario()) == (True, False)


def test_a_resync_round_that_fails_unforeseen_is_logged_and_the_next_round_runs(caplog):
    """The resync is the only thing that finds what the watches missed: an error no one mapped (here a listing
    that cannot be parsed) must not end it."""
    memo = handler_memo(RecordingReconciler(), workers=1)
    memory = memo["state"].memory
    memory.vanished = {"ConfigMap": ValueError("Expecting value: line 1 column 1 (char 0)")}
    indexes = {**OTHER_INDEXES, "services": SERVICES, "node_profiles": {}}

    async def scenario() -> None:
        task = asyncio.get_running_loop().create_task(
            dispatch.resync_forever(memo["state"], kopf_indexes(indexes), 0.01, [])
        )
        while memory.listed.count("ConfigMap") < 2:  # the loop went on after the failed round
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert "resync round failed; the next one is due in 0 s" in caplog.text
    assert "ValueError: Expecting value" in caplog.text  # with its traceback


def test_the_services_index_keeps_what_reconciles_read_without_other_writers_bookkeeping():
    meta = {"name": "a", "namespace": "ns", "uid": "u", "generation": 3, "labels": {"team": "x"}}
    body = {
        "metadata": {**meta, "managedFields": [{"manager": "kubectl"}], "annotations": {"kopf": "{...}"}},
        "spec": {"model": {"name": "m"}},
        "status": {"readyReplicas": 1},
    }
    indexed = asyncio.run(handlers.services(namespace="ns", name="a", body=kopf.Body(body)))
    assert indexed == {("ns", "a"): {"metadata": meta, "spec": body["spec"], "status": body["status"]}}


class OverlapCountingReconciler(RecordingReconciler):
    """Records the most reconciles that ran at once (each takes a moment, as an API round trip would)."""

    def __init__(self) -> None:
        super().__init__()
        self.running, self.most = 0, 0
        self.lock = threading.Lock()

    def reconcile(self, service: dict[str, Any], view: ClusterView, ticket: int | None = None) -> None:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(0.05)
        with self.lock:
            self.running -= 1
        super().reconcile(service, view, ticket)


def test_at_most_the_configured_number_of_reconciles_run_at_once():
    """A burst (services created, child events) waits for the workers instead of all running (and copying) at once."""
    rec = OverlapCountingReconciler()
    memo = handler_memo(rec, workers=2)
    bodies = [{"metadata": {"name": f"s{i}", "namespace": "ns"}} for i in range(6)]
    indexes = {"node_profiles": {"n1": [node("n1")]}, **OTHER_INDEXES}

    services = {("ns", b["metadata"]["name"]): [b] for b in bodies}

    async def burst() -> None:
        created = [service_event(memo, "ADDED", b, services, indexes) for b in bodies]
        events = [
            dispatch.reconcile_quietly(memo["state"], [b], kopf_indexes({**indexes, "services": services}))
            for b in bodies
        ]
        await asyncio.gather(*created, *events)

    asyncio.run(burst())
    assert (rec.most, len(rec.calls)) == (2, 12)


def service_event(
    memo: kopf.Memo, type_: str | None, body: dict[str, Any], services: Any, indexes: dict[str, Any]
) -> Any:
    meta = body["metadata"]
    return handlers.service_changed(
        type=type_,
        namespace=meta["namespace"],
        name=meta["name"],
        uid="u1",
        body=kopf.Body(body),
        memo=memo,
        services=services,
        **indexes,
    )


def test_a_service_event_reconciles_the_indexed_service_when_the_reconciler_finds_its_spec_unread():
    """Kopf indexes the event's object before handlers run: the reconcile gets the index's copy (without other
    writers' bookkeeping). Events whose spec was read (the operator's own status patches) and deletions do not
    reconcile; a deletion forgets the service."""
    memo = handler_memo(RecordingReconciler())
    rec = memo["state"].reconciler
    indexes = {"node_profiles": {"n1": [node("n1")]}, **OTHER_INDEXES}
    event_body = {"metadata": {"name": "a", "namespace": "ns", "managedFields": [{"manager": "kubectl"}]}}
    for type_ in (None, "ADDED"):
        asyncio.run(service_event(memo, type_, event_body, SERVICES, indexes))
    memo["state"].memory.specs_read.add("a")
    asyncio.run(service_event(memo, "MODIFIED", event_body, SERVICES, indexes))
    asyncio.run(service_event(memo, "DELETED", event_body, SERVICES, indexes))
    assert rec.calls == [("a", ["n1"])] * 2
    assert rec.forgotten == memo["state"].memory.forgotten == ["a"]
    gone = {"metadata": {"name": "gone", "namespace": "ns", "deletionTimestamp": "now"}}
    asyncio.run(service_event(memo, "MODIFIED", gone, SERVICES, indexes))  # being deleted: nothing to apply
    assert len(rec.calls) == 2


def test_failed_reconciles_of_one_service_leave_one_retry_pending_the_soonest(monkeypatch):
    memo = handler_memo(FlakyReconciler(failures=100))
    delays = iter([30.0, 0.01, 60.0])
    monkeypatch.setattr(dispatch, "retry_delay", lambda outcome, attempt, **_: next(delays, None))

    async def scenario() -> None:
        for _ in range(3):
            await dispatch.reconcile_quietly(
                memo["state"], SERVICES["ns", "a"], kopf_indexes({"services": SERVICES, **INDEXES})
            )
        assert len(memo["state"].retries.pending) == 1
        await retries_settled(memo)

    asyncio.run(scenario())
    assert len(memo["state"].reconciler.calls) == 4  # three failures, then the 0.01 s retry (its delay runs out: None)


def call_topology_changed(
    memo: kopf.Memo, type_: str | None, obj: dict[str, Any], nodes: dict[str, list[Any]], topologies: KopfIndex
) -> None:
    """As Kopf does: the topology index is updated from the event first, then the event handler runs."""
    name = obj["metadata"]["name"]
    entry = {} if type_ == "DELETED" else asyncio.run(handlers.node_facts(name=name, body=kopf.Body(obj), resource=NRT))
    topologies._replace((None, name, name), entry)
    run = kopf_call(
        handlers.node_fact_changed,
        memo,
        name=name,
        type=type_,
        resource=NRT,
        node_profiles=nodes,
        node_topologies=topologies,
    )
    asyncio.run(run)


def test_a_node_resource_topology_replans_only_when_what_it_says_of_the_node_changes(caplog):
    memo = handler_memo(RecordingReconciler())
    rec = memo["state"].reconciler
    nodes, topologies = {"n1": [node("n1", numa=None)]}, KopfIndex()
    # Kopf starts handlers once every index is loaded: the node's first listing sees its topology already.
    topologies._replace(
        (None, "n1", "n1"), asyncio.run(handlers.node_facts("n1", kopf.Body(topology_object("n1")), NRT))
    )
    call_node_changed(memo, None, node_object("n1", numa=None), nodes, topologies)
    call_topology_changed(memo, None, topology_object("n1"), nodes, topologies)  # first listing
    assert rec.calls == []
    busier = topology_object("n1")
    busier["zones"][0]["resources"][0]["available"] = "1"  # pods took CPUs: the topology-updater's minutely news
    call_topology_changed(memo, "MODIFIED", busier, nodes, topologies)
    assert rec.calls == []
    call_topology_changed(memo, "MODIFIED", topology_object("n1", cpus=(30, 32)), nodes, topologies)
    assert rec.calls == [("a", ["n1"])]
    assert rec.topologies[-1][0].zones[0].cpus == 30  # the reconcile is handed the index's topologies
    call_topology_changed(memo, "DELETED", topology_object("n1", cpus=(30, 32)), nodes, topologies)
    assert len(rec.calls) == 2 and rec.topologies[-1] == []  # back to the labels: one NUMA node
    # A node event now compares with the profile as last planned, the topology's included.
    call_topology_changed(memo, "ADDED", topology_object("n1", cpus=(30, 32)), nodes, topologies)
    call_node_changed(memo, "MODIFIED", node_object("n1", numa=None), nodes, topologies)
    assert len(rec.calls) == 3
    # A topology of a node that is not there: nothing to plan.
    call_topology_changed(memo, "ADDED", topology_object("ghost"), nodes, topologies)
    assert len(rec.calls) == 3


def test_an_unreadable_topology_is_warned_once_and_its_node_planned_from_its_labels(caplog):
    memo = handler_memo(RecordingReconciler())
    rec = memo["state"].reconciler
    nodes, topologies = {"n1": [node("n1", numa=2)]}, KopfIndex()
    call_node_changed(memo, None, node_object("n1", numa=2), nodes, topologies)
    broken = {**topology_object("n1"), "zones": []}
    for _ in range(2):
        call_topology_changed(memo, None, broken, nodes, topologies)
    warnings = [r.getMessage() for r in caplog.records if "planned from its labels" in r.getMessage()]
    assert warnings == ["NodeResourceTopology n1: no zone of type Node (NUMA node); node n1 is planned from its labels"]
    assert rec.calls == []  # the labels said 2 NUMA nodes before, and still do


def test_kopf_warns_of_unserved_node_fact_apis_only_when_another_resource_is_unserved_too(caplog):
    logger = __import__("logging").getLogger("kopf._core.reactor.observation")
    logger.addFilter(kopf_settings._optional_node_facts_unresolved)
    # As Kopf prints the selectors its decorators made (names given positionally are `any_name=`).
    nrt = str(Selector(node_topology.GROUP, node_topology.VERSION, node_topology.PLURAL))
    performance = str(Selector("cpullm.io", "v1alpha1", "nodeperformances"))
    other = str(Selector("example.com", "v1", "widgets"))
    try:
        for selectors in (nrt, f"{nrt}, {performance}", f"{nrt}, {other}"):
            logger.warning(f"Unresolved resources cannot be served (try creating their CRDs): {selectors}")
    finally:
        logger.removeFilter(kopf_settings._optional_node_facts_unresolved)
    assert [r.getMessage().count("Selector(") for r in caplog.records] == [2]


@pytest.mark.parametrize(
    ("name", "controller", "indexed_as"),
    [
        ("a", ("a", "uid-a"), ("ns", "a")),  # the servers' Deployment
        ("a-router", ("a", "uid-a"), None),  # the router's: not what the service's status reports
        ("a", None, None),  # our labels, nobody's controller reference
    ],
)
def test_the_deployment_index_keys_a_deployment_by_the_service_controlling_it(name, controller, indexed_as):
    found = asyncio.run(
        handlers.owned_deployments(
            namespace="ns", spec={"replicas": 1}, status={"replicas": 1}, **child(name, controller)
        )
    )
    assert list(found) == ([indexed_as] if indexed_as else [])


def test_the_deployment_index_keeps_what_tells_a_rollout_and_no_more():
    meta = {
        **child("a", ("a", "uid-a"))["meta"],
        "uid": "deploy-a",
        "generation": 4,
        "annotations": {TEMPLATE_DIGEST: "d1", "x": "y"},
    }
    spec = {"replicas": 2, "template": {"spec": {"containers": []}}}
    found = asyncio.run(
        handlers.owned_deployments(namespace="ns", name="a", meta=meta, spec=spec, status={"replicas": 2})
    )
    assert found == {
        ("ns", "a"): {
            # the UID: whose ReplicaSets' pods are the service's (KopfIndexes.owned_pods)
            "metadata": {"generation": 4, "annotations": {TEMPLATE_DIGEST: "d1"}, "uid": "deploy-a"},
            "spec": {"replicas": 2},
            "status": {"replicas": 2},
        }
    }


def test_kopfs_diff_base_is_empty_even_for_a_spec_deeper_than_copying_reaches():
    """Kopf builds it at every event, for change handlers this operator has none of; a 5,000-level spec raised
    RecursionError there before any handler ran."""
    deep: dict[str, Any] = {}
    for _ in range(5000):
        deep = {"a": deep}
    managed = [{"manager": "kubectl", "fieldsV1": {"f:spec": deep}}]  # the API server mirrors the spec's shape
    meta = {"name": "x", "labels": {"team": "a"}, "managedFields": managed}
    body = kopf.Body({"metadata": meta, "spec": {"model": {"config": deep}}})
    assert kopf_settings.NoDiffBase().build(body=body) == {}


@pytest.mark.parametrize("source", NODE_FACT_SOURCES, ids=[s.kind for s in NODE_FACT_SOURCES])
def test_each_node_fact_source_is_indexed_and_watched(source):
    """A registry line (core/node_facts.py) is all a source needs for its index and its watch: both are registered
    with Kopf from it, the index under the name the reconciles read."""
    registry = kopf.get_default_registry()
    where = (source.group, source.version, source.plural)

    def selects(handler: Any) -> bool:
        return (handler.selector.group, handler.selector.version, handler.selector.any_name) == where

    assert [h.id for h in registry._indexing.get_all_handlers() if selects(h)] == [source.index]
    assert any(selects(h) for h in registry._watching.get_all_handlers())


def test_the_watches_file_each_child_under_its_service_with_its_controller_for_the_reconcile():
    """The seen_children index (one per watched kind) keeps what a write needs to know of a child, filed by its
    service label; the reconcile's view holds that service's, whoever controls them (the reconcile checks)."""
    meta = {
        "uid": "cm-1",
        "resourceVersion": "42",
        "ownerReferences": [{"kind": "CpuLLMService", "name": "a", "uid": "uid-a", "controller": True}],
    }
    resource = kopf.Resource("", "v1", "configmaps", kind="ConfigMap")
    labels = {"cpullm.io/service": "a"}
    filed = asyncio.run(
        handlers.seen_children(resource=resource, namespace="ns", name="a-launcher", labels=labels, meta=meta)
    )
    assert filed == {("ns", "a"): ChildSeen("ConfigMap", "ns", "a-launcher", Ownership("cm-1", "uid-a", "42"))}
    unlabelled = asyncio.run(handlers.seen_children(resource=resource, namespace="ns", name="x", labels={}, meta=meta))
    assert unlabelled == {}
    indexes = kopf_indexes({seen_index("configmaps"): {key: [value] for key, value in filed.items()}})
    assert indexes.snapshot().view(("ns", "a")).children == (filed[("ns", "a")],)
    assert indexes.snapshot().view(("ns", "b")).children == ()


def test_a_gateway_that_comes_or_goes_reconciles_the_services_whose_allowed_from_narrows_their_callers():
    """Their NetworkPolicies admit the gateways in front of them (core/decision.py); the other services admit their
    namespace, the gateway's pods with it, and are not reconciled."""
    narrowed = {"networkPolicy": {"allowedFrom": []}}
    services = {
        ("ns", "a"): [planned_service("a", **narrowed)],
        ("ns", "b"): [planned_service("b")],
        ("other", "c"): [planned_service("c", "other", **narrowed)],
    }
    front = {"metadata": {"name": "front", "namespace": "ns"}, "spec": {"services": ["a", "b"]}}
    memo = handler_memo(RecordingReconciler())
    for gateways in ({("ns", "front"): [front]}, {}):  # it came, then it went
        asyncio.run(
            dispatch.gateway_moved(memo["state"], "ns", kopf_indexes({"services": services, "gateways": gateways}))
        )
    assert [name for name, _ in memo["state"].reconciler.calls] == ["a", "a"]
    assert memo["state"].reconciler.gateways == [("front",), ()]
