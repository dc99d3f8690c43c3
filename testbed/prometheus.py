"""A real Prometheus (scripts/build-tools.sh prometheus: built from its Go module) on this machine, scraping fixed
targets, with the chart's alert rules loaded: what the tests of the chart's dashboard and alert rules query. Its HTTP
API: https://prometheus.io/docs/prometheus/latest/querying/api/"""

from __future__ import annotations

import json
import subprocess
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testbed.images import tool_dirs
from testbed.tools import ROOT, eventually, free_port

CHART_FILES = ROOT / "charts" / "cpullm-operator" / "files"
ALERTS = CHART_FILES / "alerts.yaml"
DASHBOARD = CHART_FILES / "dashboard.json"


@dataclass(frozen=True)
class Target:
    """A scrape job: `address` (host:port), the labels its series get, and whether the series' own labels win (the
    operator's ServiceMonitor: honorLabels)."""

    job: str
    address: str
    labels: Mapping[str, str]
    honor_labels: bool = False


class Prometheus:
    def __init__(self, targets: Sequence[Target], every: str = "2s") -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="cpullm-prometheus-"))
        self.port = free_port()
        config = {
            "global": {"scrape_interval": every, "evaluation_interval": every},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [
                {
                    "job_name": t.job,
                    "honor_labels": t.honor_labels,
                    "static_configs": [{"targets": [t.address], "labels": dict(t.labels)}],
                }
                for t in targets
            ],
        }
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        binary = tool_dirs(["prometheus"])["prometheus"] / "prometheus"
        self.log = (self.workdir / "log").open("w")
        self.process = subprocess.Popen(
            [
                str(binary),
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        eventually(self._ready, timeout=60, what="Prometheus ready")

    def _ready(self) -> bool:
        assert self.process.poll() is None, f"Prometheus exited: {self.log_tail()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/{path}?{query}", timeout=10) as answer:
            body = json.loads(answer.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def alerts(self) -> dict[str, dict[str, Any]]:
        """Each alerting rule by name, with its health, last error and state (inactive, pending, firing)."""
        groups = self.api("rules", type="alert")["groups"]
        return {rule["name"]: rule for group in groups for rule in group["rules"]}

    def log_tail(self, lines: int = 20) -> str:
        self.log.flush()
        return "\n".join((self.workdir / "log").read_text().splitlines()[-lines:])

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        subprocess.run(["rm", "-rf", str(self.workdir)], check=False)


def dashboard_queries(namespace: str, service: str, rate_interval: str = "1m") -> dict[str, str]:
    """Every query of the chart's dashboard (its panels' and its variables'), with Grafana's variables set: by
    "panel title / legend" (or "variable NAME")."""
    dashboard = json.loads(DASHBOARD.read_text())

    def filled(expr: str) -> str:
        for name, value in (("$__rate_interval", rate_interval), ("$namespace", namespace), ("$service", service)):
            expr = expr.replace(name, value)
        return expr

    queries = {}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            queries[f"{panel['title']} / {target['legendFormat']}"] = filled(target["expr"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            # label_values(SELECTOR, LABEL) is Grafana's: the series it lists are SELECTOR's.
            selector = variable["query"]["query"].removeprefix("label_values(").rsplit(",", 1)[0]
            queries[f"variable {variable['name']}"] = filled(selector)
    return queries


def alert_queries() -> dict[str, str]:
    """Each alert rule's expression as a query that has series whenever what it compares has: `X > N` becomes
    `X > bool N` (1 where it would fire, 0 where not)."""
    found = {}
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            query, op, number = rule["expr"].rsplit(" ", 2)
            assert op in {"<", ">", "<=", ">=", "==", "!="} and float(number) == float(number), rule["expr"]
            found[rule["alert"]] = f"{query} {op} bool {number}"
    return found
