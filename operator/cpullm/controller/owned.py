"""Writing a child only where it is its owner's: the rule the service and gateway reconcilers share.

A child the owner's watches showed under its control is applied over as they showed it; any other is applied as a
create (io/kube.py `apply`): the API server makes it, or refuses it untouched because an object of that name exists,
and only then is that object read. Someone else's object is never adopted or changed, and a first write costs no
read (docs/tenancy.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from cpullm.core.observation import Ownership
from cpullm.errors import ChildConflict, ChildExists


class OwnedWrites(Protocol):
    def apply(self, manifest: Mapping[str, Any], over: Ownership | None) -> dict[str, Any]: ...
    def ownership(self, api_version: str, kind: str, namespace: str, name: str) -> Ownership | None: ...


def write_owned(
    kube: OwnedWrites,
    child: Mapping[str, Any],
    owner_uid: str,
    known: Ownership | None,
    owner_kind: str,
    keep_existing: bool = False,
) -> Mapping[str, Any] | None:
    """Apply `child` over `known` (the owner's, as last seen or read; None: unknown); where an object of its name
    turns out to exist, read it: the owner's is written over as read (or, `keep_existing`, left as it is: None),
    anyone else's is a ChildConflict."""
    try:
        return kube.apply(child, known)
    except ChildExists:
        found = read_owned(kube, child, owner_uid, owner_kind)
        if found is not None and keep_existing:
            return None
        return kube.apply(child, found)  # the owner's (its watches were behind), or gone again


def read_owned(kube: OwnedWrites, child: Mapping[str, Any], owner_uid: str, owner_kind: str) -> Ownership | None:
    """The object of the child's name as read now (None: absent); a ChildConflict if the owner does not control it."""
    meta = child["metadata"]
    found = kube.ownership(child["apiVersion"], child["kind"], meta["namespace"], meta["name"])
    if found is not None and found.controller_uid != owner_uid:
        raise ChildConflict(
            f"{child['kind']} {meta['namespace']}/{meta['name']} exists and is not controlled by this {owner_kind}: "
            f"it is left untouched; delete or rename it, or give the {owner_kind} another name"
        )
    return found
