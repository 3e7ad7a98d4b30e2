"""NVRTC toolchain: kernel specs from plugins, compile to cubin, on-disk cache, load, launch.

* Always cubin for the exact target (``sm_90a``...), never PTX: PTX from a newer NVRTC cannot be
  loaded by an older driver, a cubin of the same CUDA major can.
* Cache key: SHA-256 over source, every header it includes (transitively), options, target, name
  expressions, NVRTC version and the supplying distribution's version.
* Entries are written to a temp file in the cache directory and ``os.replace``d into place; a
  per-key ``filelock`` only avoids duplicate compiles. Each entry carries a SHA-256 of its payload,
  so a truncated or corrupt entry is a miss (recompiled, replaced, one warning).
* The cache directory is private (0700); a directory or entry other users can write is refused,
  because loading a cubin runs its code.
* Loaded functions are memoised per (key, device): a repeated launch is a dict lookup. Launches go
  to ``torch.cuda.current_stream()`` of the tensor's device, so CUDA graph capture records them.

CUDA (cuda-python) and torch are imported only when a kernel is compiled or launched.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import stat
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from . import _state
from ._log import get_logger
from .errors import KernelCompileError, KernelError, ToolchainError
from .kernelspec import OWN_INCLUDE, KernelSpec, Launch

log = get_logger(__name__)

CACHE_DIR_ENV = "HWPROFILE_CACHE_DIR"
CACHE_ENV = "HWPROFILE_CACHE"
_MAGIC = b"HWPCUBIN"
_FORMAT = 1

# Oldest NVRTC (major, minor) that knows each target's architecture.
MIN_NVRTC: dict[str, tuple[int, int]] = {
    "sm_80": (11, 0), "sm_89": (11, 8), "sm_90": (12, 0), "sm_90a": (12, 0),
    "sm_100": (12, 8), "sm_100a": (12, 8), "sm_103": (12, 9), "sm_103a": (12, 9),
    "sm_120": (12, 8), "sm_120a": (12, 8), "sm_121": (12, 9), "sm_121a": (12, 9),
}


# --- toolchain -----------------------------------------------------------------------------------


def _nvrtc() -> Any:
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise ToolchainError(
            f"cuda-python's NVRTC bindings are not importable ({exc}); install them with "
            "pip install 'hwprofile[cu13]' (CUDA 13 driver, 580+) or 'hwprofile[cu12]' (CUDA 12 driver)"
        ) from None
    return nvrtc


def _check(result: Any, what: str) -> None:
    nvrtc = _nvrtc()
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, msg = nvrtc.nvrtcGetErrorString(result)
        raise ToolchainError(f"{what} failed: {msg.decode() if isinstance(msg, bytes) else msg}")


@cache
def nvrtc_version() -> tuple[int, int]:
    """The installed NVRTC's (major, minor)."""
    err, major, minor = _nvrtc().nvrtcVersion()
    _check(err, "nvrtcVersion")
    return int(major), int(minor)


@cache
def nvrtc_archs() -> tuple[int, ...]:
    """Numeric architectures the installed NVRTC can compile for (90, 100, 120...)."""
    err, archs = _nvrtc().nvrtcGetSupportedArchs()
    _check(err, "nvrtcGetSupportedArchs")
    return tuple(int(a) for a in archs)


@cache
def cuda_headers() -> tuple[str | None, str | None]:
    """``(directory, problem)``: the CUDA headers of NVRTC's major (:mod:`hwprofile.headers`)."""
    from . import headers

    try:
        import cuda.pathfinder as pf

        found = pf.find_nvidia_header_directory("cudart")
    except Exception:  # noqa: BLE001 - the other candidates are still searched; none found is reported with the fix
        found = None
    try:
        major: int | None = nvrtc_version()[0]
    except ToolchainError:
        major = None  # no NVRTC: nothing will compile, and that error is reported where compiling starts
    return headers.choose(major, headers.candidates(str(found) if found else None))


