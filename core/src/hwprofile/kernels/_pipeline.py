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

Lookup order: the in-process memo, the local cache layers, the fleet store (``HWPROFILE_REMOTE``:
a verified hit is written to the local write layer), then NVRTC, whose result is written locally and
published to the store (best effort).

In-process memos (compiled kernels, loaded functions) are keyed by the cache key, a hash of every
compile input, and cleared by ``hwprofile.reset()``.

Serving: every NVRTC compile, module load and cache hit (per layer) is counted, process-wide
(:func:`counters`) and, through the ``record`` callback the ops pass, in the profile's stats; and a
process can forbid compiling (:func:`forbid_compile`, or ``HWPROFILE_NO_COMPILE=1``), after which a
compile is a :class:`CompileForbiddenError` naming the kernel and how to warm it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import _env, _remote, _state
from ..errors import HwprofileError, KernelError, ToolchainError
from . import cache as kcache
from . import toolchain

# "X as X": names handed on to hwprofile.kernels' face (its __all__), whether or not this module uses them
from .launch import LoadedKernel as LoadedKernel
from .launch import check_driver_for_nvrtc as check_driver_for_nvrtc
from .launch import driver_cuda_version as driver_cuda_version
from .spec import KernelSpec as KernelSpec
from .spec import Launch as Launch
from .toolchain import MIN_NVRTC as MIN_NVRTC
from .toolchain import CompiledKernel as CompiledKernel
from .toolchain import CompileOptions as CompileOptions
from .toolchain import check_target as check_target
from .toolchain import check_toolchain as check_toolchain
from .toolchain import cuda_headers as cuda_headers
from .toolchain import include_dirs as include_dirs
from .toolchain import nvrtc_archs as nvrtc_archs
from .toolchain import nvrtc_version as nvrtc_version


class CompileForbiddenError(KernelError):
    """A kernel had to be compiled after compiling was forbidden (:func:`forbid_compile`, ``HWPROFILE_NO_COMPILE=1``).

    Never turned into a fallback: an engine that forbids compiling asserts its serving path never
    compiles, and this is the proof that it would have.
    """


#: Where a kernel came from, as ``record`` callbacks and :func:`counters` name it.
COMPILE, LOAD, MEMO, HIT = "compiles", "loads", "memo", "hits"

Recorder = Callable[[str, str], None]  #: ``record(event, layer)``: event one of the names above, layer for a hit


class _Counters:
    """Process-wide counts of compiles, loads and hits (per layer)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.hits: dict[str, int] = {}

    def note(self, event: str, layer: str = "") -> None:
        with self.lock:
            if event == HIT:
                self.hits[layer] = self.hits.get(layer, 0) + 1
            else:
                self.counts[event] = self.counts.get(event, 0) + 1


_counters = _Counters()


def counters() -> dict[str, object]:
    """``{"compiles": n, "loads": n, "memo": n, "hits": {layer: n}}`` of this process since the last reset."""
    with _counters.lock:
        return {**{e: _counters.counts.get(e, 0) for e in (COMPILE, LOAD, MEMO)}, HIT: dict(sorted(_counters.hits.items()))}


_forbidden: str | None = None


def forbid_compile(forbid: bool = True) -> None:
    """From now on, a kernel that is not in memory or any cache layer is a :class:`CompileForbiddenError`.

    Call it after warm-up (``hwprofile.ops.warmup``) to prove the serving path never runs NVRTC;
    ``forbid_compile(False)`` allows compiling again. ``HWPROFILE_NO_COMPILE=1`` forbids it from
    the start (a process serving from a prebuilt or pre-warmed cache). Cache hits and module loads stay allowed.
    """
    global _forbidden
    _forbidden = "hwprofile.kernels.forbid_compile() was called" if forbid else None


def _why_forbidden() -> str | None:
    if _forbidden is not None:
        return _forbidden
    return f"{_env.NO_COMPILE.name}=1 is set" if _env.NO_COMPILE.read() else None


def _options_for(spec: KernelSpec, target: str) -> CompileOptions:
    """The compile options of ``spec`` for ``target``: fixed include directories, then the spec's options."""
    return CompileOptions(target, include_dirs(), spec.nvrtc_options)


def cache_key(spec: KernelSpec, target: str, expressions: Sequence[str]) -> str:
    """The cache key: a hash of every compile input (see :mod:`hwprofile.kernels.cache`)."""
    return kcache.key_of(kcache.key_document(spec, _options_for(spec, target), tuple(expressions)))


def cache_enabled() -> bool:
    return kcache.cache_enabled()


