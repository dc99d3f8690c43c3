"""What the chart's probe Job runs of `cpullm probe` in the operator's image: the probe's script saved for the vLLM
image's python, and what the script printed published as the node's NodePerformance, or refused in one line when the
planner could not read it or there is no cluster; and how the script samples what it times."""

from __future__ import annotations

import json
from importlib import resources
from urllib.parse import urlsplit

import pytest

from cpullm import perf_probe
from cpullm.cli import main
from cpullm.io.kube import Kube

from .builders import probe_object
from .fake_api import FakeTransport, kube


def test_the_saved_script_is_the_probe_the_cli_runs(tmp_path):
    saved = tmp_path / "perf_probe.py"
    assert main(["probe", "--save-script", str(saved)]) == 0
    assert saved.read_text() == resources.files("cpullm").joinpath("perf_probe.py").read_text()


def test_a_published_probe_is_applied_as_the_planner_reads_it(tmp_path, monkeypatch, capsys):
    measured = probe_object("worker-1")
    measured["spec"]["fromANewerProbe"] = True  # a field this operator does not know is left out, not sent
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(measured))
    transport = FakeTransport(200, measured)
    monkeypatch.setattr(Kube, "from_environment", classmethod(lambda cls: kube(transport)))
    assert main(["probe", "--publish", str(path)]) == 0
    (request,) = transport.requests
    assert urlsplit(request["url"]).path == "/apis/cpullm.io/v1alpha1/nodeperformances/worker-1"
    sent = json.loads(request["body"])
    assert sent["metadata"] == {"name": "worker-1"} and "fromANewerProbe" not in sent["spec"]
    assert sent["spec"]["numaNodes"][0]["allCores"]["readBytesPerSecond"] == 80e9
    assert capsys.readouterr().err == "nodeperformances.cpullm.io/worker-1 published\n"


def broken() -> dict:
    measured = probe_object()
    measured["spec"]["numaNodes"] = []
    return measured


def unnamed() -> dict:
    measured = probe_object()
    measured["metadata"] = {}
    return measured


@pytest.mark.parametrize(
    ("content", "code", "error"),
    [
        ({"kind": "Node", "metadata": {"name": "n"}}, 2, "--publish {path}: 0 NodePerformance objects in it, not one"),
        (broken(), 1, "InvalidNodePerformance: NodePerformance n1: spec.numaNodes: List should have at least 1 item"),
        (unnamed(), 2, "--publish {path}: the NodePerformance has no name (its node's)"),
        (probe_object(), 2, "--publish: no cluster to write to"),
    ],
    ids=["no-node-performance", "unreadable", "no-name", "no-cluster"],
)
def test_what_cannot_be_published_is_one_line_and_nothing_is_written(
    tmp_path, monkeypatch, capsys, content, code, error
):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(content))
    assert main(["probe", "--publish", str(path)]) == code
    err = capsys.readouterr().err
    assert err.startswith("cpullm: " + error.format(path=path)) and err.count("\n") == 1


def test_saving_the_script_and_publishing_are_one_or_the_other(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["probe", "--save-script", str(tmp_path / "s.py"), "--publish", "-"])
    assert exited.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_compute_bound_points_are_sampled_in_rounds_over_every_point():
    """A slow spell of the host's lasts seconds: each point's samples come from every round, not one stretch."""
    order: list[str] = []
    runs = {key: (lambda key=key: order.append(key)) for key in ("bf16 256", "bf16 1024", "int8 1024")}
    seconds = perf_probe.spread_seconds(runs, budget=0.0, passes=3)
    assert set(seconds) == set(runs) and all(s >= 0 for s in seconds.values())
    warm_up, timed = order[:3], order[3:]
    assert warm_up == list(runs)
    assert timed == [key for _ in range(3) for key in runs for _ in range(2)]  # two samples a round at least


def test_what_runs_before_each_timed_run_is_not_timed(monkeypatch):
    """The attention's decode runs after the caches are evicted (a server's layers stream weights between two
    layers' attention): the eviction precedes every timed run, and its time is not counted."""
    clock = iter(range(1000))
    monkeypatch.setattr(perf_probe.time, "perf_counter", lambda: float(next(clock)))
    order: list[str] = []
    seconds = perf_probe.typical_seconds(lambda: order.append("run"), budget=0.0, before=lambda: order.append("evict"))
    assert order[0] == "run"  # the warm-up
    assert order[1:] == ["evict", "run"] * 5
    assert seconds == 1.0  # each run between two readings of the clock, the eviction outside them
