"""`gather` and `resolve_model`: one set of rules for where a model's size comes from, shared by the operator
and the CLI, and which lookups an observation skips."""

from __future__ import annotations

from typing import Any

import pytest

from cpullm.controller.gather import gather, resolve_model
from cpullm.controller.outcomes import retry_delay
from cpullm.core.children.common import Owner
from cpullm.core.observation import ClusterView, NamespaceFacts
from cpullm.core.sizing import ModelFiles, size_model
from cpullm.errors import InvalidSpec, ModelConfigUnavailable, UnexpectedError

from .builders import LLAMA_8B, QWEN25_05B, node, spec


class Cluster:
    """Namespace facts and secrets from dicts; every read is recorded."""

    def __init__(self, secrets: dict[tuple[str, str, str], str] | None = None, terminating: bool = False) -> None:
        self.secrets = secrets or {}
        self.terminating = terminating
        self.reads: list[tuple[str, ...]] = []

    def read_namespace(self, namespace: str) -> NamespaceFacts:
        self.reads.append(("namespace", namespace))
        return NamespaceFacts(labels={"team": "llm"}, terminating=self.terminating)

    def read_secret_key(self, namespace: str, name: str, key: str) -> str | None:
        self.reads.append(("secret", namespace, name, key))
        return self.secrets.get((namespace, name, key))


class Source:
    """A model source answering with LLAMA_8B (or failing); records each fetch."""

    def __init__(self, files: ModelFiles | None = None, error: Exception | None = None) -> None:
        self.files = files or ModelFiles(config=LLAMA_8B, checkpoint_total_bytes=None)
        self.error = error
        self.calls: list[tuple[str, str | None, str | None]] = []

    def fetch(self, name: str, revision: str | None, token: str | None) -> ModelFiles:
        self.calls.append((name, revision, token))
        if self.error is not None:
            raise self.error
        return self.files


SECRET = {("serving", "hf", "HF_TOKEN"): "hf_secret", ("serving", "other", "token"): "hf_other"}


def test_inline_config_wins_and_neither_source_nor_secret_is_read():
    """What the user wrote is the truth, even when a token secret is named."""
    cluster, source = Cluster(SECRET), Source()
    inline = spec(model={"name": "org/any", "config": QWEN25_05B}, hfTokenSecret={"name": "hf"})
    size = resolve_model(inline, "serving", cluster, source)
    assert size == size_model(QWEN25_05B, inline.model.dtype)
    assert (size.num_layers, size.weights_source) == (24, "config.json (qwen2 formula)")
    assert (source.calls, cluster.reads) == ([], [])


def test_inline_config_with_weights_bytes_override():
    inline = spec(model={"name": "org/any", "config": QWEN25_05B, "weightsBytes": 123456})
    size = resolve_model(inline, "serving", Cluster(), Source())
    assert (size.weights_bytes, size.weights_source, size.parameters) == (123456, "spec.model.weightsBytes", None)


@pytest.mark.parametrize(
    ("fields", "secret_read", "token"),
    [
        pytest.param({}, None, None, id="no-secret-anonymous"),
        pytest.param({"hfTokenSecret": {"name": "hf"}}, ("serving", "hf", "HF_TOKEN"), "hf_secret", id="default-key"),
        pytest.param(
            {"hfTokenSecret": {"name": "other", "key": "token"}},
            ("serving", "other", "token"),
            "hf_other",
            id="named-key",
        ),
    ],
)
def test_the_secrets_token_is_passed_to_the_source(fields, secret_read, token):
    cluster, source = Cluster(SECRET), Source()
    the_spec = spec(model={"name": "meta-llama/Llama-3.1-8B", "revision": "v1"}, **fields)
    size = resolve_model(the_spec, "serving", cluster, source)
    assert source.calls == [("meta-llama/Llama-3.1-8B", "v1", token)]
    assert cluster.reads == ([("secret", *secret_read)] if secret_read else [])
    assert size == size_model(LLAMA_8B, the_spec.model.dtype)


@pytest.mark.parametrize(
    ("secret_ref", "message"),
    [
        pytest.param({"name": "hf", "key": "TOKEN"}, "secret serving/hf has no key TOKEN", id="missing-key"),
        pytest.param({"name": "absent"}, "secret serving/absent has no key HF_TOKEN", id="missing-secret"),
    ],
)
def test_a_missing_secret_key_is_model_config_unavailable_naming_the_secret(secret_ref, message):
    """No anonymous fallback: a gated model would fail later and less clearly."""
    source = Source()
    with pytest.raises(ModelConfigUnavailable) as raised:
        resolve_model(spec(hfTokenSecret=secret_ref), "serving", Cluster(SECRET), source)
    assert raised.value.message == message
    assert source.calls == []


