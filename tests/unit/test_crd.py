import re
from pathlib import Path

import pytest
import yaml

from cpullm.api.crd import _log_dropped, build_crd, build_performance_crd, known_fields, parse_stored_spec
from cpullm.api.spec import IMAGE_REFERENCE_PATTERN, CpuLLMServiceSpec, parse_spec
from cpullm.errors import InvalidSpec

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "cpullm.io_cpullmservices.yaml"


def test_crd_file_is_generated_from_the_spec_model():
    """crds/ is `cpullm crd` output: regenerate with `cpullm crd > crds/cpullm.io_cpullmservices.yaml`."""
    assert CRD_FILE.read_text() == yaml.safe_dump(build_crd(), sort_keys=False)


def test_the_node_performance_crd_is_generated_from_its_model_and_the_chart_ships_both():
    """`cpullm crd --kind NodePerformance > crds/cpullm.io_nodeperformances.yaml`; the chart's crds/ are copies."""
    generated = yaml.safe_dump(build_performance_crd(), sort_keys=False)
    assert (ROOT / "crds" / "cpullm.io_nodeperformances.yaml").read_text() == generated
    for name in ("cpullm.io_cpullmservices.yaml", "cpullm.io_nodeperformances.yaml"):
        assert (ROOT / "charts" / "cpullm-operator" / "crds" / name).read_text() == (ROOT / "crds" / name).read_text()
    crd = build_performance_crd()
    assert crd["spec"]["scope"] == "Cluster" and crd["metadata"]["name"] == "nodeperformances.cpullm.io"
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["pythonSeconds", "numaNodes"]
    assert "&id" not in generated  # no YAML aliases: a schema used twice is written out twice


def _walk(schema, path="spec"):
    yield path, schema
    for name, prop in (schema.get("properties") or {}).items():
        yield from _walk(prop, f"{path}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")


