from pathlib import Path

import yaml

from cpullm.api.crd import build_crd

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "cpullm.io_cpullmservices.yaml"


def test_crd_file_is_generated_from_the_spec_model():
    """crds/ is `cpullm crd` output: regenerate with `cpullm crd > crds/cpullm.io_cpullmservices.yaml`."""
    assert CRD_FILE.read_text() == yaml.safe_dump(build_crd(), sort_keys=False)


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
    assert spec["x-kubernetes-validations"][0]["rule"].startswith("has(self.kvCacheGiB)")
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
    assert any("'--port'" in rule and "startsWith" in rule for rule in rules)
