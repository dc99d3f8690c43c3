"""vLLM as the sizing oracle, from config.json alone: run with the vLLM environment's python (testbed/vllm_server.py,
vllm_oracle), it builds vLLM's model for each config on the meta device (no weights, no download), as vLLM CPU would
serve it on this machine at TP 1, and prints one JSON line per config: the bytes of the parameters vLLM holds, and
the KV cache vLLM would lay out for a KV cache of `kv_bytes`: its block size, each group's spec and layers, the
blocks a request of `max_model_len` takes and the token capacity vLLM logs ("CPU KV cache size: N tokens"), by
vLLM's own functions (the CPU platform's block-size alignment, get_kv_cache_configs, get_kv_cache_capacity).

    python oracle.py REQUESTS.json     # [{"config": DIR, "dtype": "bfloat16", "max_model_len": N, "kv_bytes": B}]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

PORT = 29517
# What starts each result line (vLLM logs on stdout too).
RESULT = "oracle: "


def vllm_config(request: dict[str, Any]) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=request["config"],
        skip_tokenizer_init=True,
        load_format="dummy",
        dtype=request["dtype"],
        max_model_len=request["max_model_len"],
        max_num_seqs=4,
        enforce_eager=True,
    )
    return args.create_engine_config()


def measure(request: dict[str, Any], first: bool) -> dict[str, Any]:
    """vLLM's imports here: the tests import RESULT from this file without vLLM."""
    import torch
    from vllm.config import VllmConfig, get_layers_from_vllm_config, set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.platforms import current_platform
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity, get_kv_cache_configs

    config = vllm_config(request)
    if first:  # one process-wide group of one rank serves every config
        # Made outside any model's config: vLLM then makes the expert-parallel group too (it leaves it out when the
        # current model is dense), which every MoE config after the first needs, whichever config comes first.
        with set_current_vllm_config(VllmConfig()):
            init_distributed_environment(1, 0, f"tcp://127.0.0.1:{PORT}", 0, "gloo")
            ensure_model_parallel_initialized(1, 1)
    with set_current_vllm_config(config):
        with set_default_torch_dtype(config.model_config.dtype), torch.device("meta"):
            model = initialize_model(vllm_config=config)
        current_platform.update_block_size_for_backend(config)
        specs = {}
        for name, layer in get_layers_from_vllm_config(config, AttentionLayerBase).items():  # type: ignore[type-abstract]
            spec = layer.get_kv_cache_spec(config)
            if spec is not None:
                specs[name] = spec
        supported = [layout.name for layout in get_supported_kv_cache_layouts(get_current_attn_backends(config))]
        resolve_kv_cache_layout(config, [supported], specs.values())
        [kv_config] = get_kv_cache_configs(config, [specs], [request["kv_bytes"]])
        tokens, _ = get_kv_cache_capacity(config, kv_config)
    groups = [
        {"spec": type(group.kv_cache_spec).__name__, "layers": len(group.layer_names)}
        for group in kv_config.kv_cache_groups
    ]
    return {
        "config": request["config"],
        "weights_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "parameters": sum(p.numel() for p in model.parameters()),
        "block_size": config.cache_config.block_size,
        "page_bytes": kv_config.kv_cache_groups[0].kv_cache_spec.page_size_bytes if groups else 0,
        "groups": groups,
        "num_blocks": kv_config.num_blocks,
        "kv_tokens": tokens,
        "ssm_cache_dtype": config.cache_config.mamba_ssm_cache_dtype,
    }


def main() -> None:
    """One line per request, `{"config": ..., "error": ...}` where vLLM refuses the config (the next ones go on)."""
    requests = json.loads(Path(sys.argv[1]).read_text())
    first = True
    for request in requests:
        try:
            result = measure(request, first)
        except Exception as error:  # vLLM's own refusal of this config is the answer for it
            result = {"config": request["config"], "error": f"{type(error).__name__}: {error}"[:2000]}
        first = False
        print(RESULT + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
