"""The vLLM container's confinement by Pod Security level (core/podsecurity.py), and the pod it renders: every
level x spec x the administrator's NUMA profile, either a confinement the level admits or a refusal naming the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpullm.api.plan import ServerSecurity
from cpullm.core.children.common import Owner
from cpullm.core.children.deployment import build_deployment
from cpullm.core.constants import SERVER_NON_ROOT_HOME, SERVER_NON_ROOT_UID
from cpullm.core.planner import plan_service
from cpullm.core.podsecurity import enforced_level, server_security
from cpullm.errors import PodSecurityForbidden

from .builders import llama_8b, node, spec

PROFILE = "cpullm/numa.json"
ROOT_NUMA = ServerSecurity(seccomp_profile="RuntimeDefault", capabilities=["SYS_NICE"])
LOCALHOST = ServerSecurity(seccomp_profile="Localhost", localhost_profile=PROFILE)
NODE_LOCAL = {"modelCache": {"nodeLocal": True}}
CHART_FILES = Path(__file__).resolve().parents[2] / "charts" / "cpullm-operator" / "files"


@pytest.mark.parametrize(
    ("level", "fields", "profile", "expected"),
    [
        # No Pod Security level (or privileged): the spec's choice, whatever the administrator installed.
        ("privileged", {}, None, ROOT_NUMA),
        ("privileged", {}, PROFILE, ROOT_NUMA),
        ("privileged", {"numaPrivileges": False}, None, ServerSecurity()),
        (
            "privileged",
            {"seccompProfile": "Unconfined"},
            None,
            ROOT_NUMA.model_copy(update={"seccomp_profile": "Unconfined"}),
        ),
        ("privileged", NODE_LOCAL, None, ROOT_NUMA),
        # baseline: SYS_NICE refused; the NUMA profile instead, as root with no capability.
        ("baseline", {}, PROFILE, LOCALHOST),
        ("baseline", {}, None, "numaSeccomp.enabled"),
        ("baseline", {"numaPrivileges": False}, None, ServerSecurity()),
        ("baseline", {"numaPrivileges": False}, PROFILE, ServerSecurity()),
        ("baseline", {"seccompProfile": "Unconfined"}, PROFILE, "seccomp Unconfined"),
        ("baseline", NODE_LOCAL, PROFILE, "hostPath"),
        # restricted: the same, and a non-root user.
        ("restricted", {}, PROFILE, LOCALHOST.model_copy(update={"run_as_user": SERVER_NON_ROOT_UID})),
        ("restricted", {}, None, "numaSeccomp.enabled"),
        ("restricted", {"numaPrivileges": False}, None, ServerSecurity(run_as_user=SERVER_NON_ROOT_UID)),
        ("restricted", {"seccompProfile": "Unconfined", "numaPrivileges": False}, PROFILE, "seccomp Unconfined"),
        ("restricted", NODE_LOCAL, PROFILE, "hostPath"),
    ],
)
def test_each_level_gets_a_confinement_it_admits_or_a_refusal_naming_the_fix(level, fields, profile, expected):
    service = spec(**fields)
    if isinstance(expected, str):
        with pytest.raises(PodSecurityForbidden) as refused:
            server_security(service, level, profile, "team-a")
        message = refused.value.message
        assert expected in message and f"namespace team-a enforces Pod Security '{level}'" in message
        assert "pod-security.kubernetes.io/enforce=privileged" in message
    else:
        assert server_security(service, level, profile, "team-a") == expected


def test_an_unlabelled_namespace_is_privileged():
    assert enforced_level({}) == "privileged"
    assert enforced_level({"pod-security.kubernetes.io/enforce": "restricted"}) == "restricted"


def rendered_pod(security: ServerSecurity) -> dict:
    service = spec()
    plan = plan_service(service, llama_8b(), [node(numa=2, cpu="32", memory="512Gi")])
    plan = plan.model_copy(update={"security": security})
    return build_deployment(Owner("x", "ns"), service, plan)["spec"]["template"]["spec"]


def test_the_numa_profile_in_restricted_renders_a_pod_that_level_admits():
    """What Pod Security restricted checks: seccomp Localhost, every capability dropped and none added, no privilege
    escalation, a non-root user; the volumes are the server's group's, and HOME one it can write."""
    pod = rendered_pod(LOCALHOST.model_copy(update={"run_as_user": SERVER_NON_ROOT_UID}))
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "Localhost", "localhostProfile": PROFILE},
        "runAsNonRoot": True,
        "runAsUser": SERVER_NON_ROOT_UID,
        "runAsGroup": SERVER_NON_ROOT_UID,
    }
    assert pod["securityContext"] == {"fsGroup": SERVER_NON_ROOT_UID, "fsGroupChangePolicy": "OnRootMismatch"}
    assert {"name": "HOME", "value": SERVER_NON_ROOT_HOME} in container["env"]
    assert all(v.get("hostPath") is None for v in pod["volumes"])


def test_where_no_level_confines_the_pod_is_rendered_as_before():
    """The default confinement renders what every earlier version did: an upgrade changes no server's template."""
    pod = rendered_pod(ROOT_NUMA)
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["SYS_NICE"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert "securityContext" not in pod and all(e["name"] != "HOME" for e in container["env"])


@pytest.mark.parametrize(("arch", "seccomp_arch"), [("amd64", "SCMP_ARCH_X86_64"), ("arm64", "SCMP_ARCH_AARCH64")])
def test_the_charts_numa_profiles_deny_by_default_and_allow_the_numa_calls_unconditionally(arch, seccomp_arch):
    """The chart's profiles (scripts/numa-seccomp.sh writes them from containerd's default; the real-node tests check
    they are what it writes): what is not listed fails with an errno, and vLLM's NUMA calls pass with any argument."""
    profile = json.loads((CHART_FILES / f"numa-seccomp-{arch}.json").read_text())
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO" and seccomp_arch in profile["architectures"]
    unconditional = {
        name
        for rule in profile["syscalls"]
        if rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("args")
        for name in rule["names"]
    }
    assert {"get_mempolicy", "set_mempolicy", "mbind", "migrate_pages", "move_pages"} <= unconditional
    assert {"read", "mmap", "futex"} <= unconditional  # the runtime's default is kept
    assert not {"mount", "bpf", "kexec_load", "unshare"} & unconditional
