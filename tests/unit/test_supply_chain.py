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
    """id-token: write lets any step of a job mint an identity Sigstore trusts: only the release's job, whose steps
    are the pinned actions above and this repository's scripts, holds it."""
    document = yaml.safe_load(workflow.read_text())
    holders = [name for name, job in document["jobs"].items() if (job.get("permissions") or {}).get("id-token")]
    top = (document.get("permissions") or {}).get("id-token")
    assert top is None, "id-token granted to every job: grant it in the signing job's permissions"
    for name in holders:
        assert "release.sh" in yaml.safe_dump(document["jobs"][name]), name
