"""What every owned child shares: the owner, its labels and selector, owner references, quantities."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import API_VERSION, GROUP, KIND, CpuLLMServiceSpec

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "cpullm-operator"
SERVICE_LABEL = "cpullm.io/service"
PORT_NAME = "http"


@dataclass(frozen=True)
class Owner:
    """The CpuLLMService the children belong to. uid is None when rendering offline (no owner reference)."""

    name: str
    namespace: str
    uid: str | None = None


# One kind of object the operator owns per service: a pure function of the owner, the spec and the plan; None
# when the spec does not ask for it.
ChildBuilder = Callable[[Owner, CpuLLMServiceSpec, Plan], dict[str, Any] | None]


def binary_quantity(n: int) -> str:
    """A byte count in the API server's canonical form (largest binary suffix that divides it), so what is
    rendered is what the server stores: 7168Mi is stored as 7Gi."""
    for suffix, factor in (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n and n % factor == 0:
            return f"{n // factor}{suffix}"
    return str(n)


def labels(owner: Owner) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": owner.name,
        MANAGED_BY_LABEL: MANAGED_BY,
        SERVICE_LABEL: owner.name,
    }


def selector(owner: Owner) -> dict[str, str]:
    return {SERVICE_LABEL: owner.name}


def owner_reference(kind: str, name: str, uid: str) -> dict[str, Any]:
    """The controller owner reference of a child of one of our kinds: garbage-collected with it, and the mark of
    whose child it is (the chart's write policy checks it)."""
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(owner: Owner) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": owner.name, "namespace": owner.namespace, "labels": labels(owner)}
    if owner.uid:
        meta["ownerReferences"] = [owner_reference(KIND, owner.name, owner.uid)]
    return meta


def controller_reference(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    """An object's controller owner reference ({} for none): who may change and delete it."""
    return next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), {})


def controlling_service(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the CpuLLMService controlling an object (the owner reference `metadata` writes), or None.
    What ties a child to its service, by UID: labels can be copied onto any object, and a child left by a
    service deleted and made again under the same name names the old UID."""
    ref = controller_reference(meta)
    if str(ref.get("apiVersion", "")).split("/")[0] != GROUP or ref.get("kind") != KIND:
        return None
    return str(ref.get("name", "")), str(ref.get("uid", ""))


def suffixed_name(owner: Owner, suffix: str, limit: int) -> str:
    """`<service>-<suffix>`, or when longer than `limit` the service's name cut short with a hash of it in
    between: distinct per service, and still a DNS label."""
    name = f"{owner.name}-{suffix}"
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(owner.name.encode()).hexdigest()[:8]
    return f"{owner.name[: limit - len(suffix) - len(digest) - 2].rstrip('-')}-{digest}-{suffix}"
