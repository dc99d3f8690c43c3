"""The one place a reconcile's outcome becomes a decision to retry, and how soon. Every reconcile is started by
a watch event (the service's own, a node's, a child's, a CRD's) or a resync, and controller/dispatch.py retries it
on these delays (through the RetryScheduler of controller/state.py) until one finishes, so none is left behind
after a transient fault:

- a plan, a refusal (PlanRefusal) or a bad spec (InvalidSpec) is already reported in status and waits for a
  change of the spec or the nodes: no retry;
- a transient API failure (TransientApiError) is retried soon: the API server is usually back in seconds;
- a model vLLM is sizing in a Job (SizingWithVllm) is looked at again every SIZING_RETRY_SECONDS until it reports;
- anything else the operator reports (Hub unreachable, permission denied) is retried with exponential
  backoff, 10 s x 2^n capped at 5 minutes: these take a person or an outage to end.

Every delay is jittered by up to ±20%, so the services one outage failed together do not retry together.
"""

from __future__ import annotations

from cpullm.api.plan import Plan
from cpullm.errors import CpuLLMError, InvalidSpec, PlanRefusal, SizingWithVllm, TransientApiError

BACKOFF_BASE_SECONDS = 10
MAX_BACKOFF_SECONDS = 300
TRANSIENT_RETRY_SECONDS = 5
SIZING_RETRY_SECONDS = 10


JITTER = 0.2


def retry_delay(outcome: Plan | CpuLLMError | None, retry: int, spread: float = 0.5) -> float | None:
    """Seconds until the next attempt of a reconcile with this outcome, or None when it waits for a change.
    `spread` in [0, 1) places the delay in its jitter band (a random draw; 0.5 is the band's middle)."""
    if not isinstance(outcome, CpuLLMError) or isinstance(outcome, PlanRefusal | InvalidSpec):
        return None
    if isinstance(outcome, TransientApiError):
        delay: float = TRANSIENT_RETRY_SECONDS
    elif isinstance(outcome, SizingWithVllm):
        delay = SIZING_RETRY_SECONDS
    else:
        delay = min(MAX_BACKOFF_SECONDS, BACKOFF_BASE_SECONDS * 2**retry)
    return delay * (1 - JITTER + 2 * JITTER * spread)
