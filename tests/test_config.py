"""gradtape.config: every GRADTAPE_* setting is listed there and read with its default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gradtape import config

SOURCE = Path(config.__file__).parent


def test_every_setting_the_source_reads_is_listed():
    named = set()
    for path in SOURCE.rglob("*.py"):
        named.update(re.findall(r"GRADTAPE_[A-Z][A-Z_]*[A-Z]", path.read_text(encoding="utf-8")))
    assert named <= set(config.SETTINGS), sorted(named - set(config.SETTINGS))


def test_defaults(monkeypatch):
    for name in config.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert config.numba_enabled() and config.cache_enabled()
    assert config.malloc_tune() and config.patch_numpy()
    assert config.cache_max_mb() == 256 and config.cache_max_age_days() == 30
    assert config.cache_dir() == Path.home() / ".cache" / "gradtape"


@pytest.mark.parametrize("value", ["0", "false", "No", " off "])
def test_switching_off(monkeypatch, value):
    monkeypatch.setenv("GRADTAPE_NUMBA", value)
    monkeypatch.setenv("GRADTAPE_CACHE", value)
    assert not config.numba_enabled() and not config.cache_enabled()


def test_an_empty_value(monkeypatch):
    monkeypatch.setenv("GRADTAPE_NUMBA", "")
    monkeypatch.setenv("GRADTAPE_CACHE", "")
    assert config.numba_enabled() and not config.cache_enabled()  # each as it always was read


def test_cache_directory_and_limits(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("GRADTAPE_CACHE_DIR", raising=False)
    assert config.cache_dir() == tmp_path / "xdg" / "gradtape"
    monkeypatch.setenv("GRADTAPE_CACHE_DIR", str(tmp_path / "mine"))
    assert config.cache_dir() == tmp_path / "mine"
    monkeypatch.setenv("GRADTAPE_CACHE_MAX_MB", "0.5")
    assert config.cache_max_mb() == 0.5
    monkeypatch.setenv("GRADTAPE_CACHE_MAX_AGE_DAYS", "several")
    with pytest.warns(RuntimeWarning, match="not a number"):
        assert config.cache_max_age_days() == 30
