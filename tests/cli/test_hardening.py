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

from hwprofile import _cli_sweep, cli

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


def test_an_in_process_call_with_no_stdout_gives_sys_stdout_back(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
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


# --- sweep checks what it will write before it measures -----------------------------------------------


@pytest.fixture
def no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any touch of the device (profile, timing) fails the test: the checks must come first."""

    def touched(args: object) -> object:
        raise AssertionError("sweep reached the device before refusing its arguments")

    monkeypatch.setattr(_cli_sweep, "_profile", touched)


def _sweep_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert cli.main(["sweep", "router_gemm", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error" not in err, err
    return err


@pytest.mark.usefixtures("no_device")
def test_sweep_refuses_an_output_that_is_a_directory_before_measuring(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "is not a regular file" in _sweep_error(capsys, "--output", str(tmp_path))


@pytest.mark.usefixtures("no_device")
def test_sweep_refuses_a_symlinked_output_or_samples_file_before_measuring(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "t.toml").symlink_to(victim)
    assert "symbolic link" in _sweep_error(capsys, "--output", str(tmp_path / "t.toml"))
    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "u.toml").symlink_to(victim)  # where the raw samples of u.toml go
    err = _sweep_error(capsys, "--output", str(tmp_path / "u.toml"))
    assert "sweep samples" in err and "symbolic link" in err
    assert victim.read_text() == "keep"


@pytest.mark.usefixtures("no_device")
def test_sweep_refuses_an_unwritable_output_before_measuring(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert "a file is in the way of its directory" in _sweep_error(capsys, "--output", str(blocker / "t.toml"))
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by others and not sticky: another user could swap the file
    assert "writable by other users" in _sweep_error(capsys, "--output", str(shared / "t.toml"))
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        assert "not writable by you" in _sweep_error(capsys, "--output", str(ro / "t.toml"))


@pytest.mark.usefixtures("no_device")
def test_sweep_plot_without_matplotlib_is_refused_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was "internal error: ModuleNotFoundError" after the whole sweep."""
    for m in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, m)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    err = _sweep_error(capsys, "--output", str(tmp_path / "t.toml"), "--plot", str(tmp_path / "p.png"))
    assert "--plot" in err and "needs matplotlib" in err and "pip install matplotlib" in err


@pytest.mark.usefixtures("no_device")
def test_sweep_plot_paths_and_formats_are_checked_before_measuring(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out = str(tmp_path / "t.toml")
    assert "is not a regular file" in _sweep_error(capsys, "--output", out, "--plot", str(tmp_path))
    (tmp_path / "link.png").symlink_to(tmp_path / "elsewhere.png")
    assert "symbolic link" in _sweep_error(capsys, "--output", out, "--plot", str(tmp_path / "link.png"))
    assert "cannot write .docx files" in _sweep_error(capsys, "--output", out, "--plot", str(tmp_path / "p.docx"))
    assert "also the --output" in _sweep_error(capsys, "--output", out, "--plot", out)


@pytest.mark.usefixtures("no_device")
@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [("--shapes", "256x", "NxK pairs"), ("--shapes", "axb", "NxK pairs"), ("--shapes", "0x7168", "NxK pairs"),
     ("--m", "1..x", "--m '1..x' is invalid"), ("--n", "0", "positive"), ("--k", ",", "at least one")],
)
def test_sweep_grid_flags_are_clear_errors(flag: str, value: str, needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A malformed --shapes or --m was "internal error: ValueError" (after the device was resolved)."""
    assert needle in _sweep_error(capsys, flag, value)


def test_sweep_reps_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["sweep", "router_gemm", "--reps", "0"])
    assert info.value.code == 2 and "positive integer" in capsys.readouterr().err


def test_sweep_default_output_is_checked_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --output the tuned file goes to the device's tuned directory: checked once the device is known, before timing."""
    from types import SimpleNamespace

    from hwprofile import tuning
    from hwprofile.device import DeviceInfo

    dev = DeviceInfo(0, "NVIDIA H200", (9, 0))
    monkeypatch.setattr(_cli_sweep, "_profile", lambda args: SimpleNamespace(device=dev))
    monkeypatch.setenv("HWPROFILE_CONFIG_DIR", str(tmp_path))
    d = tuning.tuned_dir(dev, os.environ)
    d.mkdir(parents=True)
    (d / "router_gemm.toml").symlink_to(tmp_path / "victim")
    assert "symbolic link" in _sweep_error(capsys)
    monkeypatch.delenv("HWPROFILE_CONFIG_DIR")
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)

    def missing(uid: int) -> pwd.struct_passwd:
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", missing)
    assert "Set HWPROFILE_CONFIG_DIR (or HOME)" in _sweep_error(capsys)


