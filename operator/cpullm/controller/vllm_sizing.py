"""The operator's way to have vLLM size a model no formula here knows: a sizing Job per question
(core/children/sizing_job.py), its answer kept in status.vllmSizing so it is asked once per config, dtype and vLLM
image. One `JobSizer` serves one reconcile's gather as sizing's vLLM seam (core/sizing/vllm_report.py): it answers
from status, or from the finished Job, or raises SizingWithVllm and notes the Job the decision creates."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from cpullm.api.spec import CpuLLMServiceSpec
from cpullm.core.children.common import Owner
from cpullm.core.children.sizing_job import (
    DEADLINE_SECONDS,
    STATUS_KEY,
    TTL_SECONDS,
    SizingJobFacts,
    VllmSizing,
    sizing_arch,
    sizing_job_name,
    sizing_request,
)
from cpullm.core.planner import server_image
from cpullm.core.sizing.vllm_report import parse_report, report_from_text
from cpullm.core.topology import NodeProfile
from cpullm.errors import ChildConflict, SizingWithVllm, VllmSizingFailed


class SizingJobs(Protocol):
    """The read of a sizing Job (io/kube.py)."""

    def read_sizing_job(self, namespace: str, name: str) -> SizingJobFacts | None: ...


class JobSizer:
    """Sizing's vLLM seam for one reconcile of one service; `outcome` is what the decision keeps and creates."""

    def __init__(
        self,
        owner: Owner,
        spec: CpuLLMServiceSpec,
        status: Mapping[str, Any],
        nodes: Sequence[NodeProfile],
        jobs: SizingJobs,
        vllm_images: Mapping[str, str],
    ) -> None:
        self.owner, self.spec, self.status, self.nodes, self.jobs = owner, spec, status, nodes, jobs
        self.vllm_images = vllm_images
        self.outcome = VllmSizing()

    def __call__(self, config: Mapping[str, Any], dtype: str) -> Mapping[str, Any]:
        arch = sizing_arch(self.spec, self.nodes)
        request = sizing_request(config, dtype, server_image(self.spec, arch, self.vllm_images), arch)
        kept = self.status.get(STATUS_KEY)
        if isinstance(kept, Mapping) and kept.get("key") == request.key:
            report = parse_report(kept.get("report"))
            if report is not None:
                self.outcome = VllmSizing(record=dict(kept))
                return report
        name = sizing_job_name(self.owner, request)
        where = f"Job {self.owner.namespace}/{name}"
        facts = self.jobs.read_sizing_job(self.owner.namespace, name)
        if facts is None:
            self.outcome = VllmSizing(request=request)
            raise SizingWithVllm(
                f"no formula here sizes this model: vLLM in {request.image} builds it on the meta device to size it "
                f"({where}); the plan follows its report"
            )
        if facts.controller_uid != self.owner.uid:  # its answer is not this service's to trust
            raise ChildConflict(
                f"{where} exists and is not controlled by this CpuLLMService: it is left untouched; delete it, or "
                "give the CpuLLMService another name"
            )
        if not facts.finished:
            stuck = f"; {facts.trouble} (the Job ends after {DEADLINE_SECONDS} s)" if facts.trouble else ""
            raise SizingWithVllm(f"vLLM in {request.image} is sizing the model on the meta device ({where}){stuck}")
        report = report_from_text(facts.message)
        if report is None:
            last = (facts.message.strip().splitlines() or ["(no message)"])[-1][-400:]
            raise VllmSizingFailed(
                f"the sizing {where} ended without vLLM's report ({facts.reason or 'completed'}: {last}); it runs "
                f"again once Kubernetes removes it, {TTL_SECONDS} s after it ended"
            )
        record = {"key": request.key, "image": request.image, "report": json.dumps(report, separators=(",", ":"))}
        self.outcome = VllmSizing(record=record)
        return report
