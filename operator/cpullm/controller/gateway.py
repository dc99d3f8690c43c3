"""Reconciles CpuLLMGateways: gather (the gateway, its namespace's services and its Deployment's status, from Kopf's
indexes) -> decide (core/gateway.py, pure) -> apply (each child that changed, after a read that it is absent or
the gateway's; the status when it changed; an event per condition that changed).

A gateway is reconciled when it changes, when a service of its namespace changes (its model, adapters, port or
plan may move a route), when its Deployment's readiness changes, and on every resync round (forced: every child
applied again, which reverts what another writer changed or deleted).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from cpullm.api.gateway import KIND, PLURAL, parse_gateway_spec
from cpullm.api.spec import API_VERSION, copy_json
from cpullm.controller.outcomes import retry_delay
from cpullm.controller.owned import read_owned, write_owned
from cpullm.controller.state import ControllerState
from cpullm.core.children.common import controller_reference
from cpullm.core.gateway import GatewayDecision, GatewayOwner, decide_gateway
from cpullm.core.observation import Ownership
from cpullm.errors import ChildConflict, ChildRejected, CpuLLMError, InvalidSpec, PermissionDenied, TransientApiError

log = logging.getLogger(__name__)
# The children a gateway may have; the PodDisruptionBudget only with more than one replica.
OPTIONAL_KINDS = (("policy/v1", "PodDisruptionBudget"),)
Key = tuple[str, str]


class GatewayKube(Protocol):
    def apply(self, manifest: Mapping[str, Any], over: Ownership | None) -> dict[str, Any]: ...
    def delete(self, api_version: str, kind: str, namespace: str, name: str, owner_uid: str) -> None: ...
    def ownership(self, api_version: str, kind: str, namespace: str, name: str) -> Ownership | None: ...
    def patch_status(self, plural: str, namespace: str, name: str, status: Mapping[str, Any]) -> None: ...
    def emit_event(self, regarding: Mapping[str, Any], type_: str, reason: str, message: str) -> None: ...


def _digest(manifest: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


class GatewayReconciler:
    """One gateway at a time per gateway (a lock each). Keeps, per gateway UID, the digest of each child it applied
    and the status it wrote: an unchanged child is not written again, an unchanged status not patched."""

    def __init__(self, kube: GatewayKube, image: str, clock: Callable[[], datetime] = lambda: datetime.now(UTC)):
        self.kube, self.image, self.clock = kube, image, clock
        self._applied: dict[str, dict[tuple[str, str], str]] = {}
        self._status: dict[str, Mapping[str, Any]] = {}
        self._locks: dict[Key, threading.Lock] = {}
        self._fronted: dict[Key, str] = {}  # what gateways read of each service, as its last event showed it
        self._guard = threading.Lock()

    def _lock(self, key: Key) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def service_news(self, namespace: str, name: str, body: Mapping[str, Any] | None) -> bool:
        """Whether a service's event changes what a gateway reads of it (its model and adapters' names, port, key,
        replicas, and its plan's capacity and drain): its own status patches mostly do not, and every reconcile of
        a fronted service patches it. None: the service went."""
        key, inputs = (namespace, name), None if body is None else _front_inputs(body)
        with self._guard:
            news = self._fronted.get(key) != inputs
            if inputs is None:
                self._fronted.pop(key, None)
            else:
                self._fronted[key] = inputs
        return news

    def forget(self, namespace: str, name: str, uid: str) -> None:
        with self._guard:
            self._locks.pop((namespace, name), None)
        self._applied.pop(uid, None)
        self._status.pop(uid, None)

    def reconcile(
        self,
        gateway: Mapping[str, Any],
        services: Mapping[str, Mapping[str, Any]],
        deployment_status: Mapping[str, Any] | None,
        force: bool = False,
    ) -> GatewayDecision | CpuLLMError:
        """`services`: the gateway's namespace's CpuLLMServices by name; `force`: apply every child again."""
        meta = gateway["metadata"]
        owner = GatewayOwner(meta["name"], meta["namespace"], str(meta.get("uid")), int(meta.get("generation") or 0))
        with self._lock((owner.namespace, owner.name)):
            try:
                return self._reconcile(owner, gateway, services, deployment_status, force)
            except (TransientApiError, PermissionDenied) as err:
                log.warning("gateway %s/%s: %s", owner.namespace, owner.name, err.message)
                return err

    def _reconcile(
        self,
        owner: GatewayOwner,
        gateway: Mapping[str, Any],
        services: Mapping[str, Mapping[str, Any]],
        deployment_status: Mapping[str, Any] | None,
        force: bool,
    ) -> GatewayDecision:
        uid = str(owner.uid)
        previous = self._status.get(uid) or gateway.get("status") or {}
        try:
            spec: Any = parse_gateway_spec(gateway.get("spec"))
        except InvalidSpec as err:
            spec = err
        decision = decide_gateway(owner, spec, services, deployment_status, previous, self.image, self.clock())
        try:
            self._apply(owner, decision, force)
        except (ChildConflict, ChildRejected) as err:
            decision = decide_gateway(owner, err, services, deployment_status, previous, self.image, self.clock())
        if force or _without_times(decision.status) != _without_times(previous):
            self.kube.patch_status(PLURAL, owner.namespace, owner.name, decision.status)
            self._status[uid] = decision.status
        regarding = {"apiVersion": API_VERSION, "kind": KIND, "name": owner.name, "namespace": owner.namespace}
        for event in decision.events:
            log.info("gateway %s/%s %s %s: %s", owner.namespace, owner.name, event.type, event.reason, event.message)
            self.kube.emit_event({**regarding, "uid": uid}, event.type, event.reason, event.message)
        return decision

    def _apply(self, owner: GatewayOwner, decision: GatewayDecision, force: bool) -> None:
        """Each child that changed (every one when forced), never one that is someone else's; then the optional
        kinds the decision no longer has go (only where the gateway controls them)."""
        uid = str(owner.uid)
        applied = self._applied.setdefault(uid, {})
        for child in decision.children:
            key, digest = (child["kind"], child["metadata"]["name"]), _digest(child)
            if not force and applied.get(key) == digest:
                continue
            # Written by this process before: read what it is now. Otherwise a create, refused where it exists.
            known = read_owned(self.kube, child, uid, KIND) if key in applied else None
            write_owned(self.kube, child, uid, known, KIND)
            applied[key] = digest
        kept = {(c["kind"], c["metadata"]["name"]) for c in decision.children}
        name = next((c["metadata"]["name"] for c in decision.children), None)
        for api_version, kind in OPTIONAL_KINDS:
            if name is not None and (kind, name) not in kept and (force or (kind, name) in applied):
                self.kube.delete(api_version, kind, owner.namespace, name, uid)
                applied.pop((kind, name), None)


def _front_inputs(body: Mapping[str, Any]) -> str:
    """What core/gateway.py's `fronted` reads of a service, raw (no parsing): a change here is news for its gateways."""
    spec, status = body.get("spec"), body.get("status")
    spec = spec if isinstance(spec, Mapping) else {}
    plan = status.get("plan") if isinstance(status, Mapping) else None
    plan = plan if isinstance(plan, Mapping) else {}
    model = spec.get("model")
    picked = {
        "model": model.get("name") if isinstance(model, Mapping) else model,
        **{field: spec.get(field) for field in ("adapters", "service", "apiKeySecret", "replicas")},
        **{field: plan.get(field) for field in ("maxNumSeqs", "drainSeconds")},
    }
    return json.dumps(picked, sort_keys=True, default=str)


