"""Benchmark, not a test: the planner alone (plan_service, no I/O) for one service against N node profiles, best
of --runs x --rounds (processes taken in turns), for this checkout and for each --vs checkout (e.g. a worktree of
an earlier commit), side by side in one run. Each checkout is measured in its own process with its own
`operator/` on PYTHONPATH, on the same nodes and spec (Llama-3.1-8B's config inline; four node shapes, 2 and 4
NUMA nodes, with and without AMX).

    git worktree add /tmp/before 82751ef
    .venv/bin/python bench/planner_bench.py --nodes 5000 --vs /tmp/before
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MEASURE = r"""
import json, sys, time
from cpullm.api.spec import parse_spec
from cpullm.core.planner import plan_service
from cpullm.core.sizing import size_model
from cpullm.core.topology import parse_node

nodes, runs = int(sys.argv[1]), int(sys.argv[2])
NFD = "feature.node.kubernetes.io/cpu-cpuid."
flags = [("AVX2", "AVX512F", "AVX512BF16", "AMXTILE", "AMXBF16"), ("AVX2", "AVX512F", "AVX512BF16")]
profiles = [
    parse_node({
        "metadata": {"name": f"node-{i}", "labels": {
            "kubernetes.io/arch": "amd64", "cpullm.io/numa-nodes": str(2 + 2 * (i % 2)),
            **{NFD + f: "true" for f in flags[(i // 2) % 2]}}},
        "status": {"allocatable": {"cpu": "64", "memory": f"{256 + i % 7}Gi"}},
    })
    for i in range(nodes)
]
config = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
          "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
          "tie_word_embeddings": False, "max_position_embeddings": 131072}
spec = parse_spec({"model": {"name": "meta-llama/Llama-3.1-8B", "config": config}, "kvCacheGiB": 4,
                   "maxModelLen": 16384, "replicas": 3})
model = size_model(config, spec.model.dtype)
best = float("inf")
for _ in range(runs):
    started = time.perf_counter()
    plan = plan_service(spec, model, profiles)
    best = min(best, time.perf_counter() - started)
print(json.dumps({"ms": best * 1000, "tp": plan.tensor_parallel_size, "eligible": len(plan.eligible_nodes)}))
"""


def measure(checkout: Path, nodes: int, runs: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(nodes), str(runs)],
        env={"PYTHONPATH": str(checkout / "operator"), "PATH": "/usr/bin:/bin"},
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=5, help="plans per process (the best counts)")
    parser.add_argument("--rounds", type=int, default=3, help="processes per checkout, taken in turns")
    parser.add_argument("--vs", type=Path, action="append", default=[], help="another checkout to measure beside")
    args = parser.parse_args()
    checkouts = [ROOT, *args.vs]
    best: dict[Path, dict[str, float]] = {}
    for _ in range(args.rounds):  # in turns, so a busy moment of the machine does not fall on one checkout
        for checkout in checkouts:
            row = measure(checkout, args.nodes, args.runs)
            if checkout not in best or row["ms"] < best[checkout]["ms"]:
                best[checkout] = row
    rows = [(str(checkout), best[checkout]) for checkout in checkouts]
    print(f"plan_service against {args.nodes} node profiles, best of {args.runs} x {args.rounds} rounds")
    print(f"{'checkout':<40} {'ms per plan':>12} {'TP':>4} {'eligible nodes':>15}")
    for name, row in rows:
        print(f"{name:<40} {row['ms']:>12.1f} {row['tp']:>4.0f} {row['eligible']:>15.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
