"""Cache directory policy and layers: which directories, opened how, trusted when. Never reads, writes or judges an entry.

``HWPROFILE_CACHE`` / ``HWPROFILE_CACHE_DIR`` (:func:`cache_enabled`, :func:`cache_dir`,
:func:`configured_dirs`), every directory opened once without following a link and checked on its
descriptor (private write layer; read-only layers owned by this user or root, never writable by
group or others), the layers installed packages ship (:data:`LAYER_GROUP`), and the cache's
warn-once state. The rules are :mod:`hwprofile.kernels.cache`'s ("No symlink is followed",
"Layers"); that module is the face the pipeline and the CLI import.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import _env, _state
from .._log import get_logger
from ..errors import CacheError, SettingError

log = get_logger("hwprofile.kernels.cache")

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)

_warned: set[str] = set()
_warned_lock = threading.Lock()


@_state.in_forked_child
def _reinit_locks_in_child() -> None:
    global _warned_lock
    _warned_lock = threading.Lock()  # a thread of the parent may have held it at the fork



def _warn_once(what: str, msg: str, *args: Any) -> None:
    with _warned_lock:
        if what in _warned:
            return
        _warned.add(what)
    log.warning(msg, *args)


# --- configuration -------------------------------------------------------------------------------


def cache_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``HWPROFILE_CACHE``: on (default) or off; any other value is a :class:`CacheError` (the pipeline's fault)."""
    try:
        return _env.CACHE.read(environ)
    except SettingError as exc:
        raise CacheError(str(exc)) from None


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where the cache lives: ``HWPROFILE_CACHE_DIR`` (``~`` expanded) or ``<user cache dir>/hwprofile/kernels``.

    The user cache dir follows platformdirs and XDG, and has a fallback for a user with no home
    (:mod:`hwprofile._paths`); a ``~`` that cannot be expanded is a :class:`CacheError` naming the variable.
    """
    from .. import _paths

    given = _env.CACHE_DIR.read(environ)
    if given is not None:
        return Path(_paths.expand(given, environ, what=_env.CACHE_DIR.name, error=CacheError))
    return _paths.cache_root(environ) / "kernels"


def _foreign(st: os.stat_result) -> bool:
    return hasattr(os, "getuid") and st.st_uid != os.getuid()


def _refuse_if_shared(st: os.stat_result, path: Path) -> None:
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or _foreign(st):
        raise CacheError(
            f"refusing kernel cache directory {path}: it is writable by other users or owned by another user "
            f"(mode {stat.filemode(st.st_mode)}), and loading a cubin runs its code; chmod 700 {path}, "
            f"or point {_env.CACHE_DIR.name} at a private directory"
        )


def _refuse_if_writable_by_others(st: os.stat_result, path: Path) -> None:
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheError(
            f"refusing read-only kernel cache layer {path}: it is writable by group or others (mode {stat.filemode(st.st_mode)}), "
            f"and loading a cubin runs its code; chmod go-w {path}, or drop it from {_env.CACHE_DIR.name}"
        )


class UntrustedOwnerError(CacheError):
    """A read-only layer (or entry) owned by a user who is neither this one nor root: refused, never read."""


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _untrusted_owner(st: os.stat_result) -> bool:
    """Owned by another user who is not root: that user can replace what it holds, so its cubins run their code here."""
    return _foreign(st) and st.st_uid != 0


def _refuse_if_untrusted_owner(st: os.stat_result, path: Path) -> None:
    if _untrusted_owner(st):
        raise UntrustedOwnerError(
            f"refusing read-only kernel cache layer {path}: it is owned by {_owner(st.st_uid)}, neither you nor root, who "
            f"can replace its cubins, and loading a cubin runs its code; have root own it (sudo chown -R root: {path}; "
            f"chmod -R go-w {path}), or drop it from {_env.CACHE_DIR.name}"
        )


def _open_checked(path: Path, create: bool, *, read_only: bool = False, any_owner: bool = False) -> int | None:
    """A descriptor of directory ``path``, opened without following a link and checked; None if absent and not created.

    ``read_only``: a layer that is only read may belong to root instead of this user (a shared, root-owned
    layer), never to another user, never be writable by group or others. ``any_owner`` (a layer an
    installed package ships, as trusted as the package's own code beside it) drops the owner check.
    """
    fix = f"set {_env.CACHE_DIR.name} to a private directory you can write, or {_env.CACHE.name}=off"
    created = False
    if create:
        try:
            os.mkdir(path, 0o700)
            created = True
        except FileExistsError:
            pass
        except FileNotFoundError:
            try:
                os.makedirs(path, 0o700, exist_ok=True)
                created = True
            except OSError as exc:
                raise CacheError(f"cannot create the kernel cache directory {path}: {exc.strerror}; {fix}") from exc
        except OSError as exc:
            raise CacheError(f"cannot create the kernel cache directory {path}: {exc.strerror}; {fix}") from exc
    try:
        fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC)
    except FileNotFoundError:
        if not create:
            return None
        raise CacheError(f"the kernel cache directory {path} vanished while it was opened; {fix}") from None
    except OSError as exc:
        if os.path.islink(path):
            why = f"is a symbolic link (to {os.path.realpath(path)}), which the cache never follows"
        elif exc.errno == errno.ENOTDIR or not os.path.isdir(path):
            why = "is not a directory"
        else:
            why = f"cannot be opened ({exc.strerror})"
        raise CacheError(f"the kernel cache directory {path} {why}; {fix}") from exc
    try:
        if created:
            os.fchmod(fd, 0o700)
        st = os.fstat(fd)
        if read_only:
            _refuse_if_writable_by_others(st, path)
            if not any_owner:
                _refuse_if_untrusted_owner(st, path)
        else:
            _refuse_if_shared(st, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_dir(create: bool = True, environ: Mapping[str, str] | None = None) -> tuple[int, Path] | None:
    """A descriptor of the checked (single) cache directory :func:`cache_dir` names, and its path (None if absent and not created).

    The caller closes the descriptor. Every fault names the directory and the fix. The pipeline
    uses :func:`open_layers`, which also reads a list of directories.
    """
    path = cache_dir(environ)
    fd = _open_checked(path, create)
    return None if fd is None else (fd, path)


# --- layers --------------------------------------------------------------------------------------

#: Entry point group through which an installed package ships a read-only layer: ``name = "package"``,
#: the layer being the directory ``<package>/cubins`` (what ``hwprofile compile --package`` writes).
LAYER_GROUP = "hwprofile.cubins"
#: The directory of a shipped layer inside its package.
LAYER_SUBDIR = "cubins"


def configured_dirs(environ: Mapping[str, str] | None = None) -> list[Path]:
    """The directories ``HWPROFILE_CACHE_DIR`` names, in order (``os.pathsep`` list), or the default one.

    Each entry is resolved as :func:`cache_dir` resolves a single one.
    """
    env = os.environ if environ is None else environ
    raw = _env.CACHE_DIR.read(env)
    if raw is None or os.pathsep not in raw:
        return [cache_dir(env)]
    parts = [p for p in raw.split(os.pathsep) if p.strip()]
    if not parts:
        return [cache_dir({k: v for k, v in env.items() if k != _env.CACHE_DIR.name})]
    return [cache_dir({**env, _env.CACHE_DIR.name: p}) for p in parts]


_shipped: list[tuple[Path, str]] | None = None


def shipped_layers() -> list[tuple[Path, str]]:
    """``(directory, origin)`` of every layer an installed package ships through :data:`LAYER_GROUP`.

    Found without importing the package (``sys.path`` is searched for it), so a layer costs a
    directory listing, not an import; looked up once per process (``hwprofile.reset()`` forgets it:
    after installing a layer package).
    """
    global _shipped
    if _shipped is None:
        _shipped = _find_shipped_layers()
    return list(_shipped)


def _find_shipped_layers() -> list[tuple[Path, str]]:
    from .._entrypoints import find_entry_points, package_file

    out = []
    for ep in find_entry_points(LAYER_GROUP):
        package = ep.value.partition(":")[0].strip()
        init = package_file(package, "__init__.py")
        origin = f"package {package} ({ep.distribution or '?'} {ep.version or '?'})"
        if init is None:
            _warn_once(
                f"layer:{package}", "kernel cache layer of %s is not importable (no package %s on sys.path); it is skipped", origin, package
            )
            continue
        out.append((Path(init).parent / LAYER_SUBDIR, origin))
    return out


@dataclass
class Layer:
    """One open cache directory: its descriptor (closed by :meth:`Layers.close`), path and role."""

    path: Path
    fd: int
    writable: bool
    origin: str
    #: A layer an installed package ships: as trusted as the package's code beside it, whoever owns it.
    shipped: bool = False

    @property
    def label(self) -> str:
        """The name counters and ``hwprofile cache info`` give this layer."""
        return layer_label(self.path, self.writable)


def layer_label(path: Path, writable: bool) -> str:
    return f"{path}" if writable else f"{path} (read-only)"


@dataclass
class Layers:
    """The open layers of one lookup: the search order (:attr:`read`) and the one written (:attr:`write`, maybe none)."""

    read: list[Layer] = field(default_factory=list)
    write: Layer | None = None

    def close(self) -> None:
        for layer in self.read:
            with contextlib.suppress(OSError):
                os.close(layer.fd)
        self.read.clear()
        self.write = None

    def __enter__(self) -> Layers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _writable_private(path: Path, fd: int) -> bool:
    st = os.fstat(fd)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or _foreign(st):
        return False
    return os.access(path, os.W_OK | os.X_OK)


def open_layers(create: bool = True, environ: Mapping[str, str] | None = None, *, shipped: bool = True) -> Layers:
    """Open every layer: those ``HWPROFILE_CACHE_DIR`` names (the last writable private one written), then shipped ones.

    The last named directory is created (private) when absent and ``create``; an earlier one that is
    absent is one warning and skipped. A fault of a named directory is a :class:`CacheError`
    naming it; a faulty shipped layer is one warning and skipped. Search order: the write layer,
    then the other named ones in order, then the shipped ones.
    """
    named = configured_dirs(environ)
    out = Layers()
    opened: list[tuple[Path, int, str]] = []
    uncreatable = False  # the write layer could not be created: warned once already
    try:
        for i, path in enumerate(named):
            last = i == len(named) - 1
            origin = _env.CACHE_DIR.name if _env.CACHE_DIR.read(environ) is not None else "default"
            problem = "does not exist"
            try:
                fd = _open_checked(path, create and last)
            except CacheError as exc:
                if not os.path.lexists(path):
                    # absent and it cannot be created (a read-only HOME, a full disk): kernels still run, uncached
                    _warn_once(f"layer:{path}:create", "%s; kernels are compiled but not cached, so each process compiles them again", exc)
                    uncreatable = True
                    continue
                # not a private directory: it may still be a read-only layer (another owner, not writable by others)
                problem = str(exc)
                try:
                    fd = _open_checked(path, False, read_only=True)
                except UntrustedOwnerError as foreign:  # refused, not read: one warning naming the owner and the fix
                    _warn_once(f"layer:{path}:owner", "%s; it is skipped", foreign)
                    continue
                except CacheError:
                    raise exc from None  # the fault of the directory meant to be written says what to fix
            if fd is None:
                if not last or create:
                    _warn_once(f"layer:{path}:absent", "kernel cache layer %s is skipped: %s", path, problem)
                continue
            opened.append((path, fd, origin))
        write_at = next((j for j in range(len(opened) - 1, -1, -1) if _writable_private(opened[j][0], opened[j][1])), None)
        layers = [Layer(p, fd, j == write_at, origin) for j, (p, fd, origin) in enumerate(opened)]
        opened.clear()
        if write_at is not None:
            out.write = layers[write_at]
            out.read.append(layers[write_at])
        out.read += [la for la in layers if not la.writable]
        if shipped:
            _open_shipped(out)
    except BaseException:
        for _p, fd, _o in opened:
            os.close(fd)
        out.close()
        raise
    if out.write is None and create and not uncreatable:
        _warn_once(
            "layer:nowrite",
            "no kernel cache layer is writable (%s names none that is a private directory you can write): "
            "kernels compiled now are used but not cached",
            _env.CACHE_DIR.name,
        )
    return out


def _open_shipped(out: Layers) -> None:
    """:func:`open_layers`' last step: append each shipped layer to ``out.read``; a faulty or absent one is one warning and skipped.

    Appended as each opens, so a layer opened before an interrupt is in ``out`` and closed by :func:`open_layers`' cleanup.
    """
    for path, origin in shipped_layers():
        try:
            fd = _open_checked(path, False, read_only=True, any_owner=True)
        except CacheError as exc:
            _warn_once(f"layer:{path}", "kernel cache layer of %s skipped: %s", origin, exc)
            continue
        if fd is None:
            _warn_once(f"layer:{path}:absent", "kernel cache layer of %s has no %s directory; it is skipped", origin, path)
            continue
        out.read.append(Layer(path, fd, False, origin, shipped=True))

def open_layer_for_writing(path: Path) -> int:
    """A descriptor of ``path`` as a layer to fill (``hwprofile compile --output``): created private, checked as the write layer."""
    fd = _open_checked(Path(path), True)
    assert fd is not None
    if not _writable_private(Path(path), fd):
        os.close(fd)
        raise CacheError(f"the kernel cache layer {path} is not writable by you; choose another directory")
    return fd


def check_layers(environ: Mapping[str, str] | None = None) -> None:
    """Open and close every named layer once: a directory fault is one :class:`CacheError`, before any kernel."""
    if cache_enabled(environ):
        open_layers(create=True, environ=environ, shipped=False).close()


@_state.on_reset
def clear_cache() -> None:
    """Forget which warnings were given and which layers packages ship (process state, cleared by ``hwprofile.reset()``)."""
    global _shipped
    with _warned_lock:
        _warned.clear()
    _shipped = None