@cache
def include_dirs() -> tuple[str, ...]:
    """hwprofile's shared kernel headers, then the CUDA headers of NVRTC's major."""
    cudart, _ = cuda_headers()
    return (OWN_INCLUDE, cudart) if cudart else (OWN_INCLUDE,)


_state.on_reset(cuda_headers.cache_clear)  # a reset may follow installing the matching headers
_state.on_reset(include_dirs.cache_clear)


def check_toolchain() -> None:
    """Raise one :class:`ToolchainError` saying what is missing (NVRTC, matching headers), or return."""
    nvrtc_version()
    _, problem = cuda_headers()
    if problem:
        raise ToolchainError(problem)


def check_target(target: str) -> None:
    """Raise a clear error if the installed NVRTC cannot compile for ``target``."""
    num = int(re.sub(r"\D", "", target))
    if num not in nvrtc_archs():
        need = MIN_NVRTC.get(target)
        v = nvrtc_version()
        hint = f"it needs NVRTC {need[0]}.{need[1]} or newer" if need else "no known NVRTC supports it"
        raise ToolchainError(
            f"NVRTC {v[0]}.{v[1]} cannot compile for {target} ({hint}); upgrade with pip install -U 'hwprofile[cu13]'"
        )


def cache_key(spec: KernelSpec, target: str, expressions: Sequence[str]) -> str:
    """Every input that changes the cubin: source+headers, options, target, names, NVRTC, plugin version."""
    doc = {
        "format": _FORMAT,
        "source": spec.source_digest(),
        "options": list(spec.options),
        "target": target,
        "names": list(expressions),
        "nvrtc": list(nvrtc_version()),
        "plugin": spec.distribution_version,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class CompiledKernel:
    """A cubin and the mangled names of its instances, plus what the compile reported."""

    key: str
    target: str
    cubin: bytes
    lowered: Mapping[str, str]
    log: str = ""
    cached: bool = False
    seconds: float = 0.0

    @property
    def registers(self) -> int | None:
        m = re.findall(r"Used (\d+) registers", self.log)
        return max(int(x) for x in m) if m else None

    @property
    def spill_bytes(self) -> int | None:
        m = re.findall(r"(\d+) bytes spill stores", self.log)
        return max(int(x) for x in m) if m else None


def nvrtc_compile(source: str, name: str, target: str, expressions: Sequence[str], options: Sequence[str], *, what: str) -> tuple[bytes, dict[str, str], str]:
    """Compile ``source`` to a cubin for ``target``; return (cubin, lowered names, log)."""
    nvrtc = _nvrtc()
    try:
        check_target(target)
    except ToolchainError as exc:
        raise ToolchainError(f"cannot compile {what}: {exc}") from None
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        for e in expressions:
            _check(nvrtc.nvrtcAddNameExpression(prog, e.encode())[0], f"adding name expression {e!r}")
        opts = [f"--gpu-architecture={target}", "-std=c++17", "--ptxas-options=--verbose", *(f"-I{d}" for d in include_dirs()), *options]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        _, n = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * n
        nvrtc.nvrtcGetProgramLog(prog, buf)
        text = buf.rstrip(b"\0 ").decode(errors="replace")
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            lines = "\n".join("  " + ln for ln in text.splitlines() if ln.strip() and "Used" not in ln)
            raise KernelCompileError(f"NVRTC failed to compile {what} for {target}:\n{lines}")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin)[0], "nvrtcGetCUBIN")
        lowered = {}
        for e in expressions:
            err, low = nvrtc.nvrtcGetLoweredName(prog, e.encode())
            _check(err, f"lowered name of {e!r}")
            lowered[e] = low.decode() if isinstance(low, bytes) else low
        return cubin, lowered, text
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


# --- on-disk cache -------------------------------------------------------------------------------


def cache_enabled() -> bool:
    return os.environ.get(CACHE_ENV, "on").strip().lower() not in ("off", "0", "false", "no")


