"""How far a value travels (bench/value_trip.py): the route arithmetic on made-up stacks, then the three trips as the
handlers run them on this tree, held to where each must pass and end."""

from __future__ import annotations

import pytest
from bench.value_trip import OUTSIDE, VALUES, Call, Stop, measure, trip

HANDLER = Call(1, "controller/handlers.py", "on_event")
DISPATCH = Call(2, "controller/dispatch.py", "route")
PLANNER = Call(3, "core/planner.py", "plan")
READER = Call(4, "core/planner.py", "read")
BUILDER = Call(5, "core/children/deployment.py", "env")
INDEXER = Call(6, "controller/handlers.py", "index")
PARSER = Call(7, "core/topology.py", "parse")


@pytest.mark.parametrize(
    "stops, calls, files, changes",
    [
        pytest.param([Stop("end", (HANDLER, DISPATCH, PLANNER))], 2, 3, 2, id="straight down"),
        pytest.param(
            [Stop("read", (HANDLER, DISPATCH, PLANNER, READER)), Stop("end", (HANDLER, DISPATCH, BUILDER))],
            6,  # down 3, up 2 to the dispatcher, down 1 to the builder
            4,
            4,  # handlers > dispatch > planner (reader and caller alike) > dispatch > deployment
            id="up to the common caller and down",
        ),
        pytest.param(
            [Stop("read", (INDEXER, PARSER)), Stop("end", (HANDLER, DISPATCH))],
            5,  # down into the parser, up out of it and out of the index handler, down 2 into the next handler
            3,  # Kopf, holding the value between handlers, is no file of ours
            5,  # handlers > topology > handlers > Kopf > handlers > dispatch
            id="through Kopf's index to the next handler",
        ),
    ],
)
def test_a_route_walks_up_to_the_common_caller_and_down(
    stops: list[Stop], calls: int, files: int, changes: int
) -> None:
    measured = trip(stops, "end")
    assert (measured.calls, len(measured.files), measured.changes) == (calls, files, changes)
    assert OUTSIDE.file not in measured.files


def test_a_trip_ends_at_the_first_stop_that_names_where_the_value_ends_up() -> None:
    stops = [Stop("read", (HANDLER, READER)), Stop("write", (HANDLER, BUILDER)), Stop("read", (HANDLER, PLANNER))]
    assert trip(stops, "write").route == (
        "v core/planner.py:read",
        "^ core/planner.py:read",
        "v core/children/deployment.py:env",
    )


def test_each_value_travels_from_its_handler_through_its_readers_to_where_it_ends_up() -> None:
    routes = {value.name: measure(value).route for value in VALUES}
    assert routes["service -> decide"][-1] == "v controller/reconcile.py:Reconciler._reconcile"
    kv = routes["kvCacheGiB -> env"]
    assert kv[0] == "v controller/dispatch.py:service_changed"
    assert "v core/planner.py:_kv_cache" in kv
    assert kv[-1] == "v core/children/deployment.py:vllm_env"
    tp = routes["NUMA label -> TP"]
    assert tp[:2] == ("v core/topology.py:parse_node", "^ core/topology.py:parse_node")
    assert tp.index("^ controller/handlers.py:node_profiles") + 1 == tp.index("v controller/handlers.py:node_changed")
    assert tp[-1] == "v core/children/deployment.py:vllm_args"
