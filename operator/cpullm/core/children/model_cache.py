"""The model cache volume (mounted at /models): where downloaded weights and what a start compiles are kept. The
spec's claim, an emptyDir (bounded by the model, and requested as ephemeral storage), or a directory on the node
(spec.modelCache.nodeLocal) that pods of the same namespace and model started on that node share: a restart, a
rollout or a scale-up there reads the weights and the compiled kernels instead of downloading and compiling them."""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec, ModelSource
from cpullm.core import constants as c
from cpullm.core.children.common import binary_quantity
from cpullm.errors import NodeCacheDisabled


def node_cache_path(directory: str | None, namespace: str, model: ModelSource) -> str:
    """The node directory of one namespace's model: under the operator's directory (the tenant chooses none of
    it), per namespace (a tenant's gated model is no other's to read), per model and revision (services serving it
    share it)."""
    if not directory:
        raise NodeCacheDisabled(
            "spec.modelCache.nodeLocal: this operator keeps no node cache directory (its setting nodeCacheDir, "
            "CPULLM_NODE_CACHE_DIR, is unset): use persistentVolumeClaim or emptyDir, or ask its administrator"
        )
    identity = f"{model.name}@{model.revision or ''}"
    readable = re.sub(r"[^A-Za-z0-9._-]+", "--", model.name).strip("-.")[:80] or "model"
    return f"{directory.rstrip('/')}/{namespace}/{readable}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"


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


def ephemeral_storage_request(cache: dict[str, Any]) -> dict[str, str]:
    """An emptyDir cache with a size limit is requested as ephemeral storage, so the scheduler places the pod
    only where the node's disk can hold the model (a node that cannot shows as the Ready condition's
    Unschedulable message)."""
    limit = (cache.get("emptyDir") or {}).get("sizeLimit")
    return {"ephemeral-storage": limit} if limit else {}
