"""The on-disk kernel cache: key, directory policy, entry format, read/write, locking. Never compiles.

Rules (each has a test in ``tests/kernels/test_cache.py``):

* **Key.** SHA-256 over a JSON document of every input of the compile: source and every header it
  reaches (also through ``-I`` / ``-include`` in the spec's options), the full flag list (fixed
  flags, include directories, the spec's options), target, name expressions, NVRTC's version and
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
* **Clearing is safe while others compile**: :func:`clear` removes entries and unheld locks, never
  a temp file younger than :data:`TMP_MAX_AGE_S` (another process's write in flight).

Directory-level faults (a shared or foreign directory, ``HWPROFILE_CACHE_DIR`` naming a file or a
symlink, a directory that cannot be created) raise :class:`~hwprofile.errors.CacheError`, a
:class:`~hwprofile.errors.KernelError`, so ops fall back to torch with one warning.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import struct
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _env, _state
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
    """Where the cache lives: ``HWPROFILE_CACHE_DIR`` or ``<user cache dir>/hwprofile/kernels``."""
    env = _env.CACHE_DIR.read(environ)
    if env is not None:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("hwprofile")) / "kernels"


def _refuse_if_shared(st: os.stat_result, path: Path) -> None:
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        raise CacheError(
            f"refusing kernel cache directory {path}: it is writable by other users or owned by another user "
            f"(mode {stat.filemode(st.st_mode)}), and loading a cubin runs its code; chmod 700 {path}, "
            f"or point {_env.CACHE_DIR.name} at a private directory"
        )


def open_dir(create: bool = True, environ: Mapping[str, str] | None = None) -> tuple[int, Path] | None:
    """A descriptor of the checked cache directory and its path (None if absent and not created).

    The caller closes the descriptor. Every fault names the directory and the fix.
    """
    path = cache_dir(environ)
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
        _refuse_if_shared(os.fstat(fd), path)
    except BaseException:
        os.close(fd)
        raise
    return fd, path


# --- key -----------------------------------------------------------------------------------------


def key_document(spec: KernelSpec, options: CompileOptions, expressions: Sequence[str]) -> dict[str, Any]:
    """Every input of one compile, as a JSON-able document (what the key hashes and entries store)."""
    from .. import __version__
    from .spec import _resolve_include, _source_digest

    dirs = options.header_dirs()
    pre = []
    for name in options.pre_includes():
        found = _resolve_include(name, dirs)
        pre.append([name, _source_digest(str(found), dirs) if found is not None else None])
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


def read(dfd: int, dpath: Path, key: str, target: str, expressions: Sequence[str]) -> CompiledKernel | None:
    """The valid entry of ``key``, or None (a miss; a damaged or foreign entry also warns once)."""
    name = entry_name(key)
    path = dpath / name
    try:
        fd = os.open(name, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        why = "is a symbolic link, which the cache never follows" if exc.errno == errno.ELOOP else f"cannot be read ({exc.strerror})"
        _warn_once(f"{path}:open", "kernel cache entry %s %s; recompiling and replacing it", path, why)
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            _warn_once(
                f"{path}:type",
                "kernel cache entry %s is not a regular file (%s); recompiling and replacing it",
                path,
                stat.filemode(st.st_mode),
            )
            return None
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
            _warn_once(
                f"{path}:mode",
                "kernel cache entry %s is writable by other users or owned by another user (mode %s); "
                "it is not loaded, and is recompiled and replaced",
                path,
                stat.filemode(st.st_mode),
            )
            return None
        if st.st_size > MAX_ENTRY_BYTES:
            _warn_once(
                f"{path}:size", "kernel cache entry %s is %d bytes, too large for a cubin; recompiling and replacing it", path, st.st_size
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
        _warn_once(f"{path}:read", "kernel cache entry %s cannot be read (%s); recompiling and replacing it", path, exc.strerror)
        return None
    finally:
        os.close(fd)
    entry, problem = decode(data, key, target, expressions)
    if entry is None:
        _warn_once(f"{path}:{problem}", "kernel cache entry %s %s; recompiling and replacing it", path, problem)
    return entry


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


def clear(environ: Mapping[str, str] | None = None) -> ClearReport:
    """Delete every entry, unheld lock and abandoned temp file; leave what others are using."""
    import filelock

    opened = open_dir(create=False, environ=environ)
    if opened is None:
        return ClearReport(cache_dir(environ))
    dfd, dpath = opened
    report = ClearReport(dpath)
    now = time.time()
    try:
        for name in sorted(os.listdir(dfd)):
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                regular_or_link = stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)
                if name.endswith(".cubin"):
                    if not regular_or_link:
                        report.skipped.append(f"{name}: not a file ({stat.filemode(st.st_mode)}); remove it by hand")
                        continue
                    os.unlink(name, dir_fd=dfd)
                    report.removed += 1
                elif name.endswith((".tmp", ".owner")) and regular_or_link:
                    if now - st.st_mtime < TMP_MAX_AGE_S:
                        if name.endswith(".tmp"):
                            report.skipped.append(f"{name}: a write in flight (younger than {TMP_MAX_AGE_S:.0f} s)")
                        continue
                    os.unlink(name, dir_fd=dfd)
                elif name.endswith(".lock") and regular_or_link:
                    if stat.S_ISLNK(st.st_mode):
                        os.unlink(name, dir_fd=dfd)
                        continue
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
    finally:
        os.close(dfd)
    return report


@_state.on_reset
def clear_cache() -> None:
    """Forget which warnings were given (process state, cleared by ``hwprofile.reset()``)."""
    with _warned_lock:
        _warned.clear()
