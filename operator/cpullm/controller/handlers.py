"""Kopf handlers: thin. They turn watch events into Reconciler.reconcile calls and retry those that could not finish.

Triggers: the CpuLLMService itself (new, its spec changed, or first seen); a node whose
profile changed (the services it can affect are re-planned; only changed plans touch anything); a DaemonSet
whose pods' requests or placement changed (every service is re-planned: whole-node plans leave it room); a change
to a child Deployment, Service or launcher ConfigMap (drift is reverted, readiness copied into status); a
server pod the scheduler cannot place, or can again (its message goes into the Ready condition); an
optional API's CRD (PodMonitor, ScaledObject) installed or removed (the services asking for it are
reconciled).

Kopf's indexes hold what reconciles read (node profiles, the DaemonSets' pods, services, the owned Deployments'
status, the scheduler's messages for unschedulable pods), so
handlers start only once they are loaded and no reconcile lists anything. Handlers are async: Kopf mutates
its indexes on the event loop, so they are read (copied) there, and only then is the blocking reconcile
handed to a worker thread.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
from collections.abc import Mapping
from typing import Any

import kopf

from cpullm.api.spec import GROUP, PLURAL, VERSION
from cpullm.controller.outcomes import retry_delay
from cpullm.controller.reconcile import Reconciler
from cpullm.controller.state import Change, ControllerState
from cpullm.controller.workers import ReconcileWorkers
from cpullm.core import node_topology
from cpullm.core.affected import affected_by_node, asks_for_api, owning_service
from cpullm.core.children import CHILD_KINDS, OPTIONAL_APIS, WATCHED_KINDS
from cpullm.core.children.common import MANAGED_BY, MANAGED_BY_LABEL, SERVICE_LABEL, controlling_service
from cpullm.core.daemonsets import DaemonPods, DaemonSetUnreadable, parse_daemonset
from cpullm.core.node_topology import NodeTopology, parse_topology, with_topology
from cpullm.core.status import scheduling_failure
from cpullm.core.topology import NodeProfile, NodeState, parse_node
from cpullm.errors import NodeLabelError, NodeTopologyError, PermissionDenied, TransientApiError
from cpullm.io.hub import HubClient
from cpullm.io.kube import Kube
from cpullm.metrics import NODE_PROFILES, track_services
from cpullm.settings import Settings

log = logging.getLogger(__name__)
CHILD_LABELS = {MANAGED_BY_LABEL: MANAGED_BY}
# The owned children that are watched (drift reverted, readiness copied), as (group, version, plural).
CHILD_RESOURCES = tuple((k.group, k.version, k.plural) for k in WATCHED_KINDS)
POD_RESOURCE = ("", "v1", "pods")  # the server pods: only whether the scheduler can place them is read


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Every Kopf setting the operator changes from Kopf's defaults, each with its reason."""
    # Kopf's resource scanning stays on (its default): a NodeResourceTopology CRD installed after the operator is
    # watched from then on. It lists and watches CRDs, which the operator reads anyway (optional APIs); in
    # watched-namespace mode it cannot list Namespaces (no RBAC) and keeps to the namespaces it was given.
    logging.getLogger("kopf._core.reactor.observation").addFilter(_optional_node_facts_unresolved)
    # Our own events say what was decided; Kopf's per-handler events would double them. Kopf still posts
    # its warnings and errors.
    settings.posting.level = logging.WARNING
    # Kopf retries a failed API request, a watch included, on these delays and then gives up (a watch that
    # gives up stops the operator). Its default sums to 54 s, about what an API server restart takes, and
    # waits up to 21 s between tries; these ride out about 4 minutes of outage and notice the API server back
    # within 10 s (measured: 50 services settled 62 s after a 30 s outage with 30 s steps), then the
    # operator's liveness probe gets it restarted.
    settings.networking.error_backoffs = [1, 2, 3, 5, *[10] * 24]
    # Watches are re-opened every 5 minutes (default: never), so a stream silently dropped by a proxy or load
    # balancer is noticed; the client waits a little longer than the server, which ends the request cleanly.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # Children are watched with a server-side label selector: the API server sends only objects the operator
    # owns, not every Deployment, Service and ConfigMap of the cluster (the handlers' `labels=` filter alone
    # is applied client-side, after the whole stream arrived).
    for resource in (*CHILD_RESOURCES, POD_RESOURCE):
        settings.watching.label_selectors[resource] = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
    if "state" not in memo:
        config: Settings = memo.get("settings") or Settings()
        hub = HubClient(
            config.hf_endpoint, config.hub_timeout_seconds, config.hub_cache_seconds, allow_http=config.hub_allow_http
        )
        # One API connection per reconcile thread, and one for the resync's lists.
        kube = Kube.from_environment(connections=config.reconcile_workers + 1, read_any_secret=config.read_any_secret)
        reconciler = Reconciler(
            kube, hub, namespace_cache_seconds=config.namespace_cache_seconds, node_cache_dir=config.node_cache_dir
        )
        memo["state"] = ControllerState(reconciler, ReconcileWorkers(config.reconcile_workers))
        track_services(reconciler.services_by_readiness)


