"""`cached`: a property computed once per instance, without a lock.

Python 3.11's `functools.cached_property` takes one lock per property for every instance of the class while it
computes (removed in 3.12: https://github.com/python/cpython/issues/87634). The planner makes many short-lived
objects with such properties, and the operator plans services on several reconcile threads at once: with 100
services arriving, a profile of the operator showed 40% of its samples in `cached_property.__get__`, threads waiting
on each other's unrelated objects. The values here are pure, so two threads that both compute one get the same.
"""

from __future__ import annotations

from collections.abc import Callable
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
