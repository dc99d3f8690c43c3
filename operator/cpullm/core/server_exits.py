"""What a server pod's vLLM container left when it ended: the kubelet's reason (OOMKilled, Error), its exit code, and
the report of which of the launcher's fixes loaded (vllm_support.REPORT_ENV: the container's termination message,
which the kubelet keeps in the pod's status). A server that ended having reported a fix the plan counts on
(plan.fixesCredited) as not loaded ran outside its plan's memory and start figures: the FixesLoaded condition,
present (False, a Warning event) while such a pod's status holds it, says which fix, on which pod, and what to do."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cpullm.core.children.deployment import CONTAINER_NAME
from cpullm.core.status import FeatureCondition
from cpullm.vllm_support import LOADED, OFF_ENV, read_report

FIXES_LOADED = "FixesLoaded"
CREDITED_FIX_NOT_LOADED = "CreditedFixNotLoaded"


@dataclass(frozen=True)
class ServerExit:
    """A server container's end whose report names fixes that did not load (fix -> outcome, vllm_support's words)."""

    pod: str
    reason: str
    exit_code: int
    not_loaded: tuple[tuple[str, str], ...]


def server_exit(pod: str, status: Mapping[str, Any]) -> ServerExit | None:
    """The vLLM container's latest end (the current state if it is ended, else the last one) when its report names a
    fix that did not load; None otherwise (running since its start, or every fix it tried loaded)."""
    for container in status.get("containerStatuses") or []:
        if container.get("name") != CONTAINER_NAME:
            continue
        for state in (container.get("state"), container.get("lastState")):
            ended = (state or {}).get("terminated")
            if not ended:
                continue
            outcomes = read_report(str(ended.get("message") or ""))
            not_loaded = tuple(sorted((fix, outcome) for fix, outcome in outcomes.items() if outcome != LOADED))
            if not not_loaded:
                return None
            return ServerExit(pod, str(ended.get("reason") or "ended"), int(ended.get("exitCode") or 0), not_loaded)
    return None


def fixes_loaded_condition(exits: Sequence[ServerExit], credited: Sequence[str]) -> FeatureCondition | None:
    """FixesLoaded=False while a server pod's last end reports a fix the plan counts on as not loaded."""
    found = [
        f"pod {ended.pod} ended ({ended.reason}, exit code {ended.exit_code}) with {fix} {outcome}"
        for ended in sorted(exits, key=lambda e: e.pod)
        for fix, outcome in ended.not_loaded
        if fix in credited
    ]
    if not found:
        return None
    message = (
        f"{'; '.join(found)}: the plan's memory limit and start figures count on that fix, so its servers run "
        "outside them. If the image's vLLM is not the version the plan renders for, set spec.vllmVersion; else "
        f"turn the fix off in spec.env ({OFF_ENV}=<fix>) for a plan that counts without it"
    )
    return FeatureCondition(FIXES_LOADED, False, CREDITED_FIX_NOT_LOADED, message)