def _optional_node_facts_unresolved(record: logging.LogRecord) -> bool:
    """Kopf warns of every watched resource the cluster does not serve; NodeResourceTopology is optional (nodes
    are then planned from their labels alone), so that warning is not logged when it names only it."""
    message = record.getMessage()
    if not message.startswith("Unresolved resources cannot be served"):
        return True
    return not (message.count("Selector(") == 1 and f"plural='{node_topology.PLURAL}'" in message)


def _state(memo: kopf.Memo) -> ControllerState:
    state: ControllerState = memo["state"]
    return state


@kopf.on.startup()
async def start_resync(memo: kopf.Memo, **indexes: Any) -> None:
    """Every `resync_seconds`, list the owned children and re-apply those that vanished or were changed unseen
    (Reconciler.find_drifted): what a watch can miss for good, and what the kinds not watched never tell. One
    metadata-only list per served kind."""
    config: Settings = memo.get("settings") or Settings()
    if config.resync_seconds > 0:
        _state(memo).resync = asyncio.get_running_loop().create_task(
            _resync_forever(memo, indexes, config.resync_seconds, config.namespaces)
        )


@kopf.on.cleanup()
async def shut_down(memo: kopf.Memo, **_: Any) -> None:
    """Stop the resync and the reconcile threads (a reconcile not yet started is dropped)."""
    state = _state(memo)
    if state.resync is not None:
        state.resync.cancel()
    state.workers.shutdown()


async def _resync_forever(memo: kopf.Memo, indexes: Mapping[str, Any], every: float, namespaces: list[str]) -> None:
    while True:
        await asyncio.sleep(every)
        await resync(memo, indexes, namespaces)


async def resync(memo: kopf.Memo, indexes: Mapping[str, Any], namespaces: list[str]) -> None:
    """One round: per kind that is served, list what exists, and reconcile the owners of what vanished or was
    changed by another writer (the only way a change to a kind that is not watched, e.g. an InferencePool, is
    seen)."""
    served = installed(indexes["installed_crds"])
    for kind in (k.kind for k in CHILD_KINDS if k.crd is None or k.crd in served):
        try:
            owners = await asyncio.to_thread(_state(memo).reconciler.find_drifted, kind, namespaces)
        except (TransientApiError, PermissionDenied) as err:  # the next round tries again
            log.warning("resync of %ss skipped: %s", kind, err.message)
            continue
        if owners:
            log.info("%d %s(s) deleted or changed unseen, applying again: %s", len(owners), kind, owners[:5])
        vanished = [s for owner in owners for s in indexes["services"].get(owner, ())]
        # Kopf's index still holds a vanished Deployment's last status (no event removed it): not the replacement's.
        facts = {**indexes, "owned_deployments": {}} if kind == "Deployment" else indexes
        await _reconcile_quietly(memo, vanished, facts)


@kopf.index("", "v1", "nodes")
async def node_profiles(name: str, body: kopf.Body, **_: Any) -> dict[str, NodeProfile]:
    """Usable nodes only: a node whose labels cannot be parsed is left out (node_changed reports it).

    Every index here answers {} for "not in the index", never None: on None Kopf keeps the object's previous
    entry (a node whose labels just broke would keep its old profile, a pod scheduled at last its old message)."""
    try:
        return {name: parse_node(body)}
    except NodeLabelError:
        return {}


@kopf.index(node_topology.GROUP, node_topology.VERSION, node_topology.PLURAL)
async def node_topologies(name: str, body: kopf.Body, **_: Any) -> dict[str, NodeTopology | NodeTopologyError]:
    """Each node's NodeResourceTopology (where its CRD is served), or why it cannot be read: that node is then
    planned from its labels (node_topology_changed logs why)."""
    try:
        return {name: parse_topology(body)}
    except NodeTopologyError as err:
        return {name: err}


