"""Shared fixtures: a private kernel cache per session and a clean hwprofile state per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

import hwprofile


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    if "HWPROFILE_CACHE_DIR" not in os.environ:
        d = tmp_path_factory.mktemp("hwpcache")
        os.chmod(d, 0o700)
        os.environ["HWPROFILE_CACHE_DIR"] = str(d)
    if "HWPROFILE_CONFIG_DIR" not in os.environ:  # no tuned files from the user's config dir
        os.environ["HWPROFILE_CONFIG_DIR"] = str(tmp_path_factory.mktemp("hwpconfig"))
    yield


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    # the CLI's --simulate writes HWPROFILE_DEVICE into os.environ; keep each test's change to itself
    before = os.environ.get("HWPROFILE_DEVICE")
    hwprofile.reset()
    yield
    if before is None:
        os.environ.pop("HWPROFILE_DEVICE", None)
    else:
        os.environ["HWPROFILE_DEVICE"] = before
    hwprofile.reset()


@pytest.fixture
def no_downstream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Profiles without the example downstream plugin (to see the architecture plugin's own values)."""
    monkeypatch.setenv("HWPROFILE_DISABLE_PLUGINS", "myengine")
    hwprofile.reset()


def tuned_toml(
    dev: object,
    thresholds: dict[str, object],
    /,
    *,
    plugin: str = "arch",
    version: str = "1.0",
    kernel: str = "",
    op: str = "router_gemm",
    **stamp_changes: object,
) -> str:
    """A tuned-thresholds file whose stamp matches ``dev`` and the running fallback, unless changed."""
    import tomli_w

    from hwprofile import tuning as stamps

    st = stamps.current(op, dev, plugin, version, kernel, "2026-11-30").as_dict()
    for k, v in stamp_changes.items():
        if k.startswith("fallback_"):
            st["fallback"][k[len("fallback_") :]] = v
        else:
            st[k] = v
    return tomli_w.dumps({"stamp": st, "thresholds": thresholds})


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Device 0's dispatch table on the real GPU, strict (a kernel that fails raises), for the GPU kernel tests."""
    from hwprofile import ops

    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    monkeypatch.setenv("HWPROFILE_STRICT", "1")
    hwprofile.reset()
    ops.reset_dispatch()
    t = ops._dispatch.table(0)
    if not t.prof.kernels:  # a GPU no architecture plugin with kernels serves: nothing of ours to test on it
        pytest.skip(f"{t.prof.device.name}: no architecture plugin with kernels serves it")
    return t


def rel(out: Any, ref: Any) -> float:
    """Relative error of ``out`` against a float64 reference; a NaN means an element was never written."""
    import torch

    assert not torch.isnan(out).any(), "an output element was not written"
    return float((out.double() - ref).norm() / ref.norm())

