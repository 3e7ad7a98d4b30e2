"""NVRTC toolchain: typed compile options, header search, source to cubin. Never touches the disk cache.

The first stage of the kernel pipeline (cuda.core's ``ProgramOptions -> Program -> ObjectCode``):

* always a cubin for the exact target (``sm_90a``...), never PTX: PTX from a newer NVRTC cannot be
  loaded by an older driver, a cubin of the same CUDA major can;
* :class:`CompileOptions` is every input of one NVRTC call but the source and the name
  expressions, so the cache (:mod:`hwprofile.kernels.cache`) can put all of it in its key, headers
  reached through ``-I`` included.

cuda-python is imported only when NVRTC is asked something.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from .. import _deps, _state
from .._record import Record, final
from ..errors import KernelCompileError, ToolchainError
from .spec import NO_OPTIONS, OWN_INCLUDE, NvrtcOptions

STD = "c++17"
#: Flags every compile gets, before the include directories and the spec's own options.
FIXED_FLAGS: tuple[str, ...] = (f"-std={STD}", "--ptxas-options=--verbose")

# Oldest NVRTC (major, minor) that knows each target's architecture.
MIN_NVRTC: dict[str, tuple[int, int]] = {
    "sm_80": (11, 0),
    "sm_89": (11, 8),
    "sm_90": (12, 0),
    "sm_90a": (12, 0),
    "sm_100": (12, 8),
    "sm_100a": (12, 8),
    "sm_103": (12, 9),
    "sm_103a": (12, 9),
    "sm_120": (12, 8),
    "sm_120a": (12, 8),
    "sm_121": (12, 9),
    "sm_121a": (12, 9),
}
_TARGET_RE = re.compile(r"^sm_\d{2,3}[af]?\Z")


@cache
def _nvrtc() -> Any:
    """cuda-bindings' NVRTC module, its library loaded: a missing wheel is a ToolchainError naming it, never a bare loader error."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise ToolchainError(_deps.text(_deps.DEPENDENCIES["cuda"], f"cuda-python's NVRTC bindings are not importable: {exc}")) from None
    try:
        nvrtc.nvrtcVersion()  # loads libnvrtc (cuda-bindings finds it on the first call)
    except Exception as exc:  # noqa: BLE001 - cuda.pathfinder's DynamicLibNotFoundError, an OSError or RuntimeError of the loader
        raise ToolchainError(_deps.text(_deps.NVRTC, f"the NVRTC library cannot be loaded: {type(exc).__name__}: {exc}")) from None
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
def nvrtc_build() -> str:
    """NVRTC's full identity beyond (major, minor): the versions of the distributions that ship it.

    NVRTC reports only major.minor, but a patch release can change the code it emits; the wheel
    versions (``nvidia-cuda-nvrtc 13.0.88``, ``cuda-bindings 13.0.3``) tell patch releases apart.
    """
    # dist-info names, listed once per process: not importlib.metadata (12-19 ms to import, 29.7-36.9 ms to scan: RESULTS.md)
    from .._entrypoints import installed_version

    parts = []
    for dist in ("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu12", "cuda-bindings"):
        version = installed_version(dist)
        if version is not None:
            parts.append(f"{dist} {version}")
    return ", ".join(parts) or "unknown"


@cache
def nvrtc_archs() -> tuple[int, ...]:
    """Numeric architectures the installed NVRTC can compile for (90, 100, 120...)."""
    err, archs = _nvrtc().nvrtcGetSupportedArchs()
    _check(err, "nvrtcGetSupportedArchs")
    return tuple(int(a) for a in archs)


@cache
def cuda_headers() -> tuple[str | None, str | None]:
    """``(directory, problem)``: the CUDA headers of NVRTC's major (:mod:`hwprofile.kernels.headers`)."""
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


def check_toolchain() -> None:
    """Raise one :class:`ToolchainError` saying what is missing (NVRTC, matching headers), or return."""
    nvrtc_version()
    _, problem = cuda_headers()
    if problem:
        raise ToolchainError(problem)


@_state.on_reset
def clear_cache() -> None:
    """Forget what was asked of NVRTC and where headers are (a reset may follow installing the matching headers)."""
    for f in (nvrtc_version, nvrtc_build, nvrtc_archs, cuda_headers, include_dirs):
        f.cache_clear()


def check_target(target: str) -> None:
    """Raise a clear error if ``target`` is malformed or the installed NVRTC cannot compile for it."""
    if not _TARGET_RE.match(target):
        raise ToolchainError(f"target {target!r} is not an NVRTC architecture; write sm_XY or sm_XYa, e.g. sm_90a")
    num = int(re.sub(r"\D", "", target))
    if num not in nvrtc_archs():
        need = MIN_NVRTC.get(target)
        v = nvrtc_version()
        hint = f"it needs NVRTC {need[0]}.{need[1]} or newer" if need else "no known NVRTC supports it"
        from .._install import hwprofile_extra

        upgrade = hwprofile_extra("cu13", upgrade=True)
        raise ToolchainError(f"NVRTC {v[0]}.{v[1]} cannot compile for {target} ({hint}); upgrade with {upgrade}")


