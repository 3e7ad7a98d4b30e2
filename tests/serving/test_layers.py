"""Cache layers, the portable key, counters and no-compile mode, on the CPU (issue 23 items 2-4, issue 25's cache items).

NVRTC is the counting fake of ``conftest.seam``; everything else of the pipeline is real.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hwprofile
from hwprofile import ops
from hwprofile.cli import main
from hwprofile.errors import CacheError
from hwprofile.kernels import _pipeline as jit
from hwprofile.kernels import cache as kcache
from hwprofile.kernels import toolchain
from hwprofile.kernels.spec import KernelSpec, Launch, parse_options
from hwprofile.kernels.toolchain import CompiledKernel

from .conftest import Seam
from .toy_kernels import EXPR, toy_package

pytest.importorskip("cuda.bindings.nvrtc")
ROOT = Path(__file__).resolve().parents[2]


def toy_spec(inc: Path) -> KernelSpec:
    return KernelSpec("toy", "toy_layer_kernels", "k.cu", (EXPR,), lambda **kw: Launch(EXPR, (1, 1, 1), (32, 1, 1)),
                      options=(f"-I{inc}",), plugin="toy", distribution_version="toy 1.0")


@pytest.fixture
def toy(seam: Seam, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> KernelSpec:
    site, inc = toy_package(tmp_path / "prefix")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "toy_layer_kernels", raising=False)
    return toy_spec(inc)


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    return path


# --- item 2: the key holds content, never a path ------------------------------------------------


def test_options_in_the_key_carry_no_machine_path() -> None:
    a = toolchain.CompileOptions("sm_90a", ("/venv-a/hwprofile/include", "/venv-a/nvidia/cu13/include"),
                                 parse_options(("-I/opt/a/inc", "--include-path=/opt/a/more", "-include", "/opt/a/pre.h", "-DX=1")))
    b = toolchain.CompileOptions("sm_90a", ("/srv/b/hwprofile/include", "/srv/b/nvidia/cu13/include"),
                                 parse_options(("-I/opt/b/inc", "--include-path=/opt/b/more", "-include", "/opt/b/pre.h", "-DX=1")))
    assert a.as_key() == b.as_key()
    assert not any("/venv-a" in f or "/opt/a" in f for f in a.as_key()["flags"])
    assert toolchain.CompileOptions("sm_90a", a.include_dirs, parse_options(("-DX=2",))).as_key() != a.as_key()  # options still count


def test_same_kernels_at_another_prefix_are_hits(tmp_path: Path) -> None:
    """Two copies of hwprofile and of a kernel package at two prefixes, one cache: the second compiles nothing."""
    cache = private_dir(tmp_path / "cache")
    for name in ("a", "b"):
        prefix = tmp_path / name
        shutil.copytree(ROOT / "core" / "src" / "hwprofile", prefix / "lib" / "hwprofile",
                        ignore=shutil.ignore_patterns("__pycache__"))
        toy_package(prefix)
    code = textwrap.dedent(f"""
        import json, sys
        import hwprofile
        from hwprofile.kernels import _pipeline as jit, toolchain
        from hwprofile.kernels.spec import OWN_INCLUDE, KernelSpec, Launch
        ran = []
        def fake(source, name, options, exprs, *, what):
            ran.append(options.flags())
            return b"cubin", {{e: "lowered" for e in exprs}}, ""
        toolchain.nvrtc_compile = fake
        inc = sys.argv[1]
        spec = KernelSpec("toy", "toy_layer_kernels", "k.cu", ({EXPR!r},), lambda **kw: None, options=("-I" + inc,),
                          plugin="toy", distribution_version="toy 1.0")
        c = jit.compile_spec(spec, "sm_90a")
        print(json.dumps({{"own": OWN_INCLUDE, "file": hwprofile.__file__, "key": c.key, "compiled": len(ran), "flags": ran}}))
    """)
    out = []
    for name in ("a", "b"):
        prefix = tmp_path / name
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(prefix / "lib"), str(prefix / "site")]),
               "HWPROFILE_CACHE_DIR": str(cache)}
        p = subprocess.run([sys.executable, "-c", code, str(prefix / "include")], capture_output=True, text=True, env=env, timeout=120)
        assert p.returncode == 0, p.stderr
        out.append(json.loads(p.stdout))
    a, b = out
    assert a["file"].startswith(str(tmp_path / "a")) and b["own"].startswith(str(tmp_path / "b"))  # really two installs
    assert str(tmp_path / "a") in " ".join(a["flags"][0])  # NVRTC is given the real paths ...
    assert a["compiled"] == 1 and b["compiled"] == 0 and a["key"] == b["key"]  # ... the key is not


# --- item 3: layers ------------------------------------------------------------------------------


def test_last_writable_private_directory_is_written_earlier_ones_are_read(toy: KernelSpec, seam: Seam, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(first))
    c = jit.compile_spec(toy, "sm_90a")  # fills "first"
    hwprofile.reset()
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", os.pathsep.join([str(first), str(second)]))
    again = jit.compile_spec(toy, "sm_90a")
    assert again.cached and again.layer == kcache.layer_label(first, False) and len(seam.compiles) == 1
    assert not (second / kcache.entry_name(c.key)).exists()  # a hit in a read layer is not copied
    jit.compile_spec(toy, "sm_90a", ("scale_kernel<3>",))
    assert len(list(second.glob("*.cubin"))) == 1  # a compile goes to the write layer
    assert len(list(first.glob("*.cubin"))) == 1


@pytest.mark.parametrize("hostile", ["group_writable_dir", "world_writable_entry"])
def test_hostile_read_layer_is_never_loaded(toy: KernelSpec, seam: Seam, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            hostile: str, caplog: pytest.LogCaptureFixture) -> None:
    layer = tmp_path / "layer"
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(layer))
    c = jit.compile_spec(toy, "sm_90a")
    hwprofile.reset()
    if hostile == "group_writable_dir":
        os.chmod(layer, 0o775)
    else:
        os.chmod(layer / kcache.entry_name(c.key), 0o666)
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", os.pathsep.join([str(layer), str(tmp_path / "mine")]))
    if hostile == "group_writable_dir":
        with pytest.raises(CacheError, match=r"kernel cache directory .*layer: it is writable by other users"):
            jit.compile_spec(toy, "sm_90a")
    else:
        with caplog.at_level(logging.WARNING):
            again = jit.compile_spec(toy, "sm_90a")
        assert not again.cached and len(seam.compiles) == 2 and "writable by other users" in caplog.text


def test_missing_read_layer_is_one_warning(toy: KernelSpec, seam: Seam, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", os.pathsep.join([str(tmp_path / "gone"), str(tmp_path / "mine")]))
    with caplog.at_level(logging.WARNING):
        jit.compile_spec(toy, "sm_90a")
        jit.compile_spec(toy, "sm_90a", ("scale_kernel<3>",))
    assert caplog.text.count("is skipped: does not exist") == 1 and len(list((tmp_path / "mine").glob("*.cubin"))) == 2


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_compile_reports_a_bad_cache_directory_once(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str], seam: Seam) -> None:
    """Issue 25: a cache directory that is a symlink to the user's own private directory, or a file, was 19 lines."""
    bad = tmp_path / "bad"
    if kind == "symlink":
        bad.symlink_to(private_dir(tmp_path / "real"))
    else:
        bad.write_text("")
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(bad))
    assert main(["compile", "--arch", "sm_90a"]) == 2
    err = capsys.readouterr().err
    assert err.count(str(bad)) == 1 and ("symbolic link" in err if kind == "symlink" else "is not a directory" in err)
    assert not seam.compiles


