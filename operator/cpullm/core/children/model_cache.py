"""The model cache volume (mounted at /models): where downloaded weights and what a start compiles are kept. The
spec's claim, an emptyDir (bounded by the model, and requested as ephemeral storage), or directories on the node
(spec.modelCache.nodeLocal): a restart, a rollout or a scale-up there reads the weights and the compiled kernels
instead of downloading and compiling them.

The node's directories are keyed by UIDs, never by names, so a namespace or a service deleted and made again (by
another tenant) starts from empty directories of its own:

    <nodeCacheDir>/ns.<namespace uid>/models/<model>-<hash>   /models       the weights: the namespace's services
                                                                            of that model share them
    <nodeCacheDir>/ns.<namespace uid>/services/<service uid>  /models/vllm  what a start compiles (vLLM's cache,
                                                                            its AOT compile cache, inductor's):
                                                                            loaded as code, so one service's own

A hostPath has no size limit and nothing removes it: `cpullm node-cache-stale` lists the directories whose
namespace or service is gone (docs/tenancy.md)."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec, ModelSource
from cpullm.core import constants as c
from cpullm.core.children.common import binary_quantity
from cpullm.errors import NodeCacheDisabled

COMPILE_CACHE_VOLUME = "compile-cache"
NAMESPACE_DIR_PREFIX = "ns."  # a "." no namespace name has: never the directory of the layout keyed by name
MODELS_DIR = "models"
SERVICES_DIR = "services"
# Offline (io/files.py) there is no Namespace object, and a service file may have no uid: the paths are rendered
# with these in their place, and nothing else that is not a UUID is taken.
UNKNOWN_NAMESPACE_UID = "<namespace-uid>"
UNKNOWN_SERVICE_UID = "<service-uid>"
# A Kubernetes UID as the API server writes it: a UUID in canonical lowercase form (one spelling, one directory).
UID_PATTERN = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
NAMESPACE_DIR = re.compile(re.escape(NAMESPACE_DIR_PREFIX) + f"({UID_PATTERN.pattern})")


@dataclass(frozen=True)
class NodeCachePaths:
    weights: str  # the namespace's, per model: HF_HOME's volume
    compiled: str  # the service's own: VLLM_CACHE_ROOT's volume


def model_directory(model: ModelSource) -> str:
    """One model and revision's directory name: readable, and one path component whatever the name holds."""
    identity = f"{model.name}@{model.revision or ''}"
    readable = re.sub(r"[^A-Za-z0-9._-]+", "--", model.name).strip("-.")[:80] or "model"
    return f"{readable}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"


def _uid(uid: str | None, whose: str) -> str:
    if uid is None or not UID_PATTERN.fullmatch(uid):
        raise NodeCacheDisabled(
            f"spec.modelCache.nodeLocal: the node directories are keyed by the {whose}'s UID, and {uid!r} is not a "
            "UUID: no node directory is made for it"
        )
    return uid


def node_cache_paths(
    directory: str | None, namespace_uid: str | None, service_uid: str | None, model: ModelSource
) -> NodeCachePaths:
    """The node directories of one service: under the operator's directory (the tenant chooses none of it), per
    namespace UID (a tenant's gated model is no other's to read, and a namespace made again under the same name
    finds nothing of the last one's), the weights per model and revision (the namespace's services of it share
    them), what a start compiles per service UID (loaded as code: only pods of the same CpuLLMService object load
    it). A UID that is not a UUID is refused, so no path is made of anything else; offline, the namespace's
    UID (and the service's, when its file has none) is UNKNOWN_*_UID."""
    if not directory:
        raise NodeCacheDisabled(
            "spec.modelCache.nodeLocal: this operator keeps no node cache directory (its setting nodeCacheDir, "
            "CPULLM_NODE_CACHE_DIR, is unset): use persistentVolumeClaim or emptyDir, or ask its administrator"
        )
    if namespace_uid == UNKNOWN_NAMESPACE_UID:
        service = UNKNOWN_SERVICE_UID if service_uid is None else _uid(service_uid, "service")
    else:
        namespace_uid, service = _uid(namespace_uid, "namespace"), _uid(service_uid, "service")
    namespace_dir = f"{directory.rstrip('/')}/{NAMESPACE_DIR_PREFIX}{namespace_uid}"
    return NodeCachePaths(
        weights=f"{namespace_dir}/{MODELS_DIR}/{model_directory(model)}",
        compiled=f"{namespace_dir}/{SERVICES_DIR}/{service}",
    )


