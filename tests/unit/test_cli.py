import json
from pathlib import Path

import pytest
import yaml

from cpullm.cli import main

ROOT = Path(__file__).resolve().parents[2]
NODES = str(ROOT / "examples" / "nodes.yaml")
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_plans_on_the_sample_nodes(example, capsys):
    assert main(["plan", str(example), "--nodes", NODES]) == 0
    plan = json.loads(capsys.readouterr().out)
    for key in (
        "tensorParallelSize",
        "kvCacheGiB",
        "threadsBind",
        "weightShardBytes",
        "memoryLimitBytes",
        "cpu",
        "image",
        "nodeProfile",
        "eligibleNodes",
    ):
        assert key in plan


def test_render_prints_deployment_and_service(capsys):
    assert main(["render", str(ROOT / "manifests/examples/llama-8b-amx.yaml"), "--nodes", NODES]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    required = docs[0]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    terms = required["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchFields"][0]["values"] for t in terms] == [["xeon-amx-0"], ["xeon-amx-1"]]


def test_model_config_file_and_multi_document_nodes(tmp_path, capsys):
    service = yaml.safe_load((ROOT / "manifests/examples/qwen-small.yaml").read_text())
    config = service["spec"]["model"].pop("config")
    (tmp_path / "svc.yaml").write_text(yaml.safe_dump(service))
    (tmp_path / "config.json").write_text(json.dumps(config))
    nodes = yaml.safe_load(Path(NODES).read_text())["items"]
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump_all(nodes))
    args = ["plan", str(tmp_path / "svc.yaml"), "--nodes", str(tmp_path / "nodes.yaml")]
    assert main([*args, "--model-config", str(tmp_path / "config.json"), "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["tensorParallelSize"] == 1


@pytest.mark.parametrize(
    ("spec_patch", "error"),
    [
        ({"cpu": {"requiredISA": ["sve2", "amx_bf16"]}}, "cpullm: NoEligibleNode: no eligible node: lacks ISA"),
        ({"tensorParallelSize": 6}, "cpullm: InvalidTensorParallelSize: tensor parallel size 6 is not supported"),
        ({"kvCacheGiB": None}, "cpullm: InvalidSpec: spec: Value error, set kvCacheGiB"),
        ({"cpu": {"threadsBind": "all"}}, "cpullm: InvalidSpec: spec.cpu.threadsBind: String should match pattern"),
    ],
)
def test_impossible_plans_exit_non_zero_with_one_line(tmp_path, capsys, spec_patch, error):
    service = yaml.safe_load((ROOT / "manifests/examples/qwen-small.yaml").read_text())
    service["spec"].update(spec_patch)
    service["spec"] = {k: v for k, v in service["spec"].items() if v is not None}
    (tmp_path / "svc.yaml").write_text(yaml.safe_dump(service))
    assert main(["plan", str(tmp_path / "svc.yaml"), "--nodes", NODES]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(error) and captured.err.count("\n") == 1


def test_missing_file_is_a_one_line_error(capsys):
    assert main(["plan", "/nonexistent.yaml", "--nodes", NODES]) == 2
    assert capsys.readouterr().err.startswith("cpullm: FileNotFoundError")
