"""The kernel cache under hostile conditions (CPU only: NVRTC compiles here, nothing is loaded).

Each test is one class of fault from issue 13; docs/architecture.md lists them.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import hwprofile
from hwprofile import _version
from hwprofile.errors import CacheError, KernelError, ToolchainError
from hwprofile.kernels import _pipeline as jit
from hwprofile.kernels import cache as kcache
from hwprofile.kernels import launch, toolchain
from hwprofile.kernels import spec as kernelspec
from hwprofile.kernels.spec import KernelSpec, Launch

pytest.importorskip("cuda.bindings.nvrtc")

SRC = """
#include "factor.cuh"
template <int S>
__global__ void scale_kernel(float* out, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = S * FACTOR * x[i];
}
"""
EXPR = "scale_kernel<2>"


@pytest.fixture
def pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A toy kernel package whose header lives in a directory reached only through ``-I``."""
    root = tmp_path / "site"
    (root / "toy_cache_kernels").mkdir(parents=True)
    (root / "toy_cache_kernels" / "__init__.py").write_text("")
    (root / "toy_cache_kernels" / "k.cu").write_text(SRC)
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "factor.cuh").write_text("#define FACTOR 1\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "toy_cache_kernels", raising=False)
    cache = tmp_path / "cache"
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(cache))
    hwprofile.reset()
    return inc


def spec(inc: Path) -> KernelSpec:
    return KernelSpec(
        "toy",
        "toy_cache_kernels",
        "k.cu",
        (EXPR,),
        lambda **kw: Launch(EXPR, (1, 1, 1), (32, 1, 1)),
        options=(f"-I{inc}",),
        plugin="toy",
        distribution_version="toy 1.0",
    )


def entry(key: str) -> Path:
    return Path(os.environ["HWPROFILE_CACHE_DIR"]) / f"{key}.cubin"


