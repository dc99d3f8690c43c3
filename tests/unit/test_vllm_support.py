"""The vLLM version table (cpullm/vllm_support.py): what a plan renders for each version, and docs/vllm-versions.md
kept equal to the table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cpullm import vllm_support
from cpullm.core.children.deployment import vllm_env
from cpullm.core.planner import plan_service

from .builders import AMX_FLAGS, AVX512_FLAGS, node, qwen_05b, spec

ROOT = Path(__file__).resolve().parents[2]
ALL_FIXES = sorted(vllm_support.FIX_VERSIONS)
# What a plan may count on: every fix but the container's CPU metrics, which only the performance check reads.
CREDITABLE = [fix for fix in ALL_FIXES if fix != vllm_support.CONTAINER_CPU_METRICS]
# What a TP 1 plan on a pod-local cache counts on: those but the AOT cache's, which needs a cache kept across pods.
TP1_FIXES = [fix for fix in CREDITABLE if fix != vllm_support.AOT_CACHE_LOADS]


def plan_for(image: str | None, **fields):
    return plan_service(spec(tensorParallelSize=1, image=image, **fields), qwen_05b(), [node("n1", numa=2)])


@pytest.mark.parametrize(
    ("image", "fields", "version", "source", "fixes"),
    [
        pytest.param(None, {}, "0.32.0", "image tag", TP1_FIXES, id="the default image"),
        pytest.param("docker.io/vllm/vllm-openai-cpu:v0.31.0-x86_64", {}, "0.31.0", "image tag", TP1_FIXES, id="0.31"),
        pytest.param("docker.io/vllm/vllm-openai-cpu:v0.33.0", {}, "0.33.0", "image tag", TP1_FIXES, id="0.33"),
        pytest.param(
            "registry.corp/vllm-cpu:0.33.0@sha256:" + "a" * 64, {}, "0.33.0", "image tag", TP1_FIXES, id="tag+digest"
        ),
        pytest.param("registry.corp/vllm@sha256:" + "a" * 64, {}, None, "unknown", [], id="digest alone"),
        pytest.param("registry.corp/vllm:latest", {}, None, "unknown", [], id="a tag of one's own"),
        pytest.param(
            "registry.corp/vllm:latest", {"vllmVersion": "0.32.0"}, "0.32.0", "spec", TP1_FIXES, id="spec says"
        ),
        pytest.param(
            "docker.io/vllm/vllm-openai-cpu:v0.40.0", {}, "0.40.0", "image tag", [], id="newer than the table"
        ),
        pytest.param("registry:5000/vllm:v0.32.0", {}, "0.32.0", "image tag", TP1_FIXES, id="a registry port"),
    ],
)
def test_the_plan_knows_its_vllm_version_and_counts_only_the_fixes_for_it(image, fields, version, source, fixes):
    plan = plan_for(image, **fields)
    assert (plan.vllm_version, plan.vllm_version_source, plan.fixes_credited) == (version, source, fixes)
    known = version in vllm_support.RELEASES
    assert plan.rank_in_engine_core is known  # fix 3's saving counted only for a version it is for
    cautions = [c.reason for c in plan.cautions or []]
    assert ("UnknownVLLMVersion" in cautions) is not known


def test_a_version_without_the_fixes_gets_the_larger_limit():
    known, unknown = plan_for(None), plan_for("registry.corp/vllm:latest")
    assert unknown.memory_limit_bytes > known.memory_limit_bytes
    assert not unknown.engine_core_forked and not unknown.aot_compile_cache


@pytest.mark.parametrize(
    ("fix_range", "version", "applies"),
    [
        (("0.31.0", None), "0.31.0", True),
        (("0.31.0", None), "0.32.0+cpu", True),
        (("0.31.0", None), "0.30.9", False),
        (("0.31.0", "0.33.0"), "0.33.0", False),
        (("0.31.0", "0.33.0"), "0.32.5", True),
        (("0.31.0", None), None, False),
        (("0.31.0", None), "main", False),
    ],
)
def test_fix_ranges_are_half_open(monkeypatch, fix_range, version, applies):
    monkeypatch.setitem(vllm_support.FIX_VERSIONS, "a_fix", fix_range)
    assert vllm_support.fix_applies("a_fix", version) is applies


@pytest.mark.parametrize(("image", "variable"), [("vllm/x:v0.33.0", "VLLM_KV_BYTES"), ("vllm/x:mine", "VLLM_KV_BYTES")])
def test_the_kv_caches_size_reaches_vllm_through_its_releases_variable(monkeypatch, image, variable):
    """The renderer names the variable the plan's version reads (an unknown version: the newest known one's)."""
    newest = list(vllm_support.RELEASES)[-1]
    monkeypatch.setitem(vllm_support.RELEASES, newest, vllm_support.RELEASES[newest]._replace(kv_cache_env=variable))
    plan = plan_for(image)
    env = {item["name"]: item.get("value") for item in vllm_env(spec(tensorParallelSize=1, image=image), plan)}
    assert env[variable] == str(plan.kv_cache_gi_b) and "VLLM_CPU_KVCACHE_SPACE" not in env


def test_the_docs_table_is_the_table():
    text = (ROOT / "docs" / "vllm-versions.md").read_text()
    rows = re.findall(
        r"^\| (\d+\.\d+\.\d+) \| (yes|no) \| `([^`]+)` \| ([^|]+) \| ([^|]+) \| (.*) \|$", text, re.MULTILINE
    )
    assert [row[0] for row in rows] == list(vllm_support.RELEASES)
    for version, run_here, kv_cache, fixes, speculative, note in rows:
        release = vllm_support.RELEASES[version]
        assert (run_here == "yes", kv_cache, note) == (release.run_here, release.kv_cache_env, release.note)
        assert speculative.strip() == ", ".join(release.speculative)
        applying = sorted(vllm_support.fixes_for(version))
        assert fixes.strip() == ("all" if applying == ALL_FIXES else ", ".join(applying) or "none")
    fixes_listed = re.findall(r"^\| `(\w+)`", text, re.MULTILINE)
    assert set(fixes_listed) == set(vllm_support.FIX_VERSIONS) - {vllm_support.ENGINE_CORE_FORKED}
    assert (
        max((v for v, r in vllm_support.RELEASES.items() if r.run_here), key=vllm_support.version_key)
        == vllm_support.DEFAULT_VERSION
    )


OFF = "CPULLM_VLLM_FIXES_OFF"


@pytest.mark.parametrize(
    ("fields", "credited"),
    [
        pytest.param({}, TP1_FIXES, id="TP 1 on a pod-local cache"),
        pytest.param(
            {"modelCache": {"persistentVolumeClaim": {"claimName": "models"}}},
            CREDITABLE,
            id="a cache kept across pods: the AOT cache",
        ),
        pytest.param(
            {"env": [{"name": OFF, "value": "short_warm_up,engine_core_forked"}]},
            [f for f in TP1_FIXES if f not in ("short_warm_up", "engine_core_forked")],
            id="turned off in spec.env",
        ),
        pytest.param(
            {"env": [{"name": OFF, "value": "rank_in_engine_core"}]},
            ["amx_tile_permission", "checkpoint_pages_dropped", "leave_page_cache_out", "short_warm_up"],
            id="no rank in the engine core: no fork either",
        ),
        pytest.param({"cpu": {"launcher": False}}, [], id="without the launcher"),
    ],
)
def test_the_plan_credits_the_fixes_its_figures_count_on(fields, credited):
    assert plan_for(None, **fields).fixes_credited == credited


@pytest.mark.parametrize(
    ("flags", "counted"),
    [(AMX_FLAGS, True), (AVX512_FLAGS, False), (("AVX2",), False)],
    ids=["AMX", "AVX-512 without AMX", "AVX2"],
)
def test_the_amx_permission_is_counted_on_only_where_the_nodes_have_amx_tiles(flags, counted):
    plan = plan_service(spec(tensorParallelSize=1), qwen_05b(), [node("n1", flags=flags)])
    assert (vllm_support.AMX_TILE_PERMISSION in plan.fixes_credited) is counted