def test_the_plot_is_written_whole_and_never_through_a_link(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from hwprofile import sweep
    from hwprofile.errors import WriteError

    ms = [{"m": m, "n": 256, "k": 7168, "kernel_us": 3.0, "fallback_us": 7.0} for m in (1, 2, 4)]
    doc = {"stamp": {"op": "router_gemm", "device": "NVIDIA H200", "fallback": {"function": "torch.mm", "torch": "2.11"}},
           "measurements": ms, "thresholds": {"router_gemm.max_tokens": 4}}
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "p.png").symlink_to(victim)
    with pytest.raises(WriteError, match="symbolic link"):
        sweep.plot(doc, tmp_path / "p.png")
    assert victim.read_text() == "keep"
    sweep.plot(doc, tmp_path / "new" / "p.svg")
    assert (tmp_path / "new" / "p.svg").read_text().lstrip().startswith("<?xml")


# --- new-plugin: whole or not at all --------------------------------------------------------------------


def _full_disk_after(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """``os.write`` fails with ENOSPC from its ``n``-th call on."""
    import errno

    real = os.write
    calls = [0]

    def write(fd: int, data: object) -> int:
        calls[0] += 1
        if calls[0] >= n:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize("nth", [1, 3, 5])
def test_new_plugin_on_a_full_disk_leaves_nothing(nth: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """It left a half-written package (the files before the failing one) that a second run then refused as not empty."""
    target = tmp_path / "hwprofile-mygpu"
    with monkeypatch.context() as m:
        _full_disk_after(m, nth)
        code = cli.main(["new-plugin", "mygpu", "--capability", "8.9", "--dir", str(target)])
    err = capsys.readouterr().err
    assert code == 2 and "No space left on device" in err and "nothing was left behind" in err and "free some space" in err
    assert str(target) in err and "internal error" not in err
    assert sorted(os.listdir(tmp_path)) == []  # neither the package nor its temporary sibling
    assert cli.main(["new-plugin", "mygpu", "--capability", "8.9", "--dir", str(target)]) == 0  # space again: it just works
    assert (target / "pyproject.toml").is_file() and sorted(os.listdir(tmp_path)) == ["hwprofile-mygpu"]


def test_new_plugin_into_an_empty_directory_replaces_it_and_has_the_usual_mode(tmp_path: Path) -> None:
    from hwprofile import scaffold

    target = tmp_path / "p"
    target.mkdir()
    written = scaffold.write(target, "mygpu", "8.9")
    assert all(p.is_file() for p in written) and sorted(os.listdir(tmp_path)) == ["p"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o777 & ~umask


@pytest.mark.parametrize("kind", ["file", "link", "non-empty"])
def test_new_plugin_refuses_a_target_that_exists(kind: str, tmp_path: Path) -> None:
    from hwprofile import scaffold
    from hwprofile.errors import HwprofileError

    target = tmp_path / "p"
    other = tmp_path / "other"
    other.mkdir()
    if kind == "file":
        target.write_text("mine")
    elif kind == "link":
        target.symlink_to(other)  # an empty directory, but through a link
    else:
        target.mkdir()
        (target / "notes.txt").write_text("mine")
    with pytest.raises(HwprofileError, match="choose another --dir"):
        scaffold.write(target, "mygpu", "8.9")
    assert not list(other.iterdir()) and sorted(os.listdir(tmp_path)) == ["other", "p"]


def test_new_plugin_racing_another_writer_keeps_its_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory that fills while the package is built is never merged into or replaced."""
    from hwprofile import scaffold
    from hwprofile.errors import HwprofileError

    target = tmp_path / "p"
    real = scaffold._write_new

    def racing(path: Path, data: bytes) -> None:
        if not target.exists():
            target.mkdir()
            (target / "theirs.txt").write_text("theirs")
        real(path, data)

    monkeypatch.setattr(scaffold, "_write_new", racing)
    with pytest.raises(HwprofileError, match="appeared while the plugin was written"):
        scaffold.write(target, "mygpu", "8.9")
    assert os.listdir(target) == ["theirs.txt"] and sorted(os.listdir(tmp_path)) == ["p"]


def test_new_plugin_hitting_a_file_size_limit_leaves_nothing(tmp_path: Path) -> None:
    """A real write failure in a child (``RLIMIT_FSIZE``: writes past 2 KiB fail with EFBIG), as a full disk fails them."""
    import resource
    import signal

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    target = tmp_path / "hwprofile-mygpu"
    r = _run(["new-plugin", "mygpu", "--capability", "8.9", "--dir", str(target)], preexec=limited)
    err = r.stderr.decode()
    assert os.listdir(tmp_path) == [], err  # no half-written package (the old code left the files before the big one)
    assert r.returncode == 2 and "File too large" in err and "nothing was left behind" in err, err


def test_path_arguments_expand_a_tilde_no_shell_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """``--dir=~/p`` (no shell expands after '=') created a literal ``./~/p``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cli.main(["new-plugin", "mygpu", "--capability", "8.9", "--dir=~/p"]) == 0
    assert (tmp_path / "home" / "p" / "pyproject.toml").is_file() and not (tmp_path / "~").exists()
    args = cli.build_parser().parse_args(["sweep", "router_gemm", "--output=~/t.toml", "--plot=~/p.png"])
    assert args.output == tmp_path / "home" / "t.toml" and args.plot == tmp_path / "home" / "p.png"
    with pytest.raises(SystemExit):
        cli.main(["new-plugin", "mygpu", "--capability", "8.9", "--dir=~no-such-user-x/p"])
    assert "argument --dir: '~no-such-user-x/p': there is no user 'no-such-user-x'" in capsys.readouterr().err


def test_a_closed_stdout_keeps_a_failed_commands_status(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def failed_check(args: object) -> int:
        print("report")
        return 1

    monkeypatch.setattr(cli, "cmd_doctor", failed_check)
    monkeypatch.setattr(sys, "stdout", None)
    assert cli.main(["doctor"]) == 1
    assert "standard output is closed" in capsys.readouterr().err


def test_doctor_warns_that_a_read_only_home_runs_kernels_uncached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hwprofile import doctor

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for v in ("HWPROFILE_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(v, raising=False)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p) == str(home) else real(p, mode, **kw))
    c = doctor._cache_check()
    assert c.status == "WARN" and "kernels run uncached" in c.detail and f"{home} is not writable" in c.detail
    assert "HWPROFILE_CACHE_DIR" in c.fix
    monkeypatch.setattr(os, "access", real)
    assert doctor._cache_check().status == "OK"


def test_a_written_text_quoting_an_undecodable_file_name_is_a_clear_error(tmp_path: Path) -> None:
    """sweep records its samples file's name in the tuned file: a name of undecodable bytes was an internal UnicodeEncodeError."""
    from hwprofile import _files
    from hwprofile.errors import WriteError

    target = tmp_path / "t.toml"
    with pytest.raises(WriteError, match=r"holds \\udcff, not valid UTF-8.*rename that file"):
        _files.atomic_write(target, 'samples = "samples/t\udcff.toml"\n', what="tuned file")
    assert os.listdir(tmp_path) == []
