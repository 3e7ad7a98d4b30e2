"""hwprofile._files: files written whole or not at all, never through a link, never into another user's directory."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from hwprofile import WriteError, _files


def test_write_replaces_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    p = tmp_path / "t.toml"
    _files.atomic_write(p, "a = 1\n", what="tuned file")
    _files.atomic_write(p, b"a = 2\n", what="tuned file")
    assert p.read_text() == "a = 2\n"
    assert [q.name for q in tmp_path.iterdir()] == ["t.toml"]


def test_symlink_target_is_refused_and_its_victim_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = tmp_path / "out.toml"
    link.symlink_to(victim)
    for check in (lambda: _files.atomic_write(link, "x", what="sweep samples"), lambda: _files.check_writable(link, what="sweep samples")):
        with pytest.raises(WriteError, match="symbolic link"):
            check()
    assert victim.read_text() == "precious" and link.is_symlink()


def test_directory_target_is_refused_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(WriteError, match="not a regular file"):
        _files.check_writable(tmp_path, what="sweep output")


def test_full_disk_keeps_the_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "t.toml"
    p.write_text("old = 1\n")

    def full(fd: int, data: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(WriteError, match=r"No space left.*previous file is unchanged.*free some space"):
        _files.atomic_write(p, "new = 2\n", what="tuned file")
    monkeypatch.undo()
    assert p.read_text() == "old = 1\n"
    assert [q.name for q in tmp_path.iterdir()] == ["t.toml"]


def test_directory_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    owner = os.stat(tmp_path).st_uid
    monkeypatch.setattr(_files, "_uid", lambda: owner + 4242)
    if owner == 0:  # root's directories are trusted; pose the directory as another user's instead
        monkeypatch.setattr(_files, "_uid", lambda: 4242)
        real_stat = os.stat

        def stat_as_other(p: object, *a: object, **k: object) -> os.stat_result:
            st = real_stat(p, *a, **k)  # type: ignore[arg-type]
            if Path(str(p)) == tmp_path:
                return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, 4343, *tuple(st)[5:]))
            return st

        monkeypatch.setattr(os, "stat", stat_as_other)
    with pytest.raises(WriteError, match="belongs to another user"):
        _files.atomic_write(tmp_path / "t.toml", "x", what="tuned file")


def test_group_writable_directory_is_refused_unless_sticky(tmp_path: Path) -> None:
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(WriteError, match="writable by other users"):
        _files.atomic_write(d / "t.toml", "x", what="tuned file")
    d.chmod(0o1777)  # sticky, as /tmp: accepted (no one else can replace what we put there)
    _files.atomic_write(d / "t.toml", "x", what="tuned file")
    assert (d / "t.toml").read_text() == "x"


def test_concurrent_readers_see_old_or_new_whole(tmp_path: Path) -> None:
    p = tmp_path / "t.toml"
    old, new = "v = " + "1" * 40000 + "\n", "v = " + "2" * 50000 + "\n"
    _files.atomic_write(p, old, what="tuned file")
    seen: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            seen.append(p.read_text())

    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    for i in range(200):
        _files.atomic_write(p, new if i % 2 else old, what="tuned file")
    stop.set()
    for t in readers:
        t.join()
    assert seen and set(seen) <= {old, new}
