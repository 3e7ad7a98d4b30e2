"""Kernel specs: what a plugin declares about a kernel (source, instances, launch plan), and its source digest.

The bottom of the kernel pipeline: never imports another stage (toolchain, cache, launch), so that
resolving a profile, which collects the specs and digests their sources, loads none of the compile,
cache and launch machinery. A digest that must cover the CUDA headers gets them passed in
(``source_digest(toolchain.include_dirs())``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _state
from .._record import Record, final
from ..errors import PluginError

if TYPE_CHECKING:  # what collect_kernels reads of the registry, as protocols: no import of it, so no circle
    from collections.abc import Iterable
    from typing import Protocol

    from ..device import DeviceInfo

    class _Plugin(Protocol):
        """What :func:`collect_kernels` reads of a ``registry.PluginInfo`` (a protocol, so this module
        imports nothing of the registry and no import circle runs through it)."""

        @property
        def name(self) -> str: ...
        @property
        def distribution(self) -> str | None: ...
        @property
        def version(self) -> str | None: ...
        @property
        def label(self) -> str: ...


    class _Selection(Protocol):
        @property
        def plugin(self) -> Any: ...
        @property
        def target(self) -> str | None: ...


    class _Registry(Protocol):
        def call_layers(self, hook: str, participants: Iterable[Any], **kwargs: Any) -> Iterable[tuple[Any, Any]]: ...
        def participants(self, selected: Any, hook: str) -> list[Any]: ...


OWN_INCLUDE = str(Path(__file__).parent.parent / "include")  # hwprofile/include: the headers plugins include as <hwprofile/...>
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


@final
class Launch(Record):
    """How to launch one kernel instance: its template name expression, grid, block, dynamic smem, PDL."""

    #: The instance, as NVRTC names it: ``"hwp90_gemv_simt<false, __nv_bfloat16, 1, 4, 2, 1, 4, 0>"``.
    name_expression: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    #: Dynamic shared memory per block, in bytes; above 48 KiB the launcher opts in first.
    shared_bytes: int = 0
    #: Launch with programmatic stream serialization (programmatic dependent launch): the kernel may
    #: start while its predecessor on the stream finishes. Only for kernels that execute
    #: ``griddepcontrol.wait`` before touching anything a predecessor may write.
    pdl: bool = False


@final
class KernelSpec(Record):
    """A kernel a plugin contributes: CUDA C++ source shipped as package data, plus how to launch it.

    ``instances`` are the template name expressions ``hwprofile compile`` pre-builds, one NVRTC
    program and cache entry each (the entry a first launch of that instance would write);
    ``configure(**shape)`` returns the :class:`Launch` for a call (a name expression not among
    ``instances`` is compiled on its first use, and cached the same way).
    """

    #: The op it implements (``"router_gemm"``); a higher-priority plugin's spec replaces a lower one's.
    op: str
    #: The importable package that ships the source as package data.
    package: str
    #: The source's path inside ``package``: ``"kernels/sm90_gemv.cu"``.
    source: str
    instances: tuple[str, ...]
    #: ``configure(**shape) -> Launch``; pure, so launch plans are tested on the CPU.
    configure: Callable[..., Launch]
    #: Extra NVRTC options (part of the cache key).
    options: tuple[str, ...] = ()
    doc: str = ""
    #: Filled in by hwprofile when it collects the spec: the plugin's name and ``"<distribution> <version>"``.
    plugin: str = ""
    distribution_version: str = ""

    def source_path(self) -> Path:
        """Filesystem path of the source; an error says which package data is missing."""
        p = _package_dir(self.package)
        if p is None:
            raise PluginError(f"plugin {self.plugin}: kernel {self.op!r} names package {self.package!r}, which is not importable") from None
        p = p / self.source
        if not p.is_file():
            raise PluginError(
                f"plugin {self.plugin}: kernel {self.op!r} source {self.source!r} is missing from package {self.package!r}; "
                "ship it as package data ([tool.setuptools.package-data] in the plugin's pyproject.toml)"
            )
        return Path(str(p))

    def read_source(self) -> str:
        return self.source_path().read_text()

    def source_digest(self, include_dirs: Sequence[str] = (OWN_INCLUDE,)) -> str:
        """SHA-256 of the source and every header it includes: changes when the kernel code changes.

        Headers are searched in ``include_dirs``, then the spec's own ``-I`` options. The default,
        hwprofile's own headers, leaves the CUDA headers out: cheap enough for the profile
        fingerprint and the stamps, and it imports nothing CUDA. Pass
        :func:`hwprofile.kernels.include_dirs` (hwprofile's, then the CUDA headers NVRTC compiles
        against) to cover those too.
        """
        return _source_digest(str(self.source_path()), (*include_dirs, *self.nvrtc_options.include_dirs))

    @property
    def nvrtc_options(self) -> NvrtcOptions:
        """``options``, parsed (once per distinct tuple): what the compile, the cache key and the digests read."""
        opts: object = self.options  # a plugin's value, checked: the annotation is a promise, not a guarantee
        if isinstance(opts, (str, bytes)) or not isinstance(opts, (tuple, list)):
            raise ValueError(f"options must be a tuple of strings, got {type(opts).__name__} {opts!r}")
        bad = [o for o in opts if not isinstance(o, str)]
        if bad:
            raise ValueError(f"NVRTC option {bad[0]!r} is a {type(bad[0]).__name__}: options are strings")
        return parse_options(tuple(opts))

    def describe(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "plugin": self.plugin,
            "package": self.package,
            "source": self.source,
            "instances": len(self.instances),
            "doc": self.doc,
        }


def collect_kernels(reg: _Registry, selection: _Selection, info: DeviceInfo) -> dict[str, KernelSpec]:
    """Kernel specs for a device: the selected arch plugin's, then downstream ones (higher wins by op)."""
    assert selection.target is not None
    out: dict[str, KernelSpec] = {}
    p: _Plugin
    kernel_participants = reg.participants(selection.plugin, "hwprofile_kernels")
    for p, specs in reg.call_layers("hwprofile_kernels", kernel_participants, device=info, target=selection.target):
        if specs is not None and (isinstance(specs, (str, bytes, dict)) or not hasattr(specs, "__iter__")):
            raise PluginError(f"plugin {p.label}: hwprofile_kernels must return a list of hwprofile.KernelSpec, got {type(specs).__name__}")
        for spec in specs or ():
            if not isinstance(spec, KernelSpec):
                raise PluginError(
                    f"plugin {p.label}: hwprofile_kernels must return hwprofile.KernelSpec objects, got {type(spec).__name__}"
                )
            spec = spec.replace(plugin=p.name, distribution_version=f"{p.distribution} {p.version}")
            spec.source_path()  # a missing source is the plugin author's error: report it now, by name
            try:
                spec.nvrtc_options  # noqa: B018 - parsed here, so a bad option is reported now, by plugin and kernel
            except ValueError as exc:
                raise PluginError(f"plugin {p.label}: kernel {spec.op!r} has a bad NVRTC option: {exc}") from None
            out[spec.op] = spec
    return out


