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
    """The README's `cpullm plan` sample (its lines other than `...`) appears, in order, in what the command
    prints today."""
    from cpullm.cli import main

    command = "$ .venv/bin/cpullm plan "
    block = (ROOT / "README.md").read_text().split(command, 1)[1].split("```", 1)[0]
    args, *sample = block.splitlines()
    assert main(["plan", *args.split()]) == 0
    printed = capsys.readouterr().out.splitlines()
    shown = [line for line in sample if line not in ("...", "")]
    assert len(shown) >= 5
    positions = [printed.index(line) for line in shown]  # ValueError: a line the CLI no longer prints
    assert positions == sorted(positions)


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
