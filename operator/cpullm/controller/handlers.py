"""Kopf handlers: thin. They turn watch events into Reconciler.reconcile calls and map its outcome to Kopf.

Triggers: the CpuLLMService itself (create/update/resume, retried with backoff on transient errors); a
node whose profile changed (every service is re-planned; only changed plans touch anything); a change to a
child Deployment or Service (drift is reverted, readiness copied into status).

Handlers are async: Kopf mutates its indexes on the event loop, so they are read (copied) there, and only
then is the blocking reconcile handed to a worker thread.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
from collections.abc import Mapping
from typing import Any

import kopf

from cpullm.api.plan import Plan
from cpullm.api.spec import GROUP, PLURAL, VERSION
from cpullm.controller.reconcile import Reconciler
from cpullm.core.manifests import MANAGED_BY, MANAGED_BY_LABEL, SERVICE_LABEL
from cpullm.core.topology import NodeProfile, parse_node
from cpullm.errors import CpuLLMError, InvalidSpec, NodeLabelError, PlanRefusal
from cpullm.io.hub import DEFAULT_ENDPOINT, HubClient
from cpullm.io.kube import Kube

log = logging.getLogger(__name__)
CHILD_LABELS = {MANAGED_BY_LABEL: MANAGED_BY}
MAX_BACKOFF_SECONDS = 300


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Every Kopf setting the operator relies on, in one place."""
    # Handler progress and the last-handled spec live in our own annotations, never in status.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # Resources are discovered once at start-up (the CRD is installed before the operator), so the operator
    # needs no list/watch on CustomResourceDefinitions or Namespaces.
    settings.scanning.disabled = True
    settings.posting.level = logging.WARNING  # our own events say what happened; Kopf's only on trouble
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.error_backoffs = [1, 2, 5, 10, 30]
    if "reconciler" not in memo:
        hub = HubClient(endpoint=os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT))
        memo["reconciler"] = Reconciler(Kube.from_environment(), hub)


def outcome_to_kopf(outcome: Plan | CpuLLMError | None, retry: int) -> None:
    """The one place errors meet Kopf. A plan, a refusal or a bad spec is already reported in status and
    waits for a change (no retry); any other error (Hub unreachable, permission denied) is transient and
    retried with exponential backoff."""
    if isinstance(outcome, CpuLLMError) and not isinstance(outcome, PlanRefusal | InvalidSpec):
        raise kopf.TemporaryError(outcome.message, delay=min(MAX_BACKOFF_SECONDS, 10 * 2**retry))


@kopf.index("", "v1", "nodes")
async def node_profiles(name: str, body: kopf.Body, **_: Any) -> dict[str, NodeProfile | NodeLabelError]:
    try:
        return {name: parse_node(body)}
    except NodeLabelError as err:
        return {name: err}


@kopf.index(GROUP, VERSION, PLURAL)
async def services(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return {(namespace, name): copy.deepcopy(dict(body))}


def usable_nodes(index: kopf.Index[Any, Any]) -> list[NodeProfile]:
    return [p for store in index.values() for p in store if isinstance(p, NodeProfile)]


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
async def reconcile_service(
    body: kopf.Body, retry: int, memo: kopf.Memo, node_profiles: kopf.Index[Any, Any], **_: Any
) -> None:
    if body.metadata.get("deletionTimestamp"):
        return
    service, nodes = copy.deepcopy(dict(body)), usable_nodes(node_profiles)
    outcome = await asyncio.to_thread(memo["reconciler"].reconcile, service, nodes)
    outcome_to_kopf(outcome, retry)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def service_deleted(type: str | None, namespace: str, name: str, uid: str, memo: kopf.Memo, **_: Any) -> None:
    if type == "DELETED":
        memo["reconciler"].forget(namespace, name, uid)


@kopf.on.event("", "v1", "nodes")
async def node_changed(
    name: str,
    type: str | None,
    body: kopf.Body,
    memo: kopf.Memo,
    node_profiles: kopf.Index[Any, Any],
    services: kopf.Index[Any, Any],
    **_: Any,
) -> None:
    """Re-plan every service when a node's profile changed (heartbeats and status noise do not count)."""
    seen: dict[str, Any] = memo.setdefault("node_profiles_seen", {})
    profile: NodeProfile | NodeLabelError | None
    if type == "DELETED":
        profile = None
    else:
        try:
            profile = parse_node(body)
        except NodeLabelError as err:
            profile = err
    before = seen.get(name, "unseen")
    seen[name] = profile
    if type is None or _same(before, profile):
        return  # the initial listing: services are planned by their resume handlers
    if isinstance(profile, NodeLabelError):
        memo["reconciler"].kube.emit_event(
            {"apiVersion": "v1", "kind": "Node", "name": name, "uid": body.metadata.get("uid")},
            "Warning",
            profile.reason,
            f"{profile.message}; node skipped by the planner",
        )
    nodes = usable_nodes(node_profiles)
    if isinstance(profile, NodeProfile):
        nodes = [n for n in nodes if n.name != name] + [profile]
    elif profile is None or isinstance(profile, NodeLabelError):
        nodes = [n for n in nodes if n.name != name]
    await _reconcile_quietly(memo, [s for store in services.values() for s in store], nodes)


def _same(before: Any, after: Any) -> bool:
    if isinstance(before, NodeLabelError) and isinstance(after, NodeLabelError):
        return before.message == after.message
    return bool(before == after) and (not isinstance(after, NodeProfile) or before.labels == after.labels)


async def _reconcile_quietly(memo: kopf.Memo, services: list[Mapping[str, Any]], nodes: list[NodeProfile]) -> None:
    """Event-driven reconciles report through status; errors are logged, the resource handler retries."""
    for service in [copy.deepcopy(dict(s)) for s in services if not s["metadata"].get("deletionTimestamp")]:
        try:
            await asyncio.to_thread(memo["reconciler"].reconcile, service, nodes)
        except Exception:  # an event handler must not stop the watch; the error is in the log
            meta = service["metadata"]
            log.exception("reconcile of %s/%s failed", meta["namespace"], meta["name"])


@kopf.on.event("apps", "v1", "deployments", labels=CHILD_LABELS)
@kopf.on.event("", "v1", "services", labels=CHILD_LABELS)
async def child_changed(
    labels: Mapping[str, str],
    namespace: str,
    type: str | None,
    memo: kopf.Memo,
    node_profiles: kopf.Index[Any, Any],
    services: kopf.Index[Any, Any],
    **_: Any,
) -> None:
    """A child changed or vanished: reconcile its owner, which reverts drift and refreshes status."""
    owner = labels.get(SERVICE_LABEL)
    if type is None or owner is None or (namespace, owner) not in services:
        return
    await _reconcile_quietly(memo, list(services[namespace, owner]), usable_nodes(node_profiles))
