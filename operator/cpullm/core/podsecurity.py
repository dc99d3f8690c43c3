"""How the vLLM container is confined, chosen by its namespace's Pod Security level, or why no pod could run there.

vLLM's NUMA memory binding calls get_mempolicy, set_mempolicy and mbind, which the container runtime's default seccomp
profile allows only to a process with SYS_NICE. Pod Security baseline and restricted reject SYS_NICE (and seccomp
Unconfined, and hostPath volumes); restricted also requires a non-root user. Where the namespace enforces one of them,
the server runs under the administrator's Localhost profile (settings.numa_seccomp_profile: the runtime's default plus
those calls, installed on every node by the chart's numaSeccomp) with every capability dropped, and as a non-root
user for restricted; without that profile it runs without NUMA calls if the spec allows (spec.numaPrivileges: false),
or is refused with the fixes named. Elsewhere (privileged, or an unlabelled namespace: the API server's default when
no AdmissionConfiguration says otherwise) the spec's choice stands: its seccomp profile, and SYS_NICE.
"""

from __future__ import annotations

from collections.abc import Mapping

from cpullm.api.plan import ServerSecurity
from cpullm.api.spec import CpuLLMServiceSpec, SeccompProfile
from cpullm.core.constants import SERVER_NON_ROOT_UID
from cpullm.errors import PodSecurityForbidden

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
NUMA_CAPABILITY = "SYS_NICE"
# The levels that reject SYS_NICE, seccomp Unconfined and hostPath volumes; the last also requires non-root.
CONFINING_LEVELS = ("baseline", "restricted")


def enforced_level(labels: Mapping[str, str]) -> str:
    return labels.get(ENFORCE_LABEL, "privileged")


def server_security(
    spec: CpuLLMServiceSpec,
    level: str = "privileged",
    numa_profile: str | None = None,
    namespace: str = "",
) -> ServerSecurity:
    """The vLLM container's confinement in a namespace enforcing `level`, given the administrator's NUMA profile
    (None: none installed); raises PodSecurityForbidden where the level would reject every pod of the spec."""
    if level not in CONFINING_LEVELS:
        capabilities = [NUMA_CAPABILITY] if spec.numa_privileges else []
        return ServerSecurity(seccomp_profile=spec.seccomp_profile.value, capabilities=capabilities)
    refused = f"namespace {namespace} enforces Pod Security '{level}', which rejects"
    fix_label = f"label the namespace {ENFORCE_LABEL}=privileged"
    if spec.model_cache and spec.model_cache.node_local:
        raise PodSecurityForbidden(
            f"{refused} hostPath volumes (spec.modelCache.nodeLocal): {fix_label}, or use persistentVolumeClaim or "
            "emptyDir"
        )
    if spec.seccomp_profile == SeccompProfile.UNCONFINED:
        raise PodSecurityForbidden(
            f"{refused} seccomp Unconfined: {fix_label}, or set spec.seccompProfile: RuntimeDefault"
        )
    user = SERVER_NON_ROOT_UID if level == "restricted" else None
    if not spec.numa_privileges:
        return ServerSecurity(seccomp_profile=SeccompProfile.RUNTIME_DEFAULT.value, run_as_user=user)
    if numa_profile is None:
        raise PodSecurityForbidden(
            f"{refused} the {NUMA_CAPABILITY} capability, which vLLM's NUMA memory binding needs under the runtime's "
            f"default seccomp profile: {fix_label}, have the operator's administrator install its NUMA seccomp "
            "profile (the chart's numaSeccomp.enabled), or set spec.numaPrivileges: false"
        )
    return ServerSecurity(seccomp_profile="Localhost", localhost_profile=numa_profile, run_as_user=user)
