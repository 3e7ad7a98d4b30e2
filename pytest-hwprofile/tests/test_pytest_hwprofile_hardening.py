"""The pytest plugin's session device and marks (issue 25): ``--hwprofile-device=none`` really has no device,
an unknown device is one usage error, a malformed mark is one usage error at collection on every host."""

from __future__ import annotations

import os

import pytest

import pytest_hwprofile

pytest_plugins = ["pytester"]


def test_device_none_unsets_an_exported_simulation(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The "leg without a device" ran on the H200 that an exported HWPROFILE_DEVICE=h200 simulated."""
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    pytester.makepyfile(
        """
        import os, pytest, hwprofile

        def test_no_simulation():
            assert "HWPROFILE_DEVICE" not in os.environ
            assert not [d for d in hwprofile.detect().devices if d.simulated]

        @pytest.mark.hwprofile_arch("sm_90")
        def test_needs_sm90():
            assert not hwprofile.detect().devices[0].simulated
        """
    )
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--hwprofile-device=none", "-rs")
    outcomes = res.parseoutcomes()
    assert outcomes.get("passed", 0) >= 1 and "failed" not in outcomes, res.stdout.str()


def test_device_none_gives_the_exported_value_back(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    pytester.makepyfile("import os\n\ndef test_x():\n    assert 'HWPROFILE_DEVICE' not in os.environ\n")
    pytester.runpytest_inprocess("-p", "no:cacheprovider", "--hwprofile-device=none").assert_outcomes(passed=1)
    assert os.environ["HWPROFILE_DEVICE"] == "h200"


@pytest.mark.parametrize("value", ["h2000", "sm_9", " , "])
def test_an_unknown_exported_device_is_one_usage_error(value: str, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """It was one error per test (each test's profile() refusing the name)."""
    monkeypatch.setenv("HWPROFILE_DEVICE", value)
    pytester.makepyfile("import hwprofile\n\n" + "".join(f"def test_{i}():\n    hwprofile.profile()\n\n" for i in range(3)))
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR, res.stdout.str()
    errors = [ln for ln in res.stderr.lines if "HWPROFILE_DEVICE=" in ln]
    assert len(errors) == 1 and "(exported)" in errors[0] and "--hwprofile-device=none" in errors[0], res.stderr.str()
    assert "passed" not in res.stdout.str() and "failed" not in res.stdout.str()


def test_the_guards_own_name_inherited_by_a_child_session_is_no_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", pytest_hwprofile.UNDECLARED_DEVICE)
    pytester.makepyfile("def test_x():\n    pass\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


BAD_MARKS = {
    "test_arch_empty": ("@pytest.mark.hwprofile_arch()", "names no capability"),
    "test_arch_keyword": ("@pytest.mark.hwprofile_arch(capability='sm_90')", "not keywords (capability)"),
    "test_arch_int": ("@pytest.mark.hwprofile_arch(90)", "90 is not a string"),
    "test_gpu_malformed": ("@pytest.mark.hwprofile_gpu('sm_9')", "'sm_9' is not a capability"),
    "test_gpu_keyword": ("@pytest.mark.hwprofile_gpu(sm='sm_90')", "not keywords (sm)"),
    "test_arch_hidden_by_a_skip": ("@pytest.mark.hwprofile_arch('sm_75')\n@pytest.mark.hwprofile_gpu('sm_9x')", "'sm_9x' is not"),
}


@pytest.mark.parametrize("args", [[], ["-m", "not hwprofile_per_device"], ["--hwprofile-device=h200"], ["--collect-only"]])
def test_malformed_marks_are_one_usage_error_at_collection(args: list[str], pytester: pytest.Pytester,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """hwprofile_arch() / with a keyword skipped forever, hwprofile_arch(90) was an AttributeError, hwprofile_gpu("sm_9")
    was reported only where nothing skipped the test first (a GPU host)."""
    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    src = "import pytest\n\n" + "".join(f"{mark}\ndef {name}():\n    pass\n\n" for name, (mark, _) in BAD_MARKS.items())
    pytester.makepyfile(test_marks=src + "def test_fine():\n    pass\n")
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    assert res.ret == pytest.ExitCode.USAGE_ERROR, res.stdout.str() + res.stderr.str()
    err = res.stderr.str()
    assert err.count("malformed hwprofile marker") == 1 and "Traceback" not in err and "INTERNALERROR" not in res.stdout.str()
    for name, (_, needle) in BAD_MARKS.items():
        assert f"test_marks.py::{name}: " in err and needle in err, (name, err)
    assert "test_fine" not in err


def test_well_formed_marks_pass_collection(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.hwprofile_arch("sm_90", "9.0", "sm_121a", " 12.0 ")
        def test_arch():
            pass

        @pytest.mark.hwprofile_gpu
        def test_any_gpu():
            pass

        @pytest.mark.hwprofile_gpu("sm_90")
        def test_gpu():
            pass
        """
    )
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--hwprofile-device=h200")
    assert res.ret == pytest.ExitCode.OK, res.stdout.str() + res.stderr.str()
