"""The one module that talks to the Kubernetes API (Kopf's own watching aside).

Children are written with server-side apply under one field manager, so the operator owns exactly the
fields it sets: drift in them is reverted, fields others own (an HPA's, kubectl annotations) are left alone.

API errors become typed errors in one place (`_api_errors`): 403 -> PermissionDenied (retried; status names
the missing rule), 422 -> ChildRejected (a spec whose pass-through fields the API server refuses; waits for
a spec change), 409, 429, 5xx and connection errors -> TransientApiError (retried soon), and so is a 422 whose
cause is the API server's own storage failing (a Service's IP allocated while etcd is down is "invalid").
A 404 is "absent" where a call says so, and transient for an apply (the kind is not served yet). Events are
best effort: a failure to post one is logged, never raised.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, cast

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from cpullm.api.performance import KIND as PERFORMANCE_KIND
from cpullm.api.performance import PLURAL as PERFORMANCE_PLURAL
from cpullm.api.spec import GROUP, HF_TOKEN_SECRET_LABEL, PLURAL, VERSION
from cpullm.core.children import CHILD_KIND, marker
from cpullm.core.children.common import MANAGED_BY, MANAGED_BY_LABEL, controller_reference
from cpullm.core.children.sizing_job import SizingJobFacts
from cpullm.core.node_facts import NodeFactSource
from cpullm.core.observation import NamespaceFacts, Ownership
from cpullm.core.pod_troubles import pod_trouble
from cpullm.errors import (
    ChildExists,
    ChildRejected,
    CpuLLMError,
    ModelConfigUnavailable,
    PermissionDenied,
    TransientApiError,
)
from cpullm.metrics import API_ERRORS

FIELD_MANAGER = "cpullm-operator"
# The probe's writes of its NodePerformance (the chart's probe Job): a manager of their own, apart from the operator's.
PROBE_FIELD_MANAGER = "cpullm-probe"
# Reads of owned children ask for their metadata only: whether they exist is all the resync needs.
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
METADATA_ONLY_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
LIST_PAGE = 500
# Every request has a deadline (the client's default is none): a connection the network dropped without a reset
# (a partition, an API server host gone) would otherwise hold a reconcile thread, or the resync, for good.
# Seconds to connect, and between bytes read; an API server under load answers a page of 500 well within them.
REQUEST_TIMEOUT = (10.0, 60.0)
APPLY = "application/apply-patch+yaml"
# What an apply that may only create carries as its resourceVersion: the API server's versions are etcd revisions,
# and etcd's first write is revision 2, so no stored object holds 1. Where the object is absent the API server creates
# it (an apply's create does not compare versions); where one exists, the versions differ: a conflict, nothing
# written. e2e/test_tenancy.py holds the API server to both.
ABSENT_VERSION = "1"
MERGE = "application/merge-patch+json"
log = logging.getLogger(__name__)


class BoundedApiClient(client.ApiClient):
    """The Kubernetes client with REQUEST_TIMEOUT on every request that does not set its own."""

    def call_api(
        self,
        method: str,
        url: str,
        header_params: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> Any:
        return super().call_api(method, url, header_params, body, post_params, _request_timeout or REQUEST_TIMEOUT)


class Kube:
    def __init__(self, api_client: client.ApiClient, read_any_secret: bool = False) -> None:
        self.read_any_secret = read_any_secret
        self.apps = client.AppsV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    @classmethod
    def from_environment(cls, connections: int | None = None, read_any_secret: bool = False) -> Kube:
        """In-cluster service account, else $KUBECONFIG / ~/.kube/config; at most `connections` kept open
        (the client's default: 5 per CPU of the machine, whatever the callers' concurrency)."""
        configuration = client.Configuration()
        if connections is not None:
            configuration.connection_pool_maxsize = connections
        try:
            config.load_incluster_config(configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        # No silent retries inside urllib3 (its default: 3, each a warning line): a failed request is one
        # TransientApiError, and the caller's jittered retry (controller/outcomes.py) is the only retry policy.
        configuration.retries = False
        return cls(BoundedApiClient(configuration), read_any_secret)

    def apply(self, manifest: Mapping[str, Any], over: Ownership | None) -> dict[str, Any]:
        """Server-side apply an owned child (the kinds of core/children); returns the object as stored.

        `over` is the child as the operator last knew it (its watches, or a read) controlled by the service, or
        None where it knows of none. Over a known child the apply carries its resourceVersion: if anything changed
        it since (deleted and made again by someone else, another controller set), the API server refuses with a
        conflict instead of the apply taking it over. Where none was known the apply may only create: it carries
        ABSENT_VERSION, which no stored object holds, so an object of that name, whoever made it, is refused
        untouched as ChildExists, and only then read (controller/owned.py). No read precedes a first write."""
        meta = manifest["metadata"]
        kind, name, namespace = manifest["kind"], meta["name"], meta["namespace"]
        version = over.resource_version if over is not None else ABSENT_VERSION
        manifest = {**manifest, "metadata": {**meta, "resourceVersion": version}}
        options: dict[str, Any] = {
            "field_manager": FIELD_MANAGER,
            "force": over is not None,
            "_content_type": APPLY,
            "_preload_content": False,
        }
        # A server-side apply creates what is absent: a 404 means the kind itself is not served (yet), e.g. a
        # CRD installed a moment ago; that passes.
        with _api_errors(f"apply {kind} {namespace}/{name}", absent_is_transient=True, taken=over is None):
            group, api_version, plural = _resource(manifest["apiVersion"], kind)
            if (typed := self._typed_api(group)) is not None:
                patch = getattr(typed, f"patch_namespaced_{_snake(kind)}")
                response = patch(name, namespace, dict(manifest), **options)
            else:
                response = self.custom.patch_namespaced_custom_object(
                    group, api_version, namespace, plural, name, dict(manifest), **options
                )
            # The body is read here, within the mapping: a connection cut mid-answer is transient too.
            return _json(response)

    def delete(self, api_version: str, kind: str, namespace: str, name: str, owner_uid: str) -> None:
        """Delete an optional child the spec no longer asks for, only if the service `owner_uid` controls it, with
        its UID as precondition (a same-name object made meanwhile is not deleted); one already gone, or not the
        service's, is left as it is."""
        found = self.ownership(api_version, kind, namespace, name)
        if found is None or found.controller_uid != owner_uid:
            return
        group, version, plural = _resource(api_version, kind)
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=found.uid))
        with _api_errors(f"delete {kind} {namespace}/{name}", absent_ok=True):
            if (typed := self._typed_api(group)) is not None:
                getattr(typed, f"delete_namespaced_{_snake(kind)}")(name, namespace, body=body)
            else:
                self.custom.delete_namespaced_custom_object(group, version, namespace, plural, name, body=body)

    def ownership(self, api_version: str, kind: str, namespace: str, name: str) -> Ownership | None:
        """The object's UID and its controller's (a read of its metadata only), or None when it does not exist."""
        meta: dict[str, Any] | None = None
        with _api_errors(f"read {kind} {namespace}/{name}", absent_ok=True):
            headers = {"Accept": METADATA_ONLY}
            group, version, plural = _resource(api_version, kind)
            if (typed := self._typed_api(group)) is not None:
                call = getattr(typed, f"read_namespaced_{_snake(kind)}")
                response = call(name, namespace, _headers=headers, _preload_content=False)
            else:
                response = self.custom.get_namespaced_custom_object(
                    group, version, namespace, plural, name, _headers=headers, _preload_content=False
                )
            meta = _json(response).get("metadata") or {}
        if meta is None:
            return None
        return Ownership(
            uid=str(meta.get("uid") or ""),
            controller_uid=controller_reference(meta).get("uid"),
            resource_version=str(meta.get("resourceVersion") or ""),
        )

    def list_owned(self, kind: str, namespaces: Sequence[str]) -> dict[tuple[str, str], str]:
        """Each child of `kind` that carries the operator's managed-by label in `namespaces` (empty: cluster-wide),
        keyed by (namespace, name), with its marker (core/children's `marker`), read in pages of metadata only."""
        child = CHILD_KIND[kind]
        typed, snake = self._typed_api(child.group), _snake(kind)
        calls: list[tuple[Callable[..., Any], tuple[str, ...]]]
        if typed is not None:
            calls = (
                [(getattr(typed, f"list_namespaced_{snake}"), (ns,)) for ns in namespaces]
                if namespaces
                else [(getattr(typed, f"list_{snake}_for_all_namespaces"), ())]
            )
        else:
            where = (child.group, child.version)
            calls = (
                [(self.custom.list_namespaced_custom_object, (*where, ns, child.plural)) for ns in namespaces]
                if namespaces
                else [(self.custom.list_cluster_custom_object, (*where, child.plural))]
            )
        selector, accept = f"{MANAGED_BY_LABEL}={MANAGED_BY}", {"Accept": METADATA_ONLY_LIST}
        return {
            (o["metadata"]["namespace"], o["metadata"]["name"]): marker(o)
            for call, args in calls
            for o in _paged(f"list {kind}s", call, *args, label_selector=selector, _headers=accept)
        }

    def list_nodes(self) -> list[dict[str, Any]]:
        """Every Node of the cluster as the API returns it (`cpullm plan --from-cluster`)."""
        return list(_paged("list nodes", self.core.list_node))

    def list_daemonsets(self) -> list[dict[str, Any]]:
        """Every DaemonSet of the cluster (`cpullm plan --from-cluster` leaves room for their pods)."""
        return [
            {"kind": "DaemonSet", **item}
            for item in _paged("list daemonsets", self.apps.list_daemon_set_for_all_namespaces)
        ]

    def list_node_facts(self, source: NodeFactSource) -> list[dict[str, Any]]:
        """Every object of a node-fact source in the cluster (`cpullm plan --from-cluster`: its
        NodeResourceTopologies); none where its CRD is not served."""
        where = (source.group, source.version, source.plural)
        try:
            items = list(_paged(f"list {source.plural}", self.custom.list_cluster_custom_object, *where))
        except ApiException as err:
            if err.status == 404:
                return []
            raise
        return [{"kind": source.kind, **item} for item in items]

    def publish_node_performance(self, manifest: Mapping[str, Any]) -> None:
        """Server-side apply a NodePerformance (cluster-scoped, named after its node) under the probe's own field
        manager, taking over its fields: a newer measurement of the node replaces the older (`cpullm probe
        --publish`, the chart's probe Job)."""
        name = manifest["metadata"]["name"]
        with _api_errors(f"apply {PERFORMANCE_KIND} {name}"):
            self.custom.patch_cluster_custom_object(
                GROUP,
                VERSION,
                PERFORMANCE_PLURAL,
                name,
                dict(manifest),
                field_manager=PROBE_FIELD_MANAGER,
                force=True,
                _content_type=APPLY,
            )

    def child_exists(self, kind: str, namespace: str, name: str) -> bool:
        """Whether one child of an owned kind exists (a read of its metadata only): a listing's word
        that a child is gone is confirmed by this before the child is taken for deleted."""
        return self.ownership(CHILD_KIND[kind].api_version, kind, namespace, name) is not None

    def _typed_api(self, group: str) -> Any:
        """The Kubernetes client's typed API for a built-in group (core, apps), or None: a CRD's kind (or one the
        client has no typed API for here) goes through the generic custom-objects calls."""
        return {"": self.core, "apps": self.apps, "batch": self.batch}.get(group)

    def read_sizing_job(self, namespace: str, name: str) -> SizingJobFacts | None:
        """A sizing Job (core/children/sizing_job.py), None where absent: whether it ended, and of the pods the Job
        itself controls (by UID: a pod with the Job's labels is not enough) the termination message once it did, or
        why one cannot run (core/pod_troubles.py) while it runs."""
        job: dict[str, Any] | None = None
        with _api_errors(f"read Job {namespace}/{name}", absent_ok=True):
            job = _json(self.batch.read_namespaced_job(name, namespace, _preload_content=False))
        if job is None:
            return None
        meta = job.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        # Without the operator's label it is no child of any service (the chart's policies keep that label the
        # operator's), whatever owner reference it names.
        ours = (meta.get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY
        controller = controller_reference(meta).get("uid") if ours else None
        ended = {
            c.get("type"): c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"
        }
        failed = ended.get("Failed")
        finished = "Complete" in ended or failed is not None
        messages, troubles = [], []
        selector = f"batch.kubernetes.io/controller-uid={uid}"
        for pod in _paged(
            f"list pods of Job {namespace}/{name}", self.core.list_namespaced_pod, namespace, label_selector=selector
        ):
            if controller_reference(pod.get("metadata") or {}).get("uid") != uid:
                continue
            status = pod.get("status") or {}
            trouble = pod_trouble(status)
            troubles += [trouble.message] if trouble is not None else []
            for container in status.get("containerStatuses") or []:
                terminated = (container.get("state") or {}).get("terminated") or {}
                messages.append(str(terminated.get("message") or ""))
        if not finished:
            return SizingJobFacts(finished=False, controller_uid=controller, trouble=next(iter(troubles), ""))
        reason = str(failed.get("reason") or "Failed") if failed is not None else ""
        message = next((m for m in messages if m), "")
        return SizingJobFacts(finished=True, message=message, reason=reason, controller_uid=controller)

    def read_namespace(self, namespace: str) -> NamespaceFacts:
        """A namespace already gone (its services' last events arrive after it) is one going away: nothing may
        be created there."""
        ns = None
        with _api_errors(f"read Namespace {namespace}", absent_ok=True):
            ns = self.core.read_namespace(namespace)
        if ns is None:
            return NamespaceFacts(terminating=True)
        labels = dict((ns.metadata.labels if ns.metadata else None) or {})
        terminating = bool(ns.metadata and ns.metadata.deletion_timestamp) or (
            ns.status is not None and ns.status.phase == "Terminating"
        )
        return NamespaceFacts(labels=labels, terminating=terminating, uid=ns.metadata.uid if ns.metadata else None)

    def patch_service_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.patch_status(PLURAL, namespace, name, status)

    def patch_status(self, plural: str, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch the status of one of our kinds (`plural`); one deleted meanwhile is not an error (its
        children go with it)."""
        with _api_errors(f"patch {plural}/status {namespace}/{name}", absent_ok=True):
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, plural, name, {"status": dict(status)}, _content_type=MERGE
            )

    def read_secret_key(self, namespace: str, name: str, key: str) -> str | None:
        """The decoded value, or None when the key does not exist (or the secret, with readAnySecret). An absent
        Secret and one that did not opt in are refused alike: a tenant cannot learn through the operator which
        Secrets exist in the namespace."""
        secret = None
        with _api_errors(f"read Secret {namespace}/{name}", absent_ok=True):
            secret = self.core.read_namespaced_secret(name, namespace)
        if secret is None and self.read_any_secret:
            return None
        labels = (secret.metadata.labels if secret is not None and secret.metadata else None) or {}
        if secret is None or (not self.read_any_secret and labels.get(HF_TOKEN_SECRET_LABEL) != "true"):
            raise ModelConfigUnavailable(
                f"secret {namespace}/{name} is absent or is not labelled {HF_TOKEN_SECRET_LABEL}=true: the operator "
                "reads only Secrets that opt in (create it with the label, or install the operator with readAnySecret)"
            )
        value = (secret.data or {}).get(key)
        if value is None:
            return None
        try:
            return base64.b64decode(value).decode()
        except (ValueError, UnicodeDecodeError):  # never shows the value
            raise ModelConfigUnavailable(f"secret {namespace}/{name} key {key} is not UTF-8 text") from None

    def emit_event(self, regarding: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about `regarding` ({apiVersion, kind, name, namespace, uid}). Best effort."""
        now = datetime.now(UTC)
        namespace = regarding.get("namespace") or "default"
        body = {
            "metadata": {"generateName": f"{regarding['name']}.", "namespace": namespace},
            "involvedObject": dict(regarding),
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "firstTimestamp": now.isoformat(),
            "lastTimestamp": now.isoformat(),
            "count": 1,
        }
        try:
            with _api_errors(f"post event {reason}"):
                self.core.create_namespaced_event(namespace, cast(Any, body))
        except (PermissionDenied, ChildRejected, TransientApiError) as err:
            log.warning("event %s on %s/%s not posted: %s", reason, namespace, regarding["name"], err.message)


_TRANSIENT_STATUS = frozenset({409, 429})
# How a validation that reads storage (a Service's cluster IP or node port allocator) reports etcd failing: a gRPC
# status from the etcd client, a Go context ended, or etcd's own timeouts. The spec is not what is wrong.
_STORAGE_FAILED = re.compile(
    r"rpc error: code = (?:Unavailable|DeadlineExceeded|Canceled|Aborted|ResourceExhausted)"
    r"|context deadline exceeded|context canceled|etcdserver: (?:request timed out|leader changed|too many requests)"
)


def _resource(api_version: str, kind: str) -> tuple[str, str, str]:
    """(group, version, plural) of an owned kind at this API version (core/children's CHILD_KINDS)."""
    group, _, version = api_version.rpartition("/")
    return group, version, CHILD_KIND[kind].plural


def _snake(kind: str) -> str:
    """A kind as the typed client's method names spell it: ConfigMap -> config_map."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()


@contextmanager
def _api_errors(
    action: str, *, absent_ok: bool = False, absent_is_transient: bool = False, taken: bool = False
) -> Iterator[None]:
    """Maps what the API server (or the connection to it) answered to the operator's typed errors; `taken`: a 409
    means an object of the name exists (an apply that may only create)."""
    try:
        yield
    except ApiException as err:
        if err.status == 404 and absent_ok:
            return
        typed: CpuLLMError | None = None
        if err.status == 409 and taken:
            typed = ChildExists(f"cannot {action}: an object of that name exists")
        elif err.status == 403:
            typed = PermissionDenied(f"forbidden to {action}: {_message(err)}")
        elif (
            err.status in _TRANSIENT_STATUS
            or (err.status or 0) >= 500
            or (err.status == 404 and absent_is_transient)
            or (err.status == 422 and _STORAGE_FAILED.search(_message(err)))
        ):
            typed = TransientApiError(f"cannot {action}: HTTP {err.status} {_message(err)}")
        elif err.status == 422:
            typed = ChildRejected(f"the API server refused to {action}: {_message(err)}")
        elif err.status == 0 and isinstance(err.__context__, urllib3.exceptions.HTTPError):
            # The client answers a TLS failure (a connection cut mid-handshake) with a status-0 ApiException.
            typed = _connection_failed(action, err.__context__)
        API_ERRORS.labels(error=typed.reason if typed else f"HTTP{err.status}").inc()
        if typed is None:
            raise
        raise typed from err
    except urllib3.exceptions.HTTPError as err:
        API_ERRORS.labels(error=TransientApiError.reason).inc()
        raise _connection_failed(action, err) from err


def _connection_failed(action: str, cause: urllib3.exceptions.HTTPError) -> TransientApiError:
    return TransientApiError(f"cannot {action}: {type(cause).__name__}: {cause}")


def _paged(action: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
    """The items of a list call, read LIST_PAGE at a time."""
    token: str | None = None
    while True:
        with _api_errors(action):
            page = _json(call(*args, limit=LIST_PAGE, _continue=token, _preload_content=False, **kwargs))
        yield from page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return


def _json(response: Any) -> dict[str, Any]:
    """The body of a call made with _preload_content=False (the client's models drop unknown fields); it is
    read from the network here, so every caller calls it inside _api_errors."""
    result: dict[str, Any] = json.loads(response.data)
    return result


def _message(err: ApiException) -> str:
    try:
        return str(json.loads(err.body or "").get("message", err.reason))
    except (TypeError, ValueError):
        return str(err.reason)
