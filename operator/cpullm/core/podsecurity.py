"""Pod Security admission awareness: would the namespace's enforced level admit the vLLM pod?

Baseline rejects seccomp `Unconfined` and added capabilities outside its small allowed set (SYS_NICE is not in
it); restricted additionally requires non-root, which the vLLM CPU image (it runs as root) does not meet (the
rendered pod already drops every other capability, forbids privilege escalation and uses RuntimeDefault).
Unlabelled namespaces get the cluster default, assumed `privileged` (the API server's default when no
AdmissionConfiguration says otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping

from cpullm.api.spec import CpuLLMServiceSpec, SeccompProfile
from cpullm.errors import PodSecurityForbidden

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"


def check_pod_security(namespace: str, labels: Mapping[str, str], spec: CpuLLMServiceSpec) -> None:
    level = labels.get(ENFORCE_LABEL, "privileged")
    fix_label = f"label the namespace {ENFORCE_LABEL}=privileged"
    if level == "restricted":
        raise PodSecurityForbidden(
            f"namespace {namespace} enforces Pod Security 'restricted', which the vLLM CPU image cannot meet "
            f"(it runs as root): {fix_label}, or use another namespace"
        )
    if level == "baseline" and spec.numa_privileges:
        raise PodSecurityForbidden(
            f"namespace {namespace} enforces Pod Security 'baseline', which rejects the SYS_NICE capability "
            f"(needed for vLLM's NUMA memory binding): {fix_label}, or set spec.numaPrivileges: false"
        )
    if level == "baseline" and spec.model_cache and spec.model_cache.node_local:
        raise PodSecurityForbidden(
            f"namespace {namespace} enforces Pod Security 'baseline', which rejects hostPath volumes "
            f"(spec.modelCache.nodeLocal): {fix_label}, or use persistentVolumeClaim or emptyDir"
        )
    if level == "baseline" and spec.seccomp_profile == SeccompProfile.UNCONFINED:
        raise PodSecurityForbidden(
            f"namespace {namespace} enforces Pod Security 'baseline', which rejects seccomp Unconfined: "
            f"{fix_label}, or set spec.seccompProfile: RuntimeDefault"
        )
