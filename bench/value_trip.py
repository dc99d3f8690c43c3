"""Measurement, not a test: how far a value travels through the operator's code, from the Kopf handler that receives
it to the place it ends up, as the code runs. A short trip is a house whose parts sit where the data flows.

Each trip drives the real handlers (controller/handlers.py) as Kopf calls them, with Kopf's indexes filled as Kopf
fills them and an API that stores what it is given, and profiles every call into the package. Its stops are, in the
order they run, the functions that name the value (an attribute or constant in their code) and the one that writes
it where it ends. Between two stops the value goes up the call stack to their common caller and down again; so:

- calls: the call edges walked, up and down, from the handler to the last stop;
- files: the package's files that route passes through;
- changes: how often the route steps from one file into another (a bounce back counts again).

Three trips, all on a one-node cluster planning manifests/examples/llama-8b-amx.yaml:

- service -> decide: the service handler, to the reconcile that hands what it gathered to the pure decision;
- kvCacheGiB -> env: the service handler, to the Deployment's env (the variable the vLLM version reads);
- NUMA label -> TP: the node's `cpullm.io/numa-nodes` goes 1 -> 2; the node index handler, then the node event
  handler, to `--tensor-parallel-size` in the server's arguments.

    .venv/bin/python bench/value_trip.py [--route] [--tree CHECKOUT]

`--tree` measures another checkout's package (a `git worktree` of an older commit) with this same script. So the
package is imported only after `--tree` has put that checkout first on the path, and the API and the node here are
this script's own, not tests/unit's builders and stubs: those import today's modules.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import itertools
import sys
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
NODE_NAME = "n1"
EXAMPLE = "manifests/examples/llama-8b-amx.yaml"


@dataclass(frozen=True)
class Call:
    serial: int  # unique per call, so two calls of one function are two places on the route
    file: str
    function: str


# Where the value is between two handlers: returned to Kopf, which keeps it in an index for the next handler.
OUTSIDE = Call(0, "(kopf)", "")


@dataclass(frozen=True)
class Stop:
    what: str  # the names that made it a stop
    stack: tuple[Call, ...]  # outermost first


def _names(code: CodeType) -> set[str]:
    """The attributes, globals, strings and keyword arguments (a call's tuple of names) that a code object names."""
    consts = [c for c in code.co_consts if isinstance(c, str)]
    consts += [name for c in code.co_consts if isinstance(c, tuple) for name in c if isinstance(name, str)]
    return {*code.co_names, *consts}


@dataclass
class Profiler:
    """A stack of the package's calls, and the stack at each call of a function whose code names the value.

    A task's coroutine continues the stack of the code that created it (asyncio.gather in dispatch), and the
    reconcile workers run inline, so one route leads from the handler to every stop."""

    package: str
    names: frozenset[str]
    stops: list[Stop] = field(default_factory=list)
    stack: list[Call] = field(default_factory=list)
    _calls: dict[int, tuple[FrameType, Call]] = field(default_factory=dict)  # frames held: their ids stay unique
    _spawned: dict[int, list[Call]] = field(default_factory=dict)
    _serial: int = 0

    def __call__(self, frame: FrameType, event: str, _arg: Any) -> None:
        code = frame.f_code
        if not code.co_filename.startswith(self.package) or event not in ("call", "return"):
            return
        held = self._calls.get(id(frame))
        if held is None:
            self._serial += 1
            held = frame, Call(self._serial, code.co_filename[len(self.package) :], code.co_qualname)
            self._calls[id(frame)] = held
        call = held[1]
        if event == "return":
            self.stack.pop()
            if id(frame) in self._spawned:
                self.stack.clear()
            return
        if not self.stack:
            self.stack.extend(self._spawned.get(id(frame), ()))
        self.stack.append(call)
        named = sorted(self.names & _names(code))
        if named and not (self.stops and self.stops[-1].stack[-1] == call):  # a coroutine resumed is no new stop
            self.stops.append(Stop(",".join(named), tuple(self.stack)))

    def task(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        self._spawned[id(coro.cr_frame)] = list(self.stack)
        return asyncio.Task(coro, loop=loop, **kwargs)

    @contextmanager
    def profiling(self) -> Iterator[None]:
        asyncio.get_running_loop().set_task_factory(self.task)
        sys.setprofile(self)
        try:
            yield
        finally:
            sys.setprofile(None)
            asyncio.get_running_loop().set_task_factory(None)


@dataclass(frozen=True)
class Trip:
    calls: int
    files: tuple[str, ...]
    changes: int
    route: tuple[str, ...]  # "v file:function" down into a call, "^ file:function" up out of one


def trip(stops: list[Stop], until: str) -> Trip:
    """The route from the first stop's outermost call through every stop, in order, to the first stop that names
    `until` (the place the value ends up)."""
    end = next(i for i, stop in enumerate(stops) if until in stop.what.split(","))
    path = list(stops[0].stack[:1])  # where the value is: the call stack down to it
    visited, route = [path[-1]], []
    for stop in stops[: end + 1]:
        shared = 0
        while shared < min(len(path), len(stop.stack)) and path[shared] == stop.stack[shared]:
            shared += 1
        while len(path) > shared:
            route.append(f"^ {path[-1].file}:{path[-1].function}")
            path.pop()
            visited.append(path[-1] if path else OUTSIDE)
        for call in stop.stack[shared:]:
            route.append(f"v {call.file}:{call.function}")
            path.append(call)
            visited.append(call)
    files = [c.file for c in visited]
    changes = sum(a != b for a, b in itertools.pairwise(files))
    return Trip(len(route), tuple(sorted(set(files) - {OUTSIDE.file})), changes, tuple(route))


class StoringApi:
    """The API server as the reconciler sees it: it stores what it is given and holds no other object."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {}

    def read_namespace(self, namespace: str) -> Any:
        from cpullm.core.observation import NamespaceFacts

        return NamespaceFacts()

    def read_secret_key(self, namespace: str, name: str, key: str) -> None:
        return None

    def apply(self, manifest: dict[str, Any], over: Any = None) -> dict[str, Any]:
        return dict(manifest)

    def delete(self, *_: Any) -> None:
        return None

    def ownership(self, *_: Any) -> None:
        return None

    def list_owned(self, kind: str, namespaces: Any) -> dict[Any, str]:
        return {}

    def child_exists(self, *_: Any) -> bool:
        return False

    def patch_service_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.status.update(status)

    def emit_event(self, *_: Any) -> None:
        return None


class InlineExecutor(concurrent.futures.Executor):
    """Runs a reconcile on the calling thread: its calls continue the handler's stack."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        done.set_result(fn(*args, **kwargs))
        return done


def node_object(numa: int) -> dict[str, Any]:
    flags = ("AVX2", "AVX512F", "AVX512BF16", "AVX512VNNI", "AMXBF16", "AMXINT8")
    labels = {"kubernetes.io/arch": "amd64", "kubernetes.io/hostname": NODE_NAME, "cpullm.io/numa-nodes": str(numa)}
    labels |= {f"feature.node.kubernetes.io/cpu-cpuid.{flag}": "true" for flag in flags}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE_NAME, "labels": labels},
        "spec": {},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi"}},
    }