def _node_profile(name: str, node_profiles: kopf.Index[Any, Any], node_topologies: kopf.Index[Any, Any]) -> Any:
    """A node's profile as the planner sees it: its labels', refined by its NodeResourceTopology's (None: the
    node is not in the index)."""
    profile, topology = _first(node_profiles, name), _first(node_topologies, name)
    return with_topology(profile, topology) if profile is not None and isinstance(topology, NodeTopology) else profile


@kopf.index("apps", "v1", "daemonsets")
async def daemonset_pods(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[tuple[str, str], DaemonPods]:
    """The pods of each DaemonSet that requests CPU or memory: where they run and what they take there."""
    try:
        daemons = parse_daemonset(body)
    except DaemonSetUnreadable as err:
        log.warning("%s: left out of the room plans leave on nodes", err)
        return {}
    return {(namespace, name): daemons} if daemons else {}


@kopf.on.event("apps", "v1", "daemonsets")
async def daemonset_changed(
    namespace: str,
    name: str,
    type: str | None,
    memo: kopf.Memo,
    daemonset_pods: kopf.Index[Any, Any],
    services: kopf.Index[Any, Any],
    **kwargs: Any,
) -> None:
    """Re-plan every service when what a DaemonSet's pods take, or where, changed (a new agent, a bigger
    request): rare, and any whole-node plan may have to leave it room. Its status (pods rolling) is noise."""
    key = (namespace, name)
    if _state(memo).daemonsets.news(key, type, _first(daemonset_pods, key)) is None:
        return
    indexes = {"daemonset_pods": daemonset_pods, "services": services, **kwargs}
    await _reconcile_quietly(memo, indexed(services), indexes)


def _optional_api(name: str, **_: Any) -> bool:
    return name in OPTIONAL_APIS.values()


def _established(status: Mapping[str, Any]) -> bool:
    """Whether the API server serves the CRD's kind: before that an apply answers 404."""
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in status.get("conditions") or [])


@kopf.index("apiextensions.k8s.io", "v1", "customresourcedefinitions", when=_optional_api)
async def installed_crds(name: str, status: Mapping[str, Any], **_: Any) -> dict[str, bool]:
    """The optional APIs' CRDs that are served (a PodMonitor or ScaledObject is applied only where they are)."""
    return {name: True} if _established(status) else {}


def installed(index: kopf.Index[Any, Any]) -> frozenset[str]:
    return frozenset(index.keys())


