"""The docs name what exists: every repository path and operator module the README, the chart's README and
docs/ mention (in backticks or as a link) is in the tree, so a move or a rename cannot leave them stale."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "charts" / "cpullm-operator" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP_LEVEL = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")} | {".ci"}
PACKAGE = ROOT / "operator" / "cpullm"
ROOMS = {p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("__")}
MENTION = re.compile(r"`([A-Za-z0-9_.-]+/[A-Za-z0-9_./{},-]*)`|\]\(([^)#:]+)\)")


def named_paths(doc: Path) -> list[Path]:
    """The files the doc names: in backticks, paths under a top-level entry of the repository or under a room of
    the package (core/..., controller/..., which the docs name relative to operator/cpullm/); as links, paths
    relative to the doc itself. `{a,b}` alternatives stand for each."""
    found = []
    for match in MENTION.finditer(doc.read_text()):
        if match.group(2):
            found += [doc.parent / link for link in expand(match.group(2))]
            continue
        mention = match.group(1)
        first = mention.split("/", 1)[0]
        if first in TOP_LEVEL or first in ROOMS:
            base = PACKAGE if first in ROOMS else ROOT
            found += [base / path.rstrip("/") for path in expand(mention)]
    return found


def expand(mention: str) -> list[str]:
    braces = re.search(r"\{([^}]*)\}", mention)
    if not braces:
        return [mention]
    head, tail = mention[: braces.start()], mention[braces.end() :]
    return [path for option in braces.group(1).split(",") for path in expand(head + option + tail)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_the_docs_name_exists(doc: Path):
    missing = sorted({str(path) for path in named_paths(doc) if not path.exists()})
    assert missing == [], f"{doc.relative_to(ROOT)} names paths that do not exist"


def test_the_docs_name_paths_at_all():
    """The check above would pass on docs that name nothing: the README names the scripts and links every page
    of docs/; docs/planning.md names the constants."""
    readme = set(named_paths(ROOT / "README.md"))
    assert {ROOT / "scripts/test.sh", ROOT / "scripts/demo.sh"} <= readme
    assert {ROOT / "docs" / page.name for page in (ROOT / "docs").glob("*.md")} <= readme
    assert PACKAGE / "core/constants.py" in set(named_paths(ROOT / "docs" / "planning.md"))


def test_the_readmes_sample_plan_is_what_the_cli_prints(capsys: pytest.CaptureFixture[str]):
    """The README's `cpullm plan` sample is, whole and line for line, what the command prints today."""
    from cpullm.cli import main

    command = "$ .venv/bin/cpullm plan "
    block = (ROOT / "README.md").read_text().split(command, 1)[1].split("```", 1)[0]
    args, *sample = block.splitlines()
    assert main(["plan", *args.split()]) == 0
    assert capsys.readouterr().out.splitlines() == sample


def console_blocks(page: str) -> list[tuple[list[str], list[str]]]:
    """Each `$ cpullm plan ...` of a docs page's console blocks (its arguments, a line ending in a backslash
    continued), with the lines shown after it up to the block's end."""
    found = []
    for block in re.findall(r"```console\n(.*?)```", (ROOT / "docs" / page).read_text(), re.DOTALL):
        lines = block.splitlines()
        if not lines[0].startswith("$ cpullm plan "):
            continue
        command, rest = lines[0], lines[1:]
        while command.endswith("\\"):
            command, rest = command[:-1] + rest[0].strip(), rest[1:]
        found.append((command.split()[3:], rest))
    return found


def test_the_two_socket_pages_plans_are_what_the_cli_prints(capsys: pytest.CaptureFixture[str], monkeypatch):
    from cpullm.cli import main

    monkeypatch.chdir(ROOT)
    blocks = console_blocks("two-socket-8b.md")
    assert len(blocks) == 2
    for args, shown in blocks:
        main(["plan", *args])
        out, err = capsys.readouterr()
        assert (out + err).splitlines() == shown


