"""Offline facts for `cpullm plan` and `cpullm render`: what the operator gathers from the cluster, read from
files instead (a CpuLLMService file, `kubectl get nodes -o yaml`, an optional config.json)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cpullm.core.decision import NamespaceFacts
from cpullm.core.sizing import ModelFiles
from cpullm.core.topology import NodeProfile, parse_node
from cpullm.errors import InvalidSpec, NodeLabelError


def read_objects(path: str) -> Iterator[dict[str, Any]]:
    """Every object in a YAML/JSON file: several documents, or `kind: List` items (kubectl get -o yaml)."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        if not isinstance(doc, dict):
            raise InvalidSpec(f"{path}: expected objects, found {type(doc).__name__}")
        if doc.get("kind", "").endswith("List") and "items" in doc:
            yield from doc["items"]
        else:
            yield doc


def load_nodes(path: str, warn: Callable[[str], None]) -> list[NodeProfile]:
    """The usable nodes of a file; each node whose labels cannot be parsed is skipped with a warning."""
    profiles = []
    for obj in read_objects(path):
        if obj.get("kind") != "Node":
            continue
        try:
            profiles.append(parse_node(obj))
        except NodeLabelError as err:
            warn(f"{err.message}; node skipped")
    return profiles


def load_service(path: str) -> dict[str, Any]:
    """The one CpuLLMService of a file, with the name and namespace an unnamed one is rendered under."""
    services = [o for o in read_objects(path) if o.get("kind") == "CpuLLMService"]
    if len(services) != 1:
        raise InvalidSpec(f"{path}: expected one CpuLLMService, found {len(services)}")
    service = dict(services[0])
    service["metadata"] = {"name": "unnamed", "namespace": "default", **(service.get("metadata") or {})}
    return service


@dataclass(frozen=True)
class OfflineCluster:
    """The cluster as seen offline: a namespace with no Pod Security level, and $HF_TOKEN standing in for the
    spec's hfTokenSecret (unset: anonymous Hub access, which is enough for public models)."""

    hf_token: str | None = None

    def read_namespace(self, namespace: str) -> NamespaceFacts:
        return NamespaceFacts()

    def read_secret_key(self, namespace: str, name: str, key: str) -> str | None:
        return self.hf_token or ""


@dataclass(frozen=True)
class ConfigFile:
    """A local config.json answering for whichever model the spec names (`--model-config`)."""

    path: str

    def fetch(self, name: str, revision: str | None, token: str | None) -> ModelFiles:
        return ModelFiles(config=json.loads(Path(self.path).read_text()), checkpoint_total_bytes=None)