def test_schema_is_structural_and_explained():
    version = build_crd()["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    for path, node in _walk(root["properties"]["spec"]):
        assert "type" in node, f"{path} has no type"
        assert not {"anyOf", "$ref", "title", "exclusiveMinimum"} & set(node), path
    # The API server's rule for a CRD's metadata: a type and nothing else (not even a description).
    assert root["properties"]["metadata"] == {"type": "object"}
    spec = root["properties"]["spec"]
    assert spec["required"] == ["model"]
    assert spec["x-kubernetes-validations"][0]["rule"].startswith("!has(self.env)")
    assert "NUMA node" in spec["properties"]["tensorParallelSize"]["description"]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert [c["name"] for c in version["additionalPrinterColumns"]][:3] == ["Model", "Placement", "TP"]


def _walk_maps(schema, path):
    yield from _walk(schema, path)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        yield from _walk_maps(extra, f"{path}{{}}")
    for name, prop in (schema.get("properties") or {}).items():
        if isinstance(prop.get("additionalProperties"), dict):
            yield from _walk_maps(prop["additionalProperties"], f"{path}.{name}{{}}")


def test_every_field_kubectl_explain_shows_has_a_description():
    """`kubectl explain cpullmservice.spec...` documents every field: the spec, the status and the plan (a list's
    items and a map's values are no fields of their own)."""
    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = {path: node for path, node in _walk_maps(root, "") if path and not path.endswith(("[]", "{}"))}
    del fields[".metadata"]  # the API server refuses a description there; kubectl explain has ObjectMeta's own
    undescribed = sorted(path for path, node in fields.items() if "description" not in node)
    assert undescribed == []


def test_chart_crd_is_identical():
    chart_copy = ROOT / "charts" / "cpullm-operator" / "crds" / CRD_FILE.name
    assert chart_copy.read_bytes() == CRD_FILE.read_bytes()


def test_env_and_args_the_operator_owns_are_refused_naming_the_field_to_use():
    from cpullm.api.spec import parse_spec
    from cpullm.errors import InvalidSpec

    base = {"model": {"name": "org/model"}, "kvCacheGiB": 1}
    ok = parse_spec({**base, "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}], "extraArgs": ["--seed=1"]})
    assert ok.extra_args == ["--seed=1"]
    bad = {**base, "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "64"}], "extraArgs": ["--port=9000", "-tp", "4"]}
    try:
        parse_spec(bad)
    except InvalidSpec as err:
        assert "env VLLM_CPU_KVCACHE_SPACE (set spec.kvCacheGiB)" in err.message
        assert "extraArgs --port (set spec.service.port)" in err.message
        assert "extraArgs -tp (set spec.tensorParallelSize)" in err.message
    else:
        raise AssertionError("accepted")
    rules = [r["rule"] for r in build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"]]  # fmt: skip
    assert any("VLLM_CPU_KVCACHE_SPACE" in rule for rule in rules)
    assert any("|--port|" in rule and ".matches(" in rule for rule in rules)


@pytest.mark.parametrize(
    "arg",
    ["--port", "--port=1", "--portx", "--max_model_len=9", "--max-model-len", "--max-model-lens", "-tp", "-tp=2",
     "--api_key", "--config", "--configure", "--seed=1", "--enable-prefix-caching", "model", "--model_impl=x",
     "--api-key.x=1", "--api_key.x", "-tp.x=2", "--hf-token", "--hf_token=hf_x", "--compilation-config.level=3",
     "--config.x", "--seed=1.5"],
)  # fmt: skip
def test_the_cel_rule_on_extra_args_refuses_what_the_model_refuses(arg):
    """The API server's rule (a pattern, for its cost budget) and the operator's check agree on every spelling
    but abbreviations, which only the operator's check refuses."""
    from cpullm.api.spec import _CEL_OWNED_FLAGS, flag_meant, flag_name

    pattern = re.search(r"matches\('([^']*)'\)", str(_CEL_OWNED_FLAGS["rule"]))
    assert pattern is not None
    refused = flag_meant(arg)
    assert (re.match(pattern.group(1), arg) is not None) is (refused == flag_name(arg))


@pytest.mark.parametrize(
    ("arg", "meant"),
    [("--max-model", "--max-model-len"), ("--tensor_parallel", "--tensor-parallel-size"), ("--api-k", "--api-key"),
     ("--hos", "--host"), ("--conf", "--config"), ("-tp2", "-tp"), ("--model-impl", None), ("--max-num-batched-tokens",
     None), ("--config-format", None), ("--", None), ("-t", None), ("--seed", None)],
)  # fmt: skip
def test_an_abbreviated_flag_is_taken_for_the_flag_vllms_parser_reads(arg, meant):
    """vLLM 0.32's parser takes an unambiguous prefix of a long flag for the flag (measured: '--max-model 9' set
    max_model_len, '--api-k x' the API key, '--hos' the host)."""
    from cpullm.api.spec import flag_meant

    assert flag_meant(arg) == meant


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def _adapters(*changes: dict) -> dict:
    """A spec of org/model with one adapter per change, each a valid adapter with those fields changed."""
    valid = {"name": "tuned", "source": "org/tuned-lora", "rank": 16}
    return {"model": {"name": "org/model"}, "adapters": [{**valid, **change} for change in changes]}


def _keda(address: str) -> dict:
    return {"autoscaling": {"kind": "keda", "maxReplicas": 2, "prometheusAddress": address}}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"extraArgs": ["--max_model_len=9"]}, "extraArgs --max-model-len (set spec.maxModelLen)"),
        ({"extraArgs": ["--tensor_parallel_size", "8"]}, "extraArgs --tensor-parallel-size (set spec.tensorParallel"),
        ({"extraArgs": ["--api-key", "sk-1"]}, "extraArgs --api-key (set spec.apiKeySecret)"),
        ({"extraArgs": ["--api_key=sk-1"]}, "extraArgs --api-key (set spec.apiKeySecret)"),
        ({"extraArgs": ["--config", "/etc/x.yaml"]}, "extraArgs --config (a file of flags the operator cannot check"),
        ({"extraArgs": ["--max-model", "9"]}, "extraArgs --max-model-len as --max-model (set spec.maxModelLen)"),
        ({"extraArgs": ["--api-k", "sk-1"]}, "extraArgs --api-key as --api-k (set spec.apiKeySecret)"),
        ({"env": [{"name": "HUGGING_FACE_HUB_TOKEN", "value": "hf_x"}]}, "env HUGGING_FACE_HUB_TOKEN (a token in"),
        ({"extraArgs": ["--api-key.x=1"]}, "extraArgs --api-key (set spec.apiKeySecret)"),
        ({"extraArgs": ["--hf-token", "hf_x"]}, "extraArgs --hf-token (a token in the Deployment's text: set spec.hf"),
        ({"env": [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}]}, "adds development routes the API key does not"),
        ({"env": [{"name": "X", "valueFrom": _nested(600)}]}, "spec: nested more than 64 levels deep"),
        ({"env": [{"name": "X", "valueFrom": {"a": {}}}]}, "spec.env.0.valueFrom.a: no such field"),
        ({"env": [{"name": "X", "valueFrom": {}}]}, "valueFrom needs exactly one of configMapKeyRef, fieldRef"),
        ({"model": {"name": "org/model", "config": _nested(100)}}, "spec: nested more than 64 levels deep"),
        (_keda("http://169.254.169.254/latest/meta-data"), "must not name a loopback or link-local host"),
        (_keda("http://127.0.0.1:9090"), "must not name a loopback or link-local host"),
        (_keda("http://localhost:9090"), "must not name a loopback or link-local host"),
        (_keda("http://admin:sk-1@prometheus:9090"), "prometheusAddress: String should match pattern"),
        (_keda("file:///etc/passwd"), "prometheusAddress: String should match pattern"),
        ({"extraArgs": ["--enable-lora"]}, "extraArgs --enable-lora (set spec.adapters)"),
        ({"extraArgs": ["--lora_modules", "a=/x"]}, "extraArgs --lora-modules (set spec.adapters)"),
        ({"env": [{"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "1"}]}, "loads adapters on request"),
        ({**_adapters({"name": "gpt2"}), "model": {"name": "gpt2"}}, "cannot be the base model's name"),
        (_adapters({}, {}), "two adapters have the same name"),
        (_adapters({"source": "a/b,c"}), "adapters.0.source: String should match pattern"),
        (_adapters({"source": "relative/path/x"}), "adapters.0.source: String should match pattern"),
        (_adapters({"rank": 1024}), "adapters.0.rank: Input should be less than or equal to 512"),
        (_adapters({"name": "-x"}), "adapters.0.name: String should match pattern"),
    ],
    ids=[
        "underscored-flag",
        "underscored-flag-apart",
        "api-key",
        "api-key-underscored",
        "config-file",
        "abbreviated-flag",
        "abbreviated-api-key",
        "hub-token-literal",
        "dotted-api-key",
        "hub-token-flag",
        "dev-mode",
        "deep-value-from",
        "untyped-value-from",
        "empty-value-from",
        "deep-config",
        "keda-metadata-service",
        "keda-loopback",
        "keda-localhost",
        "keda-credentials",
        "keda-file",
        "lora-flag",
        "lora-modules-flag",
        "lora-at-run-time",
        "adapter-named-as-the-model",
        "adapters-of-one-name",
        "adapter-source-with-a-comma",
        "adapter-source-relative",
        "adapter-rank-too-high",
        "adapter-name-pattern",
    ],
)
def test_what_a_spec_may_not_set_is_refused_with_why(spec, message):
    """Flags as vLLM's parser reads them ('_' is '-'), secrets as literals, dev routes, flag files and free-form
    nesting: each refused with the field to use or the reason, never echoing a value."""
    from cpullm.api.spec import parse_spec
    from cpullm.errors import InvalidSpec

    with pytest.raises(InvalidSpec) as refused:
        parse_spec({"model": {"name": "org/model"}, "kvCacheGiB": 1, **spec})
    assert message in refused.value.message
    assert "sk-1" not in refused.value.message and "hf_x" not in refused.value.message


def test_a_typed_value_from_passes_to_the_pod_as_written():
    from cpullm.api.spec import parse_spec

    source = {"secretKeyRef": {"name": "s", "key": "k"}}
    spec = parse_spec({"model": {"name": "org/model"}, "kvCacheGiB": 1, "env": [{"name": "X", "valueFrom": source}]})
    assert spec.env[0].model_dump(by_alias=True, exclude_none=True) == {"name": "X", "valueFrom": source}


def test_json_is_copied_and_measured_at_any_depth():
    """What Kopf's index and the reconcile copy of a stored spec: deeper than copy.deepcopy reaches, so that
    parse_spec refuses it instead of a RecursionError before it."""
    from cpullm.api.spec import copy_json, too_deep

    deep: dict = {"leaf": [1, "x", None, {"k": True}]}
    for _ in range(5000):
        deep = {"a": [deep]}
    copied = copy_json(deep)
    assert too_deep(copied) and not too_deep({"a": [{"b": 1}]})
    probe, original = copied, deep
    while "a" in probe:
        assert probe is not original
        probe, original = probe["a"][0], original["a"][0]
    assert probe == {"leaf": [1, "x", None, {"k": True}]} and probe["leaf"] is not original["leaf"]
    assert copy_json("text") == "text"


@pytest.mark.parametrize(
    ("image", "valid"),
    [
        ("docker.io/vllm/vllm-openai-cpu:v0.32.0-x86_64", True),
        ("registry.corp:5000/vllm/cpu:1", True),
        ("localhost:5000/a/b@sha256:" + "a" * 64, True),
        ("haproxy:3.2", True),
        ("Registry.Corp/vllm", True),  # a host may have capitals, a repository may not
        ("registry.corp/vllm:0.33.0@sha256:" + "b" * 64, True),
        (" docker.io/vllm/vllm-openai-cpu:v0.32.0", False),  # surrounding whitespace: the pod could not pull it
        ("docker.io/vllm/vllm-openai-cpu:v0.32.0 ", False),
        ("registry.corp/Vllm:1", False),
        ("registry.corp//vllm", False),
        ("vllm:tag with space", False),
        ("vllm@sha256:short", False),
    ],
)
def test_image_references_are_checked_as_the_runtime_parses_them(image, valid):
    """Both image fields, one pattern (api/spec.py IMAGE_REFERENCE_PATTERN), in the CRD as in the model."""
    assert bool(re.match(IMAGE_REFERENCE_PATTERN, image)) is valid
    raw = {"model": {"name": "m"}, "image": image, "routing": {"mode": "router", "router": {"image": image}}}
    if valid:
        CpuLLMServiceSpec.model_validate(raw)
    else:
        with pytest.raises(ValueError, match="image"):
            CpuLLMServiceSpec.model_validate(raw)
    spec_schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec_schema["image"]["pattern"] == IMAGE_REFERENCE_PATTERN
    router = spec_schema["routing"]["properties"]["router"]["properties"]["image"]
    assert router["pattern"] == IMAGE_REFERENCE_PATTERN


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"cpu": {"threadsBind": "63-0"}}, "spec.cpu.threadsBind: Value error, range 63-0 of rank 0 runs backwards"),
        ({"cpu": {"threadsBind": "0-7|4-11"}}, "CPU 4 is in ranks 0 and 1: give each rank its own CPUs"),
        ({"cpu": {"threadsBind": "0-10,2|5-6"}}, "CPU 5 is in ranks 0 and 1"),
        ({"cpu": {"threadsBind": "0-9000"}}, "CPU 9000 of rank 0: Linux numbers CPUs up to 8191"),
        ({"cpu": {"reservedCpusPerRank": 1000}}, "spec.cpu.reservedCpusPerRank: Input should be less than or equal"),
        ({"cpu": {"reservedCpusPerRank": 4, "cpusPerRank": 4}}, "reservedCpusPerRank 4 leaves none of cpusPerRank 4"),
        ({"tolerations": [{"key": "k", "tolerationSeconds": 60}]}, "tolerationSeconds applies only with effect NoExe"),
        ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "operator Exists takes no value"),
    ],
    ids=[
        "backwards",
        "shared-cpus",
        "shared-inside",
        "no-such-cpu",
        "reserved-cap",
        "reserved-all",
        "seconds",
        "exists",
    ],
)
def test_ranges_and_tolerations_the_pod_could_not_run_are_refused_in_the_spec(spec, message):
    """What the API server or the launcher would refuse later (a Deployment rejected, a rank with no CPU of its own)
    is the spec's InvalidSpec, naming the field."""
    from cpullm.api.spec import parse_spec
    from cpullm.errors import InvalidSpec

    with pytest.raises(InvalidSpec) as refused:
        parse_spec({"model": {"name": "org/model"}, "kvCacheGiB": 1, **spec})
    assert message in refused.value.message


