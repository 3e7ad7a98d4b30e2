"""Plugin registry: entry-point discovery, validation and per-device architecture selection.

One pluggy ``PluginManager`` for project ``hwprofile``. Plugins come from the entry-point group
``hwprofile.plugins``; the entry-point name is the plugin's name everywhere. Loading is done one
entry point at a time (not ``load_setuptools_entrypoints``) so that a broken plugin is reported by
name, distribution and version instead of stopping the whole load anonymously.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import pluggy

from . import hookspecs
from ._log import get_logger
from .device import DeviceInfo
from .errors import PluginError

log = get_logger(__name__)

ENTRY_POINT_GROUP = "hwprofile.plugins"
PIN_ENV = "HWPROFILE_PLUGIN"
DISABLE_ENV = "HWPROFILE_DISABLE_PLUGINS"
_TARGET_RE = re.compile(r"^sm_\d{2,3}[af]?$")


class EntryPoint(NamedTuple):
    """One entry point of a group, with the distribution that declares it."""

    name: str
    value: str
    distribution: str | None
    version: str | None

    def load(self) -> Any:
        import importlib

        module, _, attr = self.value.partition(":")
        obj = importlib.import_module(module.strip())
        for part in filter(None, attr.strip().split(".")):
            obj = getattr(obj, part)
        return obj


_EGG_DIR = re.compile(r"^(?P<name>[^-]+?)(?:-(?P<version>[^-]+?))?(?:-py\d[^-]*)?\.egg-info$")


def _metadata_dir(d: str) -> tuple[str, str | None, str] | None:
    """``(name, version, header file)`` of a ``name-version.dist-info`` or ``*.egg-info`` directory name.

    Plain string tests first: a site-packages directory holds hundreds of entries, and a regex per
    entry showed up in the first ``profile()``'s time.
    """
    if d.endswith(".dist-info"):
        name, _, version = d[:-10].partition("-")
        if name and version and "-" not in version:
            return name, version, "METADATA"
        return None
    if d.endswith(".egg-info"):
        m = _EGG_DIR.match(d)
        if m is not None:
            return m.group("name"), m.group("version"), "PKG-INFO"
    return None


def find_entry_points(group: str) -> list[EntryPoint]:
    """Entry points of ``group`` from every ``*.dist-info`` on ``sys.path``, first found wins.

    Why not ``importlib.metadata.entry_points()``: it parses every installed distribution's
    metadata, 50 ms on a machine with a few hundred packages, which would dominate the first
    ``profile()``. Reading only ``entry_points.txt`` of ``*.dist-info`` and ``*.egg-info``
    directories, and name and version from the header of the matching ones, gives the same answer
    in a few ms; zip imports fall back to ``importlib.metadata``.
    """
    import sys

    out: list[EntryPoint] = []
    seen_dists: set[str] = set()
    if any(e and os.path.isfile(e) for e in sys.path):
        return _entry_points_slow(group)  # zip imports: let importlib.metadata handle them
    header = f"[{group}]"
    for entry, d, meta in _metadata_dirs():
        dist = meta[0].replace("_", "-").lower()
        if dist in seen_dists:
            continue  # shadowed by an earlier sys.path entry, as importlib.metadata does
        seen_dists.add(dist)
        try:
            with open(os.path.join(entry, d, "entry_points.txt"), encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        if header not in text:
            continue
        name_, version = _dist_header(os.path.join(entry, d, meta[2]), meta[0], meta[1])
        for name, value in _ini_section(text, group):
            out.append(EntryPoint(name, value, name_, version))
    return out


def _ini_section(text: str, section: str) -> list[tuple[str, str]]:
    """``name = value`` pairs of one ``[section]`` of an entry_points.txt (the spec's INI subset)."""
    out, current = [], None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].strip()
        elif current == section and "=" in line:
            name, _, value = line.partition("=")
            out.append((name.strip(), value.strip()))
    return out


