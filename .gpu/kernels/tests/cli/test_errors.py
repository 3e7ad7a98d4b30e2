"""The CLI never shows a traceback for bad input or a broken environment (issue 13)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwprofile.cli import main


def hw(*args: str, env: dict[str, str] | None = None, stdout: object = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hwprofile.cli", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def one_line_error(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    errors = [ln for ln in p.stderr.strip().splitlines() if "error" in ln.split(":")[1]]  # other lines: logged warnings
    assert len(errors) == 1 and errors[0].startswith("hwprofile: "), p.stderr
    return errors[0]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_to_a_full_disk_is_one_line() -> None:
    with open("/dev/full", "w") as full:
        p = hw("show", "--simulate", "h200", stdout=full)
    assert p.returncode == 1 and "No space left on device" in one_line_error(p)


def test_new_plugin_into_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "afile"
    f.write_text("")
    assert main(["new-plugin", "sm89", "--capability", "8.9", "--dir", str(f)]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_new_plugin_with_a_300_character_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["new-plugin", "a" * 300, "--capability", "8.9", "--dir", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "at most 64" in err and len(err) < 400


def test_new_plugin_into_an_unwritable_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("")  # a file where a parent directory should be: fails for root too
    assert main(["new-plugin", "sm89", "--capability", "8.9", "--dir", str(blocker / "sub" / "p")]) == 2
    assert "cannot write the plugin into" in capsys.readouterr().err


def test_cache_clear_over_a_directory_entry_and_a_file_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    (d / "x.cubin").mkdir()
    (d / "y.cubin").write_bytes(b"y")
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(d))
    assert main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert "removed 1 entries" in out and "x.cubin: not a file" in out
    f = tmp_path / "afile"
    f.write_text("")
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(f))
    assert main(["cache", "clear"]) == 2
    assert "is not a directory" in capsys.readouterr().err and f.exists()


def test_compile_with_an_empty_arch_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", "--arch", ""]) == 2
    err = capsys.readouterr().err
    assert "--arch '' names no target" in err and "no architecture plugin is installed" not in err


def test_bad_control_value_is_one_line() -> None:
    line = one_line_error(hw("show", "--simulate", "h200", env={"HWPROFILE_CACHE": "disabled"}))
    assert "HWPROFILE_CACHE='disabled' is not valid" in line


def test_unexpected_error_is_one_line_and_the_traceback_is_opt_in(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import hwprofile.cli as cli

    def broken(args: object) -> int:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(cli, "cmd_show", broken)
    assert main(["show"]) == 3
    err = capsys.readouterr().err
    assert "internal error: ZeroDivisionError: boom" in err and "HWPROFILE_TRACEBACK=1" in err and "Traceback" not in err
    monkeypatch.setenv("HWPROFILE_TRACEBACK", "1")
    with pytest.raises(ZeroDivisionError):
        main(["show"])


@pytest.mark.parametrize("kind", ["directory", "missing"])
def test_broken_tuned_file_is_one_line(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "tuned"
    if kind == "directory":
        target.mkdir()
    line = one_line_error(hw("show", "--simulate", "h200", env={"HWPROFILE_TUNED_FILE": str(target)}))
    assert str(target) in line


def test_new_plugin_into_a_dir_with_a_300_character_component(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["new-plugin", "sm89", "--capability", "8.9", "--dir", str(tmp_path / ("d" * 300))]) == 2
    assert "cannot write the plugin into" in capsys.readouterr().err
