"""Generates the CpuLLMService CRD from the pydantic models: the spec model is the schema.

Pydantic's JSON Schema is turned into a structural OpenAPI v3 schema: $refs inlined, Optional unwrapped,
titles dropped, free-form maps marked x-kubernetes-preserve-unknown-fields.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Mapping
from typing import Any

from cpullm.api import gateway, performance
from cpullm.api.plan import Plan
from cpullm.api.spec import (
    GROUP,
    KIND,
    MAX_NAME_LENGTH,
    NAME_PATTERN,
    NAME_RULE,
    PLURAL,
    SHORT_NAME,
    SINGULAR,
    VERSION,
    CpuLLMServiceSpec,
    parse_spec,
    too_deep,
)

_DROP = {"title", "$defs"}

log = logging.getLogger(__name__)


def _openapi(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema:
        target = copy.deepcopy(defs[schema["$ref"].rsplit("/", 1)[-1]])  # a model used twice: two copies, no YAML alias
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return _openapi(merged, defs)
    if "anyOf" in schema:
        branches = [b for b in schema["anyOf"] if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"unions are not structural: {schema}")
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        return _openapi({**branches[0], **rest}, defs)

    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROP or (key == "default" and value is None):
            continue
        if key == "properties":
            out[key] = {name: _openapi(prop, defs) for name, prop in value.items()}
        elif key == "items":
            out[key] = _openapi(value, defs)
        elif key == "additionalProperties":
            if value is False:
                continue  # extra=forbid: the API server prunes unknown fields anyway
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            else:
                out[key] = _openapi(value, defs)
        else:
            out[key] = value
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def model_schema(model: type[Any]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="serialization")
    return _openapi(raw, raw.get("$defs", {}))


def condition_schema(types: str) -> dict[str, Any]:
    """A metav1.Condition; `types` says which types there are."""
    return {
        "type": "object",
        "required": ["type", "status", "reason", "message", "lastTransitionTime"],
        "properties": {
            "type": {"type": "string", "description": types},
            "status": {
                "type": "string",
                "enum": ["True", "False", "Unknown"],
                "description": "True, False or Unknown.",
            },
            "reason": {"type": "string", "description": "One CamelCase word for machines (e.g. KVCacheTooSmall)."},
            "message": {"type": "string", "description": "What happened and, when False, what to change."},
            "observedGeneration": {
                "type": "integer",
                "format": "int64",
                "description": "The spec's generation this condition was computed for.",
            },
            "lastTransitionTime": {
                "type": "string",
                "format": "date-time",
                "description": "When the status last changed.",
            },
        },
    }


def status_schema() -> dict[str, Any]:
    condition = condition_schema("Planned, Ready, Monitoring or Autoscaling.")
    return {
        "type": "object",
        "description": "What the operator planned and observed; written by the operator only.",
        "properties": {
            "observedGeneration": {
                "type": "integer",
                "format": "int64",
                "description": "The spec's generation the status was last computed for.",
            },
            "replicas": {"type": "integer", "description": "Pods of the Deployment."},
            "readyReplicas": {"type": "integer", "description": "Ready pods of the Deployment."},
            "selector": {"type": "string", "description": "Label selector of the pods (scale subresource)."},
            "conditions": {
                "type": "array",
                "items": condition,
                "description": "Planned, Ready, and Monitoring, Autoscaling or Routing when the spec asks for them.",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
            "plan": {**model_schema(Plan), "description": "What the planner decided (see `cpullm plan`)."},
            "vllmSizing": {
                "type": "object",
                "description": "vLLM's own size of a model no formula of the operator knows, as its sizing Job "
                "reported it: asked once per config, dtype and vLLM image (key).",
                "properties": {
                    "key": {"type": "string", "description": "The question's digest: config, dtype and image."},
                    "image": {"type": "string", "description": "The vLLM image that sized the model."},
                    "report": {"type": "string", "description": "The report (JSON) of cpullm/meta_size.py."},
                },
            },
            "optionalChildren": {
                "type": "array",
                "items": {"type": "string"},
                "description": "The optional children last applied, as Kind (named as the service: PodMonitor, "
                "HorizontalPodAutoscaler, ScaledObject, PodDisruptionBudget, InferencePool, HTTPRoute) or Kind/name "
                "(the router's Deployment/<name>-router, ConfigMap/<name>-router, Service/<name>-servers): each is "
                "deleted when the plan stops asking for it.",
            },
        },
    }


Column = tuple[str, str, str, int]  # a printer column: name, type, JSON path, priority


def _crd(
    kind: str,
    plural: str,
    singular: str,
    scope: str,
    properties: dict[str, Any],
    columns: list[Column],
    *,
    rules: list[dict[str, Any]] | None = None,
    subresources: dict[str, Any] | None = None,
    names: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A CRD of ours at VERSION (served and stored): an object schema whose spec is required, its printer columns,
    and `names` beside kind, listKind, plural and singular (short names, categories)."""
    schema: dict[str, Any] = {"type": "object", "required": ["spec"]}
    if rules:
        schema["x-kubernetes-validations"] = rules
    schema["properties"] = {
        "apiVersion": {"type": "string", "description": f"{GROUP}/{VERSION}"},
        "kind": {"type": "string", "description": kind},
        # The API server takes nothing but a type here ("must not specify anything other than name and
        # generateName"): kubectl explain describes metadata itself.
        "metadata": {"type": "object"},
        **properties,
    }
    version: dict[str, Any] = {"name": VERSION, "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}
    if subresources:
        version["subresources"] = subresources
    version["additionalPrinterColumns"] = [
        {"name": n, "type": t, "jsonPath": p, **({"priority": prio} if prio else {})} for n, t, p, prio in columns
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": singular, **(names or {})},
            "scope": scope,
            "versions": [version],
        },
    }


