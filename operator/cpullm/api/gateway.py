"""The CpuLLMGateway spec: one OpenAI endpoint in front of several CpuLLMServices, a key per team, the models each
team may use, its request rate and its priority when the servers are saturated (docs/gateway.md).

The schema of its CRD (api/crd.py) and the parser of its spec, as api/spec.py is for CpuLLMService.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, model_validator

from cpullm.api.spec import (
    IMAGE_REFERENCE_PATTERN,
    MAX_NAME_LENGTH,
    NAME_PATTERN,
    NetworkPolicyPeer,
    _Model,
    parse_model,
)

KIND = "CpuLLMGateway"
PLURAL = "cpullmgateways"
SINGULAR = "cpullmgateway"
SHORT_NAME = "cpullmgw"

# A model name the gateway routes (a service's spec.model.name, or an adapter's name): it is written into HAProxy's
# map files and into the JSON the gateway answers with, so no white space, quote, backslash, '%' or '#'.
ROUTED_NAME = r"^[A-Za-z0-9/][A-Za-z0-9._/:@+-]*$"
MAX_ROUTED_NAME = 1024
MAX_SERVICES = 64
MAX_TEAMS = 256
MAX_MODELS_PER_TEAM = 128
# HAProxy's priority classes run from -2047 to 2047; a team's priority is the class negated (lower runs first).
MAX_PRIORITY = 2047


class TeamKeySecret(_Model):
    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="A Secret in the gateway's namespace. The operator never reads it: the gateway's pods mount it "
        "and follow its changes (a key rotates without a restart).",
    )
    key: str = Field(
        default="api-key", max_length=253, pattern=r"^[-._a-zA-Z0-9]+$", description="The key holding the API key."
    )


class GatewayTeam(_Model):
    """A team: its key, what it may use, how fast, and who goes first when the servers are saturated."""

    name: str = Field(
        max_length=MAX_NAME_LENGTH,
        pattern=NAME_PATTERN,
        description="The team's name: in the metrics (label team) and the gateway's logs, never a key.",
    )
    key_secret: TeamKeySecret = Field(description="Where the team's API key is (sent as 'Authorization: Bearer').")
    models: list[Annotated[str, Field(max_length=MAX_ROUTED_NAME, pattern=ROUTED_NAME)]] = Field(
        default_factory=list,
        max_length=MAX_MODELS_PER_TEAM,
        description="The models and adapters the team may use, by the name requests give ('model'). Empty: every "
        "model the gateway routes.",
    )
    requests_per_minute: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="The most requests a minute the team may send; over it, 429 with Retry-After. Shared out among "
        "the gateway's replicas (each admits its part). Unset: no limit.",
    )
    generated_tokens_per_minute: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000_000,
        description="The most tokens a minute the services may generate for the team, as their answers' usage "
        "says: while its last minute holds that many, 429 with Retry-After (a request admitted below it may end "
        "above it). Shared out among the replicas. Unset: no limit.",
    )
    weight: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="The team's share of each service it uses, against the other teams' weights: when the servers "
        "are full, its requests beyond its share of what they run at once wait after everyone else's.",
    )
    priority: int = Field(
        default=0,
        ge=-MAX_PRIORITY,
        le=MAX_PRIORITY,
        description="When a service's servers hold all they run at once, the requests waiting in the gateway go "
        "in priority order, higher first (then in arrival order).",
    )


# Team names are the list's keys: the API server refuses two of one name.
_TEAMS_BY_NAME: dict[str, Any] = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}


class CpuLLMGatewaySpec(_Model):
    """One OpenAI endpoint for several services: routes each request by its 'model', admits each team's key."""

    services: list[Annotated[str, Field(max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)]] = Field(
        min_length=1,
        max_length=MAX_SERVICES,
        description="The CpuLLMServices in the gateway's namespace it fronts: each one's model (spec.model.name) "
        "and adapters are routed to it, through its router where it has one. A name two services serve goes to "
        "the one listed first.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    teams: list[GatewayTeam] = Field(
        min_length=1,
        max_length=MAX_TEAMS,
        description="Who may call the gateway: a request without a team's key is refused (401).",
        json_schema_extra=_TEAMS_BY_NAME,
    )
    port: int = Field(default=8000, ge=1, le=65535, description="The port of the gateway's Service.")
    replicas: int = Field(default=2, ge=1, le=20, description="Gateway pods (HAProxy).")
    image: str | None = Field(
        default=None,
        max_length=1024,
        pattern=IMAGE_REFERENCE_PATTERN,
        description="HAProxy image (2.6 or newer, with /bin/sh and sha256sum). Unset: the operator's router image.",
    )
    max_request_bytes: int = Field(
        default=256 * 1024,
        ge=16 * 1024,
        le=16 * 1024 * 1024,
        description="The largest request body the gateway reads to find its 'model' (a chat's messages come "
        "first in most clients' bodies); a larger one is refused (413). Each connection may hold two buffers of "
        "this size: the pods' memory is sized from it and maxConnections.",
    )
    max_connections: int = Field(
        default=256, ge=16, le=100_000, description="Connections each gateway pod holds at once; more wait."
    )
    allowed_from: list[NetworkPolicyPeer] | None = Field(
        default=None,
        max_length=16,
        description="Who may reach the gateway (a NetworkPolicy's from peers). Default: every pod of the cluster "
        "(the keys guard it).",
    )
    metrics_from: list[NetworkPolicyPeer] = Field(
        default_factory=list,
        max_length=16,
        description="Who may scrape the gateway's metrics port (HAProxy's /metrics, the usage per team at /usage), "
        "e.g. Prometheus' namespace. Default: no one through the NetworkPolicy.",
    )
    cluster_domain: str = Field(
        default="cluster.local",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        max_length=253,
        description="The cluster's DNS domain, in the services' addresses.",
    )

    @model_validator(mode="after")
    def _distinct(self) -> CpuLLMGatewaySpec:
        names = [t.name for t in self.teams]
        if len(set(names)) != len(names):
            raise ValueError("each team needs a name of its own")
        if len(set(self.services)) != len(self.services):
            raise ValueError("each service is listed once")
        return self


def parse_gateway_spec(raw: Mapping[str, Any] | None) -> CpuLLMGatewaySpec:
    """Validate a gateway's spec; errors become one InvalidSpec naming each field."""
    return parse_model(CpuLLMGatewaySpec, raw)
