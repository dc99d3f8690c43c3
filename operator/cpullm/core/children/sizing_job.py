"""The sizing Job: vLLM itself sizes a model no formula here knows. It runs cpullm/meta_size.py in the service's
own vLLM image (the version the plan renders for), which builds the model from config.json alone on the meta
device, without weights or network, and writes its report to the container's termination message; the operator
reads it there (io/kube.py), keeps it in status.vllmSizing, and sizes the model from it (core/sizing/vllm_report.py).

The Job is the least a build needs: no service account token, no capabilities, a non-root user on a read-only root
filesystem, bounded in time (DEADLINE_SECONDS) and memory, and gone TTL_SECONDS after it finished (a failed one is
made again then). Its pod carries none of the servers' labels, so no Service or policy of theirs selects it.
Kubernetes' Job API: https://kubernetes.io/docs/concepts/workloads/controllers/job/
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from cpullm.api.spec import CpuLLMServiceSpec
from cpullm.core import constants as c
from cpullm.core.children.common import MANAGED_BY, MANAGED_BY_LABEL, Owner, binary_quantity, metadata
from cpullm.core.topology import NodeProfile

SIZING_FOR_LABEL = "cpullm.io/sizing-for"
SIZING_KEY_LABEL = "cpullm.io/sizing-key"
CONFIG_ENV = "CPULLM_MODEL_CONFIG"
SCRIPT = "meta_size.py"
# vLLM builds a model on the meta device in 10-30 s once its image is on the node (GPT-2: 12.5 s and 0.9 GB of
# memory on a 2-vCPU Emerald Rapids guest, vLLM 0.32); the deadline leaves room for pulling the image.
DEADLINE_SECONDS = 600
TTL_SECONDS = 300
MEMORY_REQUEST_BYTES = 2 * c.GiB
MEMORY_LIMIT_BYTES = 4 * c.GiB
CPU_REQUEST, CPU_LIMIT = "500m", "2"
KEY_CHARS = 10  # of the key's hex digest, in the Job's name
_NAME_CHARS = 63 - len("-size-") - KEY_CHARS  # a Job's name is a label value of its pods (job-name): 63 at most


@dataclass(frozen=True)
class SizingRequest:
    """What vLLM is asked to size: the config (canonical JSON), the dtype, and the image (its vLLM) that sizes it,
    for the nodes' `arch`; `key` names this question in the Job's name and in status.vllmSizing."""

    config_json: str
    dtype: str
    image: str
    arch: str

    @property
    def key(self) -> str:
        question = json.dumps([self.config_json, self.dtype, self.image])
        return hashlib.sha256(question.encode()).hexdigest()


@dataclass(frozen=True)
class SizingJobFacts:
    """A sizing Job as the operator reads it (io/kube.py): whether it ended, its container's termination message
    (the report, or the end of its log where it crashed), why it failed in the Job's words (DeadlineExceeded), and
    who controls it."""

    finished: bool
    message: str = ""
    reason: str = ""
    controller_uid: str | None = None  # of the object controlling it: the service's own, or not the service's Job
    trouble: str = ""  # while it runs: why its pod cannot (unschedulable, its image not pulled)


@dataclass(frozen=True)
class VllmSizing:
    """What one reconcile learnt from vLLM's sizing: the record status.vllmSizing keeps ({key, image, report}), and
    the Job to create where none asks the question yet."""

    record: Mapping[str, str] | None = None
    request: SizingRequest | None = None


STATUS_KEY = "vllmSizing"


def sizing_request(config: Mapping[str, Any], dtype: str, image: str, arch: str) -> SizingRequest:
    return SizingRequest(json.dumps(config, sort_keys=True, separators=(",", ":")), dtype, image, arch)


def sizing_arch(spec: CpuLLMServiceSpec, nodes: Sequence[NodeProfile]) -> str:
    """The arch the servers will most likely run on: the most common among the schedulable nodes the spec's
    nodeSelector admits (amd64 where none does), so the Job runs the image the servers will."""
    wanted = spec.node_selector or {}
    arches = Counter(
        node.arch
        for node in nodes
        if not node.unschedulable and all(node.labels.get(k) == v for k, v in wanted.items())
    )
    if not arches:
        return "amd64"
    return min(arches, key=lambda arch: (-arches[arch], arch))


def sizing_job_name(owner: Owner, request: SizingRequest) -> str:
    return f"{owner.name[:_NAME_CHARS].rstrip('-')}-size-{request.key[:KEY_CHARS]}"


def _script() -> str:
    return resources.files("cpullm").joinpath(SCRIPT).read_text()


SCRIPT_SOURCE = _script()


def build_sizing_job(owner: Owner, spec: CpuLLMServiceSpec, request: SizingRequest) -> dict[str, Any]:
    """The Job that asks vLLM in `request.image` to size the model; pure."""
    container = {
        "name": "size",
        "image": request.image,
        "command": ["python3", "-c", SCRIPT_SOURCE],
        "args": ["--config-env", CONFIG_ENV, "--dtype", request.dtype, "--report-file", "/dev/termination-log"],
        "env": [
            {"name": CONFIG_ENV, "value": request.config_json},
            {"name": "HOME", "value": "/tmp"},
            # No weights, no tokenizer, no Hub: the build reads config.json only.
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
            {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
            {"name": "DO_NOT_TRACK", "value": "1"},
        ],
        "resources": {
            "requests": {"cpu": CPU_REQUEST, "memory": binary_quantity(MEMORY_REQUEST_BYTES)},
            "limits": {"cpu": CPU_LIMIT, "memory": binary_quantity(MEMORY_LIMIT_BYTES)},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        # A crash leaves no report: the end of its log says why.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "runAsUser": c.SERVER_NON_ROOT_UID,
            "runAsGroup": c.SERVER_NON_ROOT_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}],
        "nodeSelector": {**(spec.node_selector or {}), "kubernetes.io/arch": request.arch},
    }
    if spec.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
    meta = metadata(owner)
    job_labels = {**meta["labels"], SIZING_FOR_LABEL: owner.name, SIZING_KEY_LABEL: request.key[:63]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {**meta, "name": sizing_job_name(owner, request), "labels": job_labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": DEADLINE_SECONDS,
            "ttlSecondsAfterFinished": TTL_SECONDS,
            "template": {
                "metadata": {
                    "labels": {
                        "app.kubernetes.io/name": "cpullm-sizing",
                        MANAGED_BY_LABEL: MANAGED_BY,
                        SIZING_FOR_LABEL: owner.name,
                    }
                },
                "spec": pod_spec,
            },
        },
    }
