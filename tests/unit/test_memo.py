"""cached: computed once per instance, kept in the instance, and not serialized across instances by a lock."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from cpullm.core.memo import cached


@dataclass(frozen=True)
class Counted:
    value: int
    calls: list[int]

    @cached
    def doubled(self) -> int:
        """Twice the value."""
        self.calls.append(self.value)
        return 2 * self.value


def test_computed_once_per_instance_and_kept_in_it() -> None:
    calls: list[int] = []
    one, two = Counted(1, calls), Counted(2, calls)
    assert (one.doubled, one.doubled, two.doubled) == (2, 2, 4)
    assert calls == [1, 2]
    assert one.__dict__["doubled"] == 2
    assert Counted.doubled.__doc__ == "Twice the value."
    assert one == Counted(1, calls)  # the kept value is no field: equality is unchanged


def test_one_instance_computing_does_not_hold_up_another() -> None:
    """With functools.cached_property on Python 3.11 the second instance would wait for the first one's value,
    which waits for the second's: the first gives up after its timeout and sees False."""
    started, done, seen = threading.Event(), threading.Event(), []

    @dataclass(frozen=True)
    class Waits:
        first: bool

        @cached
        def value(self) -> bool:
            if self.first:
                started.set()
                return done.wait(timeout=5)
            return True

    other = threading.Thread(target=lambda: seen.append(Waits(True).value))
    other.start()
    assert started.wait(timeout=5)
    assert Waits(False).value
    done.set()
    other.join(timeout=10)
    assert seen == [True]
