"""vLLM as a sizing source: builds a model from its config.json alone on the meta device (no weights, no download),
as vLLM's CPU backend would serve it at TP 1, and prints one JSON line (prefix REPORT) of what sizing needs: the
parameter bytes vLLM holds, each kind of KV cache spec its layers ask for and how many layers ask for it, the heads
and context vLLM derives, and which tensor parallel sizes vLLM's own check accepts. Where vLLM refuses the config,
the line carries its error instead.

Run with a python that has vLLM (the service's vLLM image, or the vLLM environment):

    python meta_size.py MODEL_DIR [--dtype bfloat16] [--tensor-parallel 1,2,4,8]
    python meta_size.py --config-env CPULLM_MODEL_CONFIG --report-file /dev/termination-log

The second form is the operator's sizing Job (core/children/sizing_job.py): the config comes in an environment
variable and the line goes to the container's termination message as well, which the operator reads.

Like the launcher and the probe it stands alone (the standard library, torch and vLLM): core/sizing/vllm_report.py
reads its line. vLLM's functions used (EngineArgs.create_engine_config, initialize_model, the layers'
get_kv_cache_spec, ModelConfig.verify_with_parallel_config) are those of 0.31 and 0.32."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

REPORT = "cpullm-meta-size: "
# The process-wide group of one rank vLLM's layers ask for while they are built (a port of its own: no server runs
# beside this process).
PORT = int(os.environ.get("CPULLM_META_SIZE_PORT", "29519"))
# A termination message holds at most 4096 bytes (the kubelet cuts the rest): the report is kept below it.
REPORT_LIMIT = 4000


def _spec_entry(spec: Any) -> dict[str, Any]:
    """One KV cache spec as sizing reads it: its kind and shape (vLLM's v1/kv_cache_interface.py classes)."""
    kind = type(spec).__name__
    entry: dict[str, Any] = {"spec": kind}
    if kind == "MambaSpec":
        entry["shapes"] = [list(shape) for shape in spec.shapes]
        entry["dtypes"] = [str(dtype).removeprefix("torch.") for dtype in spec.dtypes]
        entry["mixer"] = str(getattr(spec.mamba_type, "name", spec.mamba_type)).lower()
        # A sequence's pages (MambaSpec.max_memory_usage_bytes): prefix caching's align mode keeps the running state,
        # the last block's and any prefill checkpoints; without prefix caching (an attention-free model), one.
        extra = int(getattr(spec, "num_prefill_checkpoint_blocks", 0) or 0)
        entry["pages"] = 2 + extra if getattr(spec, "mamba_cache_mode", "none") == "align" else 1
        return entry
    entry["kv_heads"] = int(spec.num_kv_heads)
    entry["head_size"] = int(spec.head_size)
    window = getattr(spec, "sliding_window", None) or getattr(spec, "attention_chunk_size", None)
    if window:
        entry["window"] = int(window)
    return entry


def measure(model: str, dtype: str, tensor_parallel: list[int]) -> dict[str, Any]:
    import torch
    from vllm.config import ParallelConfig, VllmConfig, get_layers_from_vllm_config, set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    import vllm

    args = EngineArgs(model=model, skip_tokenizer_init=True, load_format="dummy", dtype=dtype, enforce_eager=True)
    config = args.create_engine_config()
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{PORT}", 0, "gloo")
        ensure_model_parallel_initialized(1, 1)
    with set_current_vllm_config(config):
        with set_default_torch_dtype(config.model_config.dtype), torch.device("meta"):
            built = initialize_model(vllm_config=config)
        groups: dict[str, dict[str, Any]] = {}
        layers = get_layers_from_vllm_config(config, AttentionLayerBase)
        for layer in layers.values():
            spec = layer.get_kv_cache_spec(config)
            if spec is None:
                continue
            entry = _spec_entry(spec)
            key = json.dumps(entry, sort_keys=True)
            groups.setdefault(key, {**entry, "layers": 0})["layers"] += 1
    accepted: dict[str, str | None] = {}
    for tp in tensor_parallel:
        try:
            config.model_config.verify_with_parallel_config(ParallelConfig(tensor_parallel_size=tp))
            accepted[str(tp)] = None
        except Exception as refused:  # vLLM's own refusal of this size is the answer for it
            accepted[str(tp)] = f"{type(refused).__name__}: {refused}"[:300]
    text = config.model_config.hf_text_config
    return {
        "vllm": vllm.__version__,
        "architecture": config.model_config.architecture,
        "weights_bytes": sum(p.numel() * p.element_size() for p in built.parameters()),
        "parameters": sum(p.numel() for p in built.parameters()),
        "attention_heads": int(getattr(text, "num_attention_heads", 0) or 0),
        "hidden_size": int(getattr(text, "hidden_size", 0) or 0),
        "layers": int(getattr(text, "num_hidden_layers", 0) or 0),
        "vocabulary": int(getattr(text, "vocab_size", 0) or 0),
        "max_context": int(config.model_config.max_model_len),
        "groups": list(groups.values()),
        "tensor_parallel": accepted,
    }


def _version() -> str:
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:  # no vLLM at all: the error says so
        return "(none)"


def _fitted(report: dict[str, Any]) -> str:
    """The report's line, compact, within REPORT_LIMIT: vLLM's words (an error, a TP size's refusal) are shortened
    before anything sizing counts is."""
    line = json.dumps(report, separators=(",", ":"))
    if len(line) <= REPORT_LIMIT:
        return line
    if isinstance(report.get("tensor_parallel"), dict):
        report["tensor_parallel"] = {k: v if v is None else v[:120] for k, v in report["tensor_parallel"].items()}
    if "error" in report:
        report["error"] = report["error"][:1500]
    return json.dumps(report, separators=(",", ":"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("model", nargs="?", help="a directory holding the model's config.json")
    parser.add_argument("--config-env", help="the environment variable holding config.json instead of a directory")
    parser.add_argument("--report-file", help="a file the report line is written to as well")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tensor-parallel", default="1,2,4,8", help="the sizes to ask vLLM about, comma-separated")
    args = parser.parse_args(argv)
    if (args.model is None) == (args.config_env is None):
        parser.error("give a model directory or --config-env, one of them")
    sizes = [int(size) for size in args.tensor_parallel.split(",") if size]
    with tempfile.TemporaryDirectory(prefix="cpullm-meta-size-") as workdir:
        model = args.model
        if args.config_env is not None:
            model = workdir
            with open(os.path.join(workdir, "config.json"), "w") as config:
                config.write(os.environ.get(args.config_env, ""))
        try:
            report = measure(model, args.dtype, sizes)
        except Exception as error:  # vLLM's refusal of the config is the answer; its words go to the operator
            report = {"vllm": _version(), "error": f"{type(error).__name__}: {error}"[:2000]}
    line = REPORT + _fitted(report)
    print(line, flush=True)
    if args.report_file:
        with open(args.report_file, "w") as out:
            out.write(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
