"""Where hwprofile's per-user directories are: one resolution of home, config and cache paths.

The rules are platformdirs' and the XDG base-directory spec's, applied the same way by every reader
(``tuning.config_dir`` / ``tuned_dir``, ``kernels.cache.cache_dir``, ``doctor``, the CLI):

* **Home** is ``$HOME`` when it is an absolute path, else the passwd entry of this user (a relative
  or empty ``HOME`` counts as unset, as platformdirs does on POSIX). A container user with no passwd
  entry and no ``HOME`` (OpenShift's random uid, ``docker run --user 12345``) has no home: see below.
* **``~`` and ``~user``** at the start of a path-valued variable (``HWPROFILE_CACHE_DIR=~/cache`` from
  an env file, which no shell expanded) are expanded with that home; a ``~`` that cannot be
  expanded is an error naming the variable, never a literal ``./~`` directory.
* **XDG**: ``$XDG_CONFIG_HOME`` / ``$XDG_CACHE_HOME`` are used only when absolute; the spec says a
  relative value is invalid and must be ignored, so it is (``<home>/.config``, ``<home>/.cache``).
  That is the Linux rule, written out here because importing platformdirs costs 3-4 ms of every
  first ``profile()`` (a test checks both agree); elsewhere platformdirs decides.
* **No home**: the kernel cache falls back to ``<temp dir>/hwprofile-<uid>/kernels`` (per user; the
  cache creates it 0700 and refuses one that is not this user's own and private, so a squatter
  can at most make kernels fall back, never plant a cubin); the
  config directory has no default, so no tuned directory is read, and what needs one (``hwprofile
  sweep`` without ``--output``) is an error naming ``HWPROFILE_CONFIG_DIR`` and ``HOME``.

Imports only :mod:`hwprofile._env` and :mod:`hwprofile.errors`: it sits just above the bottom of
the import graph, so the settings layer and the kernel pipeline can both use it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from . import _env
from .errors import HwprofileError, SettingError

APP = "hwprofile"


def _uid() -> int | None:
    """The real user id, or ``None`` where there is none (Windows)."""
    return os.getuid() if hasattr(os, "getuid") else None


def _passwd_home() -> str | None:
    """This user's home from the passwd database, or ``None`` (no entry: a container's random uid; no ``pwd``)."""
    uid = _uid()
    if uid is None:
        return None
    try:
        import pwd
    except ImportError:  # pragma: no cover - every POSIX Python has it
        return None
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return None


def _is_posix() -> bool:
    return sys.platform != "win32"


def home(environ: Mapping[str, str] | None = None) -> str | None:
    """This user's home directory (absolute), or ``None`` when there is none (see the module doc)."""
    env = os.environ if environ is None else environ
    if not _is_posix():
        found = os.path.expanduser("~")
        return found if os.path.isabs(found) else None
    given = env.get("HOME", "")
    if os.path.isabs(given):
        return given
    entry = _passwd_home()
    return entry if entry and os.path.isabs(entry) else None


def no_home_reason(environ: Mapping[str, str] | None = None) -> str:
    """Why :func:`home` found none, in words, for the messages that need one."""
    env = os.environ if environ is None else environ
    given = env.get("HOME")
    why = "HOME is not set" if given is None else f"HOME={given!r} is not an absolute path"
    uid = _uid()
    return f"{why} and user id {uid} has no entry in the passwd database (a container started with --user?)"


def expand(value: str, environ: Mapping[str, str] | None = None, *, what: str, error: type[HwprofileError] = SettingError) -> str:
    """``value`` with a leading ``~`` or ``~user`` expanded; any other path is returned as given.

    ``what`` names where the value came from (``HWPROFILE_CACHE_DIR``; ``""`` for a command-line
    argument, whose flag argparse names) in the error a ``~`` that cannot be expanded raises
    (``error``, a :class:`SettingError` by default).
    """
    if not value.startswith("~"):
        return value
    label = f"{what}={value!r}" if what else repr(value)
    seps = "/\\" if not _is_posix() else "/"
    cut = next((i for i, c in enumerate(value) if c in seps), len(value))
    user, rest = value[1:cut], value[cut:]
    if not user:
        base = home(environ)
        if base is None:
            raise error(
                f"{label} starts with '~', but this user has no home directory: {no_home_reason(environ)}. "
                f"Write the path out in full, or set HOME to an absolute path"
            )
    else:
        base = _user_home(user)
        if base is None:
            raise error(f"{label}: there is no user {user!r} on this machine to expand '~{user}' with; write the path out in full")
    if not rest.strip("/\\"):
        return base
    return base.rstrip("/\\") + rest if base.rstrip("/\\") else rest


