"""The controller image's podman storage: paths podman accepts wherever the cache lives."""
from __future__ import annotations

from pathlib import Path

from gangctl.cluster.image import podman, runroot
from gangctl.config import ClusterSettings


def test_podmans_runroot_stays_under_50_characters_however_deep_the_cache(monkeypatch, tmp_path):
    # a cold CI run's HOME: /tmp/gangctl-cold.XXXXXX/home, so the cache is 45 characters deep already
    deep = tmp_path / ("h" * 60) / "home"
    monkeypatch.setenv("HOME", str(deep))
    args = podman(ClusterSettings())
    run = Path(args[args.index("--runroot") + 1])
    assert len(str(run)) <= 50, run   # podman: "the specified runroot is longer than 50 characters"
    assert str(deep) in args[args.index("--root") + 1], "the image store itself stays in the cache"
    assert run == runroot(Path(args[args.index("--root") + 1]).parent), "one store, one runroot"
    other = podman(ClusterSettings(cache_dir=tmp_path / "elsewhere"))
    assert other[other.index("--runroot") + 1] != str(run), "two caches never share podman's locks"