def cache_dir(create: bool = True) -> Path:
    """The checked write layer of the cache (created private if ``create``); a :class:`CacheError` if unusable.

    With no writable layer (every directory ``HWPROFILE_CACHE_DIR`` names is read-only), the last one named.
    """
    with kcache.open_layers(create, shipped=False) as layers:
        if layers.write is not None:
            return layers.write.path
    return kcache.configured_dirs()[-1]


_memo_compiled: dict[str, CompiledKernel] = {}
_loaded: dict[tuple[str, str, int, tuple[type, ...]], LoadedKernel] = {}
_memo_lock = threading.Lock()


@_state.in_forked_child
def _reinit_locks_in_child() -> None:
    global _memo_lock
    _memo_lock = threading.Lock()  # a thread of the parent may have held it at the fork; it does not exist here



def compile_spec(
    spec: KernelSpec, target: str, expressions: Sequence[str] | None = None, *, record: Recorder | None = None
) -> CompiledKernel:
    """Compile ``spec``'s instances (or the given name expressions) for ``target``, through the cache.

    Raises :class:`KernelError` (or :class:`~hwprofile.errors.PluginError` for a source the plugin
    does not ship); any other fault is wrapped into a ``KernelError`` that names its cause.
    ``record(event, layer)`` is told where the kernel came from (``compiles``, ``memo``, ``hits``).
    """
    what = f"kernel {spec.op!r} of plugin {spec.plugin or '?'} ({spec.source})"
    try:
        return _compile(spec, target, tuple(spec.instances if expressions is None else expressions), what, record)
    except HwprofileError:
        raise
    except Exception as exc:
        raise KernelError(f"cannot build {what} for {target}: {type(exc).__name__}: {exc}") from exc


def _note(record: Recorder | None, event: str, layer: str = "") -> None:
    _counters.note(event, layer)
    if record is not None:
        record(event, layer)


def _compile(spec: KernelSpec, target: str, exprs: tuple[str, ...], what: str, record: Recorder | None = None) -> CompiledKernel:
    options = _options_for(spec, target)
    doc = kcache.key_document(spec, options, exprs)
    key = kcache.key_of(doc)
    hit = _memo_compiled.get(key)
    if hit is not None:
        _note(record, MEMO)
        return CompiledKernel(hit.key, hit.target, hit.cubin, hit.lowered, hit.log, cached=True, layer=hit.layer)
    t0 = time.perf_counter()

    def build() -> CompiledKernel:
        why = _why_forbidden()
        if why is not None:
            names = ", ".join(exprs)
            raise CompileForbiddenError(
                f"{what}: instance {names} for {target} is in no cache layer and compiling is forbidden ({why}). Warm it before "
                f"serving: hwprofile.ops.warmup(shapes={{{spec.op!r}: [(M, N, K), ...]}}) before forbidding, or fill a cache layer "
                f"with 'hwprofile compile --warm {spec.op}:MxNxK' (or --models NAME, or a prebuilt layer package)"
            )
        cubin, lowered, text = toolchain.nvrtc_compile(spec.read_source(), spec.source, options, exprs, what=what)
        _note(record, COMPILE)
        return CompiledKernel(key, target, cubin, lowered, text, cached=False)

    if kcache.cache_enabled():
        with kcache.open_layers(create=True) as layers:
            entry = _read_layers(layers, key, target, exprs)
            if entry is None and layers.write is not None:
                w = layers.write
                with kcache.entry_lock(w.fd, w.path, key):
                    entry = kcache.read(w.fd, w.path, key, target, exprs)  # another process may have finished it meanwhile
                    if entry is None:
                        entry = _fetch_or_build(build, key, target, exprs, doc)
                        kcache.write(w.fd, w.path, entry, doc)  # a remote hit too: this host's next process reads it locally
            elif entry is None:
                entry = _fetch_or_build(build, key, target, exprs, doc)
        if entry.cached:
            _note(record, HIT, entry.layer)
    else:
        entry = build()
    entry = CompiledKernel(
        entry.key, entry.target, entry.cubin, entry.lowered, entry.log, entry.cached, time.perf_counter() - t0, entry.layer
    )
    with _memo_lock:
        _memo_compiled[key] = entry
    return entry


