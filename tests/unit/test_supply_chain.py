"""What the release is built from is pinned: every action a workflow uses by its commit (a tag can be moved to other
code), with the release it is, and OIDC's token only where the release signs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

WORKFLOWS = sorted((Path(__file__).resolve().parents[2] / ".github" / "workflows").glob("*.yml"))
PINNED = re.compile(r"^\s*-?\s*uses:\s*[\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+(\.\d+)*$")


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_every_action_is_pinned_by_its_commit_and_names_its_release(workflow: Path) -> None:
    uses = [line for line in workflow.read_text().splitlines() if re.match(r"^\s*-?\s*uses:", line)]
    assert uses, f"{workflow.name} uses no action"
    assert [line for line in uses if not PINNED.match(line)] == []


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_only_a_job_that_signs_may_ask_for_an_oidc_token(workflow: Path) -> None:
    """id-token: write lets any step of a job mint an identity Sigstore trusts: only a job that signs holds it, and
    it builds nothing (the build runs pip, Go and syft on third-party code: scripts/release.sh --unsigned, in a job
    of its own)."""
    document = yaml.safe_load(workflow.read_text())
    top = (document.get("permissions") or {}).get("id-token")
    assert top is None, "id-token granted to every job: grant it in the signing job's permissions"
    for name, job in document["jobs"].items():
        runs = "\n".join(step.get("run", "") for step in job.get("steps", []))
        if (job.get("permissions") or {}).get("id-token"):
            assert "scripts/sign-release.sh" in runs, f"{name} holds an OIDC token and signs nothing"
            assert "scripts/release.sh" not in runs, f"{name} holds an OIDC token and builds"
        elif "scripts/release.sh" in runs:
            assert "--unsigned" in runs, f"{name} builds and signs without an OIDC token"


ROOT = Path(__file__).resolve().parents[2]


def locked() -> dict[str, tuple[str, list[str]]]:
    """requirements.lock's packages: name -> (version, hashes)."""
    found: dict[str, tuple[str, list[str]]] = {}
    name = ""
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if match := re.match(r"^([A-Za-z0-9_.-]+)==([^ ;\\]+)", line):
            name = re.sub(r"[-_.]+", "-", match[1]).lower()
            found[name] = (match[2], [])
        elif hashed := re.match(r"^\s+--hash=(sha256:[0-9a-f]{64})", line):
            found[name][1].append(hashed[1])
    return found


def test_the_lock_pins_what_pyproject_names_each_with_hashes() -> None:
    """The image installs requirements.lock with --require-hashes: it must hold every dependency pyproject.toml names,
    at that version (scripts/lock.sh writes it), each package with at least one hash."""
    import tomllib

    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    lock = locked()
    for requirement in wanted:
        name, version = requirement.split("==")
        key = re.sub(r"[-_.]+", "-", name).lower()
        assert key in lock and lock[key][0] == version, f"{requirement}: run scripts/lock.sh"
    assert [name for name, (_, hashes) in lock.items() if not hashes] == []
