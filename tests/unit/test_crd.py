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
    spec = root["properties"]["spec"]
    assert spec["required"] == ["model"]
    assert spec["x-kubernetes-validations"][0]["rule"].startswith("has(self.kvCacheGiB)")
    assert "NUMA node" in spec["properties"]["tensorParallelSize"]["description"]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert [c["name"] for c in version["additionalPrinterColumns"]][:3] == ["Model", "Placement", "TP"]


def test_chart_crd_is_identical():
    chart_copy = ROOT / "charts" / "cpullm-operator" / "crds" / CRD_FILE.name
    assert chart_copy.read_bytes() == CRD_FILE.read_bytes()
