"""The e2e suite's tools: one wait helper, a kubectl wrapper, the operator as a real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]


class NotYet(AssertionError):
    """Raised by a probe passed to eventually() when the condition does not hold yet."""


def eventually(probe: Callable[[], T], *, timeout: float = 60, interval: float = 0.5, what: str = "") -> T:
    """Call probe until it returns a value other than None/False without raising AssertionError; after
    timeout the last failure is reported. The suite's only way to wait."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = probe()
            if result is not None and result is not False:
                return result
            last: Exception = NotYet(f"{what or probe.__name__} returned {result!r}")
        except AssertionError as err:
            last = err
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what or probe.__name__}: {last}"
            ) from last
        time.sleep(interval)


class Kubectl:
    def __init__(self, binary: str, kubeconfig: str) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig

    def run(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.binary, "--kubeconfig", self.kubeconfig, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def apply(self, *objects: dict[str, Any], check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("apply", "-f", "-", input=yaml.safe_dump_all(objects), check=check)

    def get(self, kind: str, name: str | None = None, namespace: str | None = None, **selector: str) -> Any:
        """The object (or list items); None when a named object does not exist."""
        args = ["get", kind, "-o", "json"]
        if name:
            args.insert(2, name)
        if namespace:
            args += ["-n", namespace]
        if selector:
            args += ["-l", ",".join(f"{k}={v}" for k, v in selector.items())]
        result = self.run(*args, check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        obj = json.loads(result.stdout)
        return obj if name else obj["items"]


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
        eventually(self._healthy, timeout=60, what="operator health endpoint")

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
