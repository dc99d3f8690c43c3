"""What every part of the test bed and the suites built on it share: the repository's root, a free local port, the one
way to wait (eventually), a kubectl wrapper, and the published CRDs of the APIs the operator integrates with."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from cpullm.core.children import crd_established

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]


def published_crds() -> dict[str, str]:
    """The optional APIs' published CRDs (scripts/fetch-crds.sh, from their Go modules): file path by name."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "fetch-crds.sh")], check=True, capture_output=True, text=True
    ).stdout
    return dict(line.split("=", 1) for line in out.strip().splitlines())


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

    def wait_established(self, crd: str, timeout: float = 60) -> None:
        """Until the API server serves a CRD just applied. Not `kubectl wait --for=condition=Established`: that
        fails at once while the new CRD has no status conditions yet ("<nil> is of the type <nil>")."""

        def served() -> bool:
            return crd_established((self.get("crd", crd) or {}).get("status") or {})

        eventually(served, timeout=timeout, what=f"CRD {crd} established")

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


def scrape(url: str, timeout: float = 10) -> dict[str, float]:
    """A Prometheus text page, one value per series (its name and labels as printed)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return parse_metrics(response.read().decode())


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text, one value per series (its name and labels as printed)."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            samples[series] = float(value)
    return samples


def metric_total(samples: dict[str, float], name: str) -> float:
    """The sum of every series of the metric `name` (whatever their labels)."""
    return sum(value for series, value in samples.items() if series.split("{", 1)[0] == name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_free_space(paths: list[Path], needed: int, what: str) -> None:
    """Fail at once where a long setup would run out of disk midway: a kind node's image pull then fails after
    minutes as "no space left on device", said only in a pod's events."""
    for path in paths:
        free = shutil.disk_usage(path).free
        if free < needed:
            raise AssertionError(f"{what} needs {needed / 1e9:.0f} GB free on {path}'s disk; {free / 1e9:.1f} GB are")
