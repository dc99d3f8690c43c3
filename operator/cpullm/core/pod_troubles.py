"""Why a service's pod cannot start or keep running, from what the scheduler and the kubelet wrote in its status: the
service's Ready reason while it lasts, with the cause in words and the fix, instead of Progressing for ever. Pure;
one rule per kind of trouble (TROUBLES), the first that holds wins, in the order a pod meets them (scheduled, image
pulled, container made, container running)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

GiB = 1 << 30


@dataclass(frozen=True)
class Declared:
    """What a container's spec promises, for a trouble's message: its memory limit, and how long its startup probe
    lets it take before the kubelet stops it (seconds)."""

    memory_limit: str | None = None
    startup_seconds: float | None = None


Rule = Callable[[Mapping[str, Any], Mapping[str, Declared]], "PodTrouble | None"]


@dataclass(frozen=True)
class PodTrouble:
    """The Ready reason and its message: what the pod cannot do, and what to change."""

    reason: str
    message: str


def _containers(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for c in status.get("containerStatuses") or [] if isinstance(c, Mapping)]


def _waiting(container: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((container.get("state") or {}).get("waiting")) or {}


def _unschedulable(status: Mapping[str, Any], declared: Mapping[str, Declared]) -> PodTrouble | None:
    for cond in status.get("conditions") or []:
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == ("PodScheduled", "False", "Unschedulable"):
            message = str(cond.get("message") or "the scheduler found no node for it")
            return PodTrouble("Unschedulable", f"a pod cannot be scheduled: {message}")
    return None


IMAGE_PULL = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
# A registry refusing the node: its words, or a 401 or 403 standing alone (not in a port such as localhost:40101).
REFUSED_WORDS = ("unauthorized", "denied", "authentication", "forbidden")
REFUSED_STATUS = re.compile(r"(?<![\w:.])40[13](?![\w.])")


def _image_pull(status: Mapping[str, Any], declared: Mapping[str, Declared]) -> PodTrouble | None:
    for container in _containers(status):
        waiting = _waiting(container)
        if waiting.get("reason") not in IMAGE_PULL:
            continue
        said = str(waiting.get("message") or waiting.get("reason"))
        lowered = said.lower()
        if "platform" in lowered or "exec format" in lowered:
            fix = "the image has no build for the node's CPU architecture: name one that does (spec.image)"
        elif any(word in lowered for word in REFUSED_WORDS) or REFUSED_STATUS.search(lowered):
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


def _config(status: Mapping[str, Any], declared: Mapping[str, Declared]) -> PodTrouble | None:
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


def _crash_loop(status: Mapping[str, Any], declared: Mapping[str, Declared]) -> PodTrouble | None:
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
            limit = declared.get(name, Declared()).memory_limit
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
        budget, ran = declared.get(name, Declared()).startup_seconds, _seconds_run(ended)
        if budget and ran is not None and ran >= STOPPED_AT_BUDGET * budget:
            return PodTrouble(
                "StartupTooSlow",
                f"container {name} ran {ran:.0f} s without answering /health, and its startup probe allows "
                f"{budget:.0f} s ({restarts} restarts): it starts slower on this node than the plan's estimate. "
                "A download of the weights is the usual cause: a model cache that keeps them (spec.modelCache: a "
                "persistentVolumeClaim or nodeLocal) makes the next start a load; else the node gives it fewer or "
                "slower CPUs than planned; kubectl logs --previous shows how far it got",
            )
        said = f" exit code {code}" if code is not None else ""
        words = f": {last_words}" if last_words else ""
        return PodTrouble(
            "CrashLoopBackOff",
            f"container {name} keeps ending ({reason}{said}, {restarts} restarts){words}; its log says why: kubectl "
            "logs --previous",
        )
    return None


# A container stopped this close to its startup probe's allowance was stopped by it: the kubelet kills it after
# failureThreshold failed probes, which start up to one period after the container (so a little before the sum).
STOPPED_AT_BUDGET = 0.9


def _seconds_run(ended: Mapping[str, Any]) -> float | None:
    """How long a terminated container ran, from its startedAt and finishedAt (None where either is missing)."""
    try:
        started, finished = (
            datetime.fromisoformat(str(ended[k]).replace("Z", "+00:00")) for k in ("startedAt", "finishedAt")
        )
    except (KeyError, ValueError):
        return None
    return (finished - started).total_seconds()


def _last_words(message: str, keep: int = 300) -> str:
    """A termination message's last non-empty line of its own (the fixes' report lines left out), shortened."""
    lines = [line.strip() for line in message.splitlines() if line.strip() and not line.startswith("cpullm-vllm-fix")]
    return lines[-1][-keep:] if lines else ""


TROUBLES: tuple[Rule, ...] = (_unschedulable, _image_pull, _config, _crash_loop)


def pod_trouble(status: Mapping[str, Any], declared: Mapping[str, Declared] | None = None) -> PodTrouble | None:
    """The first trouble a pod's status shows (None: none, it is starting or serving); `declared`: what each
    container's spec promises (declared_by_container), for the messages."""
    for rule in TROUBLES:
        found = rule(status, declared or {})
        if found is not None:
            return found
    return None


def declared_by_container(spec: Mapping[str, Any]) -> dict[str, Declared]:
    """What each container of a pod spec promises, by container name: its memory limit and its startup probe's
    allowance (initialDelaySeconds + periodSeconds x failureThreshold, Kubernetes' defaults where unset)."""
    found = {}
    for container in spec.get("containers") or []:
        limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
        probe = container.get("startupProbe") or {}
        startup = (
            float(probe.get("initialDelaySeconds") or 0)
            + float(probe.get("periodSeconds") or 10) * float(probe.get("failureThreshold") or 3)
            if probe
            else None
        )
        found[str(container.get("name"))] = Declared(str(limit) if limit else None, startup)
    return found