def test_cache_clear_never_deletes_the_users_own_files(toy: KernelSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    build = private_dir(tmp_path / "build")
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(build))
    c = jit.compile_spec(toy, "sm_90a")
    theirs = {n: f"user {n}" for n in ("kernel.cubin", "kernel.cubin.lock", "kernel.tmp", "job.owner", f"{'f' * 64}.cubin")}
    for n, text in theirs.items():
        (build / n).write_text(text)  # the last one has hwprofile's name pattern but not its magic
    assert main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert "removed 1 entries" in out and not (build / kcache.entry_name(c.key)).exists()
    assert {p.name: p.read_text() for p in build.iterdir()} == theirs


# --- item 4: counters and no-compile mode ---------------------------------------------------------


def test_counters_say_compiles_hits_per_layer_and_loads(seam: Seam, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ops.warmup(shapes={"gemv": [(1, 4096, 4096)]}, fallbacks=False)
    assert hwprofile.profile(0).stats.kernel_counts() == {"compiles": 1, "loads": 1, "memo": 0, "hits": {}}
    hwprofile.reset()  # a new process, as far as hwprofile knows: the cache is warm
    ops.warmup(shapes={"gemv": [(1, 4096, 4096)]}, fallbacks=False)
    stats = hwprofile.profile(0).stats.as_dict()
    assert stats["kernels"] == {"compiles": 0, "loads": 1, "memo": 0, "hits": {kcache.layer_label(seam.cache, True): 1}}
    assert jit.counters()["hits"] == {kcache.layer_label(seam.cache, True): 1}


def test_show_json_stats_include_the_kernel_counters(seam: Seam, capsys: pytest.CaptureFixture[str]) -> None:
    ops.warmup(shapes={"gemv": [(1, 4096, 4096)]}, fallbacks=False)
    capsys.readouterr()
    assert main(["show", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["kernels"]["compiles"] == 1


@pytest.mark.parametrize("how", ["env", "api"])
def test_no_compile_mode_is_a_clear_error_naming_the_kernel_and_warmup(seam: Seam, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    ops.warmup(shapes={"gemv": [(1, 4096, 4096)]}, fallbacks=False)
    if how == "env":
        monkeypatch.setenv("HWPROFILE_NO_COMPILE", "1")
    else:
        hwprofile.kernels.forbid_compile()
    torch = pytest.importorskip("torch")
    x, w = torch.zeros((1, 4096), dtype=torch.bfloat16), torch.zeros((4096, 4096), dtype=torch.bfloat16)
    ops.gemv(x, w)  # warmed: fine
    why = "HWPROFILE_NO_COMPILE=1" if how == "env" else r"forbid_compile\(\)"
    with pytest.raises(hwprofile.kernels.CompileForbiddenError, match=rf"gemv \(M=1, N=2048, K=4096\).*gemv.*{why}.*warmup"):
        ops.gemv(x, torch.zeros((2048, 4096), dtype=torch.bfloat16))  # another instance: would compile
    assert len(seam.compiles) == 1
    hwprofile.kernels.forbid_compile(False)
    monkeypatch.delenv("HWPROFILE_NO_COMPILE", raising=False)
    ops.gemv(x, torch.zeros((2048, 4096), dtype=torch.bfloat16))
    assert len(seam.compiles) == 2


# --- hwprofile compile --warm / --models / --output ------------------------------------------------


def test_compile_warm_fills_a_layer_with_what_warmup_then_reads(seam: Seam, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    layer = tmp_path / "layer"
    assert main(["compile", "--arch", "sm_90a", "--warm", "gemv:1x4096x4096,1x8192x4096", "--output", str(layer)]) == 0
    assert "cache layer" in capsys.readouterr().out and len(list(layer.glob("*.cubin"))) == 1  # the fallback shape needs none
    assert len(seam.compiles) == 1
    hwprofile.reset()
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", os.pathsep.join([str(layer), str(tmp_path / "fresh")]))
    monkeypatch.setenv("HWPROFILE_NO_COMPILE", "1")
    ops.reset_dispatch()
    report = ops.warmup(shapes={"gemv": [(1, 4096, 4096), (1, 8192, 4096)]}, fallbacks=False)
    assert report.kernels == {"compiles": 0, "loads": 1, "memo": 0, "hits": {kcache.layer_label(layer, False): 1}}
    assert len(seam.compiles) == 1


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--warm", "gemv:1x2"], "is not MxNxK"),
        (["--warm", "nope:1x2x3"], "write OP:MxNxK"),
        (["--models", "no-such-model"], "unknown model"),
    ],
)
def test_compile_warm_refuses_bad_input_in_one_line(seam: Seam, capsys: pytest.CaptureFixture[str], args: list[str], match: str) -> None:
    assert main(["compile", "--arch", "sm_90a", *args]) == 2
    err = capsys.readouterr().err
    assert re.search(match, err) and len(err.strip().splitlines()) == 1 and not seam.compiles


@pytest.mark.parametrize(
    ("setup", "name", "why"),
    [
        ("project", "hwprofile-sm90-cubins", "not a layer package hwprofile wrote"),
        ("file", "hwprofile-sm90-cubins", "not a directory"),
        ("none", 'bad"name', "not a distribution name"),
    ],
)
def test_compile_package_never_writes_over_a_users_project(
    tmp_path: Path, setup: str, name: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--package DIR refuses, before compiling, a directory holding someone's project, a file, or a malformed name."""
    from hwprofile.cli import main

    target = tmp_path / "pkg"
    if setup == "project":
        target.mkdir()
        (target / "pyproject.toml").write_text('[project]\nname = "mine"\n')
    elif setup == "file":
        target.write_text("mine")
    rc = main(["compile", "--arch", "sm_90a", "--package", str(target), "--package-name", name])
    assert rc == 2 and why in capsys.readouterr().err.lower()
    if setup == "project":
        assert (target / "pyproject.toml").read_text() == '[project]\nname = "mine"\n'


def _owned_by(monkeypatch: pytest.MonkeyPatch, uid: int, *paths: Path) -> None:
    """``os.fstat`` of a descriptor open on one of ``paths`` reports owner ``uid`` (as if chowned; no root needed)."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to map a descriptor to its path")
    real = os.fstat
    names = {str(p) for p in paths}

    def fstat(fd: int) -> os.stat_result:
        st = real(fd)
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return st
        if where not in names:
            return st
        fields = list(st)
        fields[4] = uid  # st_uid
        return os.stat_result(fields)

    monkeypatch.setattr(os, "fstat", fstat)


def _read_only_layer(toy: KernelSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, CompiledKernel]:
    """A layer holding the toy kernel's entry, made read-only as a shared layer is: (its directory, the compiled kernel)."""
    shared = tmp_path / "shared"
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(shared))
    c = jit.compile_spec(toy, "sm_90a")
    hwprofile.reset()
    os.chmod(shared, 0o755)
    os.chmod(shared / kcache.entry_name(c.key), 0o644)
    return shared, c


@pytest.mark.parametrize("what", ["layer", "entry"])
def test_a_read_layer_owned_by_another_user_is_refused_naming_the_owner(
    what: str, toy: KernelSpec, seam: Seam, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """docs: a read-only layer may be root's instead of yours, never another user's (who could replace its cubins)."""
    shared, c = _read_only_layer(toy, tmp_path, monkeypatch)
    other = os.getuid() + 4242
    _owned_by(monkeypatch, other, shared if what == "layer" else shared / kcache.entry_name(c.key))
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", os.pathsep.join([str(shared), str(tmp_path / "mine")]))
    with caplog.at_level(logging.WARNING):
        again = jit.compile_spec(toy, "sm_90a")
    assert not again.cached and len(seam.compiles) == 2  # refused, not read: compiled here
    assert str(shared) in caplog.text and f"uid {other}" in caplog.text
    if what == "layer":
        assert "neither you nor root" in caplog.text and "chown -R root" in caplog.text
    else:
        assert "owned by another user" in caplog.text


def test_a_read_layer_owned_by_root_is_read(toy: KernelSpec, seam: Seam, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared, c = _read_only_layer(toy, tmp_path, monkeypatch)
    _owned_by(monkeypatch, 0, shared, shared / kcache.entry_name(c.key))
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", os.pathsep.join([str(shared), str(tmp_path / "mine")]))
    hit = jit.compile_spec(toy, "sm_90a")
    assert hit.cached and hit.layer == kcache.layer_label(shared, False) and len(seam.compiles) == 1
