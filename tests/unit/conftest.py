"""Each test plans from scratch: the planner's memos of recent plans (core/planner.py) are emptied before
it, so a test that changes a constant the planner reads (monkeypatch) gets plans made under its value."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cpullm.core.planner import forget_plans


@pytest.fixture(autouse=True)
def fresh_plans() -> Iterator[None]:
    forget_plans()
    yield
