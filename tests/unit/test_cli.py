import importlib.metadata
import json
import logging
from pathlib import Path

import pytest
import yaml

from cpullm.cli import main
from cpullm.core.constants import GiB

from .builders import node_object, topology_object
from .support import direct_plan

ROOT = Path(__file__).resolve().parents[2]
NODES = str(ROOT / "examples" / "nodes.yaml")
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))

# What each example should plan on the sample nodes, written down by hand so a change in the planner that
# moves one of them is seen in review: (TP, KV GiB per rank, CPU, memory limit bytes, eligible nodes).
EXPECTED_PLANS = {
    "llama-8b-amx.yaml": (2, 4, 94, 32892780544, ["xeon-amx-0", "xeon-amx-1"]),
    # latency: the AMX TP 2's decode (23.8 tok/s) ties the 4-NUMA TP 4's (22.6, within 10%); TP 4's first token wins
    "mistral-7b-context.yaml": (4, 2, 124, 31932284928, ["avx512-4numa-0"]),
    "qwen-small.yaml": (1, 2, 47, 6170869760, ["xeon-amx-0", "xeon-amx-1"]),
    "qwen-throughput.yaml": (1, 1, 47, 5042601984, ["xeon-amx-0", "xeon-amx-1"]),
}


def test_the_expected_table_covers_every_example():
    """A new example must get a row in EXPECTED_PLANS, or the value checks would silently skip it."""
    assert sorted(EXPECTED_PLANS) == [p.name for p in EXAMPLES]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_plans_on_the_sample_nodes(example, capsys):
    assert main(["plan", str(example), "--nodes", NODES, "-o", "json"]) == 0
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
    assert plan == direct_plan(example)
    tp, kv_gib, cpu, memory, eligible = EXPECTED_PLANS[example.name]
    assert (plan["tensorParallelSize"], plan["kvCacheGiB"], plan["cpu"]) == (tp, kv_gib, cpu)
    assert (plan["memoryLimitBytes"], plan["eligibleNodes"]) == (memory, eligible)
    assert plan["cpu"] == tp * plan["cpusPerRank"]
    assert plan["weightShardBytes"] * tp == plan["weightsBytes"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_plan_as_yaml_equals_plan_as_json(example, capsys):
    """`-o` changes the encoding only."""
    assert main(["plan", str(example), "--nodes", NODES, "-o", "json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    assert main(["plan", str(example), "--nodes", NODES, "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == as_json


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_render_as_json_and_as_yaml_give_the_same_objects(example, capsys):
    """JSON is a `kind: List` and YAML a document stream, but the objects in them are the same."""
    assert main(["render", str(example), "--nodes", NODES, "-o", "json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    assert main(["render", str(example), "--nodes", NODES, "-o", "yaml"]) == 0
    as_yaml = list(yaml.safe_load_all(capsys.readouterr().out))
    assert (as_json["apiVersion"], as_json["kind"]) == ("v1", "List")
    assert as_json["items"] == as_yaml
    name = yaml.safe_load(example.read_text())["metadata"]["name"]
    named = {(obj["kind"], obj["metadata"]["name"]) for obj in as_yaml}
    assert {("Deployment", name), ("Service", name)} <= named
    assert {obj["metadata"]["namespace"] for obj in as_yaml} == {"default"}
    assert all("ownerReferences" not in obj["metadata"] for obj in as_yaml)  # no uid offline: no owner


def test_render_without_the_launcher_leaves_out_its_config_map_alone(capsys):
    args = ["render", str(ROOT / "manifests/examples/llama-8b-amx.yaml"), "--nodes", NODES]
    assert main(args) == 0
    whole = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert main([*args, "--no-launcher"]) == 0
    shorter = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert "ConfigMap" in whole and [k for k in whole if k != "ConfigMap"] == shorter


def test_render_prints_deployment_and_service(capsys):
    assert main(["render", str(ROOT / "manifests/examples/llama-8b-amx.yaml"), "--nodes", NODES]) == 0
    docs = {d["kind"]: d for d in yaml.safe_load_all(capsys.readouterr().out)}
    assert {"Deployment", "Service"} <= set(docs)  # selected by kind: more owned kinds may come
    assert docs["Service"]["spec"]["selector"] == {"cpullm.io/service": "llama-8b"}
    required = docs["Deployment"]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    terms = required["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    # Both chosen nodes are labelled alike: one term of their shape's labels selects them, no node names.
    (term,) = terms
    selected = {(e["key"], e["operator"], *e.get("values", [])) for e in term["matchExpressions"]}
    assert {
        ("kubernetes.io/arch", "In", "amd64"),
        ("cpullm.io/numa-nodes", "In", "2"),
        ("feature.node.kubernetes.io/cpu-cpuid.AMXBF16", "In", "true"),
        ("cpullm.io/isa.amx_bf16", "NotIn", "false"),
    } <= selected
    assert "matchFields" not in term


def test_model_config_file_and_multi_document_nodes(tmp_path, capsys):
    service = yaml.safe_load((ROOT / "manifests/examples/qwen-small.yaml").read_text())
    config = service["spec"]["model"].pop("config")
    (tmp_path / "svc.yaml").write_text(yaml.safe_dump(service))
    (tmp_path / "config.json").write_text(json.dumps(config))
    nodes = yaml.safe_load(Path(NODES).read_text())["items"]
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump_all(nodes))
    args = ["plan", str(tmp_path / "svc.yaml"), "--nodes", str(tmp_path / "nodes.yaml")]
    assert main([*args, "--model-config", str(tmp_path / "config.json"), "-o", "yaml"]) == 0
    from_file = yaml.safe_load(capsys.readouterr().out)
    assert from_file["tensorParallelSize"] == 1
    # Sized from the file, the plan is the one the inline config gives.
    assert from_file == direct_plan(ROOT / "manifests/examples/qwen-small.yaml")


def test_daemonsets_in_the_nodes_file_take_their_room(tmp_path, capsys):
    """`kubectl get nodes,daemonsets -A -o yaml` prints both kinds: the plan leaves the DaemonSets' pods room, and
    an unreadable DaemonSet is a warning, not a failure."""
    node = {
        "kind": "Node",
        "metadata": {"name": "kind-worker", "labels": {"kubernetes.io/arch": "amd64"}},
        "status": {"allocatable": {"cpu": "8", "memory": "16Gi"}},
    }

    def daemonset(name: str, cpu: str) -> dict:
        pod = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
        return {
            "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": "kube-system"},
            "spec": {"template": {"spec": pod}},
        }

    listing = {"kind": "List", "items": [node, daemonset("kindnet", "100m"), daemonset("broken", "lots")]}
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(listing))
    args = ["plan", str(ROOT / "manifests/examples/qwen-small.yaml"), "--nodes", str(tmp_path / "cluster.yaml")]
    assert main([*args, "-o", "json"]) == 0
    out, err = capsys.readouterr()
    plan = json.loads(out)
    assert plan["nodeProfile"]["cpus"] == 7 and "kube-system/kindnet" in plan["placementNote"]
    assert "DaemonSet kube-system/broken" in err and "DaemonSet skipped" in err


def test_node_resource_topologies_in_the_nodes_file_refine_their_nodes(tmp_path, capsys):
    """`kubectl get nodes,noderesourcetopologies -o yaml`: a node without a NUMA label is planned with its
    topology's two NUMA nodes; an unreadable topology is a warning, and its node keeps its labels' one."""
    nodes = [node_object(name, numa=None) for name in ("a", "b")]
    broken = {**topology_object("b"), "zones": []}
    listing = {"kind": "List", "items": [*nodes, topology_object("a", cpus=(32, 32)), broken]}
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(listing))
    args = ["plan", str(ROOT / "manifests/examples/llama-8b-amx.yaml"), "--nodes", str(tmp_path / "cluster.yaml")]
    assert main([*args, "-o", "json"]) == 0
    out, err = capsys.readouterr()
    plan = json.loads(out)
    assert (plan["eligibleNodes"], plan["tensorParallelSize"]) == (["a"], 2)
    assert plan["nodeProfile"]["numaSource"] == "NodeResourceTopology"
    assert "NodeResourceTopology b: no zone of type Node (NUMA node); its node is planned from its labels" in err


FOUR_LINES = """apiVersion: cpullm.io/v1alpha1
kind: CpuLLMService
metadata: {name: llama}
spec: {model: {name: meta-llama/Llama-3.1-8B-Instruct}}
"""


def test_a_four_line_service_plans_with_its_defaults_shown(tmp_path, capsys):
    """model.name alone: context, concurrency and KV are chosen from the model, and the plan says they were."""
    (tmp_path / "svc.yaml").write_text(FOUR_LINES)
    config = str(Path(__file__).parent / "fixtures" / "models" / "llama-3.1-8b.json")
    args = ["plan", str(tmp_path / "svc.yaml"), "--nodes", NODES, "--model-config", config]
    assert main(args) == 0
    assert "KV 4 GiB/rank (default: 8 sequences x 8192 tokens)" in capsys.readouterr().out
    assert main([*args, "-o", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    chosen = {k: plan[k] for k in ("maxModelLen", "maxModelLenSource", "maxNumSeqs", "maxNumSeqsSource")}
    assert chosen == {
        "maxModelLen": 8192,
        "maxModelLenSource": "default",
        "maxNumSeqs": 8,
        "maxNumSeqsSource": "default",
    }
    assert (plan["kvCacheGiB"], plan["kvCacheSource"], plan["tensorParallelSize"]) == (4, "default", 2)


@pytest.mark.parametrize(
    ("spec_patch", "error"),
    [
        ({"cpu": {"requiredISA": ["sve2", "amx_bf16"]}}, "cpullm: NoEligibleNode: no eligible node: lacks ISA"),
        ({"tensorParallelSize": 6}, "cpullm: InvalidTensorParallelSize: tensor parallel size 6 is not supported"),
        ({"maxModelLen": 10**9}, "cpullm: MaxModelLenTooLong: maxModelLen 1000000000 is longer than the model's"),
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


@pytest.mark.parametrize(
    ("which", "text", "error"),
    [
        ("service", "spec: [\n", "svc.yaml: not YAML: line 2, column 1: expected the node content"),
        ("nodes", "kind: Node\n  bad: : x\n", "nodes.yaml: not YAML: line 2, column 6: mapping values are not allowed"),
        ("service", "- just\n- a list\n", "svc.yaml: a YAML list where objects were expected"),
        ("nodes", "NAME    STATUS   ROLES    AGE   VERSION\nn1      Ready    <none>   1d    v1.30\n",
         "nodes.yaml: plain text, not YAML objects (kubectl get's table? write it with -o yaml)"),
    ],
)  # fmt: skip
def test_a_file_that_is_no_yaml_is_named_with_the_line(tmp_path, capsys, which, text, error):
    """The file, the line and what to do: never a Python name."""
    service, nodes = tmp_path / "svc.yaml", tmp_path / "nodes.yaml"
    service.write_text((ROOT / "manifests" / "examples" / "qwen-small.yaml").read_text())
    nodes.write_text(Path(NODES).read_text())
    (service if which == "service" else nodes).write_text(text)
    assert main(["plan", str(service), "--nodes", str(nodes)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"cpullm: InvalidSpec: {tmp_path}/") and error in err and err.count("\n") == 1, err


def test_version(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"cpullm {importlib.metadata.version('cpullm-operator')}\n"


@pytest.mark.parametrize(
    ("flags", "handler_runs", "probe_lines"),
    [
        ([], logging.WARNING, logging.WARNING),  # quiet: Kopf's per-handler lines and the kubelet's probes hidden
        (["--verbose"], logging.NOTSET, logging.NOTSET),
    ],
)
def test_run_hands_kopf_the_scope_and_quiets_chatty_loggers(
    monkeypatch: pytest.MonkeyPatch, flags: list[str], handler_runs: int, probe_lines: int
) -> None:
    import kopf

    calls: list[dict[str, object]] = []
    monkeypatch.setattr(kopf, "run", lambda **kwargs: calls.append(kwargs))
    for name in ("kopf.objects", "aiohttp.access"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    assert main(["run", "-n", "team-a", *flags]) == 0
    (call,) = calls
    assert (call["clusterwide"], call["namespaces"], call["standalone"]) == (False, ["team-a"], True)
    assert logging.getLogger("kopf.objects").level == handler_runs
    assert logging.getLogger("aiohttp.access").level == probe_lines


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        ([], "one of the arguments --nodes --from-cluster is required"),
        (["--nodes", NODES, "--from-cluster"], "argument --from-cluster: not allowed with argument --nodes"),
    ],
)
def test_the_nodes_come_from_a_file_or_from_the_cluster(capsys, flags, error):
    with pytest.raises(SystemExit) as exited:
        main(["plan", str(EXAMPLES[0]), *flags])
    assert exited.value.code == 2 and error in capsys.readouterr().err


def test_from_cluster_without_a_kubeconfig_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["plan", str(EXAMPLES[0]), "--from-cluster"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cpullm: --from-cluster: no cluster to read") and err.count("\n") == 1


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_plan_prints_a_table_for_people_by_default(example, capsys):
    """One row per rank (its NUMA node where the ranks map one-to-one onto them), the nodes, and why."""
    assert main(["plan", str(example), "--nodes", NODES]) == 0
    lines = capsys.readouterr().out.splitlines()
    plan = direct_plan(example)
    tp, kv_gib, cpu, _, eligible = EXPECTED_PLANS[example.name]
    header = next(i for i, line in enumerate(lines) if line.startswith("rank  NUMA node"))
    ranks = [line.split() for line in lines[header + 1 : header + 1 + tp]]
    assert [row[0] for row in ranks] == [str(rank) for rank in range(tp)]
    after = lines[header + 1 + tp :]
    if plan["packedEmbeddingsBytes"]:  # the sample nodes have AVX-512: oneDNN packs the bf16 embeddings
        assert after.pop(0).endswith(f"oneDNN's packed embeddings {plan['packedEmbeddingsBytes'] / GiB:.2f} GiB")
    assert after[0] == ""
    if plan["placement"] == "tensorParallel" and tp == plan["nodeProfile"]["numaNodes"]:
        assert [row[1] for row in ranks] == [str(rank) for rank in range(tp)]
    assert all(row[-2] == str(kv_gib) and str(plan["cpusPerRank"]) in row for row in ranks)
    assert lines[1].startswith(f"nodes   {len(eligible)} chosen: {', '.join(eligible)}")
    assert f"pod     {cpu} CPU" in "\n".join(lines) and f"why     {plan['summary']}" in lines


QWEN = str(ROOT / "manifests" / "examples" / "qwen-small.yaml")
NODE_WITHOUT_STATUS = "apiVersion: v1\nkind: Node\nmetadata: {name: a, labels: {kubernetes.io/arch: amd64}}\n"


@pytest.mark.parametrize(
    ("files", "args", "code", "error"),
    [
        pytest.param(
            {},
            ["/nope.yaml", "--nodes", NODES],
            2,
            "the CpuLLMService file /nope.yaml: cannot read it (No such file or directory)",
            id="missing-service-file",
        ),
        pytest.param(
            {},
            [QWEN, "--nodes", "/nope.yaml"],
            2,
            "--nodes /nope.yaml: cannot read it (No such file or directory)",
            id="missing-nodes-file",
        ),
        pytest.param(
            {"nodes": "apiVersion: v1\nkind: List\nitems: []\n"},
            [QWEN, "--nodes", "{nodes}"],
            2,
            "--nodes {nodes}: no Node in it (found no object); write it with `kubectl get nodes -o yaml > nodes.yaml`",
            id="empty-nodes-file",
        ),
        pytest.param(
            {"nodes": "apiVersion: v1\nkind: Nod\nmetadata: {name: a}\n"},
            [QWEN, "--nodes", "{nodes}"],
            2,
            "--nodes {nodes}: no Node in it (found 1 Nod) (did you mean Node?)",
            id="kind-typo",
        ),
        pytest.param(
            {"nodes": NODE_WITHOUT_STATUS},
            [QWEN, "--nodes", "{nodes}"],
            1,
            "NoEligibleNode: no eligible node: no node the planner can read",
            id="node-without-status",
        ),
        pytest.param(
            {},
            [NODES, "--nodes", NODES],
            2,
            f"{NODES}: no CpuLLMService in it (found 5 Node)",
            id="nodes-given-as-service",
        ),
        pytest.param(
            {"svc": "kind: CpuLLMServce\n"},
            ["{svc}", "--nodes", NODES],
            2,
            "(did you mean CpuLLMService?)",
            id="service-kind-typo",
        ),
        pytest.param(
            {"svc": "kind: CpuLLMService\nspec: {model: {name: m}, maxModelLength: 8}\n---\n"},
            ["{svc}", "--nodes", NODES],
            1,
            "InvalidSpec: spec.maxModelLength: no such field (did you mean maxModelLen?)",
            id="misspelt-field",
        ),
    ],
)
def test_errors_name_the_file_and_the_fix_without_python_exceptions(tmp_path, capsys, files, args, code, error):
    paths = {name: str(tmp_path / f"{name}.yaml") for name in files}
    for name, text in files.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    assert main(["plan", *(a.format(**paths) for a in args)]) == code
    err = capsys.readouterr().err
    assert error.format(**paths) in err
    assert "Error:" not in err and "Errno" not in err and "Traceback" not in err


def test_a_plan_that_does_not_fit_names_what_to_change(tmp_path, capsys):
    service = yaml.safe_load(Path(QWEN).read_text())
    service["spec"]["kvCacheGiB"] = 4000
    (tmp_path / "svc.yaml").write_text(yaml.safe_dump(service))
    assert main(["plan", str(tmp_path / "svc.yaml"), "--nodes", NODES]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cpullm: ModelTooLarge:")
    assert "try a smaller kvCacheGiB (or maxModelLen, maxNumSeqs), kvCacheDtype fp8, a quantized checkpoint" in err


def test_offline_the_hub_is_read_with_hf_token_where_the_spec_names_no_secret(capsys):
    from cpullm.commands import EnvironmentToken

    seen: list[str | None] = []

    class Source:
        def fetch(self, name, revision, token):
            seen.append(token)
            return "files"

    with_env, without = EnvironmentToken(Source(), "hf_env"), EnvironmentToken(Source(), None)
    assert with_env.fetch("org/m", None, None) == "files"
    assert with_env.fetch("org/m", None, "from-secret") == "files"  # the spec's Secret wins
    without.fetch("org/m", None, None)
    assert seen == ["hf_env", "from-secret", None]
    assert capsys.readouterr().err == "cpullm: reading org/m from the Hub with $HF_TOKEN\n"


def test_an_http_hub_endpoint_is_one_line_without_a_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.internal")
    (tmp_path / "svc.yaml").write_text(FOUR_LINES)
    assert main(["plan", str(tmp_path / "svc.yaml"), "--nodes", NODES]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cpullm: the Hub endpoint 'http://mirror.internal' is not https://") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "service", "code", "error"),
    [
        pytest.param(
            ["--model-config", "nope.json"], {}, 1,
            "cpullm: ModelConfigUnavailable: --model-config nope.json: cannot read it (No such file or directory)",
            id="a model config that is not there",
        ),
        pytest.param(
            [], {"hfTokenSecret": "hf-token"}, 1,
            "cpullm: InvalidSpec: spec.hfTokenSecret: should be an object with name, key, not str",
            id="a Secret named as a string",
        ),
        pytest.param(
            [], {"apiVersion": "cpullm.io/v1"}, 2,
            "apiVersion 'cpullm.io/v1' is not served: a CpuLLMService is cpullm.io/v1alpha1",
            id="an apiVersion not served",
        ),
        pytest.param(
            ["--model-config", str(Path(__file__).parent / "fixtures" / "models" / "llama-3.1-8b.json")],
            {"tensorParallelSize": 4, "cpu": {"requiredISA": ["amx_bf16"]}}, 1,
            "leave tensorParallelSize unset (TP 2 there)",
            id="a TP beyond the NUMA nodes",
        ),
    ],
)  # fmt: skip
def test_each_error_names_the_file_field_and_fix_in_one_line(tmp_path, capsys, args, service, code, error):
    raw = yaml.safe_load(FOUR_LINES)
    raw["apiVersion"] = service.pop("apiVersion", raw["apiVersion"])
    raw["spec"].update(service)
    (tmp_path / "svc.yaml").write_text(yaml.safe_dump(raw))
    assert main(["plan", str(tmp_path / "svc.yaml"), "--nodes", NODES, *args]) == code
    err = capsys.readouterr().err
    assert error in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_a_plan_of_a_spec_with_its_config_imports_no_hub_client_and_no_metrics():
    """What a plan's start is made of (`cpullm plan` starts in under half a second): huggingface_hub's client and
    prometheus_client are a third of it, and a spec that carries its model's config needs neither. Checked by what a
    fresh interpreter imported, not by a clock."""
    import subprocess
    import sys

    example = str(ROOT / "manifests" / "examples" / "qwen-small.yaml")
    script = (
        "import sys, contextlib, io\n"
        "from cpullm.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main(['plan', {example!r}, '--nodes', {NODES!r}]) == 0\n"
        "print(sorted(m for m in ('huggingface_hub.hf_api', 'prometheus_client', 'kopf') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_vllm_python_sizes_what_no_formula_knows_through_the_script_it_runs(tmp_path, capsys):
    """--vllm-python runs cpullm/meta_size.py with that python on a directory of the config: here a stand-in python
    that checks what it was handed and prints a report vLLM 0.32 printed for LFM2-1.2B (fixtures/vllm_reports), for
    the same config under a model_type no formula knows."""
    report = (Path(__file__).parent / "fixtures" / "vllm_reports" / "lfm2-1.2b.json").read_text()
    config = json.loads((Path(__file__).parent / "fixtures" / "models" / "lfm2-1.2b.json").read_text())
    config["model_type"] = "lfm2_fork"
    stand_in = tmp_path / "python"
    stand_in.write_text(
        "#!/bin/sh\n"
        '[ "$(basename "$1")" = meta_size.py ] && [ -f "$2/config.json" ] || exit 3\n'
        '[ "$3 $4" = "--dtype bfloat16" ] || exit 4\n'
        f"echo 'vLLM logs on stdout too'\necho 'cpullm-meta-size: {json.dumps(json.loads(report))}'\n"
    )
    stand_in.chmod(0o755)
    service = {
        "apiVersion": "cpullm.io/v1alpha1",
        "kind": "CpuLLMService",
        "metadata": {"name": "fork"},
        "spec": {"model": {"name": "org/lfm2-fork", "config": config}, "kvCacheGiB": 1, "maxModelLen": 4096},
    }
    (tmp_path / "svc.yaml").write_text(yaml.safe_dump(service))
    args = ["plan", str(tmp_path / "svc.yaml"), "--nodes", NODES, "-o", "json"]
    assert main(args) == 1
    assert "is not a known family and its config has conv_L_cache" in capsys.readouterr().err
    assert main([*args, "--vllm-python", str(stand_in)]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["sizing"]["weightsSource"] == "vLLM 0.32.0 (meta device)"
    assert plan["weightsBytes"] == 2_340_681_216
    assert plan["sizing"]["kvLayout"].startswith("6 full + 10 short_conv state layers")
