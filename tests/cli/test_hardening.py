"""The command in the environments engines run in (issue 25): a closed stdout, an output encoding that cannot
write a path, a container user with no home. Each ends in the command's output or one line and a status,
never a traceback or "internal error"."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hwprofile import cli

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX file descriptors and users")


def _run(args: list[str], env: dict[str, str] | None = None, *, preexec: Callable[[], None] | None = None,
         clean: bool = False) -> subprocess.CompletedProcess[bytes]:
    """The ``hwprofile`` program (``python -m hwprofile.cli``) in a child, stdout and stderr as bytes."""
    base = {k: v for k, v in os.environ.items() if not clean or k in ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "LANG", "LC_ALL")}
    full = {**base, "HWPROFILE_DEVICE": "h200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "hwprofile.cli", *args], env=full, capture_output=True, preexec_fn=preexec, timeout=120, check=False
    )


def _close_stdout() -> None:
    os.close(1)


# --- a closed stdout -------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["show"], ["show", "--json"], ["doctor"], ["--version"], ["cache", "info"], ["devices"]])
def test_a_closed_stdout_is_one_line_and_status_1(args: list[str]) -> None:
    """``hwprofile show >&-`` was an AttributeError traceback ('NoneType' object has no attribute 'flush')."""
    r = _run(args, preexec=_close_stdout)
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert "Traceback" not in err and "internal error" not in err
    assert err.strip().splitlines() == [
        "hwprofile: error: standard output is closed, so the output was not written; run with stdout open or redirect it (> /dev/null)"
    ]


def test_a_closed_stdout_still_does_the_work_and_keeps_usage_errors(tmp_path: Path) -> None:
    r = _run(["new-plugin", "mygpu", "--capability", "8.9", "--dir", str(tmp_path / "p")], preexec=_close_stdout)
    assert r.returncode == 1 and (tmp_path / "p" / "pyproject.toml").is_file()
    r = _run(["show", "--bogus"], preexec=_close_stdout)
    assert r.returncode == 2 and b"unrecognized arguments: --bogus" in r.stderr and b"Traceback" not in r.stderr


def test_closed_stdout_and_stderr_end_with_the_status_only() -> None:
    def close_both() -> None:
        os.close(1)
        os.close(2)

    r = _run(["show"], preexec=close_both)
    assert r.returncode == 1 and r.stderr == b""


def test_an_in_process_call_with_no_stdout_gives_sys_stdout_back(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    monkeypatch.setattr(sys, "stdout", None)
    assert cli.main(["show"]) == 1
    assert sys.stdout is None
    assert "standard output is closed" in capsys.readouterr().err


# --- paths an output encoding cannot write -----------------------------------------------------------


@pytest.mark.parametrize("args", [["cache", "info"], ["cache", "clear"], ["doctor"]])
def test_a_non_utf8_path_on_a_strict_utf8_stdout_is_written_as_its_bytes(args: list[str], tmp_path: Path) -> None:
    """A cache dir named with the byte 0xff (``os.fsdecode`` makes it '\\udcff') was an internal UnicodeEncodeError."""
    d = os.fsdecode(os.fsencode(str(tmp_path)) + b"/k\xff")
    r = _run(args, {"HWPROFILE_CACHE_DIR": d, "PYTHONIOENCODING": "utf-8:strict"})
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert os.fsencode(d) in r.stdout and b"internal error" not in r.stderr


def test_a_non_ascii_path_on_an_ascii_stdout_is_escaped(tmp_path: Path) -> None:
    d = str(tmp_path / "caf\u00e9")
    r = _run(["cache", "info"], {"HWPROFILE_CACHE_DIR": d, "PYTHONIOENCODING": "ascii"})
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert b"caf\\xe9" in r.stdout


def test_the_render_handler_is_undone_after_an_in_process_call(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", "/tmp/caf\u00e9")
    assert cli.main(["cache", "info"]) == 0
    assert out.errors == "strict"
    out.flush()
    assert b"/tmp/caf\\xe9" in out.buffer.getvalue()  # type: ignore[attr-defined]


# --- a container user with no passwd entry and no HOME -------------------------------------------------


@pytest.fixture
def no_passwd(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def missing(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", missing)
    for v in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "HWPROFILE_CACHE_DIR", "HWPROFILE_CONFIG_DIR"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")


@pytest.mark.usefixtures("no_passwd")
@pytest.mark.parametrize("args", [["cache", "info"], ["cache", "clear"], ["doctor"], ["doctor", "--json"], ["show"]])
def test_no_home_commands_work(args: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``cache info``, ``cache clear`` and ``doctor`` were "internal error: RuntimeError: could not determine the home directory"."""
    import hwprofile

    hwprofile.reset()
    try:
        code = cli.main(args)
    finally:
        hwprofile.reset()
    out, err = capsys.readouterr()
    assert "internal error" not in err and code in (0, 1), err  # doctor is 1 only for a failed check
    if args[0] == "cache":
        assert code == 0 and str(tmp_path / f"hwprofile-{os.getuid()}" / "kernels") in out
    if args == ["doctor"]:
        assert "config" in out and "Set HWPROFILE_CONFIG_DIR (or HOME)" in out and "FAIL" not in out.split("checks:")[1].split("nvrtc")[0]


@pytest.mark.usefixtures("no_passwd")
def test_no_home_sweep_without_output_names_what_to_set(capsys: pytest.CaptureFixture[str]) -> None:
    from hwprofile import tuning
    from hwprofile.device import DeviceInfo
    from hwprofile.errors import SettingError

    with pytest.raises(SettingError, match=r"Set HWPROFILE_CONFIG_DIR \(or HOME\)"):
        tuning.tuned_dir(DeviceInfo(0, "NVIDIA H200", (9, 0)), os.environ)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="becoming a user with no passwd entry needs root")
@pytest.mark.parametrize("args", [["cache", "info"], ["cache", "clear"], ["doctor"]])
def test_a_real_uid_without_passwd_entry_or_home(args: list[str], tmp_path: Path) -> None:
    """As ``docker run --user 12345`` does: a uid with no passwd entry, no HOME in the environment."""
    uid = 54321
    try:
        pwd.getpwuid(uid)
        pytest.skip(f"uid {uid} has a passwd entry here")
    except KeyError:
        pass
    os.chmod(tmp_path, 0o777)

    def become() -> None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    try:
        r = _run(args, {"TMPDIR": str(tmp_path)}, preexec=become, clean=True)
    except PermissionError as exc:
        pytest.skip(f"uid {uid} cannot run this interpreter ({exc})")
    err = r.stderr.decode()
    assert "internal error" not in err and "Traceback" not in err, err
    assert r.returncode in ((0, 1) if args[0] == "doctor" else (0,)), err
    if args[0] == "cache":
        assert f"{tmp_path}/hwprofile-{uid}/kernels".encode() in r.stdout
