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


def named_paths(doc: Path) -> list[str]:
    """Mentions that are paths of this repository: under a top-level entry, or under a room of the package
    (core/..., controller/...), which the docs name relative to operator/cpullm/."""
    found = []
    for match in MENTION.finditer(doc.read_text()):
        mention = match.group(1) or match.group(2)
        first = mention.split("/", 1)[0]
        if first in TOP_LEVEL or first in ROOMS:
            found.append(mention)
    return found


def resolve(mention: str) -> list[Path]:
    """The files a mention stands for; `{a,b}` alternatives expand to each."""
    braces = re.search(r"\{([^}]*)\}", mention)
    if braces:
        head, tail = mention[: braces.start()], mention[braces.end() :]
        return [p for option in braces.group(1).split(",") for p in resolve(head + option + tail)]
    base = PACKAGE if mention.split("/", 1)[0] in ROOMS else ROOT
    return [base / mention.rstrip("/")]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_the_docs_name_exists(doc: Path):
    mentions = named_paths(doc)
    missing = sorted({m for m in mentions for path in resolve(m) if not path.exists()})
    assert missing == [], f"{doc.relative_to(ROOT)} names paths that do not exist"


def test_the_docs_name_paths_at_all():
    """The check above would pass on docs that name nothing: the README names the scripts and the core."""
    mentions = set(named_paths(ROOT / "README.md"))
    assert {"scripts/test.sh", "examples/nodes.yaml", "core/constants.py"} <= mentions
