"""GGUF copies of a benchmark model for llama.cpp, so that llama.cpp and vLLM serve the same weights side by side:
the model's own 16-bit type (bf16 for our bf16 models, else f16), Q8_0 and Q4_K_M, cached in `<model_dir>.gguf/`
and rebuilt only when missing (each file is written under a temporary name and renamed, so a partial one is never
taken for done).

    .venv/bin/python bench/gguf_models.py [--model NAME | --model-dir DIR] [--llamacpp-dir DIR] [--python PY]

The 16-bit file comes from llama.cpp's own `convert_hf_to_gguf.py` (installed by bench/llamacpp_setup.sh, run with
the vLLM venv's python, which has the torch, transformers, safetensors and numpy it needs; its `gguf` package comes
from the vendored gguf-py on PYTHONPATH, nothing is installed into the venv), the quantized ones from
`llama-quantize`.

The pre-tokenizer snag: for a BPE tokenizer the converter hashes the token ids of a fixed probe text to recognise
which published model's pre-tokenizer (the regex split before BPE) it has, and raises NotImplementedError ("BPE
pre-tokenizer was not recognized") for any other hash. Our models' tokenizer is trained locally, so its hash is
unknown, and the converter has no option to name the pre-tokenizer. Editing the vendored file would be lost on every
rebuild, and registering our hash would have to be redone whenever the tokenizer changes, so instead the converter
runs under a small runner (`_CONVERT` below) that replaces `TextModel.get_vocab_base_pre` with one returning
PRE_TOKENIZER and then runs the unmodified script as `__main__`. Everything else (tokens, token types, merges,
special ids, all tensors) is the converter's own. PRE_TOKENIZER is "gpt-2" because our tokenizer pre-tokenizes with
`ByteLevel(use_regex=True)`, which is exactly GPT-2's split, so a text prompt gives the same token count in both
servers ("qwen2" would split digits and contractions differently; token quality does not matter for speed, but
equal prompt lengths do). The runner then checks what the benchmark needs: the GGUF holds the config's vocab_size
tokens, its embedding is [hidden_size, vocab_size], and its tensors have as many elements in all as the safetensors.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.vllm_server import built_model, vllm_python

REPO = Path(__file__).resolve().parents[1]
QUANTS = ("Q8_0", "Q4_K_M")
PRE_TOKENIZER = "gpt-2"

# Runs in the vLLM venv: python -c _CONVERT LLAMACPP_DIR PRE MODEL_DIR OUTFILE OUTTYPE
_CONVERT = r"""
import json, runpy, struct, sys
from pathlib import Path

llamacpp, pre, model_dir, outfile, outtype = sys.argv[1:6]
import conversion.base

conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
script = str(Path(llamacpp) / "convert_hf_to_gguf.py")
sys.argv = [script, model_dir, "--outfile", outfile, "--outtype", outtype]
runpy.run_path(script, run_name="__main__")

from gguf import GGUFReader

config = json.loads((Path(model_dir) / "config.json").read_text())
vocab, hidden = config["vocab_size"], config["hidden_size"]
reader = GGUFReader(outfile)
field = reader.fields["tokenizer.ggml.pre"]
assert bytes(field.parts[field.data[0]]).decode() == pre, "pre-tokenizer not written"
tokens = len(reader.fields["tokenizer.ggml.tokens"].data)
assert tokens == vocab, f"{tokens} tokens, the config says {vocab}"
embedding = next(t for t in reader.tensors if t.name == "token_embd.weight")
assert [int(d) for d in embedding.shape] == [hidden, vocab], f"token_embd {list(embedding.shape)}"
safetensors = 0
for path in Path(model_dir).glob("*.safetensors"):
    with path.open("rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    for name, entry in header.items():
        if name != "__metadata__":
            count = 1
            for d in entry["shape"]:
                count *= d
            safetensors += count
gguf = sum(int(t.n_elements) for t in reader.tensors)
assert gguf == safetensors, f"{gguf} elements in the GGUF, {safetensors} in the safetensors"
print(f"checked: {tokens} tokens, {len(reader.tensors)} tensors, {gguf} elements, pre-tokenizer {pre!r}")
"""


def sixteen_bit_type(model_dir: Path) -> str:
    """bf16 for a bf16 checkpoint (lossless, and what vLLM runs), f16 otherwise."""
    config = json.loads((model_dir / "config.json").read_text())
    return "bf16" if config.get("torch_dtype", config.get("dtype")) == "bfloat16" else "f16"


def gguf_models(model_dir: Path, llamacpp_dir: Path, python: Path) -> dict[str, Path]:
    """Returns {16-bit type, "Q8_0", "Q4_K_M": path}, converting and quantizing whichever files are missing."""
    model_dir = model_dir.resolve()
    out_dir = model_dir.with_name(model_dir.name + ".gguf")
    out_dir.mkdir(exist_ok=True)
    base_type = sixteen_bit_type(model_dir)
    base = out_dir / f"{model_dir.name}-{base_type}.gguf"
    if not base.exists():
        partial = base.with_suffix(".partial")
        env = os.environ | {"PYTHONPATH": os.pathsep.join([str(llamacpp_dir), str(llamacpp_dir / "gguf-py")])}
        args = [str(llamacpp_dir), PRE_TOKENIZER, str(model_dir), str(partial), base_type]
        subprocess.run([str(python), "-c", _CONVERT, *args], env=env, check=True)
        partial.rename(base)
    paths = {base_type: base}
    for quant in QUANTS:
        path = out_dir / f"{model_dir.name}-{quant}.gguf"
        if not path.exists():
            partial = path.with_suffix(".partial")
            threads = str(os.cpu_count() or 1)
            subprocess.run(
                [str(llamacpp_dir / "bin" / "llama-quantize"), str(base), str(partial), quant, threads], check=True
            )
            partial.rename(path)
        paths[quant] = path
    return paths


def setup_llamacpp() -> Path:
    """Runs bench/llamacpp_setup.sh (a no-op once built) and returns the directory it prints last."""
    out = subprocess.run(
        ["bash", str(REPO / "bench" / "llamacpp_setup.sh")], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    return Path(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-1.5b", help="a sized model, built with random weights if missing")
    parser.add_argument("--model-dir", type=Path, help="another checkpoint directory, instead of --model")
    parser.add_argument("--llamacpp-dir", type=Path, help="default: what bench/llamacpp_setup.sh installs")
    parser.add_argument("--python", type=Path, help="runs the converter (needs torch); default: the vLLM venv's")
    args = parser.parse_args()
    python = args.python or vllm_python()
    model_dir = args.model_dir or built_model(python, args.model)
    llamacpp_dir = args.llamacpp_dir or setup_llamacpp()
    for kind, path in gguf_models(model_dir, llamacpp_dir, python).items():
        print(f"{kind}\t{path}\t{path.stat().st_size / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
