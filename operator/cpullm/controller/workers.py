"""How many reconciles run at once: a fixed pool of threads and as many slots.

A reconcile takes a slot before it copies anything (the service, the node list) and gives it back when its
thread is done, so one waiting for a slot holds nothing. Without the limit, a burst (1,000 services created
at once, each child event another reconcile) queued every reconcile with its copies on asyncio's default
executor: ~1,600 were in flight at N=1,000 (measured with tracemalloc), each holding its copies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

Result = TypeVar("Result")


class ReconcileWorkers:
    def __init__(self, count: int) -> None:
        self.slot = asyncio.Semaphore(count)  # `async with workers.slot:` around copy + reconcile
        self._threads = ThreadPoolExecutor(count, thread_name_prefix="reconcile")

    async def run(self, blocking: Callable[..., Result], *args: Any) -> Result:
        """Run a blocking reconcile on one of the pool's threads (the caller holds a slot)."""
        return await asyncio.get_running_loop().run_in_executor(self._threads, blocking, *args)

    def shutdown(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
