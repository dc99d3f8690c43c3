"""The operator as the e2e suite runs it: a real local process, or the one the chart installed in the cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from testbed.tools import ROOT, Kubectl, NotYet, eventually


class Operator:
    """`cpullm run` as a real process against the cluster; restartable (the SIGKILL test)."""

    def __init__(
        self,
        kubeconfig: str,
        log_path: Path,
        health_port: int,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.extra_args = extra_args or []
        self.env = env or {}
        self.log_path = log_path
        self.health_url = f"http://127.0.0.1:{health_port}/healthz"
        self.metrics_url: str | None = None  # set when started with --metrics-port
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, **self.env, "KUBECONFIG": self.kubeconfig, "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cpullm", "run", "--liveness", self.health_url, *self.extra_args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        try:
            eventually(self._healthy, timeout=60, what="operator health endpoint")
        except BaseException:  # not left running (and unreaped) behind a failed start
            self.stop()
            raise

    def _healthy(self) -> bool:
        assert self.process is not None and self.process.poll() is None, f"operator exited: {self.log_tail()}"
        try:
            with urllib.request.urlopen(self.health_url, timeout=2) as response:
                return bool(response.status == 200)
        except OSError as err:
            raise NotYet(str(err)) from err

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye, as an OOM kill or a node loss would do."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 80) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


class InClusterOperator:
    """The chart's operator Deployment (the kind path), behind Operator's interface: stop scales it to 0,
    kill force-deletes its pod with no grace period (the container gets SIGKILL), start waits for a ready pod."""

    def __init__(self, kubectl: Kubectl, namespace: str, deployment: str) -> None:
        self.kubectl, self.namespace, self.deployment = kubectl, namespace, deployment

    def start(self) -> None:
        self.kubectl.run("scale", "deployment", self.deployment, "-n", self.namespace, "--replicas=1")
        self.kubectl.run("rollout", "status", "deployment", self.deployment, "-n", self.namespace, "--timeout=180s")

    def stop(self) -> None:
        self.kubectl.run("scale", "deployment", self.deployment, "-n", self.namespace, "--replicas=0")
        eventually(lambda: not self._pods(), timeout=120, what="operator pods gone")

    def kill(self) -> None:
        for pod in self._pods():
            self.kubectl.run("delete", "pod", pod, "-n", self.namespace, "--grace-period=0", "--force")

    def log_tail(self, lines: int = 80) -> str:
        args = ("logs", f"deployment/{self.deployment}", "-n", self.namespace, f"--tail={lines}")
        return self.kubectl.run(*args, check=False).stdout

    def _pods(self) -> list[str]:
        deployment = self.kubectl.get("deployment", self.deployment, self.namespace)
        selector = deployment["spec"]["selector"]["matchLabels"]
        return [p["metadata"]["name"] for p in self.kubectl.get("pods", namespace=self.namespace, **selector)]


def conditions(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in service.get("status", {}).get("conditions", [])}


def not_ready_for(kubectl: Kubectl, namespace: str, name: str, reason: str) -> str:
    """The service's Ready message while Ready's reason is `reason`; AssertionError naming the condition otherwise
    (a probe for eventually)."""
    found = conditions(kubectl.get("cpullm", name, namespace) or {}).get("Ready", {})
    assert found.get("reason") == reason, found
    return str(found["message"])


def ready(
    kubectl: Kubectl, namespace: str, name: str, replicas: int | None = None, timeout: float = 90, interval: float = 0.5
) -> dict[str, Any]:
    """The service once Ready for its current generation (and with `replicas` ready pods, if given)."""

    def probe() -> dict[str, Any]:
        service = kubectl.get("cpullm", name, namespace)
        assert service is not None, "service missing"
        status = service.get("status", {})
        ready_condition = conditions(service).get("Ready", {})
        assert ready_condition.get("status") == "True", ready_condition
        assert status.get("observedGeneration") == service["metadata"]["generation"], status
        if replicas is not None:
            assert status.get("readyReplicas") == replicas, status
        return service

    return eventually(probe, timeout=timeout, interval=interval, what=f"{namespace}/{name} Ready")