@pytest.mark.parametrize(
    "toleration",
    [{"key": "k", "effect": "NoExecute", "tolerationSeconds": 60}, {"operator": "Exists"}, {"key": "k", "value": "v"}],
)
def test_tolerations_kubernetes_takes_are_taken(toleration):
    from cpullm.api.spec import parse_spec

    assert parse_spec({"model": {"name": "org/model"}, "kvCacheGiB": 1, "tolerations": [toleration]}).tolerations


SPEC_SCHEMA = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


@pytest.mark.parametrize(
    ("stored", "kept", "dropped"),
    [
        pytest.param({"model": {"name": "m", "sizedBy": "auto"}}, {"model": {"name": "m", "sizedBy": "auto"}}, [],
                     id="known-fields-kept"),
        pytest.param({"model": {"name": "m", "quantizedBy": "x"}}, {"model": {"name": "m"}}, ["model.quantizedBy"],
                     id="a-newer-field-in-an-object"),
        pytest.param({"model": {"name": "m"}, "gateway": {"a": 1}}, {"model": {"name": "m"}}, ["gateway"],
                     id="a-newer-top-level-field"),
        pytest.param({"model": {"name": "m"}, "env": [{"name": "A", "value": "1", "secretRef": "s"}]},
                     {"model": {"name": "m"}, "env": [{"name": "A", "value": "1"}]}, ["env[0].secretRef"],
                     id="in-a-list-item"),
        pytest.param({"model": {"name": "m", "config": {"any": {"thing": [1]}}}},
                     {"model": {"name": "m", "config": {"any": {"thing": [1]}}}}, [],
                     id="a-free-form-map-kept-whole"),
        pytest.param({"model": {"name": "m"}, "nodeSelector": {"a": "b"}},
                     {"model": {"name": "m"}, "nodeSelector": {"a": "b"}}, [], id="a-map-of-strings-kept"),
    ],
)  # fmt: skip
def test_a_stored_spec_keeps_what_this_versions_schema_knows(stored, kept, dropped):
    """As the API server prunes against a structural schema: properties, items and maps followed, free-form maps
    (x-kubernetes-preserve-unknown-fields) kept whole."""
    assert known_fields(stored, SPEC_SCHEMA) == (kept, dropped)