def _user_home(user: str) -> str | None:
    try:
        import pwd
    except ImportError:
        found = os.path.expanduser("~" + user)
        return None if found.startswith("~") else found
    try:
        return pwd.getpwnam(user).pw_dir
    except KeyError:
        return None


def _xdg(name: str, environ: Mapping[str, str]) -> str | None:
    """``$name`` when it is an absolute path; the XDG spec says a relative one is invalid and ignored."""
    value = environ.get(name, "")
    return value if os.path.isabs(value) else None


def _linux(environ: Mapping[str, str]) -> bool:
    return sys.platform == "linux" and "ANDROID_DATA" not in environ


def config_root(environ: Mapping[str, str] | None = None) -> Path:
    """hwprofile's config directory: ``HWPROFILE_CONFIG_DIR`` (``~`` expanded), else the user config dir.

    The user config dir is platformdirs' ``user_config_dir("hwprofile")``: on Linux
    ``$XDG_CONFIG_HOME/hwprofile`` (absolute values only) or ``<home>/.config/hwprofile``. A user
    with no home has none: a :class:`SettingError` naming the variables to set.
    """
    env = os.environ if environ is None else environ
    given = _env.CONFIG_DIR.read(env)
    if given is not None:
        return Path(expand(given, env, what=_env.CONFIG_DIR.name))
    if _linux(env):
        xdg = _xdg("XDG_CONFIG_HOME", env)
        if xdg is not None:
            return Path(xdg) / APP
        base = home(env)
        if base is not None:
            return Path(base) / ".config" / APP
        raise SettingError(
            f"hwprofile has no config directory for this user: {no_home_reason(env)}, and XDG_CONFIG_HOME is not an absolute path. "
            f"Set {_env.CONFIG_DIR.name} (or HOME) to a directory of yours"
        )
    return Path(_platformdirs("user_config_dir", _env.CONFIG_DIR.name))


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """hwprofile's user cache directory (the kernel cache lives in its ``kernels/``).

    platformdirs' ``user_cache_dir("hwprofile")``: on Linux ``$XDG_CACHE_HOME/hwprofile`` (absolute
    values only) or ``<home>/.cache/hwprofile``; with no home, :func:`no_home_cache`.
    ``HWPROFILE_CACHE_DIR`` is the cache's own override: see :func:`expand`.
    """
    env = os.environ if environ is None else environ
    if _linux(env):
        xdg = _xdg("XDG_CACHE_HOME", env)
        if xdg is not None:
            return Path(xdg) / APP
        base = home(env)
        return Path(base) / ".cache" / APP if base is not None else no_home_cache()
    try:
        return Path(_platformdirs("user_cache_dir", _env.CACHE_DIR.name))
    except SettingError:
        return no_home_cache()


def no_home_cache() -> Path:
    """The cache of a user with no home: ``<temp dir>/hwprofile-<uid>`` (``$TMPDIR``, else ``/tmp``).

    Per user, so two container users never share it; the kernel cache creates its ``kernels/``
    0700 and refuses one that is not this user's own and private, so a squatter can at most make
    kernels fall back, never plant a cubin.
    """
    import tempfile

    uid = _uid()
    return Path(tempfile.gettempdir()) / f"{APP}-{uid if uid is not None else os.getpid()}"


def _platformdirs(kind: str, variable: str) -> str:
    """platformdirs' answer for ``kind``; one that cannot be found (platformdirs raises, or an old one
    returns a relative path) is a :class:`SettingError` naming ``variable``."""
    import platformdirs

    try:
        found = str(getattr(platformdirs, kind)(APP))
    except RuntimeError as exc:
        found, why = "", str(exc)
    else:
        why = f"platformdirs gave the relative path {found!r}"
    if not os.path.isabs(found):
        raise SettingError(f"hwprofile cannot find this user's {kind.replace('_', ' ')} ({why}); set {variable} (or HOME)")
    return found
