"""NVRTC toolchain without a GPU: compile, cache keys, corruption, permissions, races, errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hwprofile
from hwprofile.errors import KernelCompileError, KernelError, PluginError, ToolchainError
from hwprofile.kernels import KernelSpec, Launch, toolchain
from hwprofile.kernels import _pipeline as jit
from hwprofile.kernels import cache as kcache
from hwprofile.plugin import PREBUILT_SHAPES

pytest.importorskip("cuda.bindings.nvrtc")

SRC = """
#include <cuda_bf16.h>
template <int S>
__global__ void scale_kernel(float* out, const __nv_bfloat16* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = S * __bfloat162float(x[i]);
}
"""


@pytest.fixture
def pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "site"
    (root / "toy_kernels").mkdir(parents=True)
    (root / "toy_kernels" / "__init__.py").write_text("")
    (root / "toy_kernels" / "k.cu").write_text(SRC)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "toy_kernels", raising=False)
    cache = tmp_path / "cache"
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(cache))
    hwprofile.reset()  # forgets compiled-kernel memos and source digests of earlier tests
    return root / "toy_kernels"


def spec(version: str = "toy 1.0", options: tuple[str, ...] = ()) -> KernelSpec:
    return KernelSpec(
        "toy",
        "toy_kernels",
        "k.cu",
        ("scale_kernel<2>",),
        lambda **kw: Launch("scale_kernel<2>", (1, 1, 1), (32, 1, 1)),
        options=options,
        plugin="toy",
        distribution_version=version,
    )


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a", "sm_103a", "sm_120a", "sm_121a"])
def test_compiles_cubin_for_each_target(pkg: Path, target: str) -> None:
    c = jit.compile_spec(spec(), target)
    assert c.cubin[:4] == b"\x7fELF" and not c.cached
    assert "scale_kernel" in c.lowered["scale_kernel<2>"]


def test_second_compile_hits_disk_cache_in_a_new_process(pkg: Path) -> None:
    jit.compile_spec(spec(), "sm_90a")
    hwprofile.reset()  # a new process remembers nothing: only the disk cache is left
    assert jit.compile_spec(spec(), "sm_90a").cached


def test_every_key_part_changes_the_key(pkg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = jit.cache_key(spec(), "sm_90a", ("scale_kernel<2>",))
    assert jit.cache_key(spec(), "sm_100a", ("scale_kernel<2>",)) != base
    assert jit.cache_key(spec(options=("-DX=1",)), "sm_90a", ("scale_kernel<2>",)) != base
    assert jit.cache_key(spec(version="toy 1.1"), "sm_90a", ("scale_kernel<2>",)) != base
    assert jit.cache_key(spec(), "sm_90a", ("scale_kernel<3>",)) != base
    (pkg / "k.cu").write_text(SRC + "\n// edit\n")
    hwprofile.reset()  # forgets the source digest: the edit is seen
    edited = jit.cache_key(spec(), "sm_90a", ("scale_kernel<2>",))
    assert edited != base
    monkeypatch.setattr(toolchain, "nvrtc_version", lambda: (99, 0))
    assert jit.cache_key(spec(), "sm_90a", ("scale_kernel<2>",)) != edited


def test_included_header_content_is_in_the_key(pkg: Path) -> None:
    (pkg / "extra.cuh").write_text("#define FACTOR 1\n")
    (pkg / "k.cu").write_text('#include "extra.cuh"\n' + SRC)
    hwprofile.reset()
    a = jit.cache_key(spec(), "sm_90a", ("scale_kernel<2>",))
    (pkg / "extra.cuh").write_text("#define FACTOR 2\n")
    hwprofile.reset()  # forgets the source digest: the header edit is seen
    assert jit.cache_key(spec(), "sm_90a", ("scale_kernel<2>",)) != a


@pytest.mark.parametrize("damage", ["truncate", "zero", "flip"])
def test_corrupt_entry_is_a_miss_and_replaced(pkg: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    c = jit.compile_spec(spec(), "sm_90a")
    path = Path(os.environ["HWPROFILE_CACHE_DIR"]) / f"{c.key}.cubin"
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) // 2], "zero": b"", "flip": data[:-1] + bytes([data[-1] ^ 1])}[damage])
    jit.clear_cache()  # the in-process memo would answer without reading the damaged entry
    again = jit.compile_spec(spec(), "sm_90a")
    assert not again.cached and again.cubin == c.cubin
    assert "truncated or corrupt" in caplog.text
    replaced = kcache.decode(path.read_bytes(), c.key)[0]
    assert replaced is not None and replaced.cubin == c.cubin


def test_cache_dir_is_private_and_shared_dirs_are_refused(pkg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = jit.cache_dir()
    assert (d.stat().st_mode & 0o777) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(shared))
    with pytest.raises(KernelError, match="writable by other users"):
        jit.compile_spec(spec(), "sm_90a")


def test_world_writable_entry_is_not_loaded_but_replaced(pkg: Path, caplog: pytest.LogCaptureFixture) -> None:
    c = jit.compile_spec(spec(), "sm_90a")
    path = Path(os.environ["HWPROFILE_CACHE_DIR"]) / f"{c.key}.cubin"
    os.chmod(path, 0o666)
    jit.clear_cache()  # the in-process memo would answer without reading the entry on disk
    again = jit.compile_spec(spec(), "sm_90a")
    assert not again.cached and "writable by other users" in caplog.text
    assert (path.stat().st_mode & 0o077) == 0


def test_cache_off_compiles_without_writing(pkg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_CACHE", "off")
    jit.compile_spec(spec(), "sm_90a")
    d = Path(os.environ["HWPROFILE_CACHE_DIR"])
    assert not d.exists() or not list(d.glob("*.cubin"))


def test_syntax_error_names_kernel_plugin_target_and_log(pkg: Path) -> None:
    (pkg / "k.cu").write_text("__global__ void broken( { }\n")
    hwprofile.reset()
    with pytest.raises(KernelCompileError) as e:
        jit.compile_spec(spec(), "sm_120a")
    msg = str(e.value)
    assert "'toy'" in msg and "plugin toy" in msg and "sm_120a" in msg and "error" in msg


def test_target_unknown_to_nvrtc(pkg: Path) -> None:
    with pytest.raises(ToolchainError, match=r"kernel 'toy' of plugin toy .*cannot compile for sm_999a"):
        jit.compile_spec(spec(), "sm_999a")


def test_missing_source_names_plugin_and_package_data(pkg: Path) -> None:
    bad = KernelSpec("toy", "toy_kernels", "nope.cu", (), spec().configure, plugin="toy")
    with pytest.raises(PluginError, match="package data"):
        bad.source_path()


def test_concurrent_processes_into_empty_cache(pkg: Path, tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(pkg.parent)!r})
        from hwprofile.kernels import _pipeline as jit
        from hwprofile.kernels import KernelSpec, Launch
        s = KernelSpec("toy", "toy_kernels", "k.cu", ("scale_kernel<2>",), None, plugin="toy", distribution_version="toy 1.0")
        print(len(jit.compile_spec(s, "sm_90a").cubin))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=os.environ.copy()) for _ in range(4)]
    outs = [p.communicate()[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs) and len(set(outs)) == 1
    entries = list(Path(os.environ["HWPROFILE_CACHE_DIR"]).glob("*.cubin"))
    assert len(entries) == 1 and kcache.decode(entries[0].read_bytes(), entries[0].stem)[0] is not None


def test_load_without_gpu_says_so(pkg: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(KernelError, match="no CUDA device"):
        jit.load(spec(), "sm_90a", Launch("scale_kernel<2>", (1, 1, 1), (32, 1, 1)), 0, ())


def test_driver_too_old_for_nvrtc_is_explained() -> None:
    major = jit.nvrtc_version()[0]
    msg = jit.check_driver_for_nvrtc((major - 1, 8))
    assert msg and f"hwprofile[cu{major - 1}]" in msg
    assert jit.check_driver_for_nvrtc((major, 0)) is None


def test_hwprofile_compile_all_plugins_all_targets(capsys: pytest.CaptureFixture[str]) -> None:
    from hwprofile.cli import main

    code = main(["compile", "--arch", "sm_90a,sm_100a,sm_103a,sm_120a,sm_121a", "--jobs", "2", "--json"])
    import json

    rows = json.loads(capsys.readouterr().out)
    assert code == 0
    assert {(r["target"], r["op"]) for r in rows} >= {
        (t, op)
        for t in ("sm_90a", "sm_100a", "sm_103a", "sm_120a", "sm_121a")
        for op in PREBUILT_SHAPES  # what every architecture plugin serves: the family's ops (compile runs no downstream plugin)
    }
    assert all(not r["errors"] and r["cubin_bytes"] > 0 for r in rows)


def test_compiling_leaves_the_interpreters_shared_bytes_intact(tmp_path: Path) -> None:
    """NVRTC writes into the buffers it is given. An empty compile log is one byte (its NUL), and
    ``b" " * 1`` is the ``b" "`` constant itself, which is the interpreter's shared one-byte object
    when the module was compiled from source (no .pyc: ``pip install --no-compile``, as on the H200
    runs): writing the NUL there turned every ``b" "`` of the process into ``b"\\0"`` (found when the
    whole suite ran on the H200, where a later ``doctor --json`` lost its spaces). The child compiles
    hwprofile from source and stands in an NVRTC whose log is empty and which writes through the
    pointer as the C function does (NVRTC here always logs ptxas's report)."""
    code = textwrap.dedent(
        """
        import ctypes, sys
        from cuda.bindings import nvrtc
        from hwprofile.kernels import toolchain

        data = sys.getsizeof(b"") - 1  # where a bytes object's data starts: what a char* argument points at

        def write_nul(prog, buf):
            ptr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf)) if isinstance(buf, bytearray) else id(buf) + data
            ctypes.memset(ptr, 0, len(buf))
            return (nvrtc.nvrtcResult.NVRTC_SUCCESS,)

        nvrtc.nvrtcGetProgramLogSize = lambda prog: (nvrtc.nvrtcResult.NVRTC_SUCCESS, 1)  # an empty log
        nvrtc.nvrtcGetProgramLog = write_nul
        src = 'extern "C" __global__ void k(float* p) { p[0] = 1.0f; }'
        cubin, _, log = toolchain.nvrtc_compile(src, "k.cu", toolchain.CompileOptions("sm_90a"), [], what="k")
        assert log == "" and cubin
        assert list(b" ") == [32] and b" ".join([b"a", b"b"]) == bytes([97, 32, 98]), repr(b" ")
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}  # modules compiled from source
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