def test_a_newer_crds_field_is_dropped_from_a_stored_spec_and_refused_in_a_file(caplog):
    """The API server prunes what its CRD does not know, so a field this version does not know, in a stored spec, is
    a newer CRD's: shown with its default while an upgrade rolls (the CRD is applied before the operator), or after
    a downgrade of the operator alone. The operator reads the spec without it (before: InvalidSpec for every such
    service); a spec from a file still refuses it, naming the closest field."""
    newer = {"model": {"name": "m", "sizedByVllmVersion": "0.33"}, "apiKeySecret": {"name": "k", "rotation": "1h"}}
    _log_dropped.cache_clear()  # said once per process: this test's process may have said it already
    with caplog.at_level("INFO", logger="cpullm.api.crd"):
        assert parse_stored_spec(newer).api_key_secret.name == "k"  # type: ignore[union-attr]
        parse_stored_spec(newer)  # every reconcile reads it: said once
    said = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert said == [
        "stored specs carry fields this operator does not know (a newer CRD's), left out: "
        "apiKeySecret.rotation, model.sizedByVllmVersion"
    ]
    with pytest.raises(InvalidSpec, match=r"spec\.model\.sizedByVllmVersion: no such field"):
        parse_spec(newer)
    deep: dict[str, object] = {}
    for _ in range(5000):
        deep = {"a": deep}
    with pytest.raises(InvalidSpec, match="nested more than"):  # bounded before the walk
        parse_stored_spec({"model": {"name": "m", "config": deep}})


