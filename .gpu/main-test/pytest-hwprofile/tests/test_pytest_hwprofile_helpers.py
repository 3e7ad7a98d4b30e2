"""The pytest plugin's helpers for kernel tests: ``rel_error`` and the ``hwprofile_strict_gpu`` fixture."""

from __future__ import annotations

import pytest

from pytest_hwprofile import rel_error

pytest_plugins = ["pytester"]


def test_rel_error_is_float64_relative_error() -> None:
    torch = pytest.importorskip("torch")
    ref = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert rel_error(torch.tensor([3.0, 4.0], dtype=torch.bfloat16), ref) == 0.0
    assert rel_error(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.1)
    assert rel_error(torch.tensor([0.0, 0.5]), torch.zeros(2, dtype=torch.float64)) == pytest.approx(0.5)  # zero ref: absolute


def test_rel_error_fails_on_an_element_never_written() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(pytest.fail.Exception, match=r"not written \(NaN in 1 of 3\)"):
        rel_error(torch.tensor([1.0, float("nan"), 2.0]), torch.ones(3, dtype=torch.float64))


def test_strict_gpu_fixture_gives_a_strict_real_gpu_profile_or_skips(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")  # a simulated device is not a real GPU: the fixture unsets it
    pytester.makepyfile(
        """
        import os

        STRICT_BEFORE = os.environ.get("HWPROFILE_STRICT")

        def test_strict(hwprofile_strict_gpu):
            assert not hwprofile_strict_gpu.device.simulated and os.environ["HWPROFILE_STRICT"] == "1"
            assert "HWPROFILE_DEVICE" not in os.environ

        def test_restored():
            assert os.environ["HWPROFILE_DEVICE"] == "h200" and os.environ.get("HWPROFILE_STRICT") == STRICT_BEFORE
        """
    )
    res = pytester.runpytest_subprocess("-rs", "-p", "no:cacheprovider")
    outcomes = res.parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("skipped", 0) == 2 and "failed" not in outcomes and "error" not in outcomes
    if outcomes.get("skipped"):
        res.stdout.fnmatch_lines(["*needs a real NVIDIA GPU*"])
