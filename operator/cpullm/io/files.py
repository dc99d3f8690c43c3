"""Offline facts for `cpullm plan` and `cpullm render`: what the operator gathers from the cluster, read from
files instead (a CpuLLMService file, `kubectl get nodes -o yaml`, an optional config.json)."""

from __future__ import annotations

import difflib
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from cpullm.api.spec import API_VERSION
from cpullm.core.children.model_cache import NAMESPACE_DIR, SERVICES_DIR, UNKNOWN_NAMESPACE_UID
from cpullm.core.daemonsets import DaemonPods, DaemonSetUnreadable, parse_daemonset
from cpullm.core.node_facts import NODE_FACT_SOURCES, NodeFact
from cpullm.core.observation import NamespaceFacts
from cpullm.core.sizing import CheckpointTensors, CheckpointUnreadable, ModelFiles
from cpullm.core.topology import NodeProfile, parse_node
from cpullm.errors import InvalidSpec, ModelConfigUnavailable, NodeLabelError

Parsed = TypeVar("Parsed")


class InputFileError(Exception):
    """A file named on the command line cannot be read, or holds none of what it was given for."""


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except OSError as err:
        raise InputFileError(f"{what} {path}: cannot read it ({err.strerror or type(err).__name__})") from None


def kinds_found(objects: Iterable[Mapping[str, Any]]) -> str:
    """'2 Service, 1 Nod': what a file held instead, for the message that says it held nothing usable."""
    counts = Counter(str(o.get("kind") or "no kind") for o in objects)
    return ", ".join(f"{n} {kind}" for kind, n in counts.most_common()) or "no object"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    guess = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {guess[0]}?)" if guess and guess[0] != word else ""


def read_objects(path: str, what: str = "file") -> Iterator[dict[str, Any]]:
    """Every object in a YAML/JSON file: several documents, or `kind: List` items (kubectl get -o yaml). `what`
    names the file in messages (the argument it came from)."""
    text = sys.stdin.read() if path == "-" else _read_text(Path(path), what)
    shown = "stdin" if path == "-" else path
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise InvalidSpec(f"{shown}: not YAML: {where}{problem}") from None
    for doc in docs:
        if not doc:
            continue
        if not isinstance(doc, dict):
            if isinstance(doc, str):
                raise InvalidSpec(f"{shown}: plain text, not YAML objects (kubectl get's table? write it with -o yaml)")
            raise InvalidSpec(f"{shown}: a YAML {type(doc).__name__} where objects were expected")
        if doc.get("kind", "").endswith("List") and "items" in doc:
            yield from doc["items"]
        else:
            yield doc


def load_nodes(path: str, warn: Callable[[str], None]) -> list[NodeProfile]:
    """The usable nodes of a file; each node whose labels cannot be parsed is skipped with a warning."""
    return profile_nodes(read_node_file(path), warn)


def read_node_file(path: str) -> list[dict[str, Any]]:
    """The objects of a `--nodes` file, which must hold a Node: a file without one plans against no cluster."""
    objects = list(read_objects(path, "--nodes"))
    if not any(o.get("kind", "Node") == "Node" for o in objects):  # a node list's items may come without kind
        kinds = {str(o.get("kind")) for o in objects}
        hint = next((did_you_mean(k, ["Node"]) for k in kinds if did_you_mean(k, ["Node"])), "")
        raise InputFileError(
            f"--nodes {path}: no Node in it (found {kinds_found(objects)}){hint}; write it with "
            "`kubectl get nodes -o yaml > nodes.yaml`"
        )
    return objects


def _parse_each(
    objects: Iterable[Mapping[str, Any]],
    kind: str,
    parse: Callable[[Mapping[str, Any]], Parsed | None],
    unreadable: type[Exception],
    skipped: str,
    warn: Callable[[str], None],
) -> list[Parsed]:
    """Each object of `kind` parsed (None: nothing to keep); one that cannot be is left out and warned, with what
    leaving it out means (`skipped`)."""
    parsed = []
    for obj in objects:
        if obj.get("kind", "Node") != kind:  # a node list's items may come without their kind
            continue
        try:
            found = parse(obj)
        except unreadable as err:
            warn(f"{getattr(err, 'message', err)}; {skipped}")
            continue
        if found is not None:
            parsed.append(found)
    return parsed


def profile_nodes(objects: Iterable[Mapping[str, Any]], warn: Callable[[str], None]) -> list[NodeProfile]:
    """The usable nodes among these objects (a file's, or the cluster's); unparsable labels: skipped, warned."""
    return _parse_each(objects, "Node", parse_node, NodeLabelError, "node skipped", warn)


def profile_daemonsets(objects: Iterable[Mapping[str, Any]], warn: Callable[[str], None]) -> list[DaemonPods]:
    """The DaemonSets among these objects whose pods request CPU or memory (whole-node plans leave them room);
    an unreadable one is skipped, warned."""
    return _parse_each(objects, "DaemonSet", parse_daemonset, DaemonSetUnreadable, "DaemonSet skipped", warn)