def test_the_checkpoint_size_from_the_source_sizes_the_weights():
    """The safetensors index's total, when the source has one, beats counting parameters."""
    source = Source(ModelFiles(config=LLAMA_8B, checkpoint_total_bytes=16_000_000_000))
    size = resolve_model(spec(), "serving", Cluster(), source)
    assert (size.weights_bytes, size.weights_source) == (16_000_000_000, "model.safetensors.index.json total_size")
    assert size.parameters == 8_030_261_248  # counted by the formula; the bytes come from the checkpoint


def test_the_sources_error_propagates_from_resolve_model():
    with pytest.raises(ModelConfigUnavailable, match="hub down"):
        resolve_model(spec(), "serving", Cluster(), Source(error=ModelConfigUnavailable("hub down")))


def service(raw_spec: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "llama", "namespace": "serving", "uid": "u1", "generation": 4, **meta},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B"}, "kvCacheGiB": 4} if raw_spec is None else raw_spec,
        "status": {"observedGeneration": 3, "conditions": []},
    }


def observe(
    obj: dict[str, Any],
    cluster: Cluster | None = None,
    source: Source | None = None,
    last_status: dict[str, Any] | None = None,
    **view: Any,
):
    """gather on a view of one node (and whatever `view` adds to it)."""
    seen = ClusterView(**{"nodes": [node("n1")], **view})
    return gather(obj, seen, last_status=last_status, cluster=cluster or Cluster(), models=source or Source())


def test_gather_observes_owner_generation_namespace_model_and_nodes():
    cluster, source = Cluster(), Source()
    nodes = [node("n1"), node("n2")]
    deployment = {"status": {"replicas": 1}}
    obs = observe(service(), cluster, source, nodes=nodes, deployment=deployment)
    assert (obs.owner, obs.generation, obs.requested_replicas) == (Owner("llama", "serving", "u1"), 4, 0)
    assert obs.namespace == NamespaceFacts(labels={"team": "llm"})
    assert obs.model == size_model(LLAMA_8B, spec().model.dtype)
    assert (obs.nodes, obs.deployment, obs.apply_error) == (tuple(nodes), deployment, None)
    assert obs.spec == spec(model={"name": "meta-llama/Llama-3.1-8B"}, kvCacheGiB=4, maxModelLen=None)
    assert cluster.reads == [("namespace", "serving")]


@pytest.mark.parametrize(
    ("raw_spec", "requested", "message"),
    [
        pytest.param({"replicas": -1, "model": {"name": "m"}, "kvCacheGiB": 1}, -1, "spec.replicas", id="negative"),
        pytest.param({"replicas": 3, "kvCacheGiB": 1}, 3, "spec.model: Field required", id="no-model"),
        pytest.param({"replicas": "many", "model": {"name": "m"}}, 0, "spec.replicas", id="not-an-int"),
        pytest.param({}, 0, "spec.model: Field required", id="empty"),
    ],
)
def test_a_bad_spec_is_an_observation_and_the_model_is_not_looked_up(raw_spec, requested, message):
    source = Source()
    obs = observe(service(raw_spec), source=source)
    assert isinstance(obs.spec, InvalidSpec) and message in obs.spec.message
    assert (obs.model, obs.requested_replicas, source.calls) == (None, requested, [])


@pytest.mark.parametrize("name", ["qwen.small", "Qwen", "1qwen", "q" * 64, "qwen-"])
def test_a_name_its_children_cannot_take_is_an_invalid_spec(name):
    """Objects stored before the CRD's CEL rule on metadata.name: the Service (DNS-1035) and the instance label
    (63 characters) take the name, so nothing is created and the condition says why."""
    source = Source()
    obs = observe(service(name=name), source=source)
    assert isinstance(obs.spec, InvalidSpec) and "must be a DNS-1035 label of at most 63 characters" in obs.spec.message
    assert source.calls == []


def test_an_unexpected_fault_while_sizing_is_an_observation_retried_not_raised():
    """A bug on some odd input must not stop the reconcile of every service: it is this service's condition."""
    obs = observe(service(), source=Source(error=ZeroDivisionError("division by zero")))
    assert isinstance(obs.model, UnexpectedError) and obs.model.reason == "InternalError"
    assert obs.model.message == "sizing the model failed unexpectedly (ZeroDivisionError); retried"
    assert retry_delay(obs.model, 0) == 10