def test_a_spec_as_this_version_writes_it_loses_nothing_when_read_back_stored():
    """Every field this version's models hold, nested objects, lists and maps among them, is known to its schema."""
    raw = {
        "model": {"name": "m", "revision": "r", "weightsBytes": 10, "sizedBy": "auto"},
        "apiKeySecret": {"name": "k", "metrics": "key"},
        "hfTokenSecret": {"name": "h"},
        "modelCache": {"emptyDir": {"sizeLimit": "1Gi"}},
        "routing": {"mode": "router", "router": {"affinity": "prefix", "sessionHeader": "x-session"}},
        "autoscaling": {"kind": "hpa", "maxReplicas": 3},
        "monitoring": {"podMonitor": True},
        "networkPolicy": {
            "allowedFrom": [{"namespaceSelector": {"matchLabels": {"a": "b"}}}],
            "egressTo": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
        },
        "speculative": {"method": "ngram", "tokens": 2},
        "tolerations": [{"key": "a", "operator": "Exists", "effect": "NoSchedule"}],
        "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        "cpu": {"cpusPerRank": 2, "requiredISA": ["avx2"]},
    }
    full = CpuLLMServiceSpec.model_validate(raw).model_dump(by_alias=True, mode="json", exclude_none=True)
    assert known_fields(full, SPEC_SCHEMA) == (full, [])