def cache_dir(create: bool = True) -> Path:
    """The private cache directory (``HWPROFILE_CACHE_DIR`` or the user cache dir), checked for safety."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        d = Path(env)
    else:
        import platformdirs

        d = Path(platformdirs.user_cache_dir("hwprofile")) / "kernels"
    if create and not d.exists():
        d.mkdir(parents=True, mode=0o700, exist_ok=True)
        os.chmod(d, 0o700)
    if d.exists():
        _refuse_if_shared(d, "cache directory", f"chmod 700 {d}, or point {CACHE_DIR_ENV} at a private directory")
    return d


def _refuse_if_shared(p: Path, what: str, fix: str) -> None:
    st = p.stat()
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        raise KernelError(
            f"refusing kernel {what} {p}: it is writable by other users or owned by another user "
            f"(mode {stat.filemode(st.st_mode)}), and loading a cubin runs its code; {fix}"
        )


def _encode(compiled: CompiledKernel) -> bytes:
    meta = json.dumps({"target": compiled.target, "lowered": dict(compiled.lowered), "log": compiled.log}).encode()
    body = struct.pack("<I", len(meta)) + meta + compiled.cubin
    return _MAGIC + hashlib.sha256(body).digest() + body


def _decode(key: str, data: bytes) -> CompiledKernel | None:
    if len(data) < len(_MAGIC) + 36 or not data.startswith(_MAGIC):
        return None
    digest, body = data[len(_MAGIC) : len(_MAGIC) + 32], data[len(_MAGIC) + 32 :]
    if hashlib.sha256(body).digest() != digest:
        return None
    (n,) = struct.unpack("<I", body[:4])
    try:
        meta = json.loads(body[4 : 4 + n])
    except ValueError:
        return None
    return CompiledKernel(key, meta["target"], body[4 + n :], meta["lowered"], meta.get("log", ""), cached=True)


def _read_entry(path: Path, key: str) -> CompiledKernel | None:
    if not path.exists():
        return None
    _refuse_if_shared(path, "cache entry", f"delete it (hwprofile cache clear) and chmod 700 {path.parent}")
    entry = _decode(key, path.read_bytes())
    if entry is None:
        log.warning("kernel cache entry %s is truncated or corrupt; recompiling and replacing it", path)
    return entry


def _write_entry(path: Path, compiled: CompiledKernel) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_encode(compiled))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_memo_compiled: dict[str, CompiledKernel] = {}
_memo_lock = threading.Lock()


def compile_spec(spec: KernelSpec, target: str, expressions: Sequence[str] | None = None) -> CompiledKernel:
    """Compile ``spec``'s instances (or the given name expressions) for ``target``, through the cache."""
    exprs = tuple(spec.instances if expressions is None else expressions)
    key = cache_key(spec, target, exprs)
    hit = _memo_compiled.get(key)
    if hit is not None:
        return CompiledKernel(hit.key, hit.target, hit.cubin, hit.lowered, hit.log, cached=True)
    what = f"kernel {spec.op!r} of plugin {spec.plugin or '?'} ({spec.source})"
    use_cache = cache_enabled()
    t0 = time.perf_counter()
    if use_cache:
        d = cache_dir()
        path = d / f"{key}.cubin"
        entry = _read_entry(path, key)
        if entry is None:
            import filelock

            with filelock.FileLock(str(path) + ".lock", timeout=600):
                entry = _read_entry(path, key)  # another process may have finished it meanwhile
                if entry is None:
                    cubin, lowered, text = nvrtc_compile(spec.read_source(), spec.source, target, exprs, spec.options, what=what)
                    entry = CompiledKernel(key, target, cubin, lowered, text, cached=False)
                    _write_entry(path, entry)
    else:
        cubin, lowered, text = nvrtc_compile(spec.read_source(), spec.source, target, exprs, spec.options, what=what)
        entry = CompiledKernel(key, target, cubin, lowered, text, cached=False)
    entry = CompiledKernel(entry.key, entry.target, entry.cubin, entry.lowered, entry.log, entry.cached, time.perf_counter() - t0)
    with _memo_lock:
        _memo_compiled[key] = entry
    return entry


