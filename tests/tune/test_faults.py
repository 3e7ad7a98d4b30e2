"""Nothing lost, nothing torn: tune's writes under a full disk, a read-only directory, a link or a foreign directory
in the way, and readers (another process, another thread) that read while tune rewrites."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import hwprofile
from hwprofile import _files, retune, tuning
from hwprofile.profiles import build_profile, detect, registry

from .helpers import FakeTimer, stale_tuned_file


@pytest.fixture
def stale() -> Path:
    p = stale_tuned_file(hwprofile.profile(0))
    hwprofile.reset()
    return p


def _no_temporaries(d: Path) -> None:
    assert not [p for p in d.rglob("*") if p.name.startswith(".hwprofile-tmp-")]


def test_a_full_disk_keeps_the_previous_file_and_says_so(stale: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = stale.read_bytes()
    real_write = os.write

    def full(fd: int, data: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_files.os, "write", full)
    try:
        with pytest.raises(retune.TuneError) as e:
            hwprofile.tune(0, timer=FakeTimer())
    finally:
        monkeypatch.setattr(_files.os, "write", real_write)
    msg = str(e.value)
    assert "No space left on device" in msg and "free some space" in msg and "every file is whole" in msg
    assert stale.read_bytes() == before
    _no_temporaries(stale.parent)
    assert hwprofile.profile(0)["router_gemm.max_tokens"] == 16  # the shipped value still applies


def _read_only(real_open: object, only_temporaries: bool) -> object:
    """os.open refusing to create files, as a read-only mount does (root ignores permission bits, so a chmod proves nothing)."""

    def read_only(path: object, flags: int, *args: object, **kw: object) -> int:
        if flags & os.O_CREAT and (not only_temporaries or str(path).startswith(".hwprofile-tmp-")):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_open(path, flags, *args, **kw)  # type: ignore[operator, no-any-return]

    return read_only


def test_a_read_only_directory_is_refused_before_any_measurement(stale: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "open", _read_only(os.open, only_temporaries=False))
    timer = FakeTimer()
    with pytest.raises(retune.TuneError, match=r"cannot create the lock file .*\(Read-only file system\).*nothing was measured"):
        hwprofile.tune(0, timer=timer)
    assert timer.calls == []


def test_a_directory_turned_read_only_while_measuring_keeps_the_previous_file(stale: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = stale.read_bytes()
    real_open = os.open
    read_only = _read_only(real_open, only_temporaries=True)

    monkeypatch.setattr(_files.os, "open", read_only)
    with pytest.raises(retune.TuneError, match="Read-only file system") as e:
        hwprofile.tune(0, timer=FakeTimer())
    monkeypatch.setattr(_files.os, "open", real_open)
    assert "writing the tuned files failed" in str(e.value) and str(e.value).endswith("no tuned file was changed")
    assert stale.read_bytes() == before


def test_a_symlink_in_the_way_is_refused_before_any_measurement(tmp_path: Path) -> None:
    prof = hwprofile.profile(0)
    victim = stale_tuned_file(prof, directory=tmp_path / "victim")
    before = victim.read_bytes()
    link = tuning.tuned_dir(prof.device, os.environ) / "router_gemm.toml"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim)
    hwprofile.reset()
    timer = FakeTimer()
    with pytest.raises(retune.TuneError, match="it is a symbolic link .* hwprofile never writes through one"):
        hwprofile.tune(0, timer=timer)
    assert timer.calls == [] and victim.read_bytes() == before and link.is_symlink()


def test_a_directory_others_can_write_is_refused_before_any_measurement(stale: Path) -> None:
    os.chmod(stale.parent, 0o777)
    try:
        timer = FakeTimer()
        with pytest.raises(retune.TuneError, match="writable by other users"):
            hwprofile.tune(0, timer=timer)
        assert timer.calls == []
    finally:
        os.chmod(stale.parent, 0o755)


def test_every_reader_sees_the_old_or_the_new_table_whole(stale: Path, tmp_path: Path) -> None:
    """Another process reads the tuned file in a loop and this process resolves profiles from it in a thread, while tune
    rewrites it 12 times: no read fails, and every value read is one a tune wrote (or the stale file's)."""
    stop = tmp_path / "stop"
    reader = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import os, sys
            from pathlib import Path
            from hwprofile import tuning
            seen, reads = set(), 0
            ready = Path({str(tmp_path / 'ready')!r})
            while not os.path.exists({str(stop)!r}):
                _, t = tuning.read_tuned(Path({str(stale)!r}))
                seen.add(t["router_gemm.max_tokens"])
                reads += 1
                if reads == 1:
                    ready.touch()
            print(reads, sorted(seen))
        """)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    import time

    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists() and reader.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    errors: list[BaseException] = []
    values: set[int] = set()
    done = threading.Event()

    def resolve() -> None:
        info = detect().device(0)
        reg = registry()
        while not done.is_set():
            try:
                values.add(build_profile(info, reg, os.environ)["router_gemm.max_tokens"])
            except BaseException as exc:  # noqa: BLE001 - what the test counts
                errors.append(exc)

    t = threading.Thread(target=resolve)
    t.start()
    try:
        wrote = set()
        for i in range(12):
            wins_to = 4 + i % 6
            hwprofile.tune(0, everything=True, ops=["router_gemm"], timer=FakeTimer(wins_to=wins_to))
            wrote.add(wins_to)
    finally:
        done.set()
        t.join()
        stop.touch()
    out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err
    reads, seen = out.split(" ", 1)
    assert int(reads) > 0 and set(eval(seen)) <= wrote | {3}
    assert not errors, errors[:3]
    assert values <= wrote | {16}
    _no_temporaries(stale.parent)


def test_a_profile_resolved_while_a_tuned_file_is_written_never_lists_the_temporary(stale: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deterministic form of the race above: at the instant before the rename, the temporary exists; the tuned
    directory's listing (what every profile reads) must not contain it, or the rename makes a listed file vanish."""
    seen: list[list[str]] = []
    real_replace = os.replace
    info = hwprofile.profile(0).device

    def replace(src: object, dst: object, **kw: object) -> None:
        seen.append([p.name for p in tuning.tuned_files(info, os.environ)])
        real_replace(src, dst, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(_files.os, "replace", replace)
    hwprofile.tune(0, timer=FakeTimer(), ops=["router_gemm", "fp8_gemv"])  # one file written, whatever else is stale
    assert seen and all(names == ["router_gemm.toml"] for names in seen), seen
