"""Each test plans from scratch: the planner's memo of recent plans (core/planner.py SHAPE_PLANS) is emptied before
it, so a test that changes a constant the planner reads (monkeypatch) gets plans made under its value."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cpullm.core.planner import SHAPE_PLANS


@pytest.fixture(autouse=True)
def fresh_plans() -> Iterator[None]:
    SHAPE_PLANS.clear()
    yield
