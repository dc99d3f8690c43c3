"""Why a service's pod cannot start or keep running, from what the scheduler and the kubelet wrote in its status: the
service's Ready reason while it lasts, with the cause in words and the fix, instead of Progressing for ever. Pure;
one rule per kind of trouble (TROUBLES), the first that holds wins, in the order a pod meets them (scheduled, image
pulled, container made, container running)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

GiB = 1 << 30


@dataclass(frozen=True)
class PodTrouble:
    """The Ready reason and its message: what the pod cannot do, and what to change."""

    reason: str
    message: str


def _containers(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for c in status.get("containerStatuses") or [] if isinstance(c, Mapping)]


def _waiting(container: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((container.get("state") or {}).get("waiting")) or {}


def _unschedulable(status: Mapping[str, Any], limits: Mapping[str, str]) -> PodTrouble | None:
    for cond in status.get("conditions") or []:
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == ("PodScheduled", "False", "Unschedulable"):
            message = str(cond.get("message") or "the scheduler found no node for it")
            return PodTrouble("Unschedulable", f"a pod cannot be scheduled: {message}")
    return None


IMAGE_PULL = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")


def _image_pull(status: Mapping[str, Any], limits: Mapping[str, str]) -> PodTrouble | None:
    for container in _containers(status):
        waiting = _waiting(container)
        if waiting.get("reason") not in IMAGE_PULL:
            continue
        said = str(waiting.get("message") or waiting.get("reason"))
        lowered = said.lower()
        if "platform" in lowered or "exec format" in lowered:
            fix = "the image has no build for the node's CPU architecture: name one that does (spec.image)"
        elif any(word in lowered for word in ("unauthorized", "denied", "authentication", "forbidden", "403", "401")):
            fix = (
                "the registry refuses the node: give the namespace's default ServiceAccount an imagePullSecret for it, "
                "or name an image the nodes may pull"
            )
        elif any(word in lowered for word in ("not found", "manifest unknown", "no such")):
            fix = "no such image or tag: check spec.image (or the operator's image setting) and its tag"
        else:
            fix = "check spec.image (or the operator's image setting), and that the nodes can reach its registry"
        return PodTrouble(
            "ImagePullFailed", f"container {container.get('name')} cannot pull {container.get('image')}: {said}; {fix}"
        )
    return None


def _config(status: Mapping[str, Any], limits: Mapping[str, str]) -> PodTrouble | None:
    for container in _containers(status):
        waiting = _waiting(container)
        if waiting.get("reason") != "CreateContainerConfigError":
            continue
        said = str(waiting.get("message") or "its configuration cannot be made")
        return PodTrouble(
            "ContainerConfigError",
            f"container {container.get('name')} cannot be created: {said}; create what it names in the service's "
            "namespace (the Secrets of spec.apiKeySecret and spec.hfTokenSecret, with their keys)",
        )
    return None


def _crash_loop(status: Mapping[str, Any], limits: Mapping[str, str]) -> PodTrouble | None:
    for container in _containers(status):
        waiting = _waiting(container)
        if waiting.get("reason") not in ("CrashLoopBackOff", "CreateContainerError", "RunContainerError"):
            continue
        name = str(container.get("name"))
        ended = ((container.get("lastState") or {}).get("terminated")) or {}
        reason, code = str(ended.get("reason") or waiting.get("reason")), ended.get("exitCode")
        last_words = _last_words(str(ended.get("message") or waiting.get("message") or ""))
        restarts = int(container.get("restartCount") or 0)
        if reason == "OOMKilled":
            limit = limits.get(name)
            at = f" at its memory limit of {limit}" if limit else ""
            return PodTrouble(
                "OOMKilled",
                f"container {name} was killed for memory{at} ({restarts} restarts): the plan's limit (weights, KV "
                "cache, runtime) was too small for what vLLM held; if the image's vLLM is not the plan's version set "
                "spec.vllmVersion, else size the weights as vLLM holds them (spec.model.weightsBytes)",
            )
        if "exec format error" in last_words.lower():
            return PodTrouble(
                "WrongArchitecture",
                f"container {name} cannot run on the node's CPU architecture ({last_words}): name an image built for "
                "it (spec.image), or keep the service off such nodes (spec.nodeSelector)",
            )
        said = f" exit code {code}" if code is not None else ""
        words = f": {last_words}" if last_words else ""
        return PodTrouble(
            "CrashLoopBackOff",
            f"container {name} keeps ending ({reason}{said}, {restarts} restarts){words}; its log says why: kubectl "
            "logs --previous",
        )
    return None


def _last_words(message: str, keep: int = 300) -> str:
    """A termination message's last non-empty line of its own (the fixes' report lines left out), shortened."""
    lines = [line.strip() for line in message.splitlines() if line.strip() and not line.startswith("cpullm-vllm-fix")]
    return lines[-1][-keep:] if lines else ""


TROUBLES: tuple[Callable[[Mapping[str, Any], Mapping[str, str]], PodTrouble | None], ...] = (
    _unschedulable,
    _image_pull,
    _config,
    _crash_loop,
)


def pod_trouble(status: Mapping[str, Any], limits: Mapping[str, str] | None = None) -> PodTrouble | None:
    """The first trouble a pod's status shows (None: none, it is starting or serving); `limits`: each container's
    memory limit as the pod spec gives it, for an OOM kill's message."""
    for rule in TROUBLES:
        found = rule(status, limits or {})
        if found is not None:
            return found
    return None


def memory_limits(spec: Mapping[str, Any]) -> dict[str, str]:
    """Each container's memory limit in a pod spec, by container name."""
    return {
        str(c.get("name")): str(((c.get("resources") or {}).get("limits") or {}).get("memory"))
        for c in spec.get("containers") or []
        if ((c.get("resources") or {}).get("limits") or {}).get("memory")
    }
