"""The pytest plugin's per-device split: the hwprofile_per_device mark, the guard, skips at the test."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TESTS = """
import os

import pytest

import hwprofile


@pytest.mark.hwprofile_arch("sm_90")
def test_arch_marker():
    pass


@pytest.mark.hwprofile_gpu
def test_gpu_marker():
    pass


def test_profile_fixture(hwprofile_profile):
    assert hwprofile_profile.fingerprint


@pytest.fixture
def via_profile(hwprofile_profile):
    return hwprofile_profile


def test_fixture_through_a_fixture(via_profile):
    pass


@pytest.mark.hwprofile_per_device
def test_explicit_mark():
    assert hwprofile.detect().devices


def test_own_device(monkeypatch):
    monkeypatch.setenv("HWPROFILE_DEVICE", "gb300")
    assert hwprofile.profile(0).plugin.name == "sm100"


def test_simulate_fixture(hwprofile_simulate):
    assert hwprofile_simulate("b200").target == "sm_100a"


def test_no_device():
    assert 1 + 1 == 2
"""

PER_DEVICE = ["test_arch_marker", "test_gpu_marker", "test_profile_fixture", "test_fixture_through_a_fixture", "test_explicit_mark"]
ONCE = ["test_own_device", "test_simulate_fixture", "test_no_device"]


def _collected(res: pytest.RunResult) -> list[str]:
    return sorted(ln.split("::")[-1] for ln in res.stdout.lines if "::" in ln)


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    pytester.makeini("[pytest]\nhwprofile_guard_device = true\naddopts = -p no:cacheprovider --strict-markers\n")
    pytester.makepyfile(test_split=TESTS)
    return pytester


def test_device_markers_and_fixtures_make_a_test_per_device(suite: pytest.Pytester) -> None:
    per_device = suite.runpytest_subprocess("--collect-only", "-q", "-m", "hwprofile_per_device")
    once = suite.runpytest_subprocess("--collect-only", "-q", "-m", "not hwprofile_per_device")
    assert _collected(per_device) == sorted(PER_DEVICE)
    assert _collected(once) == sorted(ONCE)


def test_the_two_selections_pass_and_cover_the_suite(suite: pytest.Pytester) -> None:
    suite.runpytest_subprocess("-m", "not hwprofile_per_device").assert_outcomes(passed=len(ONCE))
    outcomes = suite.runpytest_subprocess("-m", "hwprofile_per_device", "--hwprofile-device=h200").parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("skipped", 0) == len(PER_DEVICE)
    assert outcomes["passed"] >= 4  # hwprofile_gpu passes only with a real GPU


def test_guard_fails_an_unmarked_test_that_reads_the_session_device(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_reads="""
        import subprocess, sys

        import hwprofile

        def test_reads_in_process():
            hwprofile.profile()

        def test_reads_in_a_subprocess():
            code = "import hwprofile; hwprofile.profile()"
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
        """
    )
    for device in ("h200", "none"):
        res = suite.runpytest_subprocess(f"--hwprofile-device={device}", "test_reads.py")
        res.assert_outcomes(failed=2)
        res.stdout.fnmatch_lines(["*- hwprofile -*", "*not marked hwprofile_per_device*@pytest.mark.hwprofile_per_device*"])
    # without the guard the same tests read the session device: h200 resolves
    res = suite.runpytest_subprocess("--hwprofile-device=h200", "-o", "hwprofile_guard_device=false", "test_reads.py")
    res.assert_outcomes(passed=2)


def test_guard_restores_the_session_device(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_order="""
        import os

        import pytest

        def test_unmarked():
            assert os.environ["HWPROFILE_DEVICE"] == "read-by-a-test-not-marked-hwprofile_per_device"

        @pytest.mark.hwprofile_per_device
        def test_marked():
            assert os.environ["HWPROFILE_DEVICE"] == "rtx-pro-6000"

        def test_unmarked_again():
            assert os.environ["HWPROFILE_DEVICE"] == "read-by-a-test-not-marked-hwprofile_per_device"
        """
    )
    suite.runpytest_subprocess("--hwprofile-device=rtx-pro-6000", "test_order.py").assert_outcomes(passed=3)


def test_skips_are_reported_at_the_test(suite: pytest.Pytester) -> None:
    lines = (suite.path / "test_split.py").read_text().splitlines()
    # where pytest reports a test: its first line, the decorator's (1-based: the 0-based index of the def)
    at = {name: f"test_split.py:{lines.index(f'def {name}():')}" for name in ("test_arch_marker", "test_gpu_marker")}
    res = suite.runpytest_subprocess("-rs", "-m", "hwprofile_per_device", "--hwprofile-device=rtx-pro-6000")
    skips = [ln for ln in res.stdout.lines if ln.startswith("SKIPPED")]
    assert skips and not [ln for ln in skips if "pytest_hwprofile" in ln], skips
    assert [ln for ln in skips if ln.startswith(f"SKIPPED [1] {at['test_arch_marker']}: needs sm_90; device 0 is NVIDIA RTX PRO")], skips
    if res.parseoutcomes()["skipped"] == 2:  # no real GPU usable by torch here
        assert [ln for ln in skips if ln.startswith(f"SKIPPED [1] {at['test_gpu_marker']}: needs")], skips
    res = suite.runpytest_subprocess("-rs", "--hwprofile-device=none", "test_split.py::test_profile_fixture")
    if "skipped" in res.parseoutcomes():  # no real GPU here: the fixture's skip, at the test
        line = lines.index("def test_profile_fixture(hwprofile_profile):") + 1
        res.stdout.fnmatch_lines([f"SKIPPED [[]1[]] test_split.py:{line}: nothing to profile*"])
