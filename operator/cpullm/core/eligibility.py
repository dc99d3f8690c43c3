"""Which nodes can run a service at all, before any sizing: a named, ordered chain of checks.

Each check answers None (the node passes) or why it cannot run the service; the first failing check is the
node's rejection, so the order is the order a person would ask in: can anything be scheduled there, is there
an image for it, does its CPU have what the model needs, and only then do the user's placement rules match.
The checks read the spec as `Needs`, worked out once per spec, not once per node (thousands per reconcile).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cpullm.api.spec import (
    CpuLLMServiceSpec,
    KVCacheDType,
    NodeSelectorOperator,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Toleration,
    is_int64,
)
from cpullm.core import constants as c
from cpullm.core.sizing import ModelSize
from cpullm.core.topology import NFD_MULTI_NUMA, NUMA_COUNT_LABELS, NUMA_SOURCE_UNCOUNTED, NodeProfile, Taint


@dataclass(frozen=True)
class Needs:
    """What the checks read from a spec."""

    image: str | None
    required_isa: frozenset[str]
    node_selector: Mapping[str, str]
    required_terms: list[NodeSelectorTerm]  # the user's required node affinity terms, ORed
    tolerations: tuple[Toleration, ...]
    model: ModelSize | None  # None: the model is not known yet (a node event's first look)
    fp8_kv_cache: bool
    # The chain for these needs, worked out once: the kernels check only when the model is quantized or the KV
    # cache fp8 (asked once per node of thousands, an idle check is not free). A plain field, not a cached
    # property: node_rejection reads it once per node, and a descriptor lookup there cost ~10% of a 5,000-node plan.
    checks: tuple[EligibilityCheck, ...]

    @classmethod
    def of(cls, spec: CpuLLMServiceSpec, model: ModelSize | None = None) -> Needs:
        terms = spec.affinity.required_node_terms if spec.affinity else []
        isa = frozenset(spec.cpu.required_isa)
        fp8 = spec.kv_cache_dtype == KVCacheDType.FP8
        kernels = fp8 or (model is not None and model.quantization is not None)
        checks = tuple(check for check in ELIGIBILITY_CHECKS if kernels or check.reject is not _runs_the_kernels)
        return cls(spec.image, isa, spec.node_selector, terms, tuple(spec.tolerations), model, fp8, checks)


@dataclass(frozen=True)
class EligibilityCheck:
    name: str
    reject: Callable[[Needs, NodeProfile], str | None]


def _schedulable(needs: Needs, node: NodeProfile) -> str | None:
    return "unschedulable (cordoned)" if node.unschedulable else None


def _has_image(needs: Needs, node: NodeProfile) -> str | None:
    if needs.image is None and node.arch not in c.IMAGE_ARCH_SUFFIX:
        return f"arch {node.arch} has no default vLLM CPU image (set spec.image)"
    return None


def _numa_count_known(needs: Needs, node: NodeProfile) -> str | None:
    """A node known to have several NUMA nodes but not how many would be planned as one: a rank across the
    sockets, the slowest way to run vLLM there. Refused with the fix, never guessed."""
    if node.numa_source != NUMA_SOURCE_UNCOUNTED:
        return None
    return (
        f"NUMA count unknown ({NFD_MULTI_NUMA}=true: more than one NUMA node, no {' or '.join(NUMA_COUNT_LABELS)}): "
        "install the chart with nodeFeatureRule.enabled=true (NFD then publishes the count), or label the node "
        f"{NUMA_COUNT_LABELS[0]}=N"
    )


def _has_isa(needs: Needs, node: NodeProfile) -> str | None:
    missing = sorted(needs.required_isa - node.isa)
    return "lacks ISA " + ",".join(missing) if missing else None


def _runs_the_kernels(needs: Needs, node: NodeProfile) -> str | None:
    """vLLM CPU's kernels for the model's quantization and for an fp8 KV cache need some ISA."""
    problem = needs.model.node_problem(node.isa) if needs.model else None
    if problem is None and needs.fp8_kv_cache and not node.isa & c.FP8_KV_CACHE_ISA:
        problem = f"lacks {' or '.join(sorted(c.FP8_KV_CACHE_ISA))} for an fp8 KV cache"
    return problem


def _matches_node_selector(needs: Needs, node: NodeProfile) -> str | None:
    for key, value in needs.node_selector.items():
        if node.labels.get(key) != value:
            return f"nodeSelector {key}={value} does not match"
    return None


def _matches_required_affinity(needs: Needs, node: NodeProfile) -> str | None:
    terms = needs.required_terms
    if terms and not any(_matches_term(term, node) for term in terms):
        return "required node affinity does not match"
    return None


def _taints_tolerated(needs: Needs, node: NodeProfile) -> str | None:
    for taint in node.taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not any(_tolerates(t, taint) for t in needs.tolerations):
            return f"taint {taint.key}{'=' + taint.value if taint.value else ''}:{taint.effect} not tolerated"
    return None


ELIGIBILITY_CHECKS: tuple[EligibilityCheck, ...] = (
    EligibilityCheck("schedulable", _schedulable),
    EligibilityCheck("image", _has_image),
    EligibilityCheck("numa-count", _numa_count_known),
    EligibilityCheck("isa", _has_isa),
    EligibilityCheck("kernels", _runs_the_kernels),
    EligibilityCheck("nodeSelector", _matches_node_selector),
    EligibilityCheck("nodeAffinity", _matches_required_affinity),
    EligibilityCheck("taints", _taints_tolerated),
)


def node_rejection(needs: Needs, node: NodeProfile) -> str | None:
    """Why a node cannot run the service that has these needs at all (the first check that fails), or None."""
    for check in needs.checks:
        why = check.reject(needs, node)
        if why is not None:
            return why
    return None


def _tolerates(toleration: Toleration, taint: Taint) -> bool:
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.operator == "Exists":
        return toleration.key in (None, "", taint.key)
    return toleration.key == taint.key and (toleration.value or "") == (taint.value or "")


def _matches_term(term: NodeSelectorTerm, node: NodeProfile) -> bool:
    if not term.match_expressions and not term.match_fields:
        return False  # an empty term matches no node (Kubernetes semantics)
    labels_ok = all(_matches_requirement(e, node.labels.get(e.key)) for e in term.match_expressions)
    fields_ok = all(e.key == "metadata.name" and _matches_requirement(e, node.name) for e in term.match_fields)
    return labels_ok and fields_ok


def _matches_requirement(requirement: NodeSelectorRequirement, value: str | None) -> bool:
    operator, values = requirement.operator, requirement.values
    if operator == NodeSelectorOperator.IN:
        return value is not None and value in values
    if operator == NodeSelectorOperator.NOT_IN:
        return value is None or value not in values
    if operator == NodeSelectorOperator.EXISTS:
        return value is not None
    if operator == NodeSelectorOperator.DOES_NOT_EXIST:
        return value is None
    if value is None or not is_int64(value):  # Gt, Lt: an integer label against the one integer value
        return False
    bound = int(values[0])
    return int(value) > bound if operator == NodeSelectorOperator.GT else int(value) < bound