def profile_node_facts(objects: Iterable[Mapping[str, Any]], warn: Callable[[str], None]) -> list[NodeFact]:
    """What the objects of each node-fact source among these say of their nodes (core/node_facts.py:
    NodeResourceTopologies); an unreadable one is skipped, warned (its node is then planned from its labels)."""
    skipped, found = "its node is planned from its labels", []
    for source in NODE_FACT_SOURCES:
        found += _parse_each(objects, source.kind, source.parse, source.error, skipped, warn)
    return found


def load_service(path: str) -> dict[str, Any]:
    """The one CpuLLMService of a file, with the name and namespace an unnamed one is rendered under."""
    objects = list(read_objects(path, "the CpuLLMService file"))
    services = [o for o in objects if o.get("kind") == "CpuLLMService"]
    if not services:
        hint = next((h for h in (did_you_mean(str(o.get("kind")), ["CpuLLMService"]) for o in objects) if h), "")
        raise InputFileError(f"{path}: no CpuLLMService in it (found {kinds_found(objects)}){hint}")
    if len(services) > 1:
        raise InputFileError(f"{path}: {len(services)} CpuLLMServices; give one per file")
    service = dict(services[0])
    if service.get("apiVersion", API_VERSION) != API_VERSION:  # absent: a sketch of one, read as the served version
        raise InputFileError(
            f"{path}: apiVersion {service.get('apiVersion')!r} is not served: a CpuLLMService is {API_VERSION}"
        )
    service["metadata"] = {"name": "unnamed", "namespace": "default", **(service.get("metadata") or {})}
    return service


@dataclass(frozen=True)
class OfflineCluster:
    """The cluster as seen offline: a namespace with no Pod Security level and no known UID (node cache paths are
    rendered with `<namespace-uid>` in its place), and $HF_TOKEN standing in for the spec's hfTokenSecret (unset:
    anonymous Hub access, which is enough for public models)."""

    hf_token: str | None = None

    def read_namespace(self, namespace: str) -> NamespaceFacts:
        return NamespaceFacts(uid=UNKNOWN_NAMESPACE_UID)

    def read_secret_key(self, namespace: str, name: str, key: str) -> str | None:
        return self.hf_token or ""


@dataclass(frozen=True)
class ConfigFile:
    """A local config.json, or a model directory (config.json and its safetensors files), answering for whichever
    model the spec names (`--model-config`). A directory's safetensors headers size the weights, as the Hub's do."""

    path: str

    def fetch(self, name: str, revision: str | None, token: str | None) -> ModelFiles:
        path = Path(self.path)
        config_path = path / "config.json" if path.is_dir() else path
        try:
            config = json.loads(_read_text(config_path, "--model-config"))
        except InputFileError as err:  # a reconcile's error, named with the file and said in one line
            raise ModelConfigUnavailable(str(err)) from None
        except ValueError as err:
            raise InvalidSpec(f"{config_path}: not JSON ({err})") from None
        if not isinstance(config, dict):
            raise InvalidSpec(f"{config_path}: a JSON {type(config).__name__}, not a config object")
        return ModelFiles(config=config, tensors=_local_tensors(path) if path.is_dir() else None)


def _local_tensors(directory: Path) -> CheckpointTensors | None:
    """The directory's safetensors headers, or None when it has none (or one cannot be read)."""
    if not any(directory.glob("*.safetensors")):
        return None
    # Imported here: huggingface_hub's client is a third of a plan's start, and most plans read no directory.
    from huggingface_hub import get_local_safetensors_metadata

    from cpullm.io.hub import summarize_headers

    try:
        metadata = get_local_safetensors_metadata(directory)
    except (OSError, ValueError):
        return None
    try:
        return summarize_headers(list(metadata.files_metadata.values()))
    except CheckpointUnreadable:
        return None


def scan_node_cache(directory: str) -> dict[str, float]:
    """A node cache directory's entries and each namespace directory's services/ entries (paths relative to it),
    with when each last changed; nothing is followed through a symbolic link."""
    root, entries = Path(directory), {}
    for top in root.iterdir():
        entries[top.name] = top.lstat().st_mtime
        services = top / SERVICES_DIR
        if (
            NAMESPACE_DIR.fullmatch(top.name)
            and not top.is_symlink()
            and services.is_dir()
            and not services.is_symlink()
        ):
            for service in services.iterdir():
                entries[f"{top.name}/{SERVICES_DIR}/{service.name}"] = service.lstat().st_mtime
    return entries


def cluster_uids(path: str) -> tuple[set[str], set[str]]:
    """The UIDs of the Namespaces and of the CpuLLMServices a listing holds (`kubectl get
    namespaces,cpullmservices -A -o yaml`); a listing without a Namespace is refused: every directory would look
    stale."""
    namespaces: set[str] = set()
    services: set[str] = set()
    for obj in read_objects(path, "--cluster"):
        uid = (obj.get("metadata") or {}).get("uid")
        if not isinstance(uid, str):
            continue
        if obj.get("kind") == "Namespace":
            namespaces.add(uid)
        elif obj.get("kind") == "CpuLLMService":
            services.add(uid)
    if not namespaces:
        raise InvalidSpec(f"{path}: no Namespace with a uid (kubectl get namespaces,cpullmservices -A -o yaml)")
    return namespaces, services