def in_thread(fn, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    """Run ``fn`` in a daemon thread; fail (instead of hanging the suite) if it does not finish."""
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"still running after {timeout} s (hung)"
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["value"]


# --- the key covers every input ------------------------------------------------------------------


def test_header_reached_through_an_option_include_dir_is_in_the_key(pkg: Path) -> None:
    a = jit.compile_spec(spec(pkg), "sm_90a")
    (pkg / "factor.cuh").write_text("#define FACTOR 3\n")
    hwprofile.reset()  # forgets the source digest: the edit is seen
    b = jit.compile_spec(spec(pkg), "sm_90a")
    assert a.key != b.key and not b.cached and a.cubin != b.cubin


def test_key_covers_hwprofile_version_nvrtc_build_and_fixed_flags(pkg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = jit.cache_key(spec(pkg), "sm_90a", (EXPR,))
    monkeypatch.setattr(_version, "__version__", "99.0")  # the leaf the key reads it from
    v = jit.cache_key(spec(pkg), "sm_90a", (EXPR,))
    assert v != base
    monkeypatch.setattr(toolchain, "nvrtc_build", lambda: "nvidia-cuda-nvrtc 99.9.9")
    b = jit.cache_key(spec(pkg), "sm_90a", (EXPR,))
    assert b != v
    monkeypatch.setattr(toolchain, "FIXED_FLAGS", (*toolchain.FIXED_FLAGS, "--use_fast_math"))
    assert jit.cache_key(spec(pkg), "sm_90a", (EXPR,)) != b


def test_entries_carry_their_full_key(pkg: Path) -> None:
    c = jit.compile_spec(spec(pkg), "sm_90a")
    data = entry(c.key).read_bytes()
    (n,) = struct.unpack("<I", data[40:44])
    meta = json.loads(data[44 : 44 + n])
    assert meta["key"] == c.key and kcache.key_of(meta["inputs"]) == c.key
    assert meta["inputs"]["hwprofile"] == hwprofile.__version__ and meta["inputs"]["names"] == [EXPR]


# --- a bad entry is a miss with one warning ------------------------------------------------------


def _rewrite(path: Path, meta: object, cubin: bytes = b"\x7fELF") -> None:
    """A checksum-valid entry around ``meta``: only the metadata is wrong."""
    import hashlib

    m = json.dumps(meta).encode()
    body = struct.pack("<I", len(m)) + m + cubin
    path.write_bytes(kcache.MAGIC + hashlib.sha256(body).digest() + body)


@pytest.mark.parametrize("meta", [[], {"target": "sm_90a"}, {"key": 1, "inputs": {}, "target": "sm_90a", "lowered": {}}, {"lowered": "x"}])
def test_malformed_metadata_with_valid_checksum_is_a_miss(pkg: Path, meta: object, caplog: pytest.LogCaptureFixture) -> None:
    c = jit.compile_spec(spec(pkg), "sm_90a")
    _rewrite(entry(c.key), meta)
    jit.clear_cache()
    again = jit.compile_spec(spec(pkg), "sm_90a")
    assert not again.cached and again.cubin == c.cubin
    assert "malformed metadata" in caplog.text


def test_entry_of_another_key_filed_under_this_one_is_a_miss(pkg: Path, caplog: pytest.LogCaptureFixture) -> None:
    c = jit.compile_spec(spec(pkg), "sm_90a")
    other = jit.compile_spec(spec(pkg), "sm_90a", ("scale_kernel<3>",))
    entry(c.key).write_bytes(entry(other.key).read_bytes())  # a valid entry, but of another kernel
    jit.clear_cache()
    again = jit.compile_spec(spec(pkg), "sm_90a")
    assert not again.cached and again.lowered[EXPR] == c.lowered[EXPR]
    assert "belongs to another key" in caplog.text
    assert caplog.text.count("belongs to another key") == 1  # one warning, not one per read


def test_fifo_planted_as_an_entry_does_not_hang(pkg: Path, caplog: pytest.LogCaptureFixture) -> None:
    key = jit.cache_key(spec(pkg), "sm_90a", (EXPR,))
    jit.cache_dir()
    os.mkfifo(entry(key))
    c = in_thread(lambda: jit.compile_spec(spec(pkg), "sm_90a"), timeout=30)
    assert not c.cached and "not a regular file" in caplog.text


def test_directory_where_an_entry_should_be_is_a_miss_and_the_kernel_still_builds(pkg: Path, caplog: pytest.LogCaptureFixture) -> None:
    key = jit.cache_key(spec(pkg), "sm_90a", (EXPR,))
    jit.cache_dir()
    entry(key).mkdir()
    c = jit.compile_spec(spec(pkg), "sm_90a")
    assert c.cubin[:4] == b"\x7fELF"
    assert "not a regular file" in caplog.text and "cannot write kernel cache entry" in caplog.text


def test_symlinked_entry_is_never_followed(pkg: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    c = jit.compile_spec(spec(pkg), "sm_90a")
    elsewhere = tmp_path / "victim.bin"
    elsewhere.write_bytes(entry(c.key).read_bytes())  # even a valid entry is not read through a link
    entry(c.key).unlink()
    entry(c.key).symlink_to(elsewhere)
    jit.clear_cache()
    again = jit.compile_spec(spec(pkg), "sm_90a")
    assert not again.cached and "symbolic link" in caplog.text
    assert not entry(c.key).is_symlink() and elsewhere.read_bytes()[:8] == kcache.MAGIC  # replaced, victim untouched


def test_symlink_planted_as_lock_file_truncates_nothing(pkg: Path, tmp_path: Path) -> None:
    victim = tmp_path / "precious.txt"
    victim.write_text("do not truncate me")
    key = jit.cache_key(spec(pkg), "sm_90a", (EXPR,))
    jit.cache_dir()
    Path(str(entry(key)) + ".lock").symlink_to(victim)
    c = jit.compile_spec(spec(pkg), "sm_90a")
    assert c.cubin[:4] == b"\x7fELF" and victim.read_text() == "do not truncate me"


def test_read_only_cache_dir_still_builds_with_one_warning(pkg: Path, caplog: pytest.LogCaptureFixture) -> None:
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.skip("root writes into read-only directories")
    d = jit.cache_dir()
    os.chmod(d, 0o500)
    try:
        c = jit.compile_spec(spec(pkg), "sm_90a")
        jit.compile_spec(spec(pkg), "sm_90a", ("scale_kernel<3>",))
    finally:
        os.chmod(d, 0o700)
    assert c.cubin[:4] == b"\x7fELF" and caplog.text.count("cannot write kernel cache entry") == 1


# --- the directory: refused with a clear KernelError ---------------------------------------------


def test_cache_dir_naming_a_file_is_a_kernel_error(pkg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "afile"
    f.write_text("")
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(f))
    with pytest.raises(CacheError, match="is not a directory.*HWPROFILE_CACHE_DIR"):
        jit.compile_spec(spec(pkg), "sm_90a")


def test_symlinked_cache_dir_is_refused(pkg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(link))
    with pytest.raises(CacheError, match="symbolic link"):
        jit.compile_spec(spec(pkg), "sm_90a")


def test_cache_switch_rejects_unknown_values(pkg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_CACHE", "disabled")
    with pytest.raises(CacheError, match="HWPROFILE_CACHE='disabled' is not valid.*on/off"):
        jit.compile_spec(spec(pkg), "sm_90a")
    monkeypatch.setenv("HWPROFILE_CACHE", "Off")
    jit.compile_spec(spec(pkg), "sm_90a")
    assert not list(Path(os.environ["HWPROFILE_CACHE_DIR"]).glob("*.cubin")) if Path(os.environ["HWPROFILE_CACHE_DIR"]).exists() else True


# --- locks never wait silently, clearing is safe ---------------------------------------------------


def test_stuck_lock_holder_is_named_and_then_ignored(pkg: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    key = jit.cache_key(spec(pkg), "sm_90a", (EXPR,))
    lock_path = f"{entry(key)}.lock"
    jit.cache_dir()
    code = textwrap.dedent(f"""
        import time
        from hwprofile.kernels import cache as kcache
        dfd, d = kcache.open_dir()
        with kcache.entry_lock(dfd, d, {key!r}):
            print("held", flush=True)
            time.sleep(60)
    """)
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(kcache, "LOCK_NOTICE_S", 0.2)
        monkeypatch.setattr(kcache, "LOCK_WAIT_S", 1.0)
        t0 = time.monotonic()
        c = in_thread(lambda: jit.compile_spec(spec(pkg), "sm_90a"), timeout=30)
        assert time.monotonic() - t0 < 20 and c.cubin[:4] == b"\x7fELF"
    finally:
        holder.kill()
        holder.wait()
    assert f"waiting up to 1 s for the kernel cache lock {lock_path}, held by pid {holder.pid} on " in caplog.text
    assert "compiling without it" in caplog.text
    assert entry(key).is_file()  # the duplicate compile still filled the cache


def test_clear_leaves_in_flight_writes_and_held_locks_and_odd_entries(pkg: Path) -> None:
    c = jit.compile_spec(spec(pkg), "sm_90a")
    d = entry(c.key).parent
    young = d / f"{c.key}.cubin.{os.getpid()}.abcdef012345.tmp"
    young.write_bytes(b"partial")
    old = d / f"{c.key}.cubin.1.def012345678.tmp"
    old.write_bytes(b"abandoned")
    os.utime(old, (time.time() - 2 * kcache.TMP_MAX_AGE_S,) * 2)
    weird = d / f"{'0' * 64}.cubin"
    weird.mkdir()
    import filelock

    held = filelock.FileLock(str(d / f"{'1' * 64}.cubin.lock"))
    held.acquire()
    try:
        report = in_thread(lambda: kcache.clear(), timeout=30)
    finally:
        held.release()
    assert report.removed == 1 and not entry(c.key).exists()
    assert young.exists() and not old.exists() and weird.is_dir()
    notes = "\n".join(report.skipped)
    assert "write in flight" in notes and "not a file" in notes and "held by a process" in notes


def test_clear_while_another_process_compiles_never_breaks_it(pkg: Path) -> None:
    """Clear in a loop while another process compiles into the same cache (distinct keys each time)."""
    code = textwrap.dedent(f"""
        from hwprofile.kernels import _pipeline as jit
        from hwprofile.kernels.spec import KernelSpec
        for i in range(12):
            opts = ("-I{pkg}", f"-DROUND={{i}}")
            s = KernelSpec("toy", "toy_cache_kernels", "k.cu", (), None, options=opts, plugin="toy", distribution_version="toy 1.0")
            jit.compile_spec(s, "sm_90a", ("scale_kernel<2>",))
        print("ok")
    """)
    jit.compile_spec(spec(pkg), "sm_90a")  # makes the module importable path known
    root = str(Path(sys.modules["toy_cache_kernels"].__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    while p.poll() is None:
        kcache.clear()
    out, err = p.communicate()
    assert p.returncode == 0 and out.strip() == "ok", err


# --- containment: every fault leaves load() as a KernelError naming its cause -------------------


@pytest.mark.parametrize("fault", ["cache_dir_is_a_file", "nvrtc_missing", "unexpected_in_cache", "source_gone"])
def test_every_fault_reaches_ops_as_a_kernel_error_with_its_cause(
    pkg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    s = spec(pkg)
    if fault == "cache_dir_is_a_file":
        f = tmp_path / "afile"
        f.write_text("")
        monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(f))
        cause = "is not a directory"
    elif fault == "nvrtc_missing":

        def gone() -> None:
            raise ToolchainError("cuda-python's NVRTC bindings are not importable (test)")

        monkeypatch.setattr(toolchain, "_nvrtc", gone)
        monkeypatch.setattr(toolchain, "nvrtc_version", lambda: (13, 0))
        cause = "NVRTC bindings are not importable"
    elif fault == "unexpected_in_cache":

        def boom(*a: object, **k: object) -> None:
            raise RuntimeError("disk on fire")

        monkeypatch.setattr(kcache, "read", boom)
        cause = "RuntimeError: disk on fire"
    else:
        s = s.replace(source="gone.cu")
        cause = "missing from package"
    with pytest.raises(KernelError) as e:
        jit.load(s, "sm_90a", Launch(EXPR, (1, 1, 1), (32, 1, 1)), 0, ())
    assert cause in str(e.value) and "no CUDA device" not in str(e.value)


# --- memos keyed by content, cleared by reset() ---------------------------------------------------


def test_reset_after_a_source_edit_never_returns_the_old_function(pkg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[str] = []

    def fake_load_function(key: str, cubin: bytes, lowered: str, device_index: int, *, what: str) -> object:
        loaded.append(key)
        return object()

    monkeypatch.setattr(launch, "load_function", fake_load_function)
    monkeypatch.setattr(jit, "driver_cuda_version", lambda: None)
    monkeypatch.setattr(launch, "_driver", lambda: None)
    go = Launch(EXPR, (1, 1, 1), (32, 1, 1))
    a = jit.load(spec(pkg), "sm_90a", go, 0, ())
    assert jit.load(spec(pkg), "sm_90a", go, 0, ()) is a and len(loaded) == 1  # a memo hit
    (pkg / "factor.cuh").write_text("#define FACTOR 5\n")
    hwprofile.reset()
    b = jit.load(spec(pkg), "sm_90a", go, 0, ())
    assert b is not a and len(loaded) == 2 and loaded[0] != loaded[1]


def test_reset_clears_every_kernel_pipeline_memo(pkg: Path) -> None:
    jit.compile_spec(spec(pkg), "sm_90a")
    spec(pkg).source_digest(toolchain.include_dirs())
    assert jit._memo_compiled and toolchain.nvrtc_version.cache_info().currsize
    hwprofile.reset()
    assert not jit._memo_compiled and not jit._loaded and not launch._modules
    for f in (toolchain.nvrtc_version, toolchain.nvrtc_archs, toolchain.include_dirs, toolchain.nvrtc_build, kernelspec._source_digest):
        assert f.cache_info().currsize == 0, f


def test_cache_files_are_private(pkg: Path) -> None:
    c = jit.compile_spec(spec(pkg), "sm_90a")
    assert stat.S_IMODE(entry(c.key).stat().st_mode) & 0o077 == 0
    assert stat.S_IMODE(entry(c.key).parent.stat().st_mode) == 0o700


def test_ranks_of_one_host_compile_each_kernel_once(pkg: Path) -> None:
    """Four processes asking for the same cold kernel at once: one compiles, three read its entry."""
    jit.compile_spec(spec(pkg), "sm_90a", ("scale_kernel<7>",))  # warm the module path, not this key
    root = str(Path(sys.modules["toy_cache_kernels"].__file__).parent.parent)
    code = textwrap.dedent(f"""
        import sys, time
        from hwprofile.kernels import _pipeline as jit
        from hwprofile.kernels.spec import KernelSpec
        s = KernelSpec("toy", "toy_cache_kernels", "k.cu", (), None, options=("-I{pkg}",), plugin="toy", distribution_version="toy 1.0")
        sys.stdin.readline()  # start together
        print(jit.compile_spec(s, "sm_90a", ("{EXPR}",)).cached)
    """)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) for _ in range(4)
    ]
    time.sleep(1.0)  # let them import
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs) and sorted(outs) == ["False", "True", "True", "True"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # forking with threads is the point
def test_fork_while_another_thread_holds_a_pipeline_lock(pkg: Path) -> None:
    """The child of a fork taken while another thread holds the memo lock can still compile."""
    jit.compile_spec(spec(pkg), "sm_90a")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with jit._memo_lock, kcache._warned_lock, launch._modules_lock:
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(30)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            threading.Timer(30, lambda: os._exit(3)).start()
            jit._memo_compiled.clear()
            jit.compile_spec(spec(pkg), "sm_90a", ("scale_kernel<4>",))
            launch.clear_cache()
            kcache.clear_cache()
            code = 0
        finally:
            os._exit(code)
    release.set()
    t.join(30)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_directory_where_the_lock_file_should_be_is_a_warning(pkg: Path, caplog: pytest.LogCaptureFixture) -> None:
    key = jit.cache_key(spec(pkg), "sm_90a", (EXPR,))
    jit.cache_dir()
    Path(f"{entry(key)}.lock").mkdir()
    c = in_thread(lambda: jit.compile_spec(spec(pkg), "sm_90a"), timeout=30)
    assert c.cubin[:4] == b"\x7fELF" and entry(key).is_file()
    assert "cannot use the kernel cache lock" in caplog.text


def test_read_only_file_system_still_builds_with_one_warning(
    pkg: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As the read-only directory test, but for any user (root included): creating a file fails with EROFS."""
    import errno

    jit.cache_dir()
    real_open = os.open

    def read_only_open(path: object, flags: int, *args: object, **kw: object) -> int:
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", read_only_open)
    try:
        c = jit.compile_spec(spec(pkg), "sm_90a")
        jit.compile_spec(spec(pkg), "sm_90a", ("scale_kernel<3>",))
    finally:
        monkeypatch.setattr(os, "open", real_open)
    assert c.cubin[:4] == b"\x7fELF" and caplog.text.count("cannot write kernel cache entry") == 1
    assert "Read-only file system" in caplog.text and not list(entry(c.key).parent.glob("*.cubin"))
