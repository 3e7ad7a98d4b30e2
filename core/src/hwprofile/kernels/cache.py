"""The on-disk kernel cache: key, directory policy, entry format, read/write, locking. Never compiles.

Rules (each has a test in ``tests/kernels/test_cache.py``):

* **Key.** SHA-256 over a JSON document of every input of the compile: source and every header it
  reaches (also through ``-I`` / ``-include`` in the spec's options), by content, the full flag
  list (fixed flags, include directories as placeholders, the spec's options), target, name expressions, NVRTC's version and
  build (:func:`hwprofile.kernels.toolchain.nvrtc_build`), hwprofile's version and the supplying plugin's.
* **Entries carry their key.** An entry is ``magic | sha256(body) | body``, the body holding the
  key, the key document, target, lowered names and the compile log, then the cubin. On read the
  checksum, the key, the target and every requested name are verified; anything else (truncated,
  corrupt, malformed metadata, an entry of another key filed under this name, an entry others can
  write, a directory, FIFO or symlink where an entry should be) is a miss with one warning, then
  recompiled and replaced.
* **No symlink is followed.** The directory is opened once with ``O_NOFOLLOW | O_DIRECTORY`` and
  checked on its descriptor (private: owned by this user, not writable by group or others, because
  loading a cubin runs its code); entries are opened relative to it (``dir_fd``) with
  ``O_NOFOLLOW | O_NONBLOCK`` (a planted FIFO cannot hang a read) and checked with ``fstat``.
  Lock files go through filelock >= 3.20.3, which opens them with ``O_NOFOLLOW``.
* **Writes are atomic.** A temp file ``<entry>.<pid>.<random>.tmp`` created with ``O_EXCL`` is
  renamed over the entry. A write that fails (read-only directory, disk full, a directory in the
  way) is one warning: the kernel is still used, only not cached.
* **Locks never wait silently.** A per-key lock avoids duplicate compiles by the ranks of one host;
  after :data:`LOCK_NOTICE_S` a warning names the lock file and its holder (pid, host, from
  ``<entry>.owner``), after :data:`LOCK_WAIT_S` the process compiles anyway (the atomic rename
  makes a duplicate harmless). A lock that cannot be used is a warning, never an error.
* **Clearing is safe while others compile, and touches only what hwprofile wrote**: :func:`clear`
  removes, in the writable layer only, entries (hwprofile's name pattern *and* its magic), unheld
  locks and abandoned temp files of that pattern; never a temp file younger than
  :data:`TMP_MAX_AGE_S` (another process's write in flight), never a file of any other name (a
  user's own ``*.cubin`` / ``*.lock`` / ``*.tmp`` / ``*.owner`` in a directory they pointed
  ``HWPROFILE_CACHE_DIR`` at).
* **The key is portable.** It holds content, never a machine path: the include directories enter
  the options as placeholders (their headers' content is in the source digest), so the same
  kernels installed at another prefix, or on another host, are hits.
* **Layers.** ``HWPROFILE_CACHE_DIR`` is a list (``os.pathsep``): the last entry that is a private
  directory this user can write is the *write layer* (created when it is the last and absent);
  every other entry is a read-only layer, as are the layers installed packages ship (entry point
  group :data:`LAYER_GROUP`, e.g. a ``hwprofile-sm90-cubins`` wheel built with ``hwprofile compile
  --package``). Entries of a read-only layer are verified exactly as the write layer's, except
  that their owner may be another user (a shared, root-owned layer) as long as neither the
  directory nor the entry is writable by group or others. A hit is counted per layer
  (:func:`layer_label`).

* **The fleet store** (``HWPROFILE_REMOTE``, :mod:`hwprofile._remote`) is the last layer, read after
  every directory: :func:`read_remote` passes its value through :func:`decode` exactly as a file's,
  and a verified hit is written to the write layer; :func:`publish` puts a compiled entry there in
  the same format. A value that fails is one warning and a miss, never loaded.

Directory-level faults of a directory ``HWPROFILE_CACHE_DIR`` names (a shared or foreign write
directory, a file or a symlink, a directory that cannot be created) raise
:class:`~hwprofile.errors.CacheError`, a :class:`~hwprofile.errors.KernelError`, so ops fall back
to torch with one warning; ``hwprofile compile`` checks them once (:func:`check_layers`) before any
kernel, so such a fault is one line, not one per kernel instance. A missing read-only layer, or a
faulty one a package ships, is one warning and skipped.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import struct
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _env, _remote, _state
from .._log import get_logger
from ..errors import CacheError, SettingError
from . import toolchain
from .toolchain import CompiledKernel, CompileOptions

if TYPE_CHECKING:
    from .spec import KernelSpec

log = get_logger(__name__)

FORMAT = 2
MAGIC = b"HWPCUBIN"
MAX_ENTRY_BYTES = 256 << 20
#: Seconds a process waits for another's per-key lock before saying so, and before compiling anyway.
LOCK_NOTICE_S = 2.0
LOCK_WAIT_S = 60.0
#: Temp files younger than this are another process's write in flight: ``clear`` leaves them.
TMP_MAX_AGE_S = 3600.0

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


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


# --- key -----------------------------------------------------------------------------------------


def key_document(spec: KernelSpec, options: CompileOptions, expressions: Sequence[str]) -> dict[str, Any]:
    """Every input of one compile, as a JSON-able document (what the key hashes and entries store)."""
    from .._version import __version__
    from .spec import _resolve_include, _source_digest

    dirs = options.header_dirs()
    pre = []
    for name in options.pre_includes():
        found = _resolve_include(name, dirs)
        pre.append([os.path.basename(name), _source_digest(str(found), dirs) if found is not None else None])
    return {
        "format": FORMAT,
        "source": _source_digest(str(spec.source_path()), dirs),
        "pre_includes": pre,
        "options": options.as_key(),
        "names": list(expressions),
        "nvrtc": [*toolchain.nvrtc_version(), toolchain.nvrtc_build()],
        "hwprofile": __version__,
        "plugin": spec.distribution_version,
    }


def key_of(doc: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


# --- entry format --------------------------------------------------------------------------------


def encode(compiled: CompiledKernel, doc: Mapping[str, Any]) -> bytes:
    meta = json.dumps(
        {"key": compiled.key, "inputs": dict(doc), "target": compiled.target, "lowered": dict(compiled.lowered), "log": compiled.log}
    ).encode()
    body = struct.pack("<I", len(meta)) + meta + compiled.cubin
    return MAGIC + hashlib.sha256(body).digest() + body


def decode(data: bytes, key: str, target: str | None = None, expressions: Sequence[str] = ()) -> tuple[CompiledKernel | None, str]:
    """``(entry, "")`` for a valid entry of ``key``, else ``(None, what is wrong with it)``."""
    head = len(MAGIC) + 32
    if len(data) < head + 4 or not data.startswith(MAGIC):
        return None, "is truncated or corrupt"
    digest, body = data[len(MAGIC) : head], data[head:]
    if hashlib.sha256(body).digest() != digest:
        return None, "is truncated or corrupt (checksum mismatch)"
    (n,) = struct.unpack("<I", body[:4])
    try:
        meta = json.loads(body[4 : 4 + n])
    except ValueError:
        return None, "has malformed metadata"
    lowered = meta.get("lowered") if isinstance(meta, dict) else None
    ok = (
        isinstance(meta, dict)
        and isinstance(meta.get("key"), str)
        and isinstance(meta.get("inputs"), dict)
        and isinstance(meta.get("target"), str)
        and isinstance(meta.get("log", ""), str)
        and isinstance(lowered, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in lowered.items())
    )
    if not ok or not isinstance(lowered, dict):
        return None, "has malformed metadata"
    if meta["key"] != key or key_of(meta["inputs"]) != key:
        return None, f"belongs to another key ({str(meta['key'])[:16]}...): it was misfiled or copied here"
    if target is not None and meta["target"] != target:
        return None, f"was built for {meta['target']}, not {target}"
    missing = [e for e in expressions if e not in lowered]
    if missing:
        return None, f"lacks the instance(s) {', '.join(missing)}"
    return CompiledKernel(key, meta["target"], body[4 + n :], lowered, meta.get("log", ""), cached=True), ""


# --- read / write --------------------------------------------------------------------------------

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


def entry_name(key: str) -> str:
    return f"{key}.cubin"


def read(
    dfd: int, dpath: Path, key: str, target: str, expressions: Sequence[str], *, read_only: bool = False, any_owner: bool = False
) -> CompiledKernel | None:
    """The valid entry of ``key``, or None (a miss; a damaged or foreign entry also warns once).

    ``read_only``: a layer that is never written; its entries may belong to root instead of this user,
    never to another user, and are refused when group or others can write them, as every entry is.
    ``any_owner``: a shipped layer's entry (see :attr:`Layer.shipped`), whoever owns it.
    """
    name = entry_name(key)
    then = "recompiling it" if read_only else "recompiling and replacing it"
    path = dpath / name
    try:
        fd = os.open(name, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        why = "is a symbolic link, which the cache never follows" if exc.errno == errno.ELOOP else f"cannot be read ({exc.strerror})"
        _warn_once(f"{path}:open", "kernel cache entry %s %s; %s", path, why, then)
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            _warn_once(
                f"{path}:type",
                "kernel cache entry %s is not a regular file (%s); %s",
                path,
                stat.filemode(st.st_mode),
                then,
            )
            return None
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or (
            (_untrusted_owner(st) and not any_owner) if read_only else _foreign(st)
        ):
            _warn_once(
                f"{path}:mode",
                "kernel cache entry %s is writable by other users or owned by another user (mode %s, owner %s); it is not "
                "loaded: %s",
                path,
                stat.filemode(st.st_mode),
                _owner(st.st_uid),
                then,
            )
            return None
        if st.st_size > MAX_ENTRY_BYTES:
            _warn_once(
                f"{path}:size", "kernel cache entry %s is %d bytes, too large for a cubin; %s", path, st.st_size, then
            )
            return None
        chunks, size = [], 0
        while size <= st.st_size:
            chunk = os.read(fd, max(1, st.st_size - size + 1))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        _warn_once(f"{path}:read", "kernel cache entry %s cannot be read (%s); %s", path, exc.strerror, then)
        return None
    finally:
        os.close(fd)
    entry, problem = decode(data, key, target, expressions)
    if entry is None:
        _warn_once(f"{path}:{problem}", "kernel cache entry %s %s; %s", path, problem, then)
        return None
    return CompiledKernel(entry.key, entry.target, entry.cubin, entry.lowered, entry.log, True, layer=layer_label(dpath, not read_only))


def read_remote(
    store: _remote.Store, key: str, target: str, expressions: Sequence[str], *, again: bool = False
) -> CompiledKernel | None:
    """The entry of ``key`` in the fleet store, verified by :func:`decode` exactly as a file is, or None.

    A value over :data:`hwprofile._remote.MAX_CUBIN_BYTES` is never transferred; one that fails
    :func:`decode` (corrupt, another key's, another target's, lacking an instance) is one warning and
    a miss: the kernel is compiled here and the good entry published over it. ``again``: a second look
    after a miss (under the compile lock), whose miss or rejection is not counted twice.
    """
    rkey = _remote.cubin_key(key)
    data = store.get("cubin", rkey, _remote.MAX_CUBIN_BYTES, count=not again)
    if data is None:
        return None
    entry, problem = decode(data, key, target, expressions)
    if entry is None:
        if not again:  # the second look finds the value the first rejected: one value, counted once
            _remote.note("cubin", "rejected")
        _warn_once(f"remote:{rkey}:{problem}", "remote kernel cache entry %s in %s %s; it is not loaded: compiling here and "
                   "publishing over it", rkey, store.shown, problem)
        return None
    _remote.note("cubin", "hits")
    return CompiledKernel(entry.key, entry.target, entry.cubin, entry.lowered, entry.log, True, layer=store.label)


def publish(store: _remote.Store, compiled: CompiledKernel, doc: Mapping[str, Any]) -> bool:
    """Put ``compiled`` in the fleet store in the entry format of a file (best effort)."""
    return store.put("cubin", _remote.cubin_key(compiled.key), encode(compiled, doc))


def write(dfd: int, dpath: Path, compiled: CompiledKernel, doc: Mapping[str, Any]) -> bool:
    """Atomically store ``compiled``; False (with one warning per directory and cause) if it cannot."""
    import secrets

    name = entry_name(compiled.key)
    tmp = f"{name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    data = encode(compiled, doc)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        return True
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        _warn_once(
            f"{dpath}:write:{exc.errno}",
            "cannot write kernel cache entry %s (%s); the kernel is used but not cached, so each process compiles it again. "
            "Fix the directory, or set %s to another one",
            dpath / name,
            exc.strerror or exc,
            _env.CACHE_DIR.name,
        )
        return False


def _read_small(dfd: int, name: str, limit: int = 512) -> str | None:
    """A short regular file's text, read without following links or blocking; None if not that."""
    try:
        fd = os.open(name, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.read(fd, limit).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    return "".join(c for c in text.strip() if c.isprintable())[:200] or None


def _write_small(dfd: int, name: str, text: str) -> None:
    import secrets

    tmp = f"{name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)


@contextlib.contextmanager
def entry_lock(dfd: int, dpath: Path, key: str) -> Iterator[bool]:
    """Hold the per-key lock around a compile; yields whether it is held. Never waits silently or forever.

    The holder records itself in ``<entry>.owner`` (pid, host, start), so a waiting process can
    say whom it waits for.
    """
    import filelock

    path = dpath / (entry_name(key) + ".lock")
    owner = entry_name(key) + ".owner"
    lock = filelock.FileLock(str(path), mode=0o600)
    held = False
    try:
        try:
            lock.acquire(timeout=LOCK_NOTICE_S)
            held = True
        except filelock.Timeout:
            who = _read_small(dfd, owner) or "another process"
            log.warning(
                "waiting up to %.0f s for the kernel cache lock %s, held by %s (compiling the same kernel: another rank?)",
                LOCK_WAIT_S,
                path,
                who,
            )
            try:
                lock.acquire(timeout=max(0.0, LOCK_WAIT_S - LOCK_NOTICE_S))
                held = True
            except filelock.Timeout:
                log.warning(
                    "kernel cache lock %s is still held by %s after %.0f s; compiling without it (a duplicate compile is harmless). "
                    "If that process is gone, delete the lock file",
                    path,
                    who,
                    LOCK_WAIT_S,
                )
    except Exception as exc:  # noqa: BLE001 - the lock only saves duplicate work: never let it stop a compile
        why = getattr(exc, "strerror", None) or f"{type(exc).__name__}: {exc}"
        _warn_once(f"{path}:lock", "cannot use the kernel cache lock %s (%s); compiling without it", path, why)
    if held:
        import socket

        _write_small(dfd, owner, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}")
    try:
        yield held
    finally:
        if held:
            with contextlib.suppress(OSError):
                os.unlink(owner, dir_fd=dfd)
            with contextlib.suppress(OSError):
                lock.release()


# --- clearing ------------------------------------------------------------------------------------


@dataclass
class ClearReport:
    """What :func:`clear` did."""

    path: Path | None
    removed: int = 0
    skipped: list[str] = field(default_factory=list)
    #: files in the directory that hwprofile did not write (never touched)
    foreign: int = 0


_KEY = r"[0-9a-f]{64}\.cubin"
_OURS = re.compile(rf"^{_KEY}(?P<kind>|\.lock|\.owner|\.\d+\.[0-9a-f]{{12}}\.tmp)\Z")


def is_entry_name(name: str) -> bool:
    """Whether ``name`` is an entry's name as hwprofile writes it (``<64 hex digits>.cubin``)."""
    m = _OURS.match(name)
    return m is not None and m.group("kind") == ""


def _has_magic(dfd: int, name: str) -> bool:
    """Whether ``name`` is a regular file that starts with hwprofile's entry magic (read without following a link)."""
    try:
        fd = os.open(name, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(MAGIC)) == MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


def clear(environ: Mapping[str, str] | None = None) -> ClearReport:
    """Delete, in the write layer only, every entry, unheld lock and abandoned temp file hwprofile wrote.

    "hwprofile wrote" is its name pattern (a 64-hex-digit key, ``.cubin``, then nothing, ``.lock``,
    ``.owner`` or ``.<pid>.<12 hex>.tmp``) and, for an entry, its magic: a user's own files in a
    directory ``HWPROFILE_CACHE_DIR`` names are never removed, and neither is a symlink. Read-only
    layers are never touched.
    """
    import filelock

    with open_layers(create=False, environ=environ, shipped=False) as layers:
        if layers.write is None:
            return ClearReport(configured_dirs(environ)[-1])
        dfd, dpath = layers.write.fd, layers.write.path
        report = ClearReport(dpath)
        now = time.time()
        for name in sorted(os.listdir(dfd)):
            m = _OURS.match(name)
            if m is None:
                report.foreign += 1
                continue
            kind = m.group("kind")
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    report.skipped.append(f"{name}: not a file ({stat.filemode(st.st_mode)}); remove it by hand")
                    continue
                if kind == "":
                    if not _has_magic(dfd, name):
                        report.skipped.append(f"{name}: not a hwprofile cache entry (no {MAGIC.decode()} magic); left alone")
                        continue
                    os.unlink(name, dir_fd=dfd)
                    report.removed += 1
                elif kind in (".owner",) or kind.endswith(".tmp"):
                    if now - st.st_mtime < TMP_MAX_AGE_S:
                        if kind.endswith(".tmp"):
                            report.skipped.append(f"{name}: a write in flight (younger than {TMP_MAX_AGE_S:.0f} s)")
                        continue
                    os.unlink(name, dir_fd=dfd)
                else:  # .lock
                    lock = filelock.FileLock(str(dpath / name))
                    try:
                        lock.acquire(timeout=0)
                    except filelock.Timeout:
                        report.skipped.append(f"{name}: held by a process compiling now")
                        continue
                    try:
                        for gone in (name, name[: -len(".lock")] + ".owner"):
                            with contextlib.suppress(FileNotFoundError):
                                os.unlink(gone, dir_fd=dfd)
                    finally:
                        lock.release()
            except FileNotFoundError:
                continue  # removed by another process meanwhile
            except OSError as exc:
                report.skipped.append(f"{name}: {exc.strerror or exc}")
    return report


@_state.on_reset
def clear_cache() -> None:
    """Forget which warnings were given and which layers packages ship (process state, cleared by ``hwprofile.reset()``)."""
    global _shipped
    with _warned_lock:
        _warned.clear()
    _shipped = None
