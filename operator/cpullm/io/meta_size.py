"""vLLM as a sizing source on this machine: runs cpullm/meta_size.py with a python that has vLLM (`cpullm plan
--vllm-python`), on a directory holding the config, and returns the report it printed (core/sizing/vllm_report.py
reads it). A report is cached per config, dtype and python for the process: a plan asks for it once per
reconcile-like pass."""

from __future__ import annotations

import functools
import json
import subprocess
import tempfile
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from cpullm.core.sizing.vllm_report import REPORT_MAX_CHARS, VllmSizer, report_from_text
from cpullm.errors import UnsupportedModel

SCRIPT = "meta_size.py"
TIMEOUT_SECONDS = 600


def script_source() -> str:
    """The script's source, for a vLLM image's python (a Job saves it there)."""
    return resources.files("cpullm").joinpath(SCRIPT).read_text()


@functools.lru_cache(maxsize=32)
def _run(python: str, config_json: str, dtype: str) -> Mapping[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cpullm-meta-size-") as workdir:
        (Path(workdir) / "config.json").write_text(config_json)
        script = Path(workdir) / SCRIPT
        script.write_text(script_source())
        try:
            done = subprocess.run(
                [python, str(script), workdir, "--dtype", dtype],
                capture_output=True,
                text=True,
                timeout=TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise UnsupportedModel(f"vLLM could not be asked to size the model with {python}: {error}") from None
    report = report_from_text(done.stdout[-REPORT_MAX_CHARS:])
    if report is None:
        last = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        raise UnsupportedModel(f"{python} printed no vLLM sizing report (exit {done.returncode}): {last[:300]}")
    return report


def local_vllm_sizer(python: str) -> VllmSizer:
    """Sizing's vLLM seam, answered by `python` (the vLLM environment's) on this machine."""

    def size(config: Mapping[str, Any], dtype: str) -> Mapping[str, Any]:
        return _run(python, json.dumps(config, sort_keys=True), dtype)

    return size