def _fetch_or_build(
    build: Callable[[], CompiledKernel], key: str, target: str, exprs: tuple[str, ...], doc: dict[str, Any]
) -> CompiledKernel:
    """The fleet store after the local layers: a verified hit, else one compile in the fleet, published for the others.

    On a miss this host takes the cubin's compile lock in the store (:func:`hwprofile._remote.compile_lock_key`, the
    tune lock's semantics) and reads the store again under it: a host that compiled meanwhile published, and its
    cubin is read instead. A holder alive past :data:`hwprofile._remote.COMPILE_WAIT_S`, or a store that fails, and
    this host compiles on its own; a killed holder's lock expires after :data:`hwprofile._remote.LOCK_TTL_S`.
    ``build`` is :func:`_compile`'s compile (it raises where compiling is forbidden); a module function, not a nested
    one, so :func:`_compile` reads as the layer walk it is.
    """
    store = _remote_store()
    if store is None:
        return build()
    got = kcache.read_remote(store, key, target, exprs)
    if got is not None:
        return got
    lock = None
    if _why_forbidden() is None:  # NO_COMPILE: build() raises; nothing to coordinate
        lock = store.lock(_remote.compile_lock_key(key), purpose=_remote.COMPILE, quiet=True)
        if lock.acquire(_remote.COMPILE_WAIT_S) is not True:
            lock = None  # the store failed, or a live holder past the bound: compile here
        else:
            got = kcache.read_remote(store, key, target, exprs, again=True)  # published while this host waited
    try:
        if got is None:
            got = build()
            kcache.publish(store, got, doc)
        return got
    finally:
        if lock is not None:
            lock.release()


def _remote_store() -> _remote.Store | None:
    """The fleet store (``HWPROFILE_REMOTE``), or None; a refused URL is a :class:`CacheError` naming the variable."""
    from ..errors import CacheError, SettingError

    try:
        return _remote.store()
    except SettingError as exc:
        raise CacheError(str(exc)) from None


def _read_layers(layers: kcache.Layers, key: str, target: str, exprs: tuple[str, ...]) -> CompiledKernel | None:
    for layer in layers.read:
        entry = kcache.read(layer.fd, layer.path, key, target, exprs, read_only=not layer.writable, any_owner=layer.shipped)
        if entry is not None:
            return entry
    return None


def load(
    spec: KernelSpec, target: str, launch: Launch, device_index: int, arg_types: Sequence[type], *, record: Recorder | None = None
) -> LoadedKernel:
    """The loaded function for ``launch.name_expression`` on ``device_index`` (memoised by content).

    Every fault (toolchain, cache, plugin data, driver) is a :class:`KernelError` naming its cause.
    ``record(event, layer)`` is told of each compile, cache hit and module load this call made.
    """
    what = f"kernel {spec.op!r} of plugin {spec.plugin or '?'}"
    try:
        compiled = compile_spec(spec, target, (launch.name_expression,), record=record)  # one instance: a cold miss stays short
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
        _note(record, LOAD)
    except KernelError:
        raise
    except Exception as exc:
        raise KernelError(f"cannot load {what} for {target}: {type(exc).__name__}: {exc}") from exc
    with _memo_lock:
        return _loaded.setdefault(memo_key, k)


def fill_layer(work: Iterable[tuple[KernelSpec, str]], directory: Path) -> tuple[int, int]:
    """Store every instance of each (spec, target) in the cache layer ``directory`` (compiled or read as usual first).

    What ``hwprofile compile --output`` does, so a layer holds exactly the entries the ops look up.
    Returns (entries written, entries already there); a write that fails is a :class:`CacheError`.
    """
    from ..errors import CacheError

    fd = kcache.open_layer_for_writing(directory)
    written = present = 0
    try:
        for spec, target in work:
            for expr in spec.instances:
                c = compile_spec(spec, target, (expr,))
                if kcache.read(fd, directory, c.key, target, (expr,)) is not None:
                    present += 1
                    continue
                if not kcache.write(fd, directory, c, kcache.key_document(spec, _options_for(spec, target), (expr,))):
                    raise CacheError(f"cannot write the kernel cache layer {directory} (see the warning above); choose another directory")
                written += 1
    finally:
        os.close(fd)
    return written, present


def loaded(spec: KernelSpec, target: str, launch: Launch, device_index: int, arg_types: Sequence[type]) -> LoadedKernel | None:
    """The function :func:`load` would return if it is already loaded in this process, else None.

    Hashes the compile inputs only: never compiles, reads the cache or calls the driver, so it is
    safe inside a CUDA-graph capture. Faults are a :class:`KernelError`, as in :func:`load`.
    """
    try:
        key = cache_key(spec, target, (launch.name_expression,))
    except HwprofileError:
        raise
    except Exception as exc:
        raise KernelError(f"cannot look up kernel {spec.op!r} of plugin {spec.plugin or '?'}: {type(exc).__name__}: {exc}") from exc
    return _loaded.get((key, launch.name_expression, device_index, tuple(arg_types)))


@_state.on_reset
def clear_cache() -> None:
    """Forget compiled kernels and loaded functions (``hwprofile.reset()`` calls it; the other stages register their own)."""
    with _memo_lock:
        _memo_compiled.clear()
        _loaded.clear()
    with _counters.lock:
        _counters.counts.clear()
        _counters.hits.clear()


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
