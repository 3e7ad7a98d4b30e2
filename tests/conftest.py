"""Shared fixtures: a private kernel cache per session and a clean hwprofile state per test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import hwprofile


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    if "HWPROFILE_CACHE_DIR" not in os.environ:
        d = tmp_path_factory.mktemp("hwpcache")
        os.chmod(d, 0o700)
        os.environ["HWPROFILE_CACHE_DIR"] = str(d)
    yield


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    hwprofile.reset()
    yield
    hwprofile.reset()


@pytest.fixture
def no_downstream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Profiles without the example downstream plugin (to see the architecture plugin's own values)."""
    monkeypatch.setenv("HWPROFILE_DISABLE_PLUGINS", "myengine")
    hwprofile.reset()
