"""The overlapped first profile() (hwprofile._first_profile) gives the profile the sequential path gives."""

from __future__ import annotations

import os

import pytest

import hwprofile
from hwprofile import _first_profile, device
from hwprofile.profiles import build_profile
from hwprofile.registry import Registry
from tests.device.test_device import GPUS, ThreadRecordingNVML, _real_gpu_env


def _sequential(index: int) -> hwprofile.Profile:
    return build_profile(device.detect().device(index), Registry().load_entry_points(), os.environ)


@pytest.mark.parametrize("index", [0, 1])
def test_overlapped_first_profile_equals_the_sequential_one(monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    fake = ThreadRecordingNVML(GPUS)
    _real_gpu_env(monkeypatch, fake)
    overlapped = hwprofile.profile(index)
    assert fake.init_threads == ["hwprofile-nvml-probe"]  # the overlapped path was taken
    hwprofile.reset()
    sequential = _sequential(index)
    assert fake.init_threads[-1] == "MainThread"
    assert overlapped.device == sequential.device
    assert overlapped.fingerprint == sequential.fingerprint
    assert overlapped.plugin == sequential.plugin and overlapped.target == sequential.target
    assert {k: s.value for k, s in overlapped.settings.items()} == {k: s.value for k, s in sequential.settings.items()}
    assert overlapped.env_defaults == sequential.env_defaults


def test_simulated_first_profile_equals_the_sequential_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200,gb300")
    calls: list[str] = []

    def loader() -> Registry:
        calls.append("registry")
        return Registry().load_entry_points()

    overlapped = _first_profile.first_profile(1, loader, build_profile)
    assert calls == ["registry"] and overlapped.device.name == "NVIDIA GB300"
    assert overlapped.fingerprint == _sequential(1).fingerprint
