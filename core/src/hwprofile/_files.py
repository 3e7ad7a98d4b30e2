"""Files hwprofile writes for the user: whole or not at all, never through a link, never into a directory another user controls.

Every file hwprofile writes outside its kernel cache (tuned files, sweep samples and reports, a
scaffolded plugin) goes through :func:`atomic_write`: a temporary file created exclusively in the
same directory, written, fsync'd, then renamed over the target, and the directory fsync'd. A reader
sees the old file or the new one, never a torn one; a full disk, a read-only directory or a crash
keeps the previous file; ``rename`` replaces a symbolic link planted at the target instead of writing
through it, and the target is refused up front when it is one. The directory must be the user's own
(or root's) and not writable by others, unless sticky (``/tmp``: a sticky directory lets no one else
replace or remove what we put there).

The kernel cache has its own, stricter rules (``kernels.cache``: private directory, magic, locks).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from .errors import WriteError

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_TMP_PREFIX = ".hwprofile-tmp-"


def _uid() -> int:
    """The effective user id (a seam: tests pose as another user); -1 where there is none (Windows)."""
    return os.geteuid() if hasattr(os, "geteuid") else -1


def check_directory(directory: Path, *, what: str) -> None:
    """Refuse a directory another user controls: owned by someone else, or writable by others and not sticky."""
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        raise WriteError(f"cannot write the {what}: its directory {directory} does not exist; create it or choose another path") from None
    except OSError as exc:
        why = f"cannot be read ({exc.strerror})"
        raise WriteError(f"cannot write the {what}: its directory {directory} {why}; choose another path") from None
    if not stat.S_ISDIR(st.st_mode):
        raise WriteError(f"cannot write the {what}: {directory} is not a directory; choose another path")
    me = _uid()
    if me < 0:
        return
    if st.st_uid not in (me, 0):
        raise WriteError(
            f"refusing to write the {what} into {directory}: the directory belongs to another user (uid {st.st_uid}), "
            "who could replace what hwprofile writes there; choose a directory of your own"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise WriteError(
            f"refusing to write the {what} into {directory}: the directory is writable by other users "
            f"(mode {stat.filemode(st.st_mode)}) and not sticky; chmod go-w {directory}, or choose a private directory"
        )


def ensure_directory(directory: Path, *, what: str, mode: int = 0o755) -> None:
    """Create ``directory`` (and its parents) if missing, then :func:`check_directory` it."""
    try:
        os.makedirs(directory, mode, exist_ok=True)
    except FileExistsError:
        pass  # a file, or a dangling link, in the way: check_directory names it
    except OSError as exc:
        raise WriteError(f"cannot create the directory {directory} for the {what}: {exc.strerror}; choose another path") from None
    check_directory(directory, what=what)


def check_target(path: Path, *, what: str) -> None:
    """Refuse a target that is a symbolic link or not a regular file (what ``--output`` checks before any work)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        why = f"a file is in the way of its directory {path.parent}"
        raise WriteError(f"cannot write the {what} {path}: {why}; choose another path") from None
    except OSError as exc:
        raise WriteError(f"cannot write the {what} {path}: {exc.strerror}; choose another path") from None
    if stat.S_ISLNK(st.st_mode):
        raise WriteError(
            f"refusing to write the {what} {path}: it is a symbolic link (to {os.readlink(path)}), and hwprofile never writes "
            "through one; remove the link or choose another path"
        )
    if not stat.S_ISREG(st.st_mode):
        raise WriteError(f"cannot write the {what} {path}: it exists and is not a regular file (a directory?); choose another path")


def check_writable(path: Path, *, what: str) -> None:
    """Everything :func:`atomic_write` would refuse, checked before the work that produces the data (no file is created)."""
    check_target(path, what=what)
    parent = path.parent
    probe = parent
    while not probe.exists() and probe != probe.parent:  # the nearest existing ancestor decides
        probe = probe.parent
    check_directory(probe, what=what)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise WriteError(f"cannot write the {what} {path}: {probe} is not writable by you; choose another path")


def atomic_write(path: Path, data: bytes | str, *, what: str, mode: int = 0o644) -> None:
    """Replace ``path`` by ``data`` whole (temporary file, fsync, rename), or raise :class:`WriteError` with the old file intact.

    ``what`` names the file in errors ("tuned file", "sweep samples"). The directory must exist
    (:func:`ensure_directory`).
    """
    path = Path(path)
    try:
        blob = data.encode() if isinstance(data, str) else data
    except UnicodeEncodeError as exc:  # a non-UTF-8 file name (a lone surrogate) quoted in the text
        bad = exc.object[exc.start : exc.end].encode("utf-8", "backslashreplace").decode("ascii")
        raise WriteError(
            f"cannot write the {what} {path}: its text holds {bad}, not valid UTF-8 (a file name of undecodable bytes?); "
            "rename that file or choose another path"
        ) from None
    check_target(path, what=what)
    check_directory(path.parent, what=what)
    try:
        dfd = os.open(path.parent, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    except OSError as exc:
        raise WriteError(f"cannot write the {what} {path}: {exc.strerror}; choose another path") from None
    # ".tmp" last: a reader that lists the directory by the target's suffix (tuning.tuned_files: *.toml) must never
    # pick up a temporary that the rename below makes vanish (a profile resolved meanwhile failed: tests/tune/test_faults.py)
    tmp = f"{_TMP_PREFIX}{os.getpid()}-{os.urandom(4).hex()}-{path.name}.tmp"
    created = False
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, mode, dir_fd=dfd)
        created = True
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        created = False
        try:
            os.fsync(dfd)
        except OSError:
            pass  # some filesystems refuse fsync on a directory; the rename itself has happened
    except OSError as exc:
        kept = "the previous file is unchanged" if path.exists() else "nothing was written"
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        hint = "free some space" if full else "check the directory's permissions or choose another path"
        raise WriteError(f"could not write the {what} {path}: {exc.strerror or exc}; {kept}; {hint}") from exc
    finally:
        if created:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
        os.close(dfd)


def atomic_write_many(files: Mapping[Path, bytes | str], *, what: str) -> None:
    """:func:`atomic_write` each file (each is whole; a failure stops at that file and names it)."""
    for p, data in files.items():
        atomic_write(p, data, what=what)
