"""Core's own plugin (``hwprofile._core_plugin``): profiles and ops reach the re-tuner and the self-test through the
seam hooks, registered by core's entry point, so that neither layer imports the tools above it."""

from __future__ import annotations

from typing import Any

import pytest

import hwprofile
from hwprofile import profiles
from hwprofile.errors import PluginError
from hwprofile.hookspecs import hookimpl


def test_core_registers_its_plugin_by_entry_point() -> None:
    hwprofile.reset()
    reg = profiles.registry()
    info = reg.plugins.get("hwprofile")
    assert info is not None, "core's entry point 'hwprofile' is not installed: reinstall core (pip install -e core)"
    assert info.module == "hwprofile._core_plugin" and info.arch is None and info.distribution == "hwprofile"


def test_a_first_profile_hook_replaces_the_profile_and_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The seam: a real device's first profile() returns what the hook returns (cached); a wrong answer names the plugin."""
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    seen: list[Any] = []

    class Swap:
        def __init__(self, answer: Any) -> None:
            self.answer = answer

        @hookimpl
        def hwprofile_first_profile(self, profile: hwprofile.Profile) -> Any:
            seen.append(profile)
            hwprofile.profile(profile.device.index)  # may resolve profiles: no re-entry error, no second call
            return self.answer(profile) if callable(self.answer) else self.answer

    for answer, ok in ((lambda p: p.replace(stats={}), True), ("not a profile", False)):
        hwprofile.reset()
        reg = profiles.registry()
        reg.register(Swap(answer), "swap")
        prof = profiles._profiles.get(0) or hwprofile.profile(0)  # simulated: the hook is never called
        assert seen == []
        object.__setattr__(prof.device, "simulated", False)
        try:
            if ok:
                out = profiles._hand_over(prof)
                assert out is not prof and profiles._profiles[0] is out and seen == [prof]
            else:
                with pytest.raises(PluginError, match="swap.*hwprofile_first_profile must return None or a Profile"):
                    profiles._hand_over(prof)
        finally:
            object.__setattr__(prof.device, "simulated", True)
        seen.clear()
    hwprofile.reset()


def test_a_check_kernels_answer_disables_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    from hwprofile import ops

    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    class Veto:
        @hookimpl
        def hwprofile_check_kernels(self, profile: hwprofile.Profile) -> Any:
            return {"gemv": "vetoed by the test"}

    hwprofile.reset()
    profiles.registry().register(Veto(), "veto")
    with pytest.warns(RuntimeWarning, match="gemv kernel disabled on cuda:0 .*vetoed by the test"):
        t = ops._dispatch.table(0)
    assert "gemv" in t.failed
    hwprofile.reset()
    profiles.registry().register(type("Bad", (), {"hwprofile_check_kernels": hookimpl(lambda self, profile: {"no_such_op": "x"})})(), "bad")
    with pytest.raises(PluginError, match="bad.*hwprofile_check_kernels must return"):
        ops._dispatch.table(0)
    hwprofile.reset()