class Operator:
    """The handlers, their memo and Kopf's indexes (every index the handlers declare, as Kopf fills it)."""

    def __init__(self) -> None:
        import kopf

        from cpullm.controller import handlers
        from cpullm.controller.reconcile import Reconciler
        from cpullm.controller.state import ControllerState
        from cpullm.controller.workers import ReconcileWorkers
        from cpullm.core import planner

        # A fresh operator's: a plan remembered from the last trip would hide this one's route (older trees: none).
        getattr(planner, "forget_plans", lambda: None)()
        self.handlers, self.api = handlers, StoringApi()
        workers = ReconcileWorkers(1)
        workers._threads = InlineExecutor()  # type: ignore[assignment]
        reconciler = Reconciler(self.api, None, clock=lambda: datetime(2026, 1, 1, tzinfo=UTC))  # type: ignore[arg-type]
        state = ControllerState(reconciler, workers, reconciler.memory, reconciler.pacer, reconciler.kube)
        self.memo = kopf.Memo(state=state)
        declared = kopf.get_default_registry()._indexing.get_all_handlers()  # Kopf's registry: no public reader
        self.indexes: dict[str, dict[Any, list[Any]]] = {handler.id: {} for handler in declared}
        self.service = yaml.safe_load((ROOT / EXAMPLE).read_text())
        self.service["metadata"].update(namespace="serving", uid="uid-1", generation=1)
        self.key = ("serving", self.service["metadata"]["name"])

    async def node_indexed(self, numa: int) -> dict[str, Any]:
        body = node_object(numa)
        self.indexes["node_profiles"] = {
            k: [v] for k, v in (await self.handlers.node_profiles(NODE_NAME, body)).items()
        }
        return body

    async def node_event(self, type_: str | None, body: dict[str, Any]) -> None:
        await self.handlers.node_changed(name=NODE_NAME, type=type_, body=body, memo=self.memo, **self.indexes)

    async def service_event(self) -> None:
        self.service["status"] = dict(self.api.status)
        self.indexes["services"] = {self.key: [self.service]}
        await self.handlers.service_changed(
            type=None, namespace=self.key[0], name=self.key[1], uid="uid-1", body=self.service, memo=self.memo,
            **self.indexes,
        )  # fmt: skip