_listing_cache: dict[str, list[tuple[str, tuple[str, str | None, str]]]] = {}


def _metadata_dirs() -> Iterator[tuple[str, str, tuple[str, str | None, str]]]:
    """``(sys.path entry, directory, (name, version, header))`` of every distribution's metadata
    directory, in ``sys.path`` order.

    Each sys.path directory is listed once per process (entry points and installed versions both
    read it during the first ``profile()``); :func:`clear_cache` forgets the listings.
    """
    import sys

    for entry in sys.path:
        if not entry:
            continue
        found = _listing_cache.get(entry)
        if found is None:
            try:
                names = os.listdir(entry)
            except OSError:  # missing, a file (zip) or unreadable: holds no metadata directories
                continue
            found = [(d, meta) for d in names if (meta := _metadata_dir(d)) is not None]
            _listing_cache[entry] = found
        for d, meta in found:
            yield entry, d, meta


def clear_cache() -> None:
    """Forget directory listings and installed versions (after installing or removing packages)."""
    global _dist_cache
    _listing_cache.clear()
    _dist_cache = None


def installed_version(*names: str) -> str | None:
    """Version of the first installed distribution among ``names`` (``*.dist-info`` on sys.path), or None.

    Used for fallback identities (torch, nvidia-cublas) without importing them or scanning every
    distribution's metadata; cached per process.
    """
    index = _dist_index()
    for name in names:
        v = index.get(name.replace("_", "-").lower())
        if v is not None:
            return v
    return None


_dist_cache: dict[str, str] | None = None


def _dist_index() -> dict[str, str]:
    global _dist_cache
    if _dist_cache is None:
        found: dict[str, str] = {}
        for _, _d, meta in _metadata_dirs():
            if meta[2] == "METADATA":
                found.setdefault(meta[0].replace("_", "-").lower(), meta[1] or "")
        _dist_cache = found
    return _dist_cache


