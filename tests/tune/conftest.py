"""Every tune test: a simulated H200 (unless the test says otherwise), no downstream plugin, a config directory of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

import hwprofile


@pytest.fixture(autouse=True)
def _own_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "config"
    d.mkdir()
    monkeypatch.setenv("HWPROFILE_CONFIG_DIR", str(d))
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    monkeypatch.setenv("HWPROFILE_DISABLE_PLUGINS", "myengine")  # the example engine caps router_gemm.max_tokens at 8
    monkeypatch.delenv("HWPROFILE_TUNED_FILE", raising=False)
    monkeypatch.delenv("HWPROFILE_TUNE", raising=False)
    hwprofile.reset()
    return d
