"""Why a pod cannot start or keep running (core/pod_troubles.py), from pod statuses as the scheduler and the kubelet
write them: each trouble's Ready reason, and a message that names the cause and the fix."""

from __future__ import annotations

from typing import Any

import pytest

from cpullm.core.decision import decide
from cpullm.core.pod_troubles import Declared, declared_by_container, pod_trouble

from .builders import spec
from .support import T0, observed

IMAGE = "docker.io/vllm/vllm-openai-cpu:v0.32.0-x86_64"


def waiting(reason: str, message: str = "", last: dict[str, Any] | None = None, restarts: int = 0) -> dict[str, Any]:
    container = {
        "name": "vllm",
        "image": IMAGE,
        "state": {"waiting": {"reason": reason, **({"message": message} if message else {})}},
        "lastState": {"terminated": last} if last else {},
        "restartCount": restarts,
    }
    return {"conditions": [{"type": "PodScheduled", "status": "True"}], "containerStatuses": [container]}


def ran(seconds: int, **ended: Any) -> dict[str, Any]:
    """A terminated container's state that ran `seconds` (from 10:00:00), with the other fields given."""
    return {"startedAt": "2026-11-29T10:00:00Z", "finishedAt": f"2026-11-29T10:{seconds // 60:02}:{seconds % 60:02}Z",
            **ended}  # fmt: skip


@pytest.mark.parametrize(
    ("status", "reason", "says"),
    [
        pytest.param(
            {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1"}]},
            "Unschedulable",
            ["a pod cannot be scheduled: 0/1"],
            id="unschedulable",
        ),
        pytest.param(
            waiting("ErrImagePull", f'failed to pull and unpack image "{IMAGE}": not found'),
            "ImagePullFailed",
            [f"cannot pull {IMAGE}", "no such image or tag: check spec.image"],
            id="a tag that does not exist",
        ),
        pytest.param(
            waiting(
                "ErrImagePull",
                'failed to pull and unpack image "localhost:40101/vllm/x:no-such-tag": failed to resolve reference '
                '"localhost:40101/vllm/x:no-such-tag": localhost:40101/vllm/x:no-such-tag: not found',
            ),
            "ImagePullFailed",
            ["no such image or tag"],
            id="a missing tag in a registry whose port holds 401",
        ),
        pytest.param(
            waiting("ErrImagePull", "unexpected status from HEAD request to https://r.example/v2/x/manifests/1: 401"),
            "ImagePullFailed",
            ["imagePullSecret"],
            id="a bare 401",
        ),
        pytest.param(
            waiting("ImagePullBackOff", 'Back-off pulling image: pull access denied, repository does not exist or may '
                    "require authorization: authorization failed"),
            "ImagePullFailed",
            ["imagePullSecret"],
            id="a registry without a pull secret",
        ),
        pytest.param(
            waiting("ErrImagePull", "no match for platform in manifest: not found"),
            "ImagePullFailed",
            ["no build for the node's CPU architecture"],
            id="no build for the node's arch",
        ),
        pytest.param(
            waiting("ErrImagePull", "dial tcp 127.0.0.1:1: connect: connection refused"),
            "ImagePullFailed",
            ["can reach its registry"],
            id="an unreachable registry",
        ),
        pytest.param(
            waiting("CreateContainerConfigError", 'secret "api-key" not found'),
            "ContainerConfigError",
            ['secret "api-key" not found', "spec.apiKeySecret"],
            id="a missing Secret",
        ),
        pytest.param(
            waiting("CreateContainerConfigError", "couldn't find key HF_TOKEN in Secret ns/hf"),
            "ContainerConfigError",
            ["couldn't find key HF_TOKEN"],
            id="a missing key",
        ),
        pytest.param(
            waiting("CrashLoopBackOff", "back-off 5m0s", {"reason": "OOMKilled", "exitCode": 137}, 4),
            "OOMKilled",
            ["killed for memory at its memory limit of 7364Mi (4 restarts)", "spec.vllmVersion"],
            id="killed for memory",
        ),
        pytest.param(
            waiting(
                "CrashLoopBackOff",
                last={
                    "reason": "StartError",
                    "exitCode": 128,
                    "message": 'failed to create containerd task: exec: "python3": exec format error: unknown',
                },
            ),
            "WrongArchitecture",
            ["cannot run on the node's CPU architecture", "exec format error"],
            id="an image of another arch",
        ),
        pytest.param(
            waiting(
                "CrashLoopBackOff",
                last={
                    "reason": "Error",
                    "exitCode": 1,
                    "message": "cpullm-vllm-fix short_warm_up loaded\nValueError: no model at /models/x\n",
                },
                restarts=3,
            ),
            "CrashLoopBackOff",
            ["(Error exit code 1, 3 restarts): ValueError: no model at /models/x", "kubectl logs --previous"],
            id="a crash, its last words without the fixes' report",
        ),
        pytest.param(
            waiting("CrashLoopBackOff", last=ran(292, reason="Error", exitCode=0), restarts=2),
            "StartupTooSlow",
            ["ran 292 s without answering /health, and its startup probe allows 300 s (2 restarts)",
             "spec.modelCache"],
            id="stopped by its startup probe",
        ),
        pytest.param(
            waiting("CrashLoopBackOff", last=ran(40, reason="Error", exitCode=1, message="RuntimeError: boom"),
                    restarts=1),
            "CrashLoopBackOff",
            ["(Error exit code 1, 1 restarts): RuntimeError: boom"],
            id="a crash well within the startup allowance",
        ),
        pytest.param(
            waiting("CrashLoopBackOff", last=ran(300, reason="OOMKilled", exitCode=137), restarts=1),
            "OOMKilled",
            ["killed for memory"],
            id="a kill for memory at the allowance is still a kill for memory",
        ),
        pytest.param(waiting("ContainerCreating"), None, [], id="starting"),
        pytest.param({"containerStatuses": [{"name": "vllm", "state": {"running": {}}}]}, None, [], id="running"),
        pytest.param({}, None, [], id="nothing yet"),
    ],
)  # fmt: skip
def test_a_pods_trouble_is_named_with_its_cause_and_fix(status, reason, says):
    found = pod_trouble(status, {"vllm": Declared("7364Mi", 300.0)})
    assert (found.reason if found else None) == reason
    assert all(words in (found.message if found else "") for words in says), found


def test_the_first_trouble_in_a_pods_life_wins():
    """Unscheduled before anything: a pod not placed has no containers yet, whatever an old status held."""
    both = {**waiting("ErrImagePull", "not found")}
    both["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no"}]
    assert pod_trouble(both).reason == "Unschedulable"  # type: ignore[union-attr]


