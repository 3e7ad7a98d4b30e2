"""Arguments that should be refused are refused, and a profile answers ``in`` and iteration (issue 25)."""

from __future__ import annotations

import pytest

import hwprofile
from hwprofile.errors import DeviceError, SettingError
from hwprofile.profiles import device_index


@pytest.fixture
def two_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200,gb300")
    hwprofile.reset()


@pytest.mark.parametrize("flag", [True, False])
def test_a_bool_is_not_a_device(two_devices: None, flag: bool) -> None:
    """``profile(True)`` selected device 1 (a bool is an int): a flag passed where the device goes."""
    with pytest.raises(DeviceError, match=rf"device {flag} is a bool, not a device: pass an index"):
        hwprofile.profile(flag)
    with pytest.raises(DeviceError, match="is a bool"):
        device_index(flag)


def test_the_devices_a_bool_was_mistaken_for_still_work(two_devices: None) -> None:
    assert hwprofile.profile(1).device.name == "NVIDIA GB300"
    assert hwprofile.profile("cuda:1") is hwprofile.profile(1)
    assert hwprofile.profile(0).device.name == "NVIDIA H200" and hwprofile.profile("cuda:0") is hwprofile.profile(0)


@pytest.mark.parametrize("bad", [1.0, "1", "cuda:True", "cpu", "cuda:-1"])
def test_other_non_devices_are_refused(two_devices: None, bad: object) -> None:
    with pytest.raises(DeviceError):
        hwprofile.profile(bad)


def test_in_asks_whether_a_setting_is_declared(two_devices: None) -> None:
    """``"key" in prof`` raised ``SettingError: unknown setting 0`` (the ``__getitem__`` iteration fallback)."""
    prof = hwprofile.profile(0)
    assert "router_gemm.max_tokens" in prof and "strict" in prof
    assert "router_gemm.no_such" not in prof and "" not in prof
    for other in (0, None, b"strict", ("strict",), 1.5):
        assert other not in prof  # not a key: False, never an error
    assert "router_gemm.no_such" not in prof.settings  # the same answer as the mapping


def test_iteration_and_keys_are_the_setting_keys(two_devices: None) -> None:
    prof = hwprofile.profile(0)
    keys = list(prof)
    assert keys == list(prof.settings) == list(prof.keys()) == sorted(keys)
    assert "router_gemm.max_tokens" in keys and len(keys) == len(set(keys))
    assert dict(prof) == {k: prof[k] for k in keys}  # keys() + __getitem__: the values by key
    assert {k: s.value for k, s in prof.settings.items()} == dict(prof)


def test_unknown_key_still_raises_with_the_known_ones(two_devices: None) -> None:
    prof = hwprofile.profile(0)
    with pytest.raises(SettingError, match=r"unknown setting 'router_gemm.no_such'; .*lists the \d+ settings: .*router_gemm.max_tokens"):
        prof["router_gemm.no_such"]
