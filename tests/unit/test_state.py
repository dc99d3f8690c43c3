"""The one rule that tells an event's news from noise (controller/state.py), for every watch that triggers
reconciles of other objects."""

from __future__ import annotations

import pytest

from cpullm.controller.state import Change, LastSeen

# (event type, value) in order, and what each event returns.
CASES = {
    "the first listing is no news, whatever it shows": [((None, "a"), None), ((None, "b"), Change("a", "b"))],
    "a new object is news": [(("ADDED", "a"), Change(None, "a"))],
    "the same value again is noise": [(("ADDED", "a"), Change(None, "a")), (("MODIFIED", "a"), None)],
    "a re-listing of a known object is compared like any event": [
        ((None, "a"), None),
        ((None, "a"), None),
        ((None, "b"), Change("a", "b")),
    ],
    "a deletion is news when there was something": [
        (("ADDED", "a"), Change(None, "a")),
        (("DELETED", "a"), Change("a", None)),
        (("ADDED", "a"), Change(None, "a")),
    ],
    "nothing worth keeping, first seen or gone, is no news": [
        (("ADDED", None), None),
        (("DELETED", None), None),
        ((None, None), None),
    ],
}


@pytest.mark.parametrize("events", CASES.values(), ids=CASES.keys())
def test_news_from_noise(events):
    seen: LastSeen[str, str] = LastSeen()
    assert [seen.news("k", event_type, value) for (event_type, value), _ in events] == [news for _, news in events]


def test_a_custom_comparison_decides_what_changed():
    seen: LastSeen[str, str] = LastSeen(changed=lambda before, after: (before or "").lower() != (after or "").lower())
    assert seen.news("k", "ADDED", "A") == Change(None, "A")
    assert seen.news("k", "MODIFIED", "a") is None
    assert seen.values == {"k": "a"}  # the latest value is kept either way
    assert seen.news("other", "ADDED", "a") == Change(None, "a")  # one record per object
