"""`Settings`: the environment (CPULLM_*, and the Hub's own HF_ENDPOINT/HF_TOKEN) and flags in one object."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from cpullm.settings import Settings

ENV_NAMES = (
    "HF_ENDPOINT",
    "HF_TOKEN",
    "CPULLM_HF_ENDPOINT",
    "CPULLM_HF_TOKEN",
    "CPULLM_HUB_TIMEOUT_SECONDS",
    "CPULLM_HUB_CACHE_SECONDS",
    "CPULLM_NAMESPACES",
    "CPULLM_PEERING",
    "CPULLM_LIVENESS",
    "CPULLM_VERBOSE",
    "CPULLM_ROUTER_IMAGE",
    "CPULLM_VLLM_IMAGES",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """Whatever the machine running the tests exports must not leak into them."""
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


def test_defaults():
    settings = Settings()
    assert (settings.hf_endpoint, settings.hf_token) == ("https://huggingface.co", None)
    assert (settings.hub_timeout_seconds, settings.hub_cache_seconds) == (10.0, 3600.0)
    assert (settings.namespaces, settings.peering, settings.liveness, settings.verbose) == ([], None, None, False)
    assert settings.router_image == "docker.io/library/haproxy:3.2"
    assert settings.vllm_images == {}  # vLLM's published image for every arch


@pytest.mark.parametrize(
    ("env", "field", "value"),
    [
        pytest.param({"CPULLM_HUB_TIMEOUT_SECONDS": "20"}, "hub_timeout_seconds", 20.0, id="timeout"),
        pytest.param({"CPULLM_HUB_TIMEOUT_SECONDS": "0.5"}, "hub_timeout_seconds", 0.5, id="fractional-timeout"),
        pytest.param({"CPULLM_HUB_CACHE_SECONDS": "0"}, "hub_cache_seconds", 0.0, id="cache-off"),
        pytest.param({"HF_ENDPOINT": "https://hf-mirror.example"}, "hf_endpoint", "https://hf-mirror.example", id="hf"),
        pytest.param({"CPULLM_HF_ENDPOINT": "https://ours.example"}, "hf_endpoint", "https://ours.example", id="ours"),
        pytest.param({"HF_TOKEN": "hf_abc"}, "hf_token", "hf_abc", id="hf-token"),
        pytest.param({"CPULLM_HF_TOKEN": "hf_ours"}, "hf_token", "hf_ours", id="our-token"),
        pytest.param({"CPULLM_NAMESPACES": '["a", "b"]'}, "namespaces", ["a", "b"], id="namespaces-json"),
        pytest.param({"CPULLM_RESYNC_SECONDS": "0"}, "resync_seconds", 0.0, id="resync-off"),
        pytest.param({"CPULLM_PEERING": "cpullm"}, "peering", "cpullm", id="peering"),
        pytest.param({"CPULLM_VERBOSE": "true"}, "verbose", True, id="verbose"),
        pytest.param(
            {"CPULLM_ROUTER_IMAGE": "registry.corp/haproxy@sha256:" + "0" * 64},
            "router_image",
            "registry.corp/haproxy@sha256:" + "0" * 64,
            id="router-image-by-digest",
        ),
    ],
)
def test_reads_the_environment(monkeypatch, env, field, value):
    for name, text in env.items():
        monkeypatch.setenv(name, text)
    assert getattr(Settings(), field) == value


@pytest.mark.parametrize(
    ("field", "ours", "theirs"),
    [
        pytest.param("hf_endpoint", "CPULLM_HF_ENDPOINT", "HF_ENDPOINT", id="endpoint"),
        pytest.param("hf_token", "CPULLM_HF_TOKEN", "HF_TOKEN", id="token"),
    ],
)
def test_our_prefixed_variable_wins_over_the_hub_convention(monkeypatch, field, ours, theirs):
    """A mirror configured for other Hugging Face tools must not override what was set for cpullm."""
    monkeypatch.setenv(theirs, "theirs")
    monkeypatch.setenv(ours, "ours")
    assert getattr(Settings(), field) == "ours"


def test_unprefixed_names_other_than_the_hub_aliases_are_ignored(monkeypatch):
    """Only the prefix counts: a stray HUB_TIMEOUT_SECONDS in the environment is not ours."""
    monkeypatch.setenv("HUB_TIMEOUT_SECONDS", "99")
    monkeypatch.setenv("VERBOSE", "true")
    settings = Settings()
    assert (settings.hub_timeout_seconds, settings.verbose) == (10.0, False)


def test_keyword_arguments_override_the_environment(monkeypatch):
    """`cpullm run` flags are passed as keyword arguments and win over the environment."""
    monkeypatch.setenv("CPULLM_HUB_TIMEOUT_SECONDS", "20")
    monkeypatch.setenv("CPULLM_PEERING", "from-env")
    monkeypatch.setenv("HF_ENDPOINT", "https://from-env.example")
    settings = Settings(
        hub_timeout_seconds=5, peering="from-flag", namespaces=["serving"], hf_endpoint="https://flag.example"
    )
    assert (settings.hub_timeout_seconds, settings.peering, settings.namespaces) == (5.0, "from-flag", ["serving"])
    assert settings.hf_endpoint == "https://flag.example"


@pytest.mark.parametrize(
    ("env", "field"),
    [
        pytest.param({"CPULLM_HUB_TIMEOUT_SECONDS": "0"}, "hub_timeout_seconds", id="timeout-zero"),
        pytest.param({"CPULLM_HUB_TIMEOUT_SECONDS": "-1"}, "hub_timeout_seconds", id="timeout-negative"),
        pytest.param({"CPULLM_HUB_TIMEOUT_SECONDS": "soon"}, "hub_timeout_seconds", id="timeout-not-a-number"),
        pytest.param({"CPULLM_HUB_CACHE_SECONDS": "-1"}, "hub_cache_seconds", id="cache-negative"),
        pytest.param({"CPULLM_VERBOSE": "perhaps"}, "verbose", id="verbose-not-a-bool"),
        pytest.param({"CPULLM_ROUTER_IMAGE": "haproxy 3.2"}, "router_image", id="router-image-with-a-space"),
        pytest.param({"CPULLM_ROUTER_IMAGE": ""}, "router_image", id="router-image-empty"),
    ],
)
def test_invalid_environment_values_raise_naming_the_field(monkeypatch, env, field):
    for name, text in env.items():
        monkeypatch.setenv(name, text)
    with pytest.raises(pydantic.ValidationError) as raised:
        Settings()
    assert [error["loc"] for error in raised.value.errors()] == [(field,)]


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"hub_timeout_seconds": 0}, id="timeout-zero"),
        pytest.param({"hub_cache_seconds": -0.5}, id="cache-negative"),
    ],
)
def test_invalid_keyword_values_raise(kwargs):
    with pytest.raises(pydantic.ValidationError) as raised:
        Settings(**kwargs)
    assert [error["loc"] for error in raised.value.errors()] == [tuple(kwargs)]


PINNED = "registry.corp/vllm@sha256:" + "0" * 64


@pytest.mark.parametrize(
    ("text", "images"),
    [
        pytest.param("{}", {}, id="none"),
        pytest.param(f'{{"amd64": "{PINNED}"}}', {"amd64": PINNED}, id="one-arch-by-digest"),
        pytest.param(
            '{"amd64": "registry.corp/vllm:1-x86", "arm64": "registry.corp/vllm:1-arm"}',
            {"amd64": "registry.corp/vllm:1-x86", "arm64": "registry.corp/vllm:1-arm"},
            id="both-arches",
        ),
        pytest.param('{"x86_64": "registry.corp/vllm:1"}', None, id="an-images-suffix-is-no-arch"),
        pytest.param('{"amd64": "a", "s390x": "b"}', None, id="one-unknown-arch"),
        pytest.param('{"amd64": "registry.corp/vllm 1"}', None, id="an-image-with-a-space"),
        pytest.param('{"amd64": " registry.corp/vllm:1"}', None, id="an-image-with-a-leading-space"),
        pytest.param('{"amd64": ""}', None, id="an-empty-image"),
        pytest.param('["registry.corp/vllm:1"]', None, id="not-per-arch"),
    ],
)
def test_vllm_images_are_per_known_arch(monkeypatch, text, images):
    """CPULLM_VLLM_IMAGES (JSON; the chart's vllm.images): an image per arch the planner has a default for, each
    without whitespace; anything else is refused at start, naming the setting, rather than served the default."""
    monkeypatch.setenv("CPULLM_VLLM_IMAGES", text)
    if images is not None:
        assert Settings().vllm_images == images
        return
    with pytest.raises(pydantic.ValidationError) as raised:
        Settings()
    assert {error["loc"][0] for error in raised.value.errors()} == {"vllm_images"}


def test_every_setting_is_documented():
    """docs/settings.md's table names each field's environment variable: docs that match the code."""
    table = (Path(__file__).resolve().parents[2] / "docs" / "settings.md").read_text()
    for name in Settings.model_fields:
        assert f"`CPULLM_{name.upper()}`" in table, name