def _dist_header(path: str, name: str, version: str | None) -> tuple[str, str | None]:
    """``Name:`` and ``Version:`` from a METADATA / PKG-INFO header (the spelling the distribution uses)."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith("Name:"):
                    name = line[5:].strip()
                elif line.startswith("Version:"):
                    version = line[8:].strip()
                elif not line.strip():
                    break
    except OSError:
        pass
    return name, version


def _entry_points_slow(group: str) -> list[EntryPoint]:
    from importlib import metadata

    out = []
    for ep in metadata.entry_points(group=group):
        dist = ep.dist.metadata["Name"] if ep.dist is not None else None
        out.append(EntryPoint(ep.name, ep.value, dist, ep.dist.version if ep.dist is not None else None))
    return out


class ArchSpec(NamedTuple):
    """What an architecture plugin serves: exact compute capability -> NVRTC target."""

    targets: Mapping[tuple[int, int], str]
    description: str = ""

    def target_for(self, capability: tuple[int, int]) -> str | None:
        """The NVRTC target for this exact capability, or ``None`` if not served."""
        return self.targets.get(tuple(capability))  # type: ignore[arg-type]

    @property
    def capabilities(self) -> tuple[tuple[int, int], ...]:
        return tuple(sorted(self.targets))


class PluginInfo(NamedTuple):
    """Identity of one registered plugin."""

    name: str
    distribution: str | None
    version: str | None
    module: str
    arch: ArchSpec | None = None

    @property
    def label(self) -> str:
        """``"sm90 (hwprofile-sm90 0.1.0)"``: how messages name a plugin."""
        dist = f"{self.distribution} {self.version}" if self.distribution else "not installed as a distribution"
        return f"{self.name} ({dist})"

    @property
    def source(self) -> str:
        """``"hwprofile-sm90 0.1.0"``: who supplied a value, for provenance."""
        return f"{self.distribution} {self.version}" if self.distribution else f"plugin {self.name}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "module": self.module,
            "architecture": self.arch is not None,
            "capabilities": [list(c) for c in self.arch.capabilities] if self.arch else [],
            "targets": {f"{c[0]}.{c[1]}": t for c, t in self.arch.targets.items()} if self.arch else {},
        }


class Selection(NamedTuple):
    """Which architecture plugin serves a device, its NVRTC target, and why."""

    plugin: PluginInfo | None
    target: str | None
    reason: str


class Registry:
    """The loaded plugins and the rules that pick one architecture plugin per device."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.environ = os.environ if environ is None else environ
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self.disabled: list[str] = [n.strip() for n in self.environ.get(DISABLE_ENV, "").split(",") if n.strip()]
        for name in self.disabled:
            self.pm.set_blocked(name)

    # --- loading ------------------------------------------------------------------------------

    def load_entry_points(self) -> Registry:
        """Import and register every plugin of the ``hwprofile.plugins`` group, one by one."""
        seen: dict[str, str] = {}
        for ep in sorted(find_entry_points(ENTRY_POINT_GROUP), key=lambda e: e.name):
            if ep.name in seen and seen[ep.name] != ep.distribution:
                raise PluginError(
                    f"two distributions register the plugin name {ep.name!r} in {ENTRY_POINT_GROUP}: "
                    f"{seen[ep.name]} and {ep.distribution}; uninstall one of them"
                )
            seen[ep.name] = ep.distribution or "?"
            if self.pm.is_blocked(ep.name):
                log.info("plugin %s (%s) is disabled by %s", ep.name, ep.distribution, DISABLE_ENV)
                continue
            if ep.name in self.plugins:
                continue
            try:
                obj = ep.load()
            except Exception as exc:
                raise PluginError(
                    f"plugin {ep.name!r} ({ep.distribution} {ep.version}) failed to import {ep.value!r}: "
                    f"{type(exc).__name__}: {exc}. Fix or reinstall it, or disable it with {DISABLE_ENV}={ep.name}"
                ) from exc
            self.register(obj, ep.name, distribution=ep.distribution, version=ep.version)
        return self

    def register(self, obj: object, name: str, *, distribution: str | None = None, version: str | None = None) -> PluginInfo | None:
        """Register a plugin object (a module or instance with hook implementations) under ``name``."""
        if self.pm.is_blocked(name):
            return None
        module = getattr(obj, "__name__", type(obj).__module__)
        label = PluginInfo(name, distribution, version, module).label
        if name in self.plugins:
            raise PluginError(f"a plugin named {name!r} is already registered ({self.plugins[name].label}); cannot add {label}")
        try:
            self.pm.register(obj, name=name)
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {label} has an invalid hook implementation: {exc}. Compare it with hwprofile.hookspecs.") from exc
        unknown = [h for h in self._hook_names(obj) if not hasattr(hookspecs, h)]
        if unknown:
            self.pm.unregister(name=name)
            known = ", ".join(n for n in dir(hookspecs) if n.startswith("hwprofile_"))
            raise PluginError(f"plugin {label} implements unknown hook(s) {', '.join(unknown)}; hooks are: {known}")
        info = PluginInfo(name, distribution, version, module)
        arch = self._call_plugin("hwprofile_arch", info)
        if arch is not None:
            if not isinstance(arch, ArchSpec):
                raise PluginError(f"plugin {label}: hwprofile_arch must return hwprofile.ArchSpec, got {type(arch).__name__}")
            self._validate_arch(info, arch)
            info = PluginInfo(name, distribution, version, module, arch)
        self.plugins[name] = info
        return info

    def _hook_names(self, obj: object) -> list[str]:
        out = []
        for attr in dir(obj):
            fn = getattr(obj, attr, None)
            if attr.startswith("hwprofile_") and callable(fn) and self.pm.parse_hookimpl_opts(obj, attr) is not None:
                out.append(attr)
        return out

    @staticmethod
    def _validate_arch(info: PluginInfo, arch: ArchSpec) -> None:
        for cc, target in arch.targets.items():
            ok = isinstance(cc, tuple) and len(cc) == 2 and all(isinstance(x, int) for x in cc)
            if not ok or not isinstance(target, str) or not _TARGET_RE.match(target):
                raise PluginError(
                    f"plugin {info.label}: ArchSpec entry {cc!r}: {target!r} is invalid; "
                    "use {(major, minor): 'sm_XYa'}, e.g. {(9, 0): 'sm_90a'}"
                )

    # --- calling ------------------------------------------------------------------------------

    def _call_plugin(self, hook: str, info: PluginInfo, **kwargs: Any) -> Any:
        """Call ``hook`` on one plugin only (its wrappers included); errors name the plugin."""
        plugin = self.pm.get_plugin(info.name)
        others = [p for p in self.pm.get_plugins() if p is not plugin]
        caller = self.pm.subset_hook_caller(hook, remove_plugins=others)
        try:
            results = caller(**kwargs)
        except PluginError:
            raise
        except Exception as exc:
            raise PluginError(f"plugin {info.label} raised in {hook}: {type(exc).__name__}: {exc}") from exc
        return results[0] if results else None

    def call_layers(self, hook: str, participants: Iterable[PluginInfo], **kwargs: Any) -> Iterable[tuple[PluginInfo, Any]]:
        """Yield ``(plugin, result)`` per participant, lowest priority first (lazy, so each sees the last)."""
        for info in participants:
            yield info, self._call_plugin(hook, info, **kwargs)

    def participants(self, selected: PluginInfo | None, hook: str) -> list[PluginInfo]:
        """Plugins taking part in ``hook`` for a device: the selected arch plugin, then downstream in pluggy order."""
        order = [impl.plugin_name for impl in getattr(self.pm.hook, hook).get_hookimpls() if not (impl.hookwrapper or impl.wrapper)]
        downstream = [self.plugins[n] for n in order if n in self.plugins and self.plugins[n].arch is None]
        return ([selected] if selected is not None else []) + downstream

    # --- selection ----------------------------------------------------------------------------

    @property
    def arch_plugins(self) -> list[PluginInfo]:
        return [p for p in self.plugins.values() if p.arch is not None]

    def select(self, device: DeviceInfo) -> Selection:
        """Pick the one architecture plugin for ``device`` (exact capability; pin with HWPROFILE_PLUGIN)."""
        cc = device.compute_capability
        pin = self.environ.get(PIN_ENV, "").strip()
        if pin:
            info = self.plugins.get(pin)
            if info is None or info.arch is None:
                archs = ", ".join(p.name for p in self.arch_plugins) or "none installed"
                state = "disabled" if pin in self.disabled else "not an installed architecture plugin"
                raise PluginError(f"{PIN_ENV}={pin!r} is {state}; architecture plugins: {archs}")
            target = info.arch.target_for(cc)
            if target is None:
                target = info.arch.targets[info.arch.capabilities[-1]]
                log.warning(
                    "%s=%s pins a plugin that does not claim %s (%s); kernels will be built for %s",
                    PIN_ENV, pin, device.sm, device.name, target,
                )
                return Selection(info, target, f"pinned by {PIN_ENV}={pin} (it does not claim {device.sm})")
            return Selection(info, target, f"pinned by {PIN_ENV}={pin}")
        claimants = [p for p in self.arch_plugins if p.arch is not None and p.arch.target_for(cc) is not None]
        if len(claimants) > 1:
            who = " and ".join(p.label for p in claimants)
            raise PluginError(
                f"{who} both claim compute capability {cc[0]}.{cc[1]} ({device.name}); uninstall one, "
                f"or pin one with {PIN_ENV}=<name>, or disable one with {DISABLE_ENV}=<name>"
            )
        if not claimants:
            return Selection(None, None, f"no installed architecture plugin serves {device.sm} ({device.name}); core defaults apply")
        p = claimants[0]
        assert p.arch is not None
        return Selection(p, p.arch.target_for(cc), f"{p.name} claims compute capability {cc[0]}.{cc[1]}")
