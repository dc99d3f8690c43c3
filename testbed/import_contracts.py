"""An import-linter contract type of our own (import-linter's plugin mechanism: `contract_types` in pyproject.toml):
test modules stand apart. A module whose name starts with `test_`, or a `conftest`, in the packages the contract
names is imported by no module at all: what a suite's tests share lives in its support module (e2e/support.py,
tests/unit/support.py, tests/vllm/conftest.py's fixtures aside), what the suites share in the test bed (testbed/:
the vLLM server harness, the operator process, the objects they apply), so no suite depends on another's test module
or fixtures file and no import cycle runs through them."""

from __future__ import annotations

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def is_test_module(module: str) -> bool:
    last = module.rpartition(".")[2]
    return last.startswith("test_") or last == "conftest"


class TestModulesApartContract(Contract):
    """`packages`: where test modules are looked for (each with its subpackages)."""

    __test__ = False  # not a pytest test class, whatever its name
    packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        imports = []
        for module in sorted(graph.modules):
            if not (is_test_module(module) and any(module.startswith(f"{p}.") for p in self.packages)):
                continue
            for importer in sorted(graph.find_modules_that_directly_import(module)):
                imports.append({"importer": importer, "imported": module})
        return ContractCheck(kept=not imports, metadata={"imports": imports})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for found in check.metadata["imports"]:
            output.print_error(f"{found['importer']} imports the test module {found['imported']}", bold=False)
            output.new_line()