@kopf.index(GROUP, VERSION, PLURAL)
async def services(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Each service as reconciles read it: without the other writers' bookkeeping (managedFields, and the
    annotations where kubectl and Kopf keep the last configuration), which nothing reads and which was over half
    of each copy (16.5 and 1.7 of 33 KB measured, for a service applied with kubectl)."""
    meta = {key: value for key, value in body.metadata.items() if key not in ("managedFields", "annotations")}
    return {(namespace, name): copy.deepcopy({**body, "metadata": meta})}


@kopf.index("apps", "v1", "deployments", labels=CHILD_LABELS)
async def owned_deployments(
    namespace: str, name: str, meta: Mapping[str, Any], status: Mapping[str, Any], **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    """The status of each service's servers' Deployment (what the service's status reports; a router's is not),
    keyed by the service that controls it."""
    controller = controlling_service(meta)
    return {(namespace, name): {"status": copy.deepcopy(dict(status))}} if controller and controller[0] == name else {}


@kopf.index(*POD_RESOURCE, labels=CHILD_LABELS)
async def unschedulable_pods(
    namespace: str, labels: Mapping[str, str], status: Mapping[str, Any], **_: Any
) -> dict[tuple[str, str], str]:
    """The scheduler's message for each server pod it cannot place, keyed by the pod's service."""
    owner, message = labels.get(SERVICE_LABEL), scheduling_failure(status)
    return {(namespace, owner): message} if owner and message else {}


def indexed(index: kopf.Index[Any, Any]) -> list[Any]:
    """Every value a Kopf index holds (the node profiles, the DaemonSets' pods, the services)."""
    return [value for store in index.values() for value in store]


def _first(index: kopf.Index[Any, Any], key: Any) -> Any:
    return next(iter(index.get(key, ())), None)


class _Facts:
    """What a reconcile reads from Kopf's indexes, which Kopf passes every handler by name among its keyword
    arguments; read here, on the event loop, before the reconcile goes to a worker thread. Made only once the
    reconcile holds a worker slot (controller/workers.py): a waiting reconcile holds no copies."""

    def __init__(self, kwargs: Mapping[str, Any]) -> None:
        self.nodes: list[NodeProfile] = indexed(kwargs["node_profiles"])
        self.topologies = [t for t in indexed(kwargs["node_topologies"]) if isinstance(t, NodeTopology)]
        self.daemons: list[DaemonPods] = indexed(kwargs["daemonset_pods"])
        self.crds = installed(kwargs["installed_crds"])
        self._deployments: kopf.Index[Any, Any] = kwargs["owned_deployments"]
        self._unschedulable: kopf.Index[Any, Any] = kwargs["unschedulable_pods"]

    async def reconcile(self, memo: kopf.Memo, service: Mapping[str, Any]) -> Any:
        key = (service["metadata"]["namespace"], service["metadata"]["name"])
        deployment, unschedulable = _first(self._deployments, key), _first(self._unschedulable, key)
        reconciler, workers = _state(memo).reconciler, _state(memo).workers
        facts = (self.nodes, deployment, self.crds, unschedulable, reconciler.begin(service, deployment), self.daemons)
        return await workers.run(reconciler.reconcile, service, *facts, self.topologies)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def service_changed(
    type: str | None,
    namespace: str,
    name: str,
    uid: str,
    body: kopf.Body,
    memo: kopf.Memo,
    services: kopf.Index[Any, Any],
    **kwargs: Any,
) -> None:
    """A CpuLLMService was created or changed, or is listed (the operator's first listing reconciles every
    service, as resume handlers would), or was deleted (what is remembered of it goes; its children go by
    garbage collection). Only a spec no reconcile has read yet is reconciled (Reconciler.service_event): the
    operator's own status patches are events too.

    An event handler, not Kopf's create/update handlers: those keep the last handled spec in an annotation,
    one more write per change and a copy of the whole object per event to compare with it, while the
    generation already says whether the spec changed."""
    if type == "DELETED":
        _state(memo).reconciler.forget(namespace, name, uid)
    elif _state(memo).reconciler.service_event(body):
        await _reconcile_quietly(memo, list(services.get((namespace, name), ())), {"services": services, **kwargs})


@kopf.on.event("", "v1", "nodes")
async def node_changed(
    name: str,
    type: str | None,
    body: kopf.Body,
    memo: kopf.Memo,
    node_profiles: kopf.Index[Any, Any],
    services: kopf.Index[Any, Any],
    **kwargs: Any,
) -> None:
    """Re-plan the services a node can affect when its profile changed (heartbeats and status noise do not count).

    Kopf updates its indexes before event handlers run, so the index already holds this event's profile;
    what the services were last planned against is remembered per node (ControllerState.nodes)."""
    state: NodeState = None
    if type != "DELETED":
        state = _node_profile(name, node_profiles, kwargs["node_topologies"])
        if state is None:  # left out of the index: its labels cannot be parsed
            try:
                parse_node(body)
            except NodeLabelError as err:
                state = err
    NODE_PROFILES.set(sum(len(store) for store in node_profiles.values()))
    change = _state(memo).nodes.news(name, type, state)
    if change is None:
        return  # the operator's first listing (service_changed plans every service) or noise
    if isinstance(state, NodeLabelError):
        _state(memo).reconciler.kube.emit_event(
            {"apiVersion": "v1", "kind": "Node", "name": name, "uid": body.metadata.get("uid")},
            "Warning",
            state.reason,
            f"{state.message}; node skipped by the planner",
        )
    await _replan_for_node(memo, name, change, {"node_profiles": node_profiles, "services": services, **kwargs})


@kopf.on.event(node_topology.GROUP, node_topology.VERSION, node_topology.PLURAL)
async def node_topology_changed(
    name: str,
    type: str | None,
    memo: kopf.Memo,
    node_profiles: kopf.Index[Any, Any],
    node_topologies: kopf.Index[Any, Any],
    **kwargs: Any,
) -> None:
    """A NodeResourceTopology appeared, changed or went: its node's profile is news as a label change is (the
    topology-updater rewrites it every minute with what pods use, which the profile does not read: noise)."""
    topology, logged = _first(node_topologies, name), _state(memo).topology_problems
    problem = topology.message if isinstance(topology, NodeTopologyError) and type != "DELETED" else None
    if problem and logged.get(name) != problem:
        log.warning("%s; node %s is planned from its labels", problem, name)
    logged[name] = problem
    if _first(node_profiles, name) is None:
        return  # no usable node of that name: its own events say what there is to say
    # For the node, its NodeResourceTopology going is a change of its profile, not the node's deletion.
    change = _state(memo).nodes.news(
        name, None if type is None else "MODIFIED", _node_profile(name, node_profiles, node_topologies)
    )
    if change is not None:
        facts = {"node_profiles": node_profiles, "node_topologies": node_topologies, **kwargs}
        await _replan_for_node(memo, name, change, facts)


async def _replan_for_node(memo: kopf.Memo, name: str, change: Change[Any], kwargs: Mapping[str, Any]) -> None:
    """Reconcile the services the node's change can affect."""
    services = kwargs["services"]
    affected = [s for s in indexed(services) if affected_by_node(s, name, change.before, change.after)]
    await _reconcile_quietly(memo, affected, kwargs)


async def _reconcile_quietly(
    memo: kopf.Memo, services: list[Mapping[str, Any]], kwargs: Mapping[str, Any], attempt: int = 0
) -> None:
    """Reconciles report through status. One that could not finish (API server unreachable, Hub down,
    permission denied) is tried again later with the latest service and indexes (controller/outcomes.py's
    delays), until one finishes or the service is gone; a handler bug is logged with its traceback and not
    retried."""
    for service in [s for s in services if not s["metadata"].get("deletionTimestamp")]:
        meta = service["metadata"]
        try:
            async with _state(memo).workers.slot:
                outcome = await _Facts(kwargs).reconcile(memo, copy.deepcopy(dict(service)))
        except Exception:  # an event handler must not stop the watch; the error is in the log
            log.exception("reconcile of %s/%s failed", meta["namespace"], meta["name"])
            continue
        delay = retry_delay(outcome, attempt, spread=random.random())
        if delay is not None:
            key = (meta["namespace"], meta["name"])

            async def again(key: tuple[str, str] = key) -> None:  # from Kopf's indexes as they are then
                latest = list(kwargs["services"].get(key, ())) if "services" in kwargs else []
                await _reconcile_quietly(memo, latest, kwargs, attempt + 1)

            _state(memo).retries.later(key, delay, again)


async def child_changed(
    namespace: str,
    type: str | None,
    memo: kopf.Memo,
    services: kopf.Index[Any, Any],
    **kwargs: Any,
) -> None:
    """A child changed or vanished: reconcile its owner (its controller owner reference, name and UID), which
    reverts drift and refreshes status, when the
    event can change either (Reconciler.child_event): someone else's edit or deletion, or a Deployment's
    replica counts; the operator's own writes and a Deployment's other status updates do not. Kopf lists
    again (events of type None) when a watch failed and the API server no longer has its resource version:
    what changed meanwhile is found there."""
    service = owning_service(namespace, kwargs["meta"], services)
    if service is None or not _state(memo).reconciler.child_event(
        kwargs["resource"].kind, namespace, kwargs["name"], type, kwargs["body"], service["metadata"]["name"]
    ):
        return
    await _reconcile_quietly(memo, [service], {"services": services, **kwargs})


for _resource in CHILD_RESOURCES:  # each watched child kind (core/children's CHILD_KINDS)
    kopf.on.event(*_resource, labels=CHILD_LABELS)(child_changed)


@kopf.on.event(*POD_RESOURCE, labels=CHILD_LABELS)
async def pod_changed(
    labels: Mapping[str, str],
    namespace: str,
    name: str,
    type: str | None,
    status: Mapping[str, Any],
    memo: kopf.Memo,
    services: kopf.Index[Any, Any],
    **kwargs: Any,
) -> None:
    """A server pod became unschedulable, or schedulable again (or went): reconcile its service, so its Ready
    condition carries the scheduler's reason. Every other pod change (most of them) does nothing."""
    owner = labels.get(SERVICE_LABEL)
    news = _state(memo).unschedulable_pods.news((namespace, name), type, scheduling_failure(status))
    if news and (namespace, owner) in services:
        await _reconcile_quietly(memo, list(services[namespace, owner]), {"services": services, **kwargs})


@kopf.on.event("apiextensions.k8s.io", "v1", "customresourcedefinitions", when=_optional_api)
async def optional_api_changed(
    name: str,
    type: str | None,
    status: Mapping[str, Any],
    memo: kopf.Memo,
    services: kopf.Index[Any, Any],
    **kwargs: Any,
) -> None:
    """An optional API began or stopped being served: reconcile the services that ask for it (a PodMonitor or
    a ScaledObject is applied as soon as its CRD is established)."""
    if _state(memo).served_optional_apis.news(name, type, True if _established(status) else None) is None:
        return  # no change in what is served (CRD edits, resyncs), or the operator's first listing
    wanting = [s for s in indexed(services) if asks_for_api(s, name)]
    await _reconcile_quietly(memo, wanting, {"services": services, **kwargs})
