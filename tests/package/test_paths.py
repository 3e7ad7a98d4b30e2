"""One resolution of home, config and cache paths (``hwprofile._paths``), as platformdirs and the XDG spec say.

Issue 25: ``~`` in ``HWPROFILE_CACHE_DIR`` from an env file made a literal ``./~``; a relative
``XDG_CONFIG_HOME`` was used; a container user with no passwd entry and no HOME got "internal error"
(platformdirs raising) or a relative ``~/.config``.
"""

from __future__ import annotations

import os
import pwd
import sys
from pathlib import Path

import pytest

from hwprofile import tuning
from hwprofile.device import DeviceInfo
from hwprofile.errors import CacheError, SettingError
from hwprofile.kernels import cache as kcache

linux = pytest.mark.skipif(sys.platform != "linux", reason="the XDG rules are written out for Linux (platformdirs decides elsewhere)")
H200 = DeviceInfo(0, "NVIDIA H200", (9, 0), simulated=True)
ROOT_HOME = pwd.getpwnam("root").pw_dir


@pytest.fixture
def no_passwd(monkeypatch: pytest.MonkeyPatch) -> None:
    """This uid has no passwd entry (OpenShift's random uid, ``docker run --user 12345``) and no HOME."""

    def missing(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", missing)
    monkeypatch.delenv("HOME", raising=False)
    for v in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "HWPROFILE_CONFIG_DIR", "HWPROFILE_CACHE_DIR", "HWPROFILE_TUNED_FILE"):
        monkeypatch.delenv(v, raising=False)


# --- ~ in path variables ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("~", "{home}"), ("~/", "{home}"), ("~/cache", "{home}/cache"), ("~/a/b/", "{home}/a/b/"), ("~root/x", ROOT_HOME + "/x"),
     ("/abs/~/x", "/abs/~/x"), ("rel/~", "rel/~"), ("plain", "plain")],
)
def test_tilde_is_expanded_like_a_shell_does(value: str, expected: str, tmp_path: Path) -> None:
    from hwprofile import _paths

    env = {"HOME": str(tmp_path)}
    assert _paths.expand(value, env, what="X") == expected.format(home=tmp_path)


def test_tilde_in_the_cache_dir_variable_never_makes_a_literal_tilde_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``HWPROFILE_CACHE_DIR=~/kc`` from an env file (no shell expanded it) created ``./~/kc``."""
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "HWPROFILE_CACHE_DIR": "~/kc"}
    assert kcache.cache_dir(env) == home / "kc"
    opened = kcache.open_dir(create=True, environ=env)
    assert opened is not None
    os.close(opened[0])
    assert (home / "kc").is_dir() and not (tmp_path / "~").exists()


def test_tilde_in_the_config_and_tuned_file_variables(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "HWPROFILE_CONFIG_DIR": "~/cfg", "HWPROFILE_TUNED_FILE": os.pathsep.join(["~/a.toml", "/b.toml"])}
    assert tuning.config_dir(env) == str(tmp_path / "cfg")
    assert tuning.tuned_dir(H200, env) == tmp_path / "cfg" / "tuned" / "nvidia-h200-sm-90"
    assert tuning.tuned_files(H200, env) == [tmp_path / "a.toml", Path("/b.toml")]


def test_an_unknown_user_after_tilde_is_an_error_naming_the_variable() -> None:
    with pytest.raises(CacheError, match=r"HWPROFILE_CACHE_DIR='~no-such-user-x/c'.*no user 'no-such-user-x'.*in full"):
        kcache.cache_dir({"HWPROFILE_CACHE_DIR": "~no-such-user-x/c"})
    with pytest.raises(SettingError, match="HWPROFILE_CONFIG_DIR"):
        tuning.config_dir({"HWPROFILE_CONFIG_DIR": "~no-such-user-x"})


# --- XDG -------------------------------------------------------------------------------------------


@linux
@pytest.mark.parametrize("xdg", ["relative/config", "~/.cfg", "./x", ""])
def test_a_relative_xdg_home_is_ignored_as_the_spec_says(xdg: str, tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": xdg, "XDG_CACHE_HOME": xdg}
    assert tuning.config_dir(env) == str(tmp_path / ".config" / "hwprofile")
    assert kcache.cache_dir(env) == tmp_path / ".cache" / "hwprofile" / "kernels"


@linux
def test_an_absolute_xdg_home_is_used(tmp_path: Path) -> None:
    env = {"HOME": "/nonexistent", "XDG_CONFIG_HOME": str(tmp_path / "c"), "XDG_CACHE_HOME": str(tmp_path / "k")}
    assert tuning.config_dir(env) == str(tmp_path / "c" / "hwprofile")
    assert kcache.cache_dir(env) == tmp_path / "k" / "hwprofile" / "kernels"


@linux
@pytest.mark.parametrize("home", ["{tmp}", "relative-home", ""])
@pytest.mark.parametrize("xdg", [None, "/srv/xdg", "rel/xdg"])
def test_the_rules_agree_with_platformdirs(home: str, xdg: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Linux rules are written out (importing platformdirs costs every first profile() 3-4 ms): the same answers."""
    import platformdirs

    from hwprofile import _paths

    monkeypatch.setenv("HOME", home.format(tmp=tmp_path))
    monkeypatch.delenv("HWPROFILE_CONFIG_DIR", raising=False)
    for var in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        if xdg is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, xdg)
    assert str(_paths.config_root(os.environ)) == platformdirs.user_config_dir("hwprofile")
    assert str(_paths.cache_root(os.environ)) == platformdirs.user_cache_dir("hwprofile")


