"""Imported at start-up by every Python process of a vLLM server the sizing tests start (they put this directory
on PYTHONPATH), and by nothing else. vLLM CPU 0.32 logs no model-load memory (its V1 CPU runner prints only the
load time), so this reports it: when vLLM's loader has loaded a checkpoint's weights into the model and before it
repacks them for the CPU kernels, the bytes of the model's parameters, as one log line:
`cpullm-probe: loaded parameter bytes N`."""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

LOADER_MODULE = "vllm.model_executor.model_loader.base_loader"


class _ReportLoadedBytes(importlib.abc.MetaPathFinder):
    """Wraps the loader module's process_weights_after_loading once the module is imported."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != LOADER_MODULE:
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module = _reporting(spec.loader.exec_module)
                return spec
        return None


def _reporting(execute: Any) -> Any:
    def exec_module(module: Any) -> None:
        execute(module)
        process = module.process_weights_after_loading

        def report(model: Any, *args: Any, **kwargs: Any) -> Any:
            loaded = sum(p.numel() * p.element_size() for p in model.parameters())
            print(f"cpullm-probe: loaded parameter bytes {loaded}", file=sys.stderr, flush=True)
            return process(model, *args, **kwargs)

        module.process_weights_after_loading = report

    return exec_module


sys.meta_path.insert(0, _ReportLoadedBytes())
