"""The pytest plugin itself: markers skip with reasons, --hwprofile-device simulates."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TESTS = """
import pytest, hwprofile

@pytest.mark.hwprofile_arch("sm_120", "sm_121")
def test_sm12x():
    assert hwprofile.profile(0).plugin.name == "sm120"

@pytest.mark.hwprofile_arch("sm_120")
def test_sm120_only():
    pass

@pytest.mark.hwprofile_gpu("sm_75")
def test_real_turing_never_here():
    pass

def test_simulate_fixture(hwprofile_simulate):
    assert hwprofile_simulate("b200").target == "sm_100a"
"""


@pytest.mark.parametrize(("device", "passed", "skipped"), [("dgx-spark", 2, 2), ("rtx-pro-6000", 3, 1), ("h200", 1, 3)])
def test_markers_under_simulation(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, device: str, passed: int, skipped: int
) -> None:
    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    pytester.makepyfile(TESTS)
    res = pytester.runpytest_subprocess(f"--hwprofile-device={device}", "-rs")
    res.assert_outcomes(passed=passed, skipped=skipped)
    res.stdout.fnmatch_lines(["*needs*"])