def clear_cache() -> int:
    """Delete every cache entry; return how many were removed."""
    d = cache_dir(create=False)
    n = 0
    if d.exists():
        for p in d.iterdir():
            if p.suffix in (".cubin", ".lock", ".tmp") or p.name.endswith(".tmp"):
                p.unlink(missing_ok=True)
                n += p.suffix == ".cubin"
    _memo_compiled.clear()
    return n


# --- load and launch -----------------------------------------------------------------------------


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise ToolchainError(f"cuda-python is not installed ({exc}); pip install 'hwprofile[cu13]'") from None
    return driver


def _cu(result: Any, what: str) -> Any:
    """Unpack a cuda.bindings driver result tuple, raising on error."""
    cu = _driver()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        raise KernelError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def driver_cuda_version() -> tuple[int, int] | None:
    """The driver's CUDA version, through the driver API (initialises it), or None without a driver."""
    try:
        cu = _driver()
        (err,) = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return None
        v = _cu(cu.cuDriverGetVersion(), "cuDriverGetVersion")
        return int(v) // 1000, (int(v) % 1000) // 10
    except Exception:  # noqa: BLE001
        return None


def check_driver_for_nvrtc(driver: tuple[int, int] | None) -> str | None:
    """A plain-words problem if cubins from this NVRTC cannot load on this driver, else None."""
    if driver is None:
        return None
    nv = nvrtc_version()
    if nv[0] > driver[0]:
        return (
            f"NVRTC {nv[0]}.{nv[1]} makes cubins that need a CUDA {nv[0]} driver, but the driver supports CUDA "
            f"{driver[0]}.{driver[1]}; install 'hwprofile[cu{driver[0]}]' or upgrade the driver"
        )
    return None


class _ArgPack:
    """Pre-packed ``void**`` argument array: per launch only the slot values change (no allocation)."""

    def __init__(self, types: Sequence[type]) -> None:
        self.slots = [t() for t in types]
        self.array = (ctypes.c_void_p * len(types))(*[ctypes.addressof(s) for s in self.slots])
        self.address = ctypes.addressof(self.array)


class LoadedKernel:
    """A function loaded into torch's context of one device, with a reusable argument pack."""

    def __init__(self, function: Any, name: str, arg_types: Sequence[type]) -> None:
        self.function = function
        self.name = name
        self._pack = _ArgPack(arg_types)
        self._lock = threading.Lock()
        self._cu = _driver()
        self._smem_set = 0
        self._pdl_configs: dict[tuple[Launch, int], Any] = {}

    def launch(self, launch: Launch, stream: int, args: Sequence[Any]) -> None:
        """Launch on ``stream`` (a CUstream handle as int). Arguments must be checked by the caller."""
        cu = self._cu
        if launch.shared_bytes > 48 * 1024 and launch.shared_bytes > self._smem_set:
            _cu(
                cu.cuFuncSetAttribute(self.function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, launch.shared_bytes),
                f"raising the shared-memory limit of {self.name} to {launch.shared_bytes} bytes",
            )
            self._smem_set = launch.shared_bytes
        g, b = launch.grid, launch.block
        with self._lock:
            for slot, value in zip(self._pack.slots, args, strict=True):
                slot.value = value
            if launch.pdl:
                cfg = self._pdl_configs.get((launch, stream))
                if cfg is None:
                    cfg = self._pdl_configs[(launch, stream)] = _pdl_config(cu, launch, stream)
                (err,) = cu.cuLaunchKernelEx(cfg, self.function, self._pack.address, 0)
            else:
                (err,) = cu.cuLaunchKernel(self.function, g[0], g[1], g[2], b[0], b[1], b[2], launch.shared_bytes, stream, self._pack.address, 0)
        if err != cu.CUresult.CUDA_SUCCESS:
            _cu(err, f"launching {self.name} grid={g} block={b} smem={launch.shared_bytes}")


