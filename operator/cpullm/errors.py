"""Typed errors. Each carries the condition `reason` it is reported under; `controller/outcomes.py` maps
them to a retry delay (or none) in one place, and `io/kube.py` maps API errors to them in one place."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar


class CpuLLMError(Exception):
    """Base of every error the operator reports on a resource."""

    reason: ClassVar[str] = "Error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidSpec(CpuLLMError):
    reason = "InvalidSpec"


class PlanRefusal(CpuLLMError):
    """The spec cannot be planned on the nodes there are. Permanent until the spec or the nodes change."""

    reason = "PlanRefused"


class NoEligibleNode(PlanRefusal):
    reason = "NoEligibleNode"

    def __init__(self, rejections: Mapping[str, str]) -> None:
        self.rejections = dict(rejections)
        super().__init__(summarize_rejections(self.rejections))


class ModelTooLarge(PlanRefusal):
    reason = "ModelTooLarge"


class InvalidTensorParallelSize(PlanRefusal):
    reason = "InvalidTensorParallelSize"


class InvalidPlacement(PlanRefusal):
    """The spec asks a placement for something it cannot do (e.g. a throughput server bigger than a NUMA node)."""

    reason = "InvalidPlacement"


class KVCacheTooSmall(PlanRefusal):
    reason = "KVCacheTooSmall"


class ContextTooLong(PlanRefusal):
    """spec.maxModelLen is beyond the model's own context length."""

    reason = "MaxModelLenTooLong"


class SpeculationRefused(PlanRefusal):
    """spec.speculative names a method vLLM cannot run for this model or version on CPU (core/speculation.py)."""

    reason = "SpeculationRefused"


class UnsupportedModel(PlanRefusal):
    """A model the operator cannot plan: one sizing's formulas do not know (vLLM itself may size it: see
    core/sizing/vllm_report.py), or one vLLM cannot serve (VllmCannotServe)."""

    reason = "UnsupportedModel"


class NotSizedHere(UnsupportedModel):
    """A family or layer pattern the formulas here do not know (where vLLM may: a sizing Job or the CLI's
    --vllm-python asks it). A config they know but whose values cannot be (head_dim 0, a layer count that is not one)
    is an UnsupportedModel, never sent to vLLM."""


class VllmCannotServe(UnsupportedModel):
    """vLLM's CPU backend cannot serve this model, for vLLM's own reason (a kernel it lacks, a GPU-only layer): asking
    vLLM to size it would not change that."""


class PodSecurityForbidden(PlanRefusal):
    """The namespace's Pod Security level would reject the vLLM pod."""

    reason = "PodSecurityForbidden"


class NodeCacheDisabled(PlanRefusal):
    """spec.modelCache.nodeLocal, where the operator keeps no node cache directory."""

    reason = "NodeCacheDisabled"


class ChildRejected(PlanRefusal):
    """The API server refused a child built from the spec (e.g. an invalid pass-through env or affinity)."""

    reason = "ChildRejected"


class ChildConflict(CpuLLMError):
    """A child's name is taken by an object this CpuLLMService does not control: it is left untouched. Retried
    with backoff: the operator does not watch the other object, and whoever removes it ends the conflict."""

    reason = "Conflict"


class ModelConfigUnavailable(CpuLLMError):
    """The model's config could not be had (Hub down, gated, path without inline config). Retried."""

    reason = "ModelConfigUnavailable"


class SizingWithVllm(CpuLLMError):
    """vLLM is sizing the model in a Job (core/children/sizing_job.py): the plan follows its report. Looked at again
    every SIZING_RETRY_SECONDS (controller/outcomes.py) while the Job runs."""

    reason = "SizingWithVllm"


class VllmSizingFailed(CpuLLMError):
    """The sizing Job ended without vLLM's report (out of time or memory, its image not pulled): retried with
    backoff; the Job runs again once Kubernetes removed the one that failed."""

    reason = "VllmSizingFailed"


class UnexpectedError(CpuLLMError):
    """A fault of the operator's own while reading a service's facts (a bug): reported and retried with backoff,
    so one service's odd input never stops the others; the traceback goes to the debug log only."""

    reason = "InternalError"


class NodeLabelError(CpuLLMError):
    """A node's topology labels cannot be parsed; the node is skipped."""

    reason = "InvalidNodeLabels"


class NodeTopologyError(CpuLLMError):
    """A NodeResourceTopology cannot be read; its node is planned from its labels alone."""

    reason = "InvalidNodeResourceTopology"


class NodePerformanceError(CpuLLMError):
    """A NodePerformance cannot be read; its node's speed is estimated from its ISA class instead."""

    reason = "InvalidNodePerformance"


def name_list(names: Sequence[str], shown: int = 3) -> str:
    """'a, b, c, ...': the first few names, so messages about big node pools stay readable."""
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


def summarize_rejections(rejections: Mapping[str, str]) -> str:
    """'no eligible node: lacks amx_bf16 (2: a, b); tainted (1: c)' — grouped so big pools stay readable."""
    if not rejections:
        return (
            "no eligible node: no node the planner can read (none listed, or each skipped for its labels or status: "
            "the operator's log and the nodes' events, or the CLI's warnings, say why)"
        )
    by_reason: dict[str, list[str]] = {}
    for node, why in sorted(rejections.items()):
        by_reason.setdefault(why, []).append(node)
    parts = [
        f"{why} ({len(nodes)}: {name_list(nodes)})"
        for why, nodes in sorted(by_reason.items(), key=lambda item: (-len(item[1]), item[0]))
    ]
    return "no eligible node: " + "; ".join(parts)


class PermissionDenied(CpuLLMError):
    """The API server refused the operator an action its RBAC should grant. Retried."""

    reason = "PermissionDenied"


class TransientApiError(CpuLLMError):
    """The API server could not be reached or asked us to come back (connection refused or reset, 409,
    429, 5xx). Retried soon; nothing about the spec is wrong."""

    reason = "ApiUnavailable"


class ChildExists(TransientApiError):
    """An apply that may only create (io/kube.py) found an object of the child's name: whose it is is read next
    (controller/owned.py). Transient where nothing reads it: the retry reads it."""
