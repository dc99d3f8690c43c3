"""Kopf handlers: the decorators, Kopf's settings, the indexes, and one line per event into controller/dispatch.py,
which turns watch events into Reconciler.reconcile calls and retries those that could not finish.

Triggers: the CpuLLMService itself (new, its spec changed, or first seen); a node whose
profile changed (the services it can affect are re-planned; only changed plans touch anything); a DaemonSet
whose pods' requests or placement changed (every service is re-planned: whole-node plans leave it room); a change
to a child Deployment, Service or launcher ConfigMap (drift is reverted, readiness copied into status); a
pod that cannot start or keep running, or can again (why goes into the Ready condition: core/pod_troubles.py); an
optional API's CRD (PodMonitor, ScaledObject) installed or removed (the services asking for it are
reconciled).

Kopf's indexes hold what reconciles read (node profiles, the DaemonSets' pods, services, the owned Deployments'
status, why pods cannot run), so
handlers start only once they are loaded and no reconcile lists anything. Handlers are async: Kopf mutates
its indexes on the event loop, so they are read (copied) there, and only then is the blocking reconcile
handed to a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import kopf

from cpullm.api.crd import spec_schema
from cpullm.api.gateway import PLURAL as GATEWAY_PLURAL
from cpullm.api.spec import GROUP, PLURAL, VERSION, copy_json
from cpullm.controller import dispatch, gateway, kopf_settings, performance
from cpullm.controller.indexes import KopfIndexes, fronting_gateways, seen_index
from cpullm.controller.state import ControllerState
from cpullm.core.children import OPTIONAL_APIS, WATCHED_KINDS, crd_established
from cpullm.core.children.common import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    SERVICE_LABEL,
    controller_reference,
    controlling_service,
)
from cpullm.core.daemonsets import DaemonPods, DaemonSetUnreadable, parse_daemonset
from cpullm.core.gateway import GATEWAY_LABEL
from cpullm.core.node_facts import NODE_FACT_SOURCES, SOURCE_OF_PLURAL
from cpullm.core.observation import ChildSeen, Ownership
from cpullm.core.performance_check import ServerAddress, ready_server_address
from cpullm.core.pod_troubles import PodTrouble, declared_by_container, pod_trouble
from cpullm.core.rollout import server_deployment_facts
from cpullm.core.server_exits import ServerExit, server_exit
from cpullm.core.topology import NodeProfile, parse_node
from cpullm.errors import NodeLabelError
from cpullm.metrics import track_predictions, track_services
from cpullm.settings import Settings

log = logging.getLogger(__name__)
CHILD_LABELS = {MANAGED_BY_LABEL: MANAGED_BY}
# The owned children that are watched (drift reverted, readiness copied), as (group, version, plural).
CHILD_RESOURCES = tuple((k.group, k.version, k.plural) for k in WATCHED_KINDS)
# The server pods: whether the scheduler can place them, and the vLLM container's last end (core/server_exits.py).
POD_RESOURCE = ("", "v1", "pods")
# Their ReplicaSets: which Deployment's a pod is (the index of server_replicasets).
REPLICASET_RESOURCE = ("apps", "v1", "replicasets")


def _settings(memo: kopf.Memo) -> Settings:
    """What `cpullm run` put in the memo, else the environment's settings."""
    config: Settings = memo.get("settings") or Settings()
    return config


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Kopf's settings (controller/kopf_settings.py, each with its reason) and the operator's state, once."""
    kopf_settings.apply(settings, watched=(*CHILD_RESOURCES, POD_RESOURCE, REPLICASET_RESOURCE))
    if "state" not in memo:
        memo["state"] = kopf_settings.controller_state(_settings(memo))
        track_services(memo["state"].memory.readiness)
        track_predictions(memo["state"].performance.predictions)
    spec_schema()  # what each reconcile prunes stored specs against: made before several threads want it


def _state(memo: kopf.Memo) -> ControllerState:
    state: ControllerState = memo["state"]
    return state


def _every(seconds: float, rounds: Callable[[float], Coroutine[Any, Any, None]]) -> asyncio.Task[None] | None:
    """A task running `rounds(seconds)` (its rounds that many seconds apart) in the background; None where the
    setting is 0, which turns them off."""
    return asyncio.get_running_loop().create_task(rounds(seconds)) if seconds > 0 else None


@kopf.on.startup()
async def start_resync(memo: kopf.Memo, **indexes: Any) -> None:
    """Every `resync_seconds`, list the owned children and re-apply those that vanished or were changed unseen
    (dispatch.find_drifted): what a watch can miss for good, and what the kinds not watched never tell. One
    metadata-only list per served kind."""
    config, state = _settings(memo), _state(memo)
    state.resync = _every(
        config.resync_seconds,
        lambda every: dispatch.resync_forever(state, KopfIndexes.of(indexes), every, config.namespaces),
    )


@kopf.on.startup()
async def start_performance_check(memo: kopf.Memo, **indexes: Any) -> None:
    """Every `performance_check_seconds`, read the ready servers' /metrics and judge their speed against their plan's
    (controller/performance.py)."""
    config, state = _settings(memo), _state(memo)
    state.performance_check = _every(
        config.performance_check_seconds,
        lambda every: performance.check_forever(state, KopfIndexes.of(indexes), every),
    )


@kopf.on.startup()
async def start_gateway_resync(memo: kopf.Memo, **indexes: Any) -> None:
    """Every `resync_seconds`, every CpuLLMGateway's children applied again (controller/gateway.py)."""
    config, state = _settings(memo), _state(memo)
    state.gateway_resync = _every(
        config.resync_seconds, lambda every: gateway.resync_forever(state, gateway.gather_indexes(indexes), every)
    )