def _pdl_config(cu: Any, launch: Launch, stream: int) -> Any:
    """A reusable launch configuration with programmatic stream serialization (built once per launch and stream)."""
    attr = cu.CUlaunchAttribute()
    attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = launch.grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = launch.block
    cfg.sharedMemBytes = launch.shared_bytes
    cfg.hStream = stream
    cfg.attrs = [attr]
    cfg.numAttrs = 1
    return cfg


_loaded: dict[tuple[str, str, int], LoadedKernel] = {}
_modules: dict[tuple[str, int], Any] = {}


def load(spec: KernelSpec, target: str, launch: Launch, device_index: int, arg_types: Sequence[type]) -> LoadedKernel:
    """The loaded function for ``launch.name_expression`` on ``device_index`` (memoised)."""
    memo_key = (spec.op + "|" + target, launch.name_expression, device_index)
    k = _loaded.get(memo_key)
    if k is not None:
        return k
    compiled = compile_spec(spec, target, (launch.name_expression,))  # one instance: a cold miss stays short
    cu = _driver()
    problem = check_driver_for_nvrtc(driver_cuda_version())
    if problem:
        raise ToolchainError(problem)
    mod_key = (compiled.key, device_index)
    module = _modules.get(mod_key)
    if module is None:
        import torch

        if not torch.cuda.is_available():
            raise KernelError(f"cannot load kernel {spec.op!r}: no CUDA device is available to this process")
        torch.cuda.init()
        dev = _cu(cu.cuDeviceGet(device_index), "cuDeviceGet")
        ctx = _cu(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")  # torch's context
        _cu(cu.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
        try:
            module = _cu(cu.cuModuleLoadData(compiled.cubin), f"loading the cubin of {spec.op!r} for {target}")
        finally:
            _cu(cu.cuCtxPopCurrent(), "cuCtxPopCurrent")
        _modules[mod_key] = module
    fn = _cu(cu.cuModuleGetFunction(module, compiled.lowered[launch.name_expression].encode()), f"finding {launch.name_expression}")
    k = LoadedKernel(fn, launch.name_expression, arg_types)
    _loaded[memo_key] = k
    return k


@dataclass
class CompileReport:
    """What compiling every instance of one (spec, target) did, for ``hwprofile compile``."""

    spec: KernelSpec
    target: str
    compiled: int = 0
    cached: int = 0
    seconds: float = 0.0
    cubin_bytes: int = 0
    registers: int | None = None
    spill_bytes: int = 0
    errors: list[str] = field(default_factory=list)


def compile_all(
    specs: Iterable[tuple[KernelSpec, str]], jobs: int, progress: Callable[[int, int, str], None] | None = None
) -> list[CompileReport]:
    """Compile every instance of each (spec, target), one NVRTC program per instance, in threads.

    Each instance is its own cache entry, exactly as a first launch would compile it, so this
    pre-warms the cache that ops use. NVRTC releases the GIL, so threads run in parallel.
    """
    from concurrent.futures import ThreadPoolExecutor

    reports = [CompileReport(spec, target) for spec, target in specs]
    work = [(r, e) for r in reports for e in r.spec.instances]
    lock = threading.Lock()
    done = [0]

    def one(item: tuple[CompileReport, str]) -> None:
        r, expr = item
        try:
            c = compile_spec(r.spec, r.target, (expr,))
        except Exception as exc:  # noqa: BLE001 - reported per kernel in the table
            with lock:
                r.errors.append(f"{expr}: {exc}")
        else:
            with lock:
                r.cached += c.cached
                r.compiled += not c.cached
                r.seconds += c.seconds
                r.cubin_bytes += len(c.cubin)
                if c.registers is not None:
                    r.registers = max(r.registers or 0, c.registers)
                r.spill_bytes = max(r.spill_bytes, c.spill_bytes or 0)
        with lock:
            done[0] += 1
            if progress:
                progress(done[0], len(work), f"{r.spec.op} {r.target}")

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        list(ex.map(one, work))
    return reports