async def kv_cache_to_env(operator: Operator, profiler: Profiler) -> None:
    await operator.node_event(None, await operator.node_indexed(numa=2))
    operator.service["spec"]["kvCacheGiB"] = 5
    with profiler.profiling():
        await operator.service_event()


async def numa_label_to_tp(operator: Operator, profiler: Profiler) -> None:
    await operator.node_event(None, await operator.node_indexed(numa=1))
    await operator.service_event()
    with profiler.profiling():
        body = await operator.node_indexed(numa=2)
        await operator.node_event("MODIFIED", body)


@dataclass(frozen=True)
class Value:
    name: str
    drive: Callable[[Operator, Profiler], Coroutine[Any, Any, None]]
    names: frozenset[str]  # what a function's code names when it handles the value
    until: str  # what the place where the value ends up names


VALUES = (
    Value("service -> decide", kv_cache_to_env, frozenset({"decide"}), "decide"),
    Value("kvCacheGiB -> env", kv_cache_to_env, frozenset({"kv_cache_gi_b", "kv_cache_env"}), "kv_cache_env"),
    Value("NUMA label -> TP", numa_label_to_tp,
          frozenset({"NUMA_NODES_LABEL", "numa_nodes", "tensor_parallel_size", "--tensor-parallel-size"}),
          "--tensor-parallel-size"),
)  # fmt: skip


def measure(value: Value) -> Trip:
    import cpullm

    profiler = Profiler(str(Path(cpullm.__file__).parent) + "/", value.names)
    asyncio.run(value.drive(Operator(), profiler))
    return trip(profiler.stops, value.until)


def table(trips: list[tuple[str, Trip]]) -> str:
    lines = [f"{'value':<20} {'calls':>5} {'files':>5} {'changes':>7}"]
    lines += [f"{name:<20} {t.calls:>5} {len(t.files):>5} {t.changes:>7}" for name, t in trips]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--route", action="store_true", help="print each trip's route, call by call")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose package is measured")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.tree / "operator"))
    trips = [(value.name, measure(value)) for value in VALUES]
    import cpullm

    print(f"package measured: {Path(cpullm.__file__).parent}\n{table(trips)}")
    for name, measured in trips if args.route else ():
        print(f"\n{name}: {', '.join(measured.files)}\n  " + "\n  ".join(measured.route))
    return 0


if __name__ == "__main__":
    sys.exit(main())
