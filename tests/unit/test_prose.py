"""The prose rules of CONTRIBUTING.md that a test can hold: module docstrings under 200 words, CRD descriptions under
80 (what `kubectl explain` shows), and no tracker numbers in the repository."""

import ast
import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MODULE_WORDS, DESCRIPTION_WORDS = 200, 80
# "issue" and a number, unless an upstream project's ("vLLM issue 47328"); written so this file does not match.
TRACKER = re.compile(r"(?<![Vv][Ll][Ll][Mm] )\b[Ii]ssues? " + r"#?\d+")


def descriptions(value: object, path: str = "") -> list[tuple[str, str]]:
    if isinstance(value, dict):
        found = [(path, value["description"])] if isinstance(value.get("description"), str) else []
        for key, item in value.items():
            found += descriptions(item, f"{path}.{key}")
        return found
    if isinstance(value, list):
        return [found for item in value for found in descriptions(item, path)]
    return []


@pytest.mark.parametrize("module", sorted((ROOT / "operator" / "cpullm").rglob("*.py")), ids=lambda p: p.name)
def test_a_module_docstring_is_a_few_sentences(module: Path):
    docstring = ast.get_docstring(ast.parse(module.read_text())) or ""
    assert len(docstring.split()) < MODULE_WORDS, f"{module}: {len(docstring.split())} words"


@pytest.mark.parametrize("crd", sorted((ROOT / "crds").glob("*.yaml")), ids=lambda p: p.name)
def test_a_crd_description_fits_kubectl_explain(crd: Path):
    long = [(path, len(text.split())) for path, text in descriptions(yaml.safe_load(crd.read_text()))]
    assert not [item for item in long if item[1] >= DESCRIPTION_WORDS]


def test_no_tracker_numbers_in_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    found = []
    for name in tracked.splitlines():
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".yaml", ".sh", ".tpl", ".txt"} or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if TRACKER.search(line):
                found.append(f"{name}:{number}: {line.strip()[:120]}")
    assert not found, "\n".join(found)
