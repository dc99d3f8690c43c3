"""The e2e image cache keeps one version of each image: a new key supersedes the others."""

from pathlib import Path

import pytest
from testbed import images


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(images, "CACHE", tmp_path)
    for name in (
        "operator-28d55793917b.tar",
        "operator-28d55793917b.json",
        "operator-4274717d084b.tar",
        "operator-4274717d084b.json",
        "python-base-8c8282feefe7.tar",
        "python-base-trust",
        "pause-staging",
    ):
        (tmp_path / name).touch()
    (tmp_path / "rootfs-python-bookworm-8c8282feefe73d3f").mkdir()
    (tmp_path / "rootfs-python-bookworm-0123456789abcdef").mkdir()
    (tmp_path / "rootfs-vllm-bookworm-736ff39f593b704d").mkdir()
    return tmp_path


def test_a_new_version_removes_the_others_of_the_same_image_only(cache: Path):
    images.drop_superseded(cache / "operator-4274717d084b.tar")
    images.drop_superseded(cache / "rootfs-python-bookworm-0123456789abcdef")
    assert sorted(p.name for p in cache.iterdir()) == [
        "operator-4274717d084b.json",
        "operator-4274717d084b.tar",
        "pause-staging",
        "python-base-8c8282feefe7.tar",
        "python-base-trust",
        "rootfs-python-bookworm-0123456789abcdef",
        "rootfs-vllm-bookworm-736ff39f593b704d",
    ]
