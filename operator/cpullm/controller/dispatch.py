"""What each watch event does, apart from Kopf's decorators (controller/handlers.py, one line per event).

Each function takes the operator's ControllerState, the event's own facts, and Kopf's indexes, typed
(controller/indexes.py: node profiles, node-fact sources, DaemonSets' pods, services, the owned Deployments' status,
the scheduler's messages, the servers' last ends, the served optional APIs). What an event can affect is decided by
the pure functions of core/affected.py; whether it is news, by the state's LastSeen records. Reconciles read the
indexes on the event loop (Kopf mutates them there), then run on a worker thread; one that could not finish is
retried on controller/outcomes.py's delays.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from cpullm.api.spec import copy_json
from cpullm.controller.indexes import KopfIndexes, first, indexed
from cpullm.controller.outcomes import retry_delay
from cpullm.controller.state import Change, ControllerState
from cpullm.core.affected import affected_by_node, asks_for_api, owning_service
from cpullm.core.children import CHILD_KINDS, crd_established
from cpullm.core.children.common import SERVICE_LABEL
from cpullm.core.node_facts import NodeFactSource
from cpullm.core.pod_troubles import declared_by_container, pod_trouble
from cpullm.core.server_exits import server_exit
from cpullm.core.topology import NodeState, parse_node
from cpullm.errors import NodeLabelError, PermissionDenied, TransientApiError
from cpullm.metrics import NODE_PROFILES, POD_TROUBLES

log = logging.getLogger(__name__)


# How soon a service whose rollout waits for a slot is reconciled again when no event woke it before.
PACED_RETRY_SECONDS = 30


@dataclass(frozen=True)
class ChildEvent:
    """What a watched child's event says, read from Kopf's arguments by the handler."""

    kind: str
    namespace: str
    name: str
    type: str | None
    meta: Mapping[str, Any]
    body: Mapping[str, Any]


async def _reconcile(state: ControllerState, indexes: KopfIndexes, service: Mapping[str, Any]) -> Any:
    """One reconcile on a worker thread, with the ClusterView read from the indexes on the event loop."""
    key = (service["metadata"]["namespace"], service["metadata"]["name"])
    view = replace(indexes.snapshot().view(key), performance=state.performance.verdicts.get(key))
    ticket = state.memory.begin(service, view.deployment)
    return await state.workers.run(state.reconciler.reconcile, service, view, ticket)


async def reconcile_quietly(
    state: ControllerState, services: list[Mapping[str, Any]], indexes: KopfIndexes, attempt: int = 0
) -> None:
    """Reconciles report through status. The services are reconciled side by side, as many at once as there are
    worker slots (one event can affect hundreds: a node's change, a resync after an outage). One that could not
    finish (API server unreachable, Hub down, permission denied) is tried again later with the latest service and
    indexes (controller/outcomes.py's delays), until one finishes or the service is gone; a handler bug is logged
    with its traceback and not retried."""
    live = [s for s in services if not s["metadata"].get("deletionTimestamp")]
    await asyncio.gather(*(_reconcile_one(state, service, indexes, attempt) for service in live))


async def _reconcile_one(
    state: ControllerState, service: Mapping[str, Any], indexes: KopfIndexes, attempt: int
) -> None:
    meta = service["metadata"]
    try:
        async with state.workers.slot:
            outcome = await _reconcile(state, indexes, copy_json(service))
    except Exception:  # an event handler must not stop the watch; the error is in the log
        log.exception("reconcile of %s/%s failed", meta["namespace"], meta["name"])
        return
    await wake_paced(state, indexes)
    key = (meta["namespace"], meta["name"])
    delay = retry_delay(outcome, attempt, spread=random.random())
    if delay is None and state.pacer.waiting(key):  # woken when a slot frees; this, if no event says so
        delay = PACED_RETRY_SECONDS
    if delay is not None:

        async def again() -> None:  # from Kopf's indexes as they are then
            latest = indexes.service(key)
            await reconcile_quietly(state, latest, indexes, attempt + 1)

        state.retries.later(key, delay, again)


async def wake_paced(state: ControllerState, indexes: KopfIndexes) -> None:
    """Reconcile the services whose rollout waits for a slot, as many as are free (controller/pacing.py). Called on
    every reconcile's end and Deployment event: the index is walked only while someone waits."""
    if not state.pacer.anyone_waiting():
        return
    woken = state.pacer.to_wake()
    services = [s for key in woken for s in indexes.service(key)]
    if services:
        await reconcile_quietly(state, services, indexes)


def find_drifted(state: ControllerState, kind: str, namespaces: list[str]) -> list[tuple[str, str]]:
    """The owners (namespace, service) of children of `kind` the operator applied that no longer exist or that
    another writer changed (OperatorMemory.drifted), from a listing of what does. A watch cannot tell them all:
    after the API server forgot a watch's resourceVersion, Kopf lists again, and a listing has no events for what
    was deleted meanwhile; the kinds that are not watched (the optional ones) have no events at all."""
    owners, missed = state.memory.drifted(
        kind, lambda: state.kube.list_owned(kind, namespaces), lambda key: state.kube.child_exists(*key)
    )
    for key in missed:
        log.warning("%s %s/%s is missing from a listing but exists; left as it is", *key)
    return owners


async def resync(state: ControllerState, indexes: KopfIndexes, namespaces: list[str]) -> None:
    """One round: per kind that is served, list what exists; then reconcile, once each, the owners of what
    vanished or was changed by another writer (the only way a change to a kind that is not watched, e.g. an
    InferencePool, is seen)."""
    served = frozenset(indexes.installed_crds.keys())
    drifted: dict[tuple[str, str], set[str]] = {}  # owner -> the kinds of its children that drifted
    for kind in (k.kind for k in CHILD_KINDS if k.kept and (k.crd is None or k.crd in served)):
        try:
            owners = await asyncio.to_thread(find_drifted, state, kind, namespaces)
        except (TransientApiError, PermissionDenied) as err:  # the next round tries again
            log.warning("resync of %ss skipped: %s", kind, err.message)
            continue
        if owners:
            log.info("%d %s(s) deleted or changed unseen, applying again: %s", len(owners), kind, owners[:5])
        for owner in owners:
            drifted.setdefault(owner, set()).add(kind)
    if not drifted:
        return
    # Kopf's index still holds a vanished Deployment's last status (no event removed it): not the replacement's.
    facts = indexes.without_deployments({owner for owner, kinds in drifted.items() if "Deployment" in kinds})
    await reconcile_quietly(state, [s for owner in drifted for s in indexes.service(owner)], facts)


async def resync_forever(state: ControllerState, indexes: KopfIndexes, every: float, namespaces: list[str]) -> None:
    """A round that fails in a way no one foresaw is logged with its traceback; the rounds go on (the task is
    the only one that finds what the watches missed: ended, nothing would say so)."""
    while True:
        await asyncio.sleep(every)
        try:
            await resync(state, indexes, namespaces)
        except Exception:
            log.exception("resync round failed; the next one is due in %.0f s", every)


async def service_changed(
    state: ControllerState, type: str | None, namespace: str, name: str, uid: str, body: Any, indexes: KopfIndexes
) -> None:
    """A deleted service is forgotten; one whose spec no reconcile has read yet is reconciled."""
    if type == "DELETED":
        state.forget(namespace, name, uid)
    elif state.memory.service_event(body):
        await reconcile_quietly(state, indexes.service((namespace, name)), indexes)


async def gateway_moved(state: ControllerState, namespace: str, indexes: KopfIndexes) -> None:
    """A CpuLLMGateway came, went or changed what it fronts: the namespace's services whose allowedFrom narrows who
    may call them are reconciled, so their NetworkPolicies admit exactly the gateways in front of them now."""

    def narrows(service: Mapping[str, Any]) -> bool:  # as stored: perhaps not a valid spec
        policy = (service.get("spec") or {}).get("networkPolicy")
        return isinstance(policy, Mapping) and policy.get("allowedFrom") is not None

    narrowed = [s for (ns, _), bodies in indexes.services.items() if ns == namespace for s in bodies if narrows(s)]
    if narrowed:
        await reconcile_quietly(state, narrowed, indexes)


async def node_changed(state: ControllerState, name: str, type: str | None, body: Any, indexes: KopfIndexes) -> None:
    """A node whose profile changed re-plans the services it can affect; one whose labels cannot be parsed is
    reported on the node. Kopf updates its indexes before event handlers run, so the index already holds this
    event's profile; what the services were last planned against is remembered per node (ControllerState.nodes)."""
    node: NodeState = None
    if type != "DELETED":
        node = indexes.node_profile(name)
        if node is None:  # left out of the index: its labels cannot be parsed
            try:
                parse_node(body)
            except NodeLabelError as err:
                node = err
    NODE_PROFILES.set(sum(len(store) for store in indexes.node_profiles.values()))
    change = state.nodes.news(name, type, node)
    if change is None:
        return  # the operator's first listing (service_changed plans every service) or noise
    if isinstance(node, NodeLabelError):
        state.kube.emit_event(
            {"apiVersion": "v1", "kind": "Node", "name": name, "uid": body.metadata.get("uid")},
            "Warning",
            node.reason,
            f"{node.message}; node skipped by the planner",
        )
    await _replan_for_node(state, name, change, indexes)


async def node_fact_changed(
    state: ControllerState, source: NodeFactSource, name: str, type: str | None, indexes: KopfIndexes
) -> None:
    """An object of a node-fact source (core/node_facts.py: a NodeResourceTopology) that appeared, changed or went
    changes its node's profile as a label change does (the topology-updater rewrites a NodeResourceTopology every
    minute with what pods use, which the profile does not read: noise); one that cannot be read is logged once per
    problem, and its node planned from its labels."""
    said, logged = first(indexes.node_facts[source.index], name), state.node_fact_problems
    problem = said.message if isinstance(said, source.error) and type != "DELETED" else None
    if problem and logged.get((source.kind, name)) != problem:
        log.warning("%s; node %s is planned from its labels", problem, name)
    logged[source.kind, name] = problem
    if first(indexes.node_profiles, name) is None:
        return  # no usable node of that name: its own events say what there is to say
    # For the node, a fact's object going is a change of its profile, not the node's deletion.
    change = state.nodes.news(name, None if type is None else "MODIFIED", indexes.node_profile(name))
    if change is not None:
        await _replan_for_node(state, name, change, indexes)


async def _replan_for_node(state: ControllerState, name: str, change: Change[Any], indexes: KopfIndexes) -> None:
    affected = [s for s in indexed(indexes.services) if affected_by_node(s, name, change.before, change.after)]
    await reconcile_quietly(state, affected, indexes)


async def daemonset_changed(
    state: ControllerState, namespace: str, name: str, type: str | None, indexes: KopfIndexes
) -> None:
    """Every service is re-planned when what a DaemonSet's pods take, or where, changed (a new agent, a bigger
    request): rare, and any whole-node plan may have to leave it room. Its status (pods rolling) is noise."""
    key = (namespace, name)
    if state.daemonsets.news(key, type, first(indexes.daemonset_pods, key)) is not None:
        await reconcile_quietly(state, indexed(indexes.services), indexes)


async def child_changed(state: ControllerState, child: ChildEvent, indexes: KopfIndexes) -> None:
    """A child's owner (its controller owner reference, name and UID) is reconciled, which reverts drift and
    refreshes status, when the event can change either (OperatorMemory.child_event): someone else's edit or deletion,
    or a Deployment's replica counts; the operator's own writes and a Deployment's other status updates do not.
    Kopf lists again (events of type None) when a watch failed and the API server no longer has its resource
    version: what changed meanwhile is found there."""
    service = owning_service(child.namespace, child.meta, indexes.services)
    if child.kind == "Deployment":  # a rollout may have ended (or its Deployment gone with its owner)
        owner = service["metadata"]["name"] if service is not None else None
        if child.name == owner:  # the servers' (a router's rollout is not paced)
            state.pacer.observe((child.namespace, owner), None if child.type == "DELETED" else child.body)
        await wake_paced(state, indexes)
    if service is None or not state.memory.child_event(
        child.kind, child.namespace, child.name, child.type, child.body, service["metadata"]["name"]
    ):
        return
    await reconcile_quietly(state, [service], indexes)


async def pod_changed(
    state: ControllerState,
    namespace: str,
    name: str,
    type: str | None,
    labels: Mapping[str, str] | None,
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    indexes: KopfIndexes,
) -> None:
    """A pod of a service that cannot start or keep running (unschedulable, an image that cannot be pulled, a Secret
    missing, a crash loop: core/pod_troubles.py), or no longer, reconciles its service, so its Ready condition says
    why; so does one whose vLLM container's last end reports fixes that
    did not load, or no longer does (FixesLoaded); every other pod change (most of them) does nothing. A pod's
    controller is its ReplicaSet: it is matched to its service by label, and changes only what status says."""
    owner = (labels or {}).get(SERVICE_LABEL)
    trouble = state.pod_troubles.news((namespace, name), type, pod_trouble(status, declared_by_container(spec)))
    if trouble is not None and trouble.after is not None:
        POD_TROUBLES.labels(trouble.after.reason).inc()
    ended = state.server_exits.news((namespace, name), type, server_exit(name, status))
    if (trouble is not None or ended is not None) and owner is not None:
        await reconcile_quietly(state, indexes.service((namespace, owner)), indexes)


async def optional_api_changed(
    state: ControllerState, name: str, type: str | None, status: Mapping[str, Any], indexes: KopfIndexes
) -> None:
    """An optional API that began or stopped being served reconciles the services that ask for it (a PodMonitor
    or an InferencePool is applied as soon as its CRD is established)."""
    if state.served_optional_apis.news(name, type, True if crd_established(status) else None) is None:
        return  # no change in what is served (CRD edits, resyncs), or the operator's first listing
    await reconcile_quietly(state, [s for s in indexed(indexes.services) if asks_for_api(s, name)], indexes)
