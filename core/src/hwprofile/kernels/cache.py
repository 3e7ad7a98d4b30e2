"""The on-disk kernel cache: its rules, read/write, locks, clear; the face of the key, layers and entry modules. Never compiles.

The key is :mod:`._cache_key`, the directory policy and layers :mod:`._cache_layers`, the entry format
:mod:`._cache_entry`; this module re-exports what the pipeline, the CLI and tests use of them, so
``kernels.cache`` stays the one name to import (a test that patches :func:`read` or the lock timeouts
patches it here, where the pipeline and :func:`entry_lock` look them up).

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
import os
import re
import stat
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import _env, _remote
from .._log import get_logger
from ._cache_entry import MAGIC as MAGIC
from ._cache_entry import MAX_ENTRY_BYTES as MAX_ENTRY_BYTES
from ._cache_entry import decode as decode
from ._cache_entry import encode as encode
from ._cache_entry import entry_name as entry_name
from ._cache_key import FORMAT as FORMAT
from ._cache_key import key_document as key_document
from ._cache_key import key_of as key_of
from ._cache_layers import _O_CLOEXEC, _O_NOFOLLOW, _O_NONBLOCK, _foreign, _owner, _untrusted_owner, _warn_once
from ._cache_layers import LAYER_GROUP as LAYER_GROUP
from ._cache_layers import LAYER_SUBDIR as LAYER_SUBDIR
from ._cache_layers import Layer as Layer
from ._cache_layers import Layers as Layers
from ._cache_layers import UntrustedOwnerError as UntrustedOwnerError
from ._cache_layers import _warned_lock as _warned_lock  # the lock a fork test holds (tests/kernels/test_cache.py)
from ._cache_layers import cache_dir as cache_dir
from ._cache_layers import cache_enabled as cache_enabled
from ._cache_layers import check_layers as check_layers
from ._cache_layers import clear_cache as clear_cache
from ._cache_layers import configured_dirs as configured_dirs
from ._cache_layers import layer_label as layer_label
from ._cache_layers import open_dir as open_dir
from ._cache_layers import open_layer_for_writing as open_layer_for_writing
from ._cache_layers import open_layers as open_layers
from ._cache_layers import shipped_layers as shipped_layers
from .toolchain import CompiledKernel

log = get_logger(__name__)

#: Seconds a process waits for another's per-key lock before saying so, and before compiling anyway.
LOCK_NOTICE_S = 2.0
LOCK_WAIT_S = 60.0
#: Temp files younger than this are another process's write in flight: ``clear`` leaves them.
TMP_MAX_AGE_S = 3600.0


# --- read / write --------------------------------------------------------------------------------

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