def _package_dir(package: str) -> Path | None:
    """Directory of an installed package (plugins are plain directories; zipped ones go through
    importlib.resources, which costs ~10 ms to import and is not needed otherwise)."""
    import importlib
    import sys

    try:
        module = sys.modules.get(package) or importlib.import_module(package)
    except ImportError:
        return None
    file = getattr(module, "__file__", None)
    if file and Path(file).parent.is_dir():
        return Path(file).parent
    from importlib import resources

    return Path(str(resources.files(package)))


@final
class NvrtcOptions(Record):
    """A kernel spec's own NVRTC options, parsed once (:func:`parse_options`): every consumer reads these fields.

    The compile passes ``argv``; the header search and the source digest read ``include_dirs``; the cache key reads
    ``pre_includes`` (by content) and ``portable`` (``argv`` without a machine path), so no consumer re-parses the
    option strings and none can disagree about which directory an option names.
    """

    #: The options as given, in order: what NVRTC gets after the fixed flags and hwprofile's include directories.
    argv: tuple[str, ...]
    #: The value of every ``-I DIR`` / ``-IDIR`` / ``--include-path[=]DIR``, in NVRTC's search order.
    include_dirs: tuple[str, ...]
    #: The value of every ``-include H`` / ``--pre-include[=]H``: headers NVRTC reads before the source.
    pre_includes: tuple[str, ...]
    #: ``argv`` with each include directory a numbered placeholder and each forced header by its file name: the
    #: cache key's and the rank digest's form (the headers themselves are digested by content).
    portable: tuple[str, ...]


_INCLUDE_DIR = ("-I", "--include-path")
_PRE_INCLUDE = ("-include", "--pre-include")


@cache
def parse_options(options: tuple[str, ...]) -> NvrtcOptions:
    """Parse a spec's NVRTC options into :class:`NvrtcOptions`; a flag without its value is a ``ValueError`` naming it."""
    dirs: list[str] = []
    pre: list[str] = []
    portable: list[str] = []
    it = iter(options)
    for o in it:
        if not isinstance(o, str):
            raise ValueError(f"NVRTC option {o!r} is a {type(o).__name__}: options are strings")
        flag, eq, glued = o.partition("=")
        if o in _INCLUDE_DIR or o in _PRE_INCLUDE:  # the value is the next option
            value = next(it, "")
            flag, sep = o, " "
        elif eq and flag in ("--include-path", "--pre-include"):
            value, sep = glued, "="
        elif o.startswith("-I"):
            flag, value, sep = "-I", o[2:], ""
        else:
            portable.append(o)
            continue
        if not value:
            what, long = ("DIR", "--include-path") if flag in _INCLUDE_DIR else ("HEADER", "--pre-include")
            raise ValueError(f"NVRTC option {o!r} has no value: write {flag} {what} or {long}={what}")
        if flag in _INCLUDE_DIR:
            placeholder = f"<-I {len(dirs)}>"
            dirs.append(value)
        else:  # a forced header may be named by a path: only its file name enters the key, its content is digested
            placeholder = f"<pre-include {os.path.basename(value)}>"
            pre.append(value)
        portable += [flag, placeholder] if sep == " " else [f"{flag}{sep}{placeholder}"]
    return NvrtcOptions(tuple(options), tuple(dirs), tuple(pre), tuple(portable))


NO_OPTIONS = parse_options(())


def _resolve_include(name: str, dirs: Sequence[str]) -> Path | None:
    for d in dirs:
        p = Path(d) / name
        if p.is_file():
            return p
    return None


@cache
def _source_digest(path: str, dirs: tuple[str, ...]) -> str:
    """SHA-256 over the source and, transitively, the content of every header found in ``dirs``."""
    import hashlib  # not at import: profile() should not pay for it unless it digests

    h = hashlib.sha256()
    seen: set[Path] = set()
    todo = [Path(path)]
    search = (str(Path(path).parent), *dirs)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        text = p.read_bytes()
        h.update(str(p.name).encode() + b"\0" + hashlib.sha256(text).digest())
        for inc in _INCLUDE_RE.findall(text.decode(errors="replace")):
            found = _resolve_include(inc, (str(p.parent), *search))
            if found is not None:
                todo.append(found)
            else:
                h.update(b"<builtin>" + inc.encode())
    return h.hexdigest()


_state.on_reset(_source_digest.cache_clear)
