"""Which nodes a pod may land on, said with the labels that made the chosen nodes eligible, never their names:
a node of the same shape joining or leaving the pool (autoscaler, maintenance) then leaves the pod template as
it was, and no running server is rolled.

Each chosen node contributes a node selector term made of what its labels say of its shape (core/topology.py):
its arch, the label its NUMA count is read from, the label each required ISA flag came from, its SMT, CPU
manager and topology manager labels (or their absence). Nodes labelled the same way give the same term, so a
pool needs one term per way of labelling, not one per node. The scheduler's resource fit keeps pods off
matching nodes too small for them; CPU count and memory are not labels. Facts from a NodeResourceTopology are no
labels either: a node they show the pod cannot fit, but labelled like the chosen ones, is excluded by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cpullm.core.topology import (
    ARCH_LABEL,
    CPU_MANAGER_POLICY_LABEL,
    ISA_LABEL_PREFIX,
    NFD_CPUID_PREFIX,
    NFD_NUMA_COUNT,
    NFD_SMT,
    NUMA_NODES_LABEL,
    TOPOLOGY_MANAGER_POLICY_LABEL,
    NodeProfile,
    lscpu_flag,
)

Expression = tuple[str, str, tuple[str, ...]]


def _equals(key: str, value: str) -> Expression:
    return (key, "In", (value,))


def _absent(key: str) -> Expression:
    return (key, "DoesNotExist", ())


def _optional(key: str, value: str | None) -> Expression:
    return _absent(key) if value is None else _equals(key, value)


def _isa_expressions(node: NodeProfile, flag: str) -> list[Expression]:
    """The label that gave this node `flag`: our override, or NFD's (which our override could veto)."""
    override = ISA_LABEL_PREFIX + flag
    if node.labels.get(override) == "true":
        return [_equals(override, "true")]
    nfd = next(k for k, v in node.labels.items() if k.startswith(NFD_CPUID_PREFIX) and lscpu_flag(k) == flag)
    return [_equals(nfd, node.labels[nfd]), (override, "NotIn", ("false",))]


def node_signature(node: NodeProfile, required_isa: Iterable[str]) -> tuple[Expression, ...] | None:
    """The label expressions that select nodes like this one, or None when its arch is no label (then only
    its name can select it)."""
    if ARCH_LABEL not in node.labels:
        return None
    labels = node.labels
    expressions = [_equals(ARCH_LABEL, labels[ARCH_LABEL])]
    if NUMA_NODES_LABEL in labels:
        expressions.append(_equals(NUMA_NODES_LABEL, labels[NUMA_NODES_LABEL]))
    elif NFD_NUMA_COUNT in labels:
        expressions += [_equals(NFD_NUMA_COUNT, labels[NFD_NUMA_COUNT]), _absent(NUMA_NODES_LABEL)]
    else:
        expressions += [_absent(NUMA_NODES_LABEL), _absent(NFD_NUMA_COUNT)]
    for flag in sorted(set(required_isa)):
        expressions += _isa_expressions(node, flag)
    for label in (NFD_SMT, CPU_MANAGER_POLICY_LABEL, TOPOLOGY_MANAGER_POLICY_LABEL):
        expressions.append(_optional(label, labels.get(label)))
    return tuple(sorted(set(expressions)))


def shape_node_terms(
    nodes: Sequence[NodeProfile], required_isa: Iterable[str], excluded: Sequence[NodeProfile] = ()
) -> list[dict[str, Any]]:
    """Node selector terms (ORed) that select the chosen nodes and the nodes labelled like them, but not the
    `excluded` nodes labelled like them (nodes the labels cannot tell apart from the chosen ones, which facts from
    another source say the pod does not fit: core/node_topology.py)."""
    required = list(required_isa)
    signatures: set[tuple[Expression, ...]] = set()
    by_name: list[str] = []
    for node in nodes:
        signature = node_signature(node, required)
        if signature is None:
            by_name.append(node.name)
        else:
            signatures.add(signature)
    exclusions: dict[tuple[Expression, ...], list[str]] = {}
    for node in excluded:
        signature = node_signature(node, required)
        if signature in signatures:
            exclusions.setdefault(signature, []).append(node.name)
    terms: list[dict[str, Any]] = [
        {"matchExpressions": [_expression(e) for e in signature], **_not_named(exclusions.get(signature, []))}
        for signature in sorted(signatures)
    ]
    # A metadata.name field selector takes one value per requirement: one term per node.
    terms += [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]} for name in sorted(by_name)
    ]
    return terms


def _not_named(names: list[str]) -> dict[str, Any]:
    """A metadata.name field selector takes one value per requirement: one NotIn per node."""
    if not names:
        return {}
    return {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [n]} for n in sorted(names)]}


def combine_terms(user_terms: Sequence[Mapping[str, Any]], shape_terms: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The user's required terms AND the shape's: terms are ORed and a term's requirements ANDed, so every
    user term is joined with every shape term."""
    if not user_terms:
        return [dict(term) for term in shape_terms]
    combined = []
    for user in user_terms:
        for shape in shape_terms:
            term: dict[str, Any] = {}
            for key in ("matchExpressions", "matchFields"):
                joined = [*(user.get(key) or []), *(shape.get(key) or [])]
                if joined:
                    term[key] = joined
            combined.append(term)
    return combined


def _expression(expression: Expression) -> dict[str, Any]:
    key, operator, values = expression
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}
