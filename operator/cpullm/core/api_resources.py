"""A Kubernetes API resource the operator reads or writes, as its registries name one (core/children's CHILD_KINDS,
core/node_facts.py's NODE_FACT_SOURCES)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ApiResource:
    api_version: str  # group/version ("v1" for the core group)
    kind: str
    plural: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]