@final
class CompileOptions(Record):
    """Everything but the source and the name expressions that decides what one NVRTC call produces.

    ``extra`` are a :class:`~hwprofile.KernelSpec`'s own options, parsed (``spec.nvrtc_options``), passed after
    the fixed flags; ``include_dirs`` hwprofile's and the CUDA headers (searched before any ``-I`` in ``extra``).
    """

    target: str
    include_dirs: tuple[str, ...] = ()
    extra: NvrtcOptions = NO_OPTIONS

    def __post_init__(self) -> None:
        if not isinstance(self.extra, NvrtcOptions):  # NVRTC option strings as given: parsed here, once
            raise TypeError(f"CompileOptions.extra must be parsed options (spec.nvrtc_options or kernels.spec.parse_options(...)), "
                            f"got {type(self.extra).__name__} {self.extra!r}")

    def flags(self) -> list[str]:
        """The option list handed to ``nvrtcCompileProgram``, in order."""
        return [f"--gpu-architecture={self.target}", *FIXED_FLAGS, *(f"-I{d}" for d in self.include_dirs), *self.extra.argv]

    def header_dirs(self) -> tuple[str, ...]:
        """Directories NVRTC searches for ``#include``, in its order: fixed ones, then ``-I`` of ``extra``."""
        return (*self.include_dirs, *self.extra.include_dirs)

    def as_key(self) -> dict[str, Any]:
        """The options as a JSON-able document for the cache key, without a machine path.

        Include directories (the fixed ones and every ``-I`` / ``--include-path`` of ``extra``) become
        placeholders by position: which headers they hold is in the key as content (the source
        digest covers every header reached), and where they are installed is not, so the same
        kernels at another prefix or on another host share their entries.
        """
        fixed = [f"-I<include {i}>" for i in range(len(self.include_dirs))]
        return {"target": self.target, "flags": [f"--gpu-architecture={self.target}", *FIXED_FLAGS, *fixed, *self.extra.portable]}


@final
class CompiledKernel(Record):
    """A cubin and the mangled names of its instances, plus what the compile reported."""

    key: str
    target: str
    cubin: bytes
    lowered: Mapping[str, str]
    log: str = ""
    cached: bool = False
    seconds: float = 0.0
    #: Where it came from: ``""`` compiled by NVRTC in this process, else the label of the cache layer it was read from.
    layer: str = ""

    @property
    def registers(self) -> int | None:
        m = re.findall(r"Used (\d+) registers", self.log)
        return max(int(x) for x in m) if m else None

    @property
    def spill_bytes(self) -> int | None:
        m = re.findall(r"(\d+) bytes spill stores", self.log)
        return max(int(x) for x in m) if m else None


def nvrtc_compile(
    source: str, name: str, options: CompileOptions, expressions: Sequence[str], *, what: str
) -> tuple[bytes, dict[str, str], str]:
    """Compile ``source`` to a cubin; return (cubin, lowered names, log). Errors name ``what``."""
    nvrtc = _nvrtc()
    try:
        check_target(options.target)
    except ToolchainError as exc:
        raise ToolchainError(f"cannot compile {what}: {exc}") from None
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        for e in expressions:
            _check(nvrtc.nvrtcAddNameExpression(prog, e.encode())[0], f"adding name expression {e!r}")
        opts = options.flags()
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        _, n = nvrtc.nvrtcGetProgramLogSize(prog)
        # NVRTC writes into the buffers it is given: they must be fresh and writable. ``b" " * n``
        # is the ``b" "`` constant itself when n == 1 (an empty log), and that constant is the
        # interpreter's shared one-byte object when this module was compiled from source (no .pyc):
        # NVRTC's NUL then turned every b" " in the process into b"\0"
        buf = bytearray(n)
        nvrtc.nvrtcGetProgramLog(prog, buf)
        text = bytes(buf).rstrip(b"\0 ").decode(errors="replace")
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            lines = "\n".join("  " + ln for ln in text.splitlines() if ln.strip() and "Used" not in ln)
            raise KernelCompileError(f"NVRTC failed to compile {what} for {options.target}:\n{lines}")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize")
        out = bytearray(size)
        _check(nvrtc.nvrtcGetCUBIN(prog, out)[0], "nvrtcGetCUBIN")
        cubin = bytes(out)
        lowered = {}
        for e in expressions:
            err, low = nvrtc.nvrtcGetLoweredName(prog, e.encode())
            _check(err, f"lowered name of {e!r}")
            lowered[e] = low.decode() if isinstance(low, bytes) else low
        return cubin, lowered, text
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