def _name_rule(kind: str) -> dict[str, Any]:
    """Its children take the object's name: a DNS-1035 label (checked on metadata.name by CEL)."""
    return {
        "rule": f"self.metadata.name.matches('{NAME_PATTERN}') && size(self.metadata.name) <= {MAX_NAME_LENGTH}",
        "message": NAME_RULE.replace("CpuLLMService", kind),
    }


def build_crd() -> dict[str, Any]:
    spec = model_schema(CpuLLMServiceSpec)
    spec["description"] = "A model served by vLLM's CPU backend, planned for the cluster's CPU topology."
    columns: list[Column] = [
        ("Model", "string", ".spec.model.name", 0),
        ("Placement", "string", ".status.plan.placement", 0),
        ("TP", "integer", ".status.plan.tensorParallelSize", 0),
        ("KV GiB", "integer", ".status.plan.kvCacheGiB", 1),
        ("Bind", "string", ".status.plan.threadsBind", 1),
        ("Replicas", "integer", ".spec.replicas", 0),
        ("Ready", "integer", ".status.readyReplicas", 0),
        ("Status", "string", '.status.conditions[?(@.type=="Ready")].reason', 0),
        ("Age", "date", ".metadata.creationTimestamp", 0),
        # The plan's one-line summary: the strategy, and why TP, KV, binding and memory are what they are.
        ("Plan", "string", '.status.conditions[?(@.type=="Planned")].message', 1),
    ]
    scale = {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    properties = {"spec": spec, "status": status_schema()}
    return _crd(
        KIND,
        PLURAL,
        SINGULAR,
        "Namespaced",
        properties,
        columns,
        rules=[_name_rule(KIND)],
        subresources={"status": {}, "scale": scale},
        names={"shortNames": [SHORT_NAME], "categories": ["all"]},
    )


def build_performance_crd() -> dict[str, Any]:
    """NodePerformance: cluster-scoped, one per node and named after it; what `cpullm probe` measured."""
    spec = model_schema(performance.NodePerformanceSpec)
    spec["description"] = "What `cpullm probe` measured of the node's cores, per NUMA node (docs/performance.md)."
    columns: list[Column] = [
        ("CPU", "string", ".spec.cpu.model", 0),
        ("vLLM", "string", ".spec.vllm", 0),
        ("Measured", "string", ".spec.measuredAt", 0),
        ("Age", "date", ".metadata.creationTimestamp", 0),
    ]
    return _crd(performance.KIND, performance.PLURAL, performance.SINGULAR, "Cluster", {"spec": spec}, columns)


def build_gateway_crd() -> dict[str, Any]:
    """CpuLLMGateway: namespaced; one OpenAI endpoint in front of CpuLLMServices, a key per team (docs/gateway.md)."""
    spec = model_schema(gateway.CpuLLMGatewaySpec)
    spec["description"] = "One OpenAI endpoint for several CpuLLMServices, with a key per team (docs/gateway.md)."
    status = {
        "type": "object",
        "description": "What the gateway routes and whether it serves; written by the operator only.",
        "properties": {
            "observedGeneration": {"type": "integer", "format": "int64", "description": "The spec's generation seen."},
            "endpoint": {"type": "string", "description": "The gateway's address inside the cluster."},
            "readyReplicas": {"type": "integer", "description": "Ready gateway pods."},
            "routes": {
                "type": "array",
                "description": "Each model name the gateway routes, and the service that serves it.",
                "items": {
                    "type": "object",
                    "properties": {
                        "model": {"type": "string", "description": "The name requests give ('model')."},
                        "service": {"type": "string", "description": "The CpuLLMService serving it."},
                    },
                },
            },
            "conditions": {
                "type": "array",
                "items": condition_schema("Routed or Ready."),
                "description": "Routed (every listed service found and routed) and Ready (a gateway pod serves).",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
        },
    }
    columns: list[Column] = [
        ("Endpoint", "string", ".status.endpoint", 0),
        ("Ready", "integer", ".status.readyReplicas", 0),
        ("Status", "string", '.status.conditions[?(@.type=="Routed")].reason', 0),
        ("Age", "date", ".metadata.creationTimestamp", 0),
        ("Routes", "string", '.status.conditions[?(@.type=="Routed")].message', 1),
    ]
    return _crd(
        gateway.KIND,
        gateway.PLURAL,
        gateway.SINGULAR,
        "Namespaced",
        {"spec": spec, "status": status},
        columns,
        rules=[_name_rule(gateway.KIND)],
        subresources={"status": {}},
        names={"shortNames": [gateway.SHORT_NAME], "categories": ["all"]},
    )


@functools.cache
def spec_schema() -> dict[str, Any]:
    """The spec's schema, as stored specs are pruned against it: made once (~0.05 s), at the operator's start, so the
    first reconciles on several threads do not each make it."""
    return model_schema(CpuLLMServiceSpec)


def known_fields(value: Any, schema: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """`value` with what `schema` does not know dropped, as the API server prunes an object against a structural
    schema (properties, items, additionalProperties; x-kubernetes-preserve-unknown-fields keeps all), and the dropped
    fields' paths. Recursive: call it on a value whose depth is bounded (api/spec.py too_deep)."""
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        pairs = [known_fields(item, schema["items"]) for item in value]
        return [kept for kept, _ in pairs], [f"[{i}].{p}" for i, (_, gone) in enumerate(pairs) for p in gone]
    if not isinstance(value, Mapping) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return value, []
    properties, values = schema.get("properties"), schema.get("additionalProperties")
    if not isinstance(properties, Mapping) and not isinstance(values, Mapping):
        return value, []
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    for key, item in value.items():
        field = properties.get(key) if isinstance(properties, Mapping) else None
        field = field if field is not None else values if isinstance(values, Mapping) else None
        if field is None:
            dropped.append(str(key))
            continue
        kept[key], below = known_fields(item, field)
        dropped += [f"{key}.{p}" if not p.startswith("[") else f"{key}{p}" for p in below]
    return kept, dropped


def parse_stored_spec(raw: Mapping[str, Any] | None) -> CpuLLMServiceSpec:
    """A spec as the API server stored it. The API server prunes what its CRD does not know, so a field this
    version's models do not know is a newer CRD's (shown with its default while an upgrade rolls, or after a
    downgrade of the operator alone): it is dropped, where a spec from a file refuses it (parse_spec). The depth is
    bounded first."""
    if too_deep(raw):
        return parse_spec(raw)  # refused, before a recursive walk
    kept, dropped = known_fields(raw or {}, spec_schema())
    if dropped:
        _log_dropped(tuple(sorted(dropped)))
    return parse_spec(kept)


@functools.cache
def _log_dropped(paths: tuple[str, ...]) -> None:
    """Once per process for each set of fields: every reconcile of every such service reads them."""
    log.info("stored specs carry fields this operator does not know (a newer CRD's), left out: %s", ", ".join(paths))
