"""One version everywhere a release names it: the Python package, `cpullm --version`, the chart and the operator
image the chart installs by default (its tag is the chart's appVersion), and the CHANGELOG's newest entry."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

import cpullm
from cpullm.cli import main
from cpullm.core.constants import DEFAULT_ROUTER_IMAGE, VLLM_VERSION

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_the_cli_the_chart_and_the_changelog_name_one_version(capsys):
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((ROOT / "charts" / "cpullm-operator" / "Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "charts" / "cpullm-operator" / "values.yaml").read_text())
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.split() == ["cpullm", version]
    assert cpullm.__version__ == version
    assert (chart["version"], chart["appVersion"]) == (version, version)
    assert values["image"]["tag"] == ""  # the chart's appVersion
    newest = re.search(r"^## \[?([0-9A-Za-z.-]+)", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert newest is not None and newest.group(1) in (version, "Unreleased")


def test_the_chart_names_the_default_images_the_operator_renders():
    """The chart's defaults (the probe Job's vLLM image, the pods policy's images) are the operator's."""
    helpers = (ROOT / "charts" / "cpullm-operator" / "templates" / "_helpers.tpl").read_text()
    found = re.search(r'define "cpullm\.vllmVersion" -\}\}([^{]+)\{\{', helpers)
    assert found is not None and found.group(1) == VLLM_VERSION
    router = re.search(r'define "cpullm\.routerImage" -\}\}\n[^\n]*default "([^"]+)"', helpers)
    assert router is not None and router.group(1) == DEFAULT_ROUTER_IMAGE