@kopf.on.cleanup()
async def shut_down(memo: kopf.Memo, **_: Any) -> None:
    """Stop the resync, the performance check and the reconcile threads (a reconcile not yet started is dropped)."""
    state = _state(memo)
    for task in (state.resync, state.performance_check, state.gateway_resync):
        if task is not None:
            task.cancel()
    state.workers.shutdown()


@kopf.index("", "v1", "nodes")
async def node_profiles(name: str, body: kopf.Body, **_: Any) -> dict[str, NodeProfile]:
    """Usable nodes only: a node whose labels cannot be parsed is left out (node_changed reports it).

    Every index here answers {} for "not in the index", never None: on None Kopf keeps the object's previous
    entry (a node whose labels just broke would keep its old profile, a pod scheduled at last its old message)."""
    try:
        return {name: parse_node(body)}
    except NodeLabelError:
        return {}


async def node_facts(name: str, body: kopf.Body, resource: kopf.Resource, **_: Any) -> dict[str, Any]:
    """What each object of a node-fact source (core/node_facts.py; its CRD served) says of its node, or why it cannot
    be read: that node is then planned from its labels (node_fact_changed logs why)."""
    source = SOURCE_OF_PLURAL[resource.plural]
    try:
        return {name: source.parse(body)}
    except source.error as err:
        return {name: err}