def _without_times(status: Mapping[str, Any]) -> Any:
    """A status without its conditions' transition times, to compare with what was written."""
    conditions = [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions") or []]
    return {**status, "conditions": conditions}


def controlling_gateway(namespace: str, meta: Mapping[str, Any]) -> Key | None:
    """(namespace, name) of the gateway controlling an object (by its owner reference), or None."""
    ref = controller_reference(meta)
    if ref.get("kind") != KIND or not str(ref.get("apiVersion", "")).startswith("cpullm.io/"):
        return None
    return namespace, str(ref.get("name"))


def namespace_services(services: Mapping[Key, Any], namespace: str) -> dict[str, Mapping[str, Any]]:
    """The namespace's CpuLLMServices by name, from Kopf's index of them."""
    return {name: next(iter(bodies)) for (ns, name), bodies in services.items() if ns == namespace and bodies}


def _first(index: Mapping[Key, Any], key: Key) -> Any:
    values = index.get(key)
    return next(iter(values), None) if values else None


async def reconcile_gateways(
    state: ControllerState,
    gateways: Iterable[Mapping[str, Any]],
    indexes: Mapping[str, Mapping[Key, Any]],
    force: bool = False,
    attempt: int = 0,
) -> None:
    """Reconcile each gateway on a worker thread; one that could not finish (the API server unreachable) is tried
    again later (controller/outcomes.py's delays) with the latest indexes."""
    reconciler = state.gateways
    if reconciler is None:
        return
    for gateway in gateways:
        meta = gateway["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        key = (meta["namespace"], meta["name"])
        services = namespace_services(indexes["services"], key[0])
        deployment = _first(indexes["gateway_deployments"], key)
        try:
            async with state.workers.slot:
                outcome = await state.workers.run(reconciler.reconcile, copy_json(gateway), services, deployment, force)
        except Exception:  # an event handler must not stop the watch; the error is in the log
            log.exception("reconcile of gateway %s/%s failed", *key)
            continue
        delay = retry_delay(outcome if isinstance(outcome, CpuLLMError) else None, attempt, spread=random.random())
        if delay is not None:

            async def again(key: Key = key) -> None:
                latest = _first(indexes["gateways"], key)
                await reconcile_gateways(state, [latest] if latest else [], indexes, force, attempt + 1)

            state.retries.later((f"gateway:{key[0]}", key[1]), delay, again)


async def resync_gateways(state: ControllerState, indexes: Mapping[str, Mapping[Key, Any]]) -> None:
    """Every gateway, forced: what a watch cannot tell (a child changed or deleted by someone else) is applied
    again."""
    gateways = [body for bodies in indexes["gateways"].values() for body in bodies]
    await reconcile_gateways(state, gateways, indexes, force=True)


async def resync_forever(state: ControllerState, indexes: Mapping[str, Mapping[Key, Any]], every: float) -> None:
    """A round that fails is logged with its traceback; the rounds go on."""
    while True:
        await asyncio.sleep(every)
        try:
            await resync_gateways(state, indexes)
        except Exception:
            log.exception("gateway resync round failed; the next one is due in %.0f s", every)


def gather_indexes(kwargs: Mapping[str, Any]) -> dict[str, Mapping[Key, Any]]:
    """The indexes a gateway reconcile reads, among the keyword arguments Kopf passed a handler."""
    return {name: kwargs[name] for name in ("gateways", "gateway_deployments", "services")}
