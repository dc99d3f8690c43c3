"""Every file of the repository the test bed names by a module-level path exists (a moved file fails here, in
seconds, not in the real-node stage an hour into CI)."""

import importlib
import pkgutil
from pathlib import Path

import pytest
import testbed
from testbed.tools import ROOT

MODULES = sorted(f"testbed.{info.name}" for info in pkgutil.iter_modules(testbed.__path__))


def repository_paths(module_name: str) -> dict[str, Path]:
    module = importlib.import_module(module_name)
    return {
        name: value
        for name, value in vars(module).items()
        if isinstance(value, Path) and ROOT in value.parents and not name.startswith("_")
    }


def test_the_test_bed_names_repository_files() -> None:
    named = {name for module in MODULES for name in repository_paths(module)}
    assert {"PAUSE_SOURCE", "RUNC_WRAPPER", "KINDNET"} <= named


@pytest.mark.parametrize("module_name", MODULES)
def test_every_repository_path_the_test_bed_names_exists(module_name: str) -> None:
    missing = {
        name: str(path.relative_to(ROOT)) for name, path in repository_paths(module_name).items() if not path.exists()
    }
    assert missing == {}