def test_an_unavailable_model_is_an_observation_not_raised():
    error = ModelConfigUnavailable("hub down")
    obs = observe(service(), source=Source(error=error))
    assert obs.model is error


def test_a_terminating_namespace_skips_the_model_lookup():
    """Nothing will be created there: asking the Hub (or reading secrets) would be wasted or fail."""
    cluster, source = Cluster(SECRET, terminating=True), Source()
    obs = observe(service({"model": {"name": "m"}, "kvCacheGiB": 1, "hfTokenSecret": {"name": "hf"}}), cluster, source)
    assert obs.namespace.terminating is True
    assert (obs.model, source.calls, cluster.reads) == (None, [], [("namespace", "serving")])


@pytest.mark.parametrize(
    ("last_status", "expected"),
    [
        pytest.param(None, {"observedGeneration": 3, "conditions": []}, id="none-uses-the-objects-own"),
        pytest.param({}, {}, id="empty-is-what-was-written"),
        pytest.param({"observedGeneration": 4}, {"observedGeneration": 4}, id="written-wins"),
    ],
)
def test_last_status_falls_back_to_the_objects_own_only_when_none(last_status, expected):
    assert observe(service(), last_status=last_status).status == expected


def test_an_object_without_status_or_namespace_gets_defaults():
    obj = {"metadata": {"name": "bare"}, "spec": {"model": {"name": "m"}, "kvCacheGiB": 1}}
    cluster = Cluster()
    obs = observe(obj, cluster)
    assert (obs.owner, obs.generation, obs.status) == (Owner("bare", "default", None), 0, {})
    assert cluster.reads == [("namespace", "default")]


class Adapters:
    """Adapter ranks by source (absent: cannot be told); records each read with its token."""

    def __init__(self, ranks: dict[str, int]) -> None:
        self.ranks = ranks
        self.reads: list[tuple[str, str | None]] = []

    def adapter_rank(self, source: str, token: str | None) -> int | None:
        self.reads.append((source, token))
        return self.ranks.get(source)


ADAPTERS = [
    {"name": "support", "source": "org/support-lora", "rank": 16},
    {"name": "sql", "source": "/m/sql", "rank": 8},
]


@pytest.mark.parametrize(
    ("ranks", "message"),
    [
        pytest.param({"org/support-lora": 16}, None, id="as-stated"),
        pytest.param({"org/support-lora": 8}, None, id="lower-counted-high-is-safe"),
        pytest.param({}, None, id="cannot-be-told-the-spec-stands"),
        pytest.param(
            {"org/support-lora": 64},
            "spec.adapters[0] (support): rank 16, but its adapter_config.json says r=64: set rank: 64",
            id="higher-refused",
        ),
        pytest.param(
            {"/m/sql": 32},
            "spec.adapters[1] (sql): rank 8, but its adapter_config.json says r=32: set rank: 32",
            id="second-refused",
        ),
    ],
)
def test_an_adapter_whose_file_gives_a_higher_rank_than_the_spec_is_an_invalid_spec(ranks, message):
    """vLLM refuses an adapter above --max-lora-rank, or holds more memory for it than the plan counts."""
    raw = {"model": {"name": "org/m"}, "kvCacheGiB": 1, "hfTokenSecret": {"name": "hf"}, "adapters": ADAPTERS}
    adapters, cluster = Adapters(ranks), Cluster(SECRET)
    obs = gather(
        service(raw),
        ClusterView(nodes=[node("n1")]),
        last_status=None,
        cluster=cluster,
        models=Source(),
        adapters=adapters,
    )
    if message is None:
        assert obs.model == size_model(LLAMA_8B, spec().model.dtype)
    else:
        assert isinstance(obs.model, InvalidSpec) and obs.model.message == message
    assert adapters.reads[:1] == [("org/support-lora", "hf_secret")]  # with the spec's token, as the model
    assert [read for read in cluster.reads if read[0] == "secret"] == [("secret", "serving", "hf", "HF_TOKEN")]


def test_without_an_adapter_source_the_ranks_are_not_read():
    raw = {"model": {"name": "org/m"}, "kvCacheGiB": 1, "adapters": ADAPTERS}
    obs = observe(service(raw))
    assert obs.model == size_model(LLAMA_8B, spec().model.dtype)
