"""`cached`: a property computed once per instance, without a lock; `Memo`: a pure function's recent values by key;
`Hashed`: a part of a memo's key with its hash worked out once.

Python 3.11's `functools.cached_property` takes one lock per property for every instance of the class while it
computes (removed in 3.12: https://github.com/python/cpython/issues/87634). The planner makes many short-lived
objects with such properties, and the operator plans services on several reconcile threads at once: with 100
services arriving, a profile of the operator showed 40% of its samples in `cached_property.__get__`, threads waiting
on each other's unrelated objects. The values here are pure, so two threads that both compute one get the same.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class cached(Generic[T]):  # lower case: used as a decorator, like the property it replaces
    """Like functools.cached_property (the value is kept in the instance's __dict__, so later reads skip this
    descriptor), for pure computations only."""

    def __init__(self, compute: Callable[[Any], T]) -> None:
        self.compute = compute
        self.name = compute.__name__
        self.__doc__ = compute.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> cached[T]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> T: ...

    def __get__(self, instance: object | None, owner: type | None = None) -> T | cached[T]:
        if instance is None:
            return self
        value = self.compute(instance)
        instance.__dict__[self.name] = value
        return value


K = TypeVar("K", bound=Hashable)


class Memo(Generic[K, T]):
    """The last `size` values of a pure function by their key, shared by threads (two that miss the same key both
    compute it and get equal values). A function that raises is not remembered."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.values: OrderedDict[K, T] = OrderedDict()
        self.lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: K, compute: Callable[[], T]) -> T:
        with self.lock:
            if key in self.values:
                self.values.move_to_end(key)
                self.hits += 1
                return self.values[key]
            self.misses += 1
        value = compute()
        with self.lock:
            self.values[key] = value
            if len(self.values) > self.size:
                self.values.popitem(last=False)
        return value

    def clear(self) -> None:
        """Forget every value (a test that changes what the function reads, e.g. a module's constant)."""
        with self.lock:
            self.values.clear()


class Hashed:
    """A hashable value with its hash worked out once. A memo's key made of many parts (a node profile per node)
    hashes every part again on each lookup; a part kept in a long-lived object (the node index's profile) is hashed
    once this way, and compared at a hit by identity first."""

    __slots__ = ("hash", "value")

    def __init__(self, value: Hashable) -> None:
        self.value = value
        self.hash = hash(value)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return isinstance(other, Hashed) and self.hash == other.hash and self.value == other.value
