"""A read-only HOME (a container's image layer, a locked-down account) must not disable kernels (issue 25).

The cache directory cannot be created there: kernels are compiled and used uncached, with one
warning, instead of every op falling back to torch. A directory that exists and is refused stays an error.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from hwprofile.errors import CacheError
from hwprofile.kernels import _pipeline as jit

from .test_cache import pkg, spec  # noqa: F401 - the toy kernel package fixture

pytest.importorskip("cuda.bindings.nvrtc")


@pytest.fixture
def read_only_home(pkg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:  # noqa: F811
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in ("HWPROFILE_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    real_mkdir = os.mkdir

    def mkdir(path: object, *args: object, **kw: object) -> None:
        if str(path).startswith(str(home)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        real_mkdir(path, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "mkdir", mkdir)  # os.makedirs calls it too
    return home


def test_kernels_run_uncached_with_one_warning(read_only_home: Path, pkg: Path, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    c = jit.compile_spec(spec(pkg), "sm_90a")
    jit.clear_cache()
    again = jit.compile_spec(spec(pkg), "sm_90a")
    jit.compile_spec(spec(pkg), "sm_90a", ("scale_kernel<3>",))
    assert c.cubin[:4] == b"\x7fELF" and not c.cached and not again.cached
    warned = [r for r in caplog.records if "not cached" in r.getMessage()]
    assert len(warned) == 1, caplog.text
    text = warned[0].getMessage()
    assert str(read_only_home / ".cache" / "hwprofile" / "kernels") in text and "Read-only file system" in text
    assert "HWPROFILE_CACHE_DIR" in text
    assert not (read_only_home / ".cache").exists()


def test_a_refused_existing_directory_is_still_an_error(pkg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    f = tmp_path / "a-file"
    f.write_text("")
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(f))
    with pytest.raises(CacheError, match="is not a directory"):
        jit.compile_spec(spec(pkg), "sm_90a")
