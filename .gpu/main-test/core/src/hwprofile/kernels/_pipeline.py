"""The kernel pipeline in one call: spec -> cubin (through the cache) -> loaded function.

The stages live in their own modules, as cuda.core splits them:

* :mod:`hwprofile.kernels.toolchain`: NVRTC, header search, :class:`~hwprofile.kernels.toolchain.CompileOptions`;
* :mod:`hwprofile.kernels.cache`: the on-disk cache (key, directory policy, entry format, locking);
* :mod:`hwprofile.kernels.launch`: module loading, argument packing, launching.

This module joins them; callers (``ops``, the CLI, ``doctor``, ``distributed``) reach it through
the lazy face :mod:`hwprofile.kernels`, tests import it directly. It must never let a fault
escape :func:`load`, what ops call, as anything but a
:class:`~hwprofile.errors.KernelError`: ops turn that into the one documented warning and the
torch fallback, so no cache or toolchain fault reaches an engine.

In-process memos (compiled kernels, loaded functions) are keyed by the cache key, a hash of every
compile input, and cleared by ``hwprofile.reset()``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .. import _state
from ..errors import HwprofileError, KernelError, ToolchainError
from . import cache as kcache
from . import toolchain
from .launch import LoadedKernel, check_driver_for_nvrtc, driver_cuda_version
from .spec import KernelSpec, Launch
from .toolchain import (
    MIN_NVRTC,
    CompiledKernel,
    CompileOptions,
    check_target,
    check_toolchain,
    cuda_headers,
    include_dirs,
    nvrtc_archs,
    nvrtc_version,
)

__all__ = [
    "MIN_NVRTC",
    "CompileOptions",
    "CompileReport",
    "CompiledKernel",
    "KernelSpec",
    "Launch",
    "LoadedKernel",
    "cache_dir",
    "cache_enabled",
    "cache_key",
    "check_driver_for_nvrtc",
    "check_target",
    "check_toolchain",
    "clear_cache",
    "compile_all",
    "compile_spec",
    "cuda_headers",
    "driver_cuda_version",
    "include_dirs",
    "load",
    "nvrtc_archs",
    "nvrtc_version",
]

def options_for(spec: KernelSpec, target: str) -> CompileOptions:
    """The compile options of ``spec`` for ``target``: fixed include directories, then the spec's options."""
    return CompileOptions(target, include_dirs(), tuple(spec.options))


def cache_key(spec: KernelSpec, target: str, expressions: Sequence[str]) -> str:
    """The cache key: a hash of every compile input (see :mod:`hwprofile.kernels.cache`)."""
    return kcache.key_of(kcache.key_document(spec, options_for(spec, target), tuple(expressions)))


def cache_enabled() -> bool:
    return kcache.cache_enabled()


def cache_dir(create: bool = True) -> Path:
    """The checked cache directory (created private if ``create``); a :class:`CacheError` if unusable."""
    opened = kcache.open_dir(create)
    if opened is None:
        return kcache.cache_dir()
    os.close(opened[0])
    return opened[1]


_memo_compiled: dict[str, CompiledKernel] = {}
_loaded: dict[tuple[str, str, int, tuple[type, ...]], LoadedKernel] = {}
_memo_lock = threading.Lock()


@_state.in_forked_child
def _reinit_locks_in_child() -> None:
    global _memo_lock
    _memo_lock = threading.Lock()  # a thread of the parent may have held it at the fork; it does not exist here



def compile_spec(spec: KernelSpec, target: str, expressions: Sequence[str] | None = None) -> CompiledKernel:
    """Compile ``spec``'s instances (or the given name expressions) for ``target``, through the cache.

    Raises :class:`KernelError` (or :class:`~hwprofile.errors.PluginError` for a source the plugin
    does not ship); any other fault is wrapped into a ``KernelError`` that names its cause.
    """
    what = f"kernel {spec.op!r} of plugin {spec.plugin or '?'} ({spec.source})"
    try:
        return _compile(spec, target, tuple(spec.instances if expressions is None else expressions), what)
    except HwprofileError:
        raise
    except Exception as exc:
        raise KernelError(f"cannot build {what} for {target}: {type(exc).__name__}: {exc}") from exc


def _compile(spec: KernelSpec, target: str, exprs: tuple[str, ...], what: str) -> CompiledKernel:
    options = options_for(spec, target)
    doc = kcache.key_document(spec, options, exprs)
    key = kcache.key_of(doc)
    hit = _memo_compiled.get(key)
    if hit is not None:
        return CompiledKernel(hit.key, hit.target, hit.cubin, hit.lowered, hit.log, cached=True)
    t0 = time.perf_counter()

    def build() -> CompiledKernel:
        cubin, lowered, text = toolchain.nvrtc_compile(spec.read_source(), spec.source, options, exprs, what=what)
        return CompiledKernel(key, target, cubin, lowered, text, cached=False)

    if kcache.cache_enabled():
        opened = kcache.open_dir(create=True)
        assert opened is not None
        dfd, dpath = opened
        try:
            entry = kcache.read(dfd, dpath, key, target, exprs)
            if entry is None:
                with kcache.entry_lock(dfd, dpath, key):
                    entry = kcache.read(dfd, dpath, key, target, exprs)  # another process may have finished it meanwhile
                    if entry is None:
                        entry = build()
                        kcache.write(dfd, dpath, entry, doc)
        finally:
            os.close(dfd)
    else:
        entry = build()
    entry = CompiledKernel(entry.key, entry.target, entry.cubin, entry.lowered, entry.log, entry.cached, time.perf_counter() - t0)
    with _memo_lock:
        _memo_compiled[key] = entry
    return entry


def load(spec: KernelSpec, target: str, launch: Launch, device_index: int, arg_types: Sequence[type]) -> LoadedKernel:
    """The loaded function for ``launch.name_expression`` on ``device_index`` (memoised by content).

    Every fault (toolchain, cache, plugin data, driver) is a :class:`KernelError` naming its cause.
    """
    what = f"kernel {spec.op!r} of plugin {spec.plugin or '?'}"
    try:
        compiled = compile_spec(spec, target, (launch.name_expression,))  # one instance: a cold miss stays short
        memo_key = (compiled.key, launch.name_expression, device_index, tuple(arg_types))
        k = _loaded.get(memo_key)
        if k is not None:
            return k
        problem = check_driver_for_nvrtc(driver_cuda_version())
        if problem:
            raise ToolchainError(problem)
        from .launch import load_function

        fn = load_function(
            compiled.key, compiled.cubin, compiled.lowered[launch.name_expression], device_index, what=f"{what} for {target}"
        )
        k = LoadedKernel(fn, launch.name_expression, arg_types)
    except KernelError:
        raise
    except Exception as exc:
        raise KernelError(f"cannot load {what} for {target}: {type(exc).__name__}: {exc}") from exc
    with _memo_lock:
        return _loaded.setdefault(memo_key, k)


@_state.on_reset
def clear_cache() -> None:
    """Forget compiled kernels and loaded functions (``hwprofile.reset()`` calls it; the other stages register their own)."""
    with _memo_lock:
        _memo_compiled.clear()
        _loaded.clear()


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
