"""One idempotent reconcile for a CpuLLMService, shared by create, update, resume, node and child events.

gather (spec, model size, nodes, current status) -> decide (plan, manifests, status: pure) -> apply
(server-side apply of the children, status patch only when it changed, events only for changed conditions).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from cpullm.api.plan import Plan
from cpullm.api.spec import API_VERSION, KIND, CpuLLMServiceSpec, parse_spec
from cpullm.core.manifests import Owner, build_deployment, build_service
from cpullm.core.planner import plan_service
from cpullm.core.podsecurity import check_pod_security
from cpullm.core.sizing import ModelSize, size_model
from cpullm.core.status import changed_conditions, compute_status, status_changes
from cpullm.core.topology import NodeProfile
from cpullm.errors import CpuLLMError, ModelConfigUnavailable
from cpullm.io.hub import ModelFiles
from cpullm.io.kube import NamespaceInfo

log = logging.getLogger(__name__)


class KubeGateway(Protocol):
    def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]: ...
    def read_deployment(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def read_namespace(self, namespace: str) -> NamespaceInfo: ...
    def patch_service_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None: ...
    def read_secret_key(self, namespace: str, name: str, key: str) -> str | None: ...
    def emit_event(self, regarding: Mapping[str, Any], type_: str, reason: str, message: str) -> None: ...


class ModelConfigSource(Protocol):
    def fetch(self, name: str, revision: str | None, token: str | None) -> ModelFiles: ...


class Reconciler:
    def __init__(
        self, kube: KubeGateway, hub: ModelConfigSource, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self.kube = kube
        self.hub = hub
        self.clock = clock
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        # The operator is the only writer of status; what it last wrote (per object uid) is newer than a
        # watch snapshot that may not have caught up yet, and comparing against it avoids repeated patches
        # and events. Empty after a restart: the object's own status is used then.
        self._written: dict[str, dict[str, Any]] = {}

    def _lock(self, key: tuple[str, str]) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    def resolve_model(self, spec: CpuLLMServiceSpec, namespace: str) -> ModelSize:
        """Inline config wins; else the Hub (with the spec's token secret). Paths need an inline config."""
        model = spec.model
        if model.config is not None:
            return size_model(model.config, model.dtype, weights_bytes=model.weights_bytes)
        if model.name.startswith("/"):
            raise ModelConfigUnavailable(
                f"model {model.name} is a path the operator cannot read: give spec.model.config"
            )
        token = None
        if spec.hf_token_secret is not None:
            ref = spec.hf_token_secret
            token = self.kube.read_secret_key(namespace, ref.name, ref.key)
            if token is None:
                raise ModelConfigUnavailable(f"secret {namespace}/{ref.name} has no key {ref.key}")
        files = self.hub.fetch(model.name, model.revision, token)
        return size_model(
            files.config,
            model.dtype,
            weights_bytes=model.weights_bytes,
            checkpoint_total_bytes=files.checkpoint_total_bytes,
        )

    def forget(self, namespace: str, name: str, uid: str) -> None:
        """Drop what is remembered about a deleted service (its children go by garbage collection)."""
        with self._locks_guard:
            self._locks.pop((namespace, name), None)
        self._written.pop(uid, None)

    def _current_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        """What still runs after a failed plan, for the replica counts; unknown if it cannot be read."""
        try:
            return self.kube.read_deployment(namespace, name)
        except CpuLLMError:
            return None

    def reconcile(self, service: Mapping[str, Any], nodes: Sequence[NodeProfile]) -> Plan | CpuLLMError | None:
        """Bring children and status in line with the spec; returns the plan or the error reported, or None
        when the namespace is being deleted (nothing may be created there; everything goes with it)."""
        meta = service["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        with self._lock((namespace, name)):
            namespace_info = self.kube.read_namespace(namespace)
            if namespace_info.terminating:
                return None
            owner = Owner(name=name, namespace=namespace, uid=meta.get("uid"))
            outcome: Plan | CpuLLMError
            deployment: Mapping[str, Any] | None = None
            spec: CpuLLMServiceSpec | None = None
            try:
                spec = parse_spec(service.get("spec"))
                check_pod_security(namespace, namespace_info.labels, spec)
                outcome = plan_service(spec, self.resolve_model(spec, namespace), nodes)
                deployment = self.kube.apply(build_deployment(owner, spec, outcome))
                self.kube.apply(build_service(owner, spec))
            except CpuLLMError as err:
                outcome = err
                deployment = self._current_deployment(namespace, name)

            uid = str(meta.get("uid"))
            current = self._written.get(uid) or service.get("status") or {}
            desired = compute_status(
                name=name,
                generation=int(meta.get("generation") or 0),
                desired_replicas=spec.replicas if spec else int((service.get("spec") or {}).get("replicas", 0)),
                outcome=outcome,
                deployment_status=(deployment or {}).get("status"),
                previous=current,
                now=self.clock(),
            )
            patch = status_changes(current, desired)
            if patch:
                self.kube.patch_service_status(namespace, name, patch)
                self._written[uid] = desired
            regarding = {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": name,
                "namespace": namespace,
                "uid": meta.get("uid"),
            }
            for cond in changed_conditions(current, desired):
                kind = "Normal" if cond["status"] == "True" else "Warning"
                log.info(
                    "%s/%s %s=%s %s: %s", namespace, name, cond["type"], cond["status"], cond["reason"], cond["message"]
                )
                self.kube.emit_event(regarding, kind, cond["reason"], cond["message"])
            return outcome