def test_what_a_pod_spec_promises_is_read_by_container():
    """The memory limit, and the startup probe's allowance with Kubernetes' defaults for what is unset."""
    probe = {"httpGet": {"path": "/health"}, "periodSeconds": 5, "failureThreshold": 61}
    pod_spec = {
        "containers": [
            {"name": "vllm", "resources": {"limits": {"memory": "7364Mi"}}, "startupProbe": probe},
            {"name": "x", "startupProbe": {"initialDelaySeconds": 4}},
            {"name": "y"},
        ]
    }
    assert declared_by_container(pod_spec) == {
        "vllm": Declared("7364Mi", 305.0),
        "x": Declared(None, 34.0),
        "y": Declared(None, None),
    }


def test_the_trouble_is_the_services_ready_reason_and_a_warning_event():
    trouble = pod_trouble(waiting("ImagePullBackOff", "not found"))
    decision = decide(observed(spec=spec(replicas=1), deployment={"status": {"replicas": 1}}, pod_trouble=trouble), T0)
    ready = decision.status["conditions"][1]
    assert (ready["status"], ready["reason"]) == ("False", "ImagePullFailed")
    assert ready["message"].startswith("0/1 replicas ready; container vllm cannot pull")
    assert [(e.type, e.reason) for e in decision.events if e.reason == "ImagePullFailed"] == [
        ("Warning", "ImagePullFailed")
    ]