@kopf.index("apps", "v1", "daemonsets")
async def daemonset_pods(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[tuple[str, str], DaemonPods]:
    """The pods of each DaemonSet that requests CPU or memory: where they run and what they take there."""
    try:
        daemons = parse_daemonset(body)
    except DaemonSetUnreadable as err:
        log.warning("%s: left out of the room plans leave on nodes", err)
        return {}
    return {(namespace, name): daemons} if daemons else {}


def _optional_api(name: str, **_: Any) -> bool:
    return name in OPTIONAL_APIS.values()


@kopf.index("apiextensions.k8s.io", "v1", "customresourcedefinitions", when=_optional_api)
async def installed_crds(name: str, status: Mapping[str, Any], **_: Any) -> dict[str, bool]:
    """The optional APIs' CRDs that are served (a PodMonitor or ScaledObject is applied only where they are)."""
    return {name: True} if crd_established(status) else {}


@kopf.index(GROUP, VERSION, PLURAL)
async def services(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Each service as reconciles read it: without the other writers' bookkeeping (managedFields, and the
    annotations where kubectl and Kopf keep the last configuration), which nothing reads and which was over half
    of each copy (16.5 and 1.7 of 33 KB measured, for a service applied with kubectl)."""
    meta = {key: value for key, value in body.metadata.items() if key not in ("managedFields", "annotations")}
    return {(namespace, name): copy_json({**body, "metadata": meta})}


@kopf.index(GROUP, VERSION, GATEWAY_PLURAL)
async def gateways(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Each CpuLLMGateway, without the other writers' bookkeeping (as the services' index)."""
    meta = {key: value for key, value in body.metadata.items() if key not in ("managedFields", "annotations")}
    return {(namespace, name): copy_json({**body, "metadata": meta})}


@kopf.index("apps", "v1", "deployments", labels={**CHILD_LABELS, GATEWAY_LABEL: kopf.PRESENT})
async def gateway_deployments(
    namespace: str, meta: Mapping[str, Any], status: Mapping[str, Any], **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    """Each gateway's Deployment status, keyed by the gateway controlling it (its owner reference)."""
    key = gateway.controlling_gateway(namespace, meta)
    return {key: dict(status)} if key else {}


@kopf.on.event(GROUP, VERSION, GATEWAY_PLURAL)
async def gateway_changed(
    type: str | None, namespace: str, name: str, uid: str, body: kopf.Body, memo: kopf.Memo, **indexes: Any
) -> None:
    """A CpuLLMGateway was created, listed, or its spec changed (its own status patches are not news: their
    observedGeneration is the generation), or it was deleted (its children go by garbage collection)."""
    state = _state(memo)
    if type == "DELETED":
        if state.gateways is not None:
            state.gateways.forget(namespace, name, uid)
        await dispatch.gateway_moved(state, namespace, KopfIndexes.of(indexes))
        return
    observed = (body.get("status") or {}).get("observedGeneration")
    if type in (None, "ADDED") or observed != body.metadata.get("generation"):
        await gateway.reconcile_gateways(state, [copy_json(dict(body))], gateway.gather_indexes(indexes))
        if type is not None:  # the first listing reconciles every service anyway
            await dispatch.gateway_moved(state, namespace, KopfIndexes.of(indexes))


@kopf.on.event("apps", "v1", "deployments", labels={**CHILD_LABELS, GATEWAY_LABEL: kopf.PRESENT})
async def gateway_deployment_changed(namespace: str, meta: Mapping[str, Any], memo: kopf.Memo, **indexes: Any) -> None:
    """A gateway's Deployment changed (its readiness, or someone else's edit): the gateway is reconciled."""
    key = gateway.controlling_gateway(namespace, meta)
    found = indexes["gateways"].get(key) if key else None
    if found:
        await gateway.reconcile_gateways(_state(memo), list(found), gateway.gather_indexes(indexes))


@kopf.index("apps", "v1", "deployments", labels=CHILD_LABELS)
async def owned_deployments(
    namespace: str, name: str, meta: Mapping[str, Any], spec: Mapping[str, Any], status: Mapping[str, Any], **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    """Each service's servers' Deployment (a router's is not), keyed by the service that controls it: its status
    (what the service's status reports), and what tells whether a rollout is due or under way (core/rollout.py)."""
    controller = controlling_service(meta)
    if not controller or controller[0] != name:
        return {}
    return {(namespace, name): server_deployment_facts(meta, spec, status)}


@kopf.index(*REPLICASET_RESOURCE, labels=CHILD_LABELS)
async def server_replicasets(namespace: str, meta: Mapping[str, Any], **_: Any) -> dict[tuple[str, str], str]:
    """Each ReplicaSet a Deployment controls, keyed by (namespace, its UID): that Deployment's UID. A server pod's
    facts count for a service only through it (KopfIndexes.owned_pods): a pod's labels can be copied by anyone."""
    ref = controller_reference(meta)
    if ref.get("kind") != "Deployment" or not ref.get("uid") or not meta.get("uid"):
        return {}
    return {(namespace, str(meta["uid"])): str(ref["uid"])}


def _pod_key(namespace: str, labels: Mapping[str, str], meta: Mapping[str, Any]) -> tuple[tuple[str, str], str] | None:
    """A server pod's service (by label) and its ReplicaSet's UID, by which the label is checked on reading."""
    owner, ref = labels.get(SERVICE_LABEL), controller_reference(meta)
    if not owner or ref.get("kind") != "ReplicaSet" or not ref.get("uid"):
        return None
    return (namespace, owner), str(ref["uid"])


@kopf.index(*POD_RESOURCE, labels=CHILD_LABELS)
async def pod_troubles(
    namespace: str,
    labels: Mapping[str, str],
    meta: Mapping[str, Any],
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    **_: Any,
) -> dict[tuple[str, str], tuple[str, PodTrouble]]:
    """Why each of a service's pods cannot start or keep running (core/pod_troubles.py), keyed by its service, with
    the pod's ReplicaSet."""
    key, trouble = _pod_key(namespace, labels, meta), pod_trouble(status, declared_by_container(spec))
    return {key[0]: (key[1], trouble)} if key and trouble else {}


@kopf.index(*POD_RESOURCE, labels=CHILD_LABELS)
async def server_exits(
    namespace: str, name: str, labels: Mapping[str, str], meta: Mapping[str, Any], status: Mapping[str, Any], **_: Any
) -> dict[tuple[str, str], tuple[str, ServerExit]]:
    """Each server pod whose vLLM container last ended reporting fixes that did not load, keyed by its service, with
    the pod's ReplicaSet."""
    key, ended = _pod_key(namespace, labels, meta), server_exit(name, status)
    return {key[0]: (key[1], ended)} if key and ended else {}


@kopf.index(*POD_RESOURCE, labels=CHILD_LABELS)
async def server_addresses(
    namespace: str, name: str, labels: Mapping[str, str], meta: Mapping[str, Any], status: Mapping[str, Any], **_: Any
) -> dict[tuple[str, str], tuple[str, ServerAddress]]:
    """Each ready server pod's address, keyed by its service, with the pod's ReplicaSet: where the
    PerformanceAsPredicted check reads /metrics."""
    key, address = _pod_key(namespace, labels, meta), ready_server_address(name, labels, status)
    return {key[0]: (key[1], address)} if key and address else {}


@kopf.on.event(GROUP, VERSION, PLURAL)
async def service_changed(
    type: str | None, namespace: str, name: str, uid: str, body: kopf.Body, memo: kopf.Memo, **indexes: Any
) -> None:
    """A CpuLLMService was created or changed, or is listed (the operator's first listing reconciles every
    service, as resume handlers would), or was deleted (what is remembered of it goes; its children go by
    garbage collection). Only a spec no reconcile has read yet is reconciled (OperatorMemory.service_event): the
    operator's own status patches are events too.

    An event handler, not Kopf's create/update handlers: those keep the last handled spec in an annotation,
    one more write per change and a copy of the whole object per event to compare with it, while the
    generation already says whether the spec changed."""
    await dispatch.service_changed(_state(memo), type, namespace, name, uid, body, KopfIndexes.of(indexes))
    fronting = fronting_gateways(indexes.get("gateways", {}), (namespace, name))
    reconciler = _state(memo).gateways
    news = reconciler is not None and reconciler.service_news(namespace, name, None if type == "DELETED" else body)
    if fronting and news:  # a gateway in front of it may route its model elsewhere now
        await gateway.reconcile_gateways(_state(memo), fronting, gateway.gather_indexes(indexes))


@kopf.on.event("", "v1", "nodes")
async def node_changed(name: str, type: str | None, body: kopf.Body, memo: kopf.Memo, **indexes: Any) -> None:
    """Re-plan the services a node can affect when its profile changed (heartbeats and status noise do not count)."""
    await dispatch.node_changed(_state(memo), name, type, body, KopfIndexes.of(indexes))


async def node_fact_changed(
    name: str, type: str | None, resource: kopf.Resource, memo: kopf.Memo, **indexes: Any
) -> None:
    """An object of a node-fact source appeared, changed or went: its node's profile is news as a label change is."""
    await dispatch.node_fact_changed(
        _state(memo), SOURCE_OF_PLURAL[resource.plural], name, type, KopfIndexes.of(indexes)
    )


for _source in NODE_FACT_SOURCES:  # each source's index and watch (core/node_facts.py)
    kopf.index(_source.group, _source.version, _source.plural, id=_source.index)(node_facts)
    kopf.on.event(_source.group, _source.version, _source.plural, id=f"{_source.index}_changed")(node_fact_changed)


@kopf.on.event("apps", "v1", "daemonsets")
async def daemonset_changed(namespace: str, name: str, type: str | None, memo: kopf.Memo, **indexes: Any) -> None:
    """Re-plan every service when what a DaemonSet's pods take, or where, changed."""
    await dispatch.daemonset_changed(_state(memo), namespace, name, type, KopfIndexes.of(indexes))


async def child_changed(
    resource: kopf.Resource,
    namespace: str,
    name: str,
    type: str | None,
    meta: Mapping[str, Any],
    body: kopf.Body,
    memo: kopf.Memo,
    **indexes: Any,
) -> None:
    """A child changed or vanished: reconcile its owner when the event can change what the operator wrote or
    reports. A gateway's child deleted is applied again at once (its other changes wait for the resync)."""
    owner = gateway.controlling_gateway(namespace, meta)
    if owner is not None:
        found = indexes.get("gateways", {}).get(owner)
        if type == "DELETED" and found:
            await gateway.reconcile_gateways(_state(memo), list(found), gateway.gather_indexes(indexes), force=True)
        return
    child = dispatch.ChildEvent(resource.kind, namespace, name, type, meta, body)
    await dispatch.child_changed(_state(memo), child, KopfIndexes.of(indexes))


async def seen_children(
    resource: kopf.Resource, namespace: str, name: str, labels: Mapping[str, str], meta: Mapping[str, Any], **_: Any
) -> dict[tuple[str, str], ChildSeen]:
    """Each watched child as its watch shows it, keyed by the service its label names: which object it is and
    which controls it, so a reconcile writes over a child the operator controls without reading it first. The
    label only files it: what counts is its controller, as the API server showed it."""
    owner = labels.get(SERVICE_LABEL)
    if not owner:
        return {}
    shown = Ownership(
        str(meta.get("uid") or ""), controller_reference(meta).get("uid"), str(meta.get("resourceVersion") or "")
    )
    return {(namespace, owner): ChildSeen(resource.kind, namespace, name, shown)}


for _resource in CHILD_RESOURCES:  # each watched child kind (core/children's CHILD_KINDS)
    kopf.on.event(*_resource, labels=CHILD_LABELS)(child_changed)
    kopf.index(*_resource, labels=CHILD_LABELS, id=seen_index(_resource[2]))(seen_children)


@kopf.on.event(*POD_RESOURCE, labels=CHILD_LABELS)
async def pod_changed(
    namespace: str,
    name: str,
    type: str | None,
    labels: Mapping[str, str],
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    memo: kopf.Memo,
    **indexes: Any,
) -> None:
    """A service's pod cannot start or keep running, or can again (or went), or its vLLM container ended reporting a
    fix that did not load: its service's conditions say so."""
    await dispatch.pod_changed(_state(memo), namespace, name, type, labels, spec, status, KopfIndexes.of(indexes))


@kopf.on.event("apiextensions.k8s.io", "v1", "customresourcedefinitions", when=_optional_api)
async def optional_api_changed(
    name: str, type: str | None, status: Mapping[str, Any], memo: kopf.Memo, **indexes: Any
) -> None:
    """An optional API began or stopped being served: reconcile the services that ask for it."""
    await dispatch.optional_api_changed(_state(memo), name, type, status, KopfIndexes.of(indexes))