# The facts the docs quote, checked against the code that holds them: a renamed setting, field, chart value or
# condition reason leaves no doc behind.
TEXTS = {doc: doc.read_text() for doc in DOCS}
SOURCES = [
    *ROOT.glob("scripts/*.sh"),
    ROOT / ".ci" / "run",
    *ROOT.glob("e2e/*.py"),
    *ROOT.glob("testbed/**/*.py"),
    *ROOT.glob("tests/**/*.py"),
    *PACKAGE.glob("**/*.py"),
]


def quoted(pattern: str) -> set[str]:
    """Every backticked mention in the docs matching `pattern` (its first group)."""
    return {m.group(1) for text in TEXTS.values() for m in re.finditer(pattern, text)}


def test_every_cpullm_variable_the_docs_name_is_read_somewhere():
    """A setting (settings.py, by its CPULLM_ name), or a knob of the in-pod files or of the tests and scripts."""
    from cpullm.settings import Settings

    settings = {f"CPULLM_{name.upper()}" for name in Settings.model_fields}
    code = "\n".join(path.read_text() for path in SOURCES if path.is_file() and path.name != "test_docs.py")
    named = quoted(r"`(CPULLM_[A-Z0-9_]+)[=`]")
    assert named, "no variable found: the check is not looking at the docs"
    assert sorted(v for v in named if v not in settings and v not in code) == []


def test_every_spec_and_plan_field_the_docs_name_exists():
    """A `spec.x` is a CpuLLMService's field or a CpuLLMGateway's (docs/gateway.md)."""
    from cpullm.api.crd import build_crd, build_gateway_crd

    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    gateway = build_gateway_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]

    def exists(path: list[str], node: dict) -> bool:
        for part in path:
            node = node.get("items", node)  # a list's fields are its items'
            props = node.get("properties") or {}
            if part not in props:
                return False
            node = props[part]
        return True

    fields = quoted(r"`((?:spec|status\.plan)\.[A-Za-z][A-Za-z0-9.]*)`")
    assert len(fields) > 20
    plan = schema["status"]["properties"]["plan"]
    missing = [
        f
        for f in fields
        if not (
            exists(f.split(".")[1:], schema["spec"]) or exists(f.split(".")[1:], gateway)
            if f.startswith("spec.")
            else exists(f.split(".")[2:], plan)
        )
        and f != "spec.py"  # api/spec.py, a file the docs name
    ]
    assert sorted(missing) == []


def test_every_chart_value_the_docs_name_is_in_values_yaml():
    import yaml

    values = yaml.safe_load((ROOT / "charts" / "cpullm-operator" / "values.yaml").read_text())
    named = quoted(r"`((?:" + "|".join(map(re.escape, values)) + r")\.[A-Za-z][A-Za-z0-9.]*)(?:=[^`]*)?`")
    assert len(named) > 10

    def known(path: str) -> bool:
        node = values
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    # `vllm.platforms.cpu` and the like are vLLM's own modules, which share a chart key's name.
    def vllm_module(path: str) -> bool:
        return path.startswith("vllm.") and not known(".".join(path.split(".")[:2]))

    def a_file(path: str) -> bool:  # metrics.py, monitoring.md: files named as chart keys are
        return path.endswith((".py", ".md"))

    unknown = [p for p in named if not known(p) and not vllm_module(p) and not a_file(p)]
    assert sorted(unknown) == []


def test_every_condition_reason_the_troubleshooting_table_names_is_the_operators():
    """The README's table of conditions and reasons: each name is a string the operator writes."""
    table = TEXTS[ROOT / "README.md"].split("## Troubleshooting", 1)[1].split("\n## ", 1)[0]
    names = {
        name
        for row in table.splitlines()
        if row.startswith("| `")
        for name in re.findall(r"`(\w+)`", row.split("|")[1])
    }
    from cpullm.core.children import CHILD_KINDS

    code = "\n".join(path.read_text() for path in PACKAGE.glob("**/*.py"))
    # An optional child's reasons are made from its kind (core/decision.py): {Kind}Applied, {Kind}CRDMissing.
    made = {f"{k.kind}{suffix}" for k in CHILD_KINDS for suffix in ("Applied", "CRDMissing")}
    assert len(names) > 20
    assert sorted(n for n in names if f'"{n}"' not in code and n not in made) == []