def stale_node_cache(
    entries: Mapping[str, float], namespace_uids: Collection[str], service_uids: Collection[str], before: float
) -> tuple[list[str], list[str]]:
    """(the stale entries, the foreign ones) of a node cache directory, given the UIDs of the cluster's Namespaces
    and CpuLLMServices: `entries` maps each entry of the directory, and each of a namespace directory's services/,
    by its path relative to the directory, to when it last changed. Stale: a namespace directory whose namespace
    is gone (all of it), a service directory whose service is gone; an entry changed since `before` (the listing
    of the cluster, less a margin) is not, as it may be an object's made since. Foreign: a top entry not of this
    layout (the layout keyed by namespace name before it, anything else), which is left to whoever knows it."""
    stale, foreign = [], []
    for path, changed in sorted(entries.items()):
        top, _, rest = path.partition("/")
        namespace = NAMESPACE_DIR.fullmatch(top)
        if namespace is None:
            if not rest:
                foreign.append(path)
            continue
        if changed >= before:
            continue
        if not rest:
            if namespace.group(1) not in namespace_uids:
                stale.append(path)
            continue
        parent, _, service = rest.partition("/")
        if (
            parent == SERVICES_DIR
            and namespace.group(1) in namespace_uids
            and UID_PATTERN.fullmatch(service)
            and service not in service_uids
        ):
            stale.append(path)
    return stale, foreign


def model_cache_limit(plan: Plan) -> int:
    """The default model cache's size limit: room for the checkpoint as downloaded (up to twice the served
    bytes, a float32 checkpoint served in bfloat16) and its tokenizer and configs, in whole GiB. A pod that
    fills more is evicted instead of filling the node's disk."""
    return math.ceil((2 * plan.weights_bytes + c.MODEL_CACHE_SPARE_BYTES) / c.GiB) * c.GiB


def model_cache_source(spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any]:
    """The model cache volume's source: the spec's claim or emptyDir, the node's directory, else an emptyDir bounded
    by the model."""
    if spec.model_cache and spec.model_cache.persistent_volume_claim:
        return {"persistentVolumeClaim": {"claimName": spec.model_cache.persistent_volume_claim.claim_name}}
    if spec.model_cache and spec.model_cache.empty_dir and spec.model_cache.empty_dir.size_limit:
        return {"emptyDir": {"sizeLimit": spec.model_cache.empty_dir.size_limit}}
    if plan.node_cache_path:
        return {"hostPath": {"path": plan.node_cache_path, "type": "DirectoryOrCreate"}}
    return {"emptyDir": {"sizeLimit": binary_quantity(model_cache_limit(plan))}}


def compile_cache_volume(plan: Plan) -> dict[str, Any] | None:
    """With the node's directories, the service's own for what a start compiles, mounted over VLLM_CACHE_ROOT
    (/models/vllm) in the weights' volume; None: that is in the model cache volume."""
    if not plan.node_compile_cache_path:
        return None
    return {
        "name": COMPILE_CACHE_VOLUME,
        "hostPath": {"path": plan.node_compile_cache_path, "type": "DirectoryOrCreate"},
    }


def ephemeral_storage_request(cache: dict[str, Any]) -> dict[str, str]:
    """An emptyDir cache with a size limit is requested as ephemeral storage, so the scheduler places the pod
    only where the node's disk can hold the model (a node that cannot shows as the Ready condition's
    Unschedulable message). The kubelet counts a pod's emptyDir volumes, writable layer and logs as its ephemeral
    storage, never a hostPath: the node's directories are requested as nothing and bounded by nothing."""
    limit = (cache.get("emptyDir") or {}).get("sizeLimit")
    return {"ephemeral-storage": limit} if limit else {}