def test_a_relative_home_falls_back_to_the_passwd_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    from hwprofile import _paths

    me = pwd.getpwuid(os.getuid()).pw_dir
    assert _paths.home({"HOME": "not/absolute"}) == me
    assert _paths.home({}) == me


# --- a user with no home ----------------------------------------------------------------------------


@pytest.mark.usefixtures("no_passwd")
def test_no_home_gives_a_private_per_user_cache_in_the_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    d = kcache.cache_dir()
    assert d == tmp_path / f"hwprofile-{os.getuid()}" / "kernels" and d.is_absolute()
    opened = kcache.open_dir(create=True)
    assert opened is not None
    os.close(opened[0])
    assert d.stat().st_mode & 0o777 == 0o700


@pytest.mark.usefixtures("no_passwd")
def test_no_home_has_no_config_dir_and_says_what_to_set() -> None:
    """It was platformdirs' RuntimeError ("internal error") or, with an older platformdirs, a relative ``~/.config``."""
    with pytest.raises(SettingError) as info:
        tuning.config_dir(os.environ)
    msg = str(info.value)
    assert "HOME is not set" in msg and f"user id {os.getuid()} has no entry in the passwd database" in msg
    assert "HWPROFILE_CONFIG_DIR" in msg
    assert tuning.tuned_files(H200, os.environ) == []  # profiles still resolve: there is no tuned directory to read


@pytest.mark.usefixtures("no_passwd")
def test_no_home_and_a_tilde_is_an_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", "~/kc")
    with pytest.raises(CacheError, match=r"HWPROFILE_CACHE_DIR='~/kc' starts with '~'.*no home directory.*set HOME"):
        kcache.cache_dir()
    monkeypatch.setenv("HWPROFILE_TUNED_FILE", "~/t.toml")
    with pytest.raises(SettingError, match="HWPROFILE_TUNED_FILE"):
        tuning.tuned_files(H200, os.environ)


@pytest.mark.usefixtures("no_passwd")
def test_no_home_but_config_dir_set_reads_the_tuned_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_CONFIG_DIR", str(tmp_path))
    d = tuning.tuned_dir(H200, os.environ)
    d.mkdir(parents=True)
    (d / "router_gemm.toml").write_text("")
    assert tuning.tuned_files(H200, os.environ) == [d / "router_gemm.toml"]


@pytest.mark.usefixtures("no_passwd")
def test_no_home_profiles_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    import hwprofile

    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    try:
        assert hwprofile.profile().device.name == "NVIDIA H200"
    finally:
        hwprofile.reset()
