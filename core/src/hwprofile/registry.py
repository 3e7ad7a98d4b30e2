"""Plugin registry: entry-point discovery, validation and per-device architecture selection.

One pluggy ``PluginManager`` for project ``hwprofile``. Plugins come from the entry-point group
``hwprofile.plugins`` (found by :mod:`hwprofile._entrypoints`, a start-up trick); the entry-point
name is the plugin's name everywhere. Loading is done one entry point at a time (not
``load_setuptools_entrypoints``) so that a broken plugin is reported by name, distribution and
version instead of stopping the whole load anonymously.

Never imports the plugin-author API (:mod:`hwprofile.plugin`), settings or profiles: they sit above
it. Its control variables (``HWPROFILE_PLUGIN``, ``HWPROFILE_PLUGIN_FORCE``,
``HWPROFILE_DISABLE_PLUGINS``) are read through :mod:`hwprofile._env`.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pluggy

from . import _env, hookspecs
from ._entrypoints import ENTRY_POINT_GROUP as ENTRY_POINT_GROUP  # the group, read without pluggy by doctor and the CLI
from ._entrypoints import find_entry_points, natural_key
from ._log import get_logger
from ._registry_records import ArchSpec as ArchSpec  # the records live in a leaf (hookspecs and tuning type them)
from ._registry_records import PluginInfo as PluginInfo
from ._registry_records import Selection as Selection
from .device import DeviceInfo
from .errors import PluginError

if TYPE_CHECKING:
    from .catalog import CatalogEntry

log = get_logger(__name__)

_TARGET_RE = re.compile(r"^sm_\d{2,3}[af]?\Z")
#: A plugin whose import takes longer than this gets a warning naming it (every process pays it).
SLOW_IMPORT_S = 1.0

_activity = threading.local()


def current_activity() -> str | None:
    """What this thread is doing inside a plugin right now ("importing plugin X (...)"), or None.

    ``profile()`` asks, so a plugin calling it during its own import or from a hook gets an error
    naming the plugin instead of a second, different profile or an endless recursion.
    """
    stack = getattr(_activity, "stack", None)
    return stack[-1] if stack else None


class _Doing:
    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        if not hasattr(_activity, "stack"):
            _activity.stack = []
        _activity.stack.append(self.what)

    def __exit__(self, *exc: object) -> None:
        _activity.stack.pop()


#: The hooks through which the layers below hand over to the tools above (hwprofile.hookspecs, "seams"): unlike
#: the resolving hooks, they are called after resolving, outside any plugin activity, and may call profile().
SEAMS = frozenset({"hwprofile_first_profile", "hwprofile_check_kernels"})
_NOTHING = contextlib.nullcontext()


class Registry:
    """The loaded plugins and the rules that pick one architecture plugin per device."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.environ = os.environ if environ is None else environ
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        #: Seconds each entry-point plugin took to import and register (``hwprofile plugins`` shows them).
        self.import_seconds: dict[str, float] = {}
        self.disabled: list[str] = list(_env.DISABLE_PLUGINS.read(self.environ))
        for name in self.disabled:
            self.pm.set_blocked(name)

    # --- loading ------------------------------------------------------------------------------

    def load_entry_points(self) -> Registry:
        """Import and register every plugin of the ``hwprofile.plugins`` group, one by one.

        Each plugin's :attr:`import_seconds` include what its import loads first. The modules the
        plugin API builds on (settings, tuning, kernel specs) are loaded before the first plugin by
        :func:`hwprofile.profiles.registry`; :mod:`hwprofile.plugin` itself, which this module must
        not import (it builds on the registry), is charged to the first plugin loaded (a few ms).
        """
        seen: dict[str, str] = {}
        disable = _env.DISABLE_PLUGINS.name
        eps = sorted(find_entry_points(ENTRY_POINT_GROUP), key=lambda e: e.name)
        for ep in eps:
            if ep.name in seen and seen[ep.name] != ep.distribution:
                raise PluginError(
                    f"two distributions register the plugin name {ep.name!r} in {ENTRY_POINT_GROUP}: "
                    f"{seen[ep.name]} and {ep.distribution}; uninstall one of them"
                )
            seen[ep.name] = ep.distribution or "?"
            if self.pm.is_blocked(ep.name):
                log.info("plugin %s (%s) is disabled by %s", ep.name, ep.distribution, disable)
                continue
            if ep.name in self.plugins:
                continue
            t0 = time.perf_counter()
            with _Doing(f"importing plugin {ep.name} ({ep.distribution} {ep.version})"):
                try:
                    obj = ep.load()
                except PluginError:
                    raise
                except Exception as exc:
                    raise PluginError(
                        f"plugin {ep.name!r} ({ep.distribution} {ep.version}) failed to import {ep.value!r}: "
                        f"{type(exc).__name__}: {exc}. Fix or reinstall it, or disable it with {disable}={ep.name}"
                    ) from exc
                self.register(obj, ep.name, distribution=ep.distribution, version=ep.version)
            seconds = self.import_seconds[ep.name] = time.perf_counter() - t0
            log.debug("plugin %s (%s %s) imported and registered in %.1f ms", ep.name, ep.distribution, ep.version, 1e3 * seconds)
            if seconds > SLOW_IMPORT_S:
                log.warning(
                    "plugin %s (%s %s) took %.1f s to import; every process pays this on its first profile(). "
                    "Make its module-level work lazy, or disable it with %s=%s",
                    ep.name, ep.distribution, ep.version, seconds, disable, ep.name,
                )
        unknown = [n for n in self.disabled if n not in seen]
        if unknown:
            import difflib  # only for a typo

            guesses = [g for n in unknown for g in difflib.get_close_matches(n, sorted(seen), n=1, cutoff=0.5)]
            log.warning(
                "%s names %s, which no installed plugin is called; %sinstalled plugins: %s",
                disable, ", ".join(unknown), f"did you mean {', '.join(guesses)}? " if guesses else "",
                ", ".join(sorted(seen, key=natural_key)) or "none",
            )
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
        try:
            self.pm.check_pending()  # a @hookimpl whose name matches no hook (a typo) would never be called
        except pluggy.PluginValidationError as exc:
            self.pm.unregister(name=name)
            known = ", ".join(n for n in dir(hookspecs) if n.startswith("hwprofile_"))
            raise PluginError(f"plugin {label}: {exc}; it would never be called. Hooks are: {known}") from exc
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
        if not isinstance(arch.targets, Mapping) or not arch.targets:
            raise PluginError(
                f"plugin {info.label}: ArchSpec targets must be a non-empty dict {{(major, minor): 'sm_XYa'}}, "
                f"e.g. {{(9, 0): 'sm_90a'}}; got {type(arch.targets).__name__} {arch.targets!r:.80}"
            )
        if not isinstance(arch.description, str):
            raise PluginError(f"plugin {info.label}: ArchSpec description must be a string, got {type(arch.description).__name__}")
        for cc, target in arch.targets.items():
            ok = isinstance(cc, tuple) and len(cc) == 2 and all(isinstance(x, int) for x in cc)
            if not ok or not isinstance(target, str) or not _TARGET_RE.match(target):
                raise PluginError(
                    f"plugin {info.label}: ArchSpec entry {cc!r}: {target!r} is invalid; "
                    "use {(major, minor): 'sm_XYa'}, e.g. {(9, 0): 'sm_90a'}"
                )

    # --- calling ------------------------------------------------------------------------------

    def _call_plugin(self, hook: str, info: PluginInfo, **kwargs: Any) -> Any:
        """Call ``hook`` on one plugin only (its wrappers included); errors name the plugin.

        A seam hook (:data:`SEAMS`) may resolve profiles and run ops: it is not marked as this thread's
        activity, which :func:`current_activity` reports and ``profile()`` refuses to run under.
        """
        plugin = self.pm.get_plugin(info.name)
        others = [p for p in self.pm.get_plugins() if p is not plugin]
        caller = self.pm.subset_hook_caller(hook, remove_plugins=others)
        try:
            with _Doing(f"running {hook} of plugin {info.label}") if hook not in SEAMS else _NOTHING:
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

    def catalog_entries(self) -> dict[str, CatalogEntry]:
        """The catalog entries the registered plugins contribute (hook ``hwprofile_catalog``), by name.

        Each plugin is asked in name order; :func:`hwprofile.catalog.merge_plugin_entries` checks
        what it returns. Callers pass this to detection (``plugin_catalog``), which never imports
        the registry.
        """
        from . import catalog

        plugins = sorted(self.plugins.values(), key=lambda p: p.name)
        return catalog.merge_plugin_entries((p.label, self._call_plugin("hwprofile_catalog", p)) for p in plugins)

    # --- selection ----------------------------------------------------------------------------

    @property
    def arch_plugins(self) -> list[PluginInfo]:
        return [p for p in self.plugins.values() if p.arch is not None]

    def select(self, device: DeviceInfo) -> Selection:
        """Pick the one architecture plugin for ``device`` (exact capability; pin with ``HWPROFILE_PLUGIN``)."""
        cc = device.compute_capability
        pin_var, force_var, disable = _env.PLUGIN.name, _env.PLUGIN_FORCE.name, _env.DISABLE_PLUGINS.name
        pin = _env.PLUGIN.read(self.environ)
        if pin is not None:
            info = self.plugins.get(pin)
            if info is None or info.arch is None:
                archs = ", ".join(sorted((p.name for p in self.arch_plugins), key=natural_key)) or "none installed"
                state = "disabled" if pin in self.disabled else "not an installed architecture plugin"
                raise PluginError(f"{pin_var}={pin!r} is {state}; architecture plugins: {archs}")
            target = info.arch.target_for(cc)
            if target is None:
                target = info.arch.targets[info.arch.capabilities[-1]]
                if not _env.PLUGIN_FORCE.read(self.environ):
                    raise PluginError(
                        f"{pin_var}={pin} pins {info.label}, which does not claim {device.sm} ({device.name}): its {target} "
                        f"kernels cannot load there. Unset {pin_var}, pin a plugin that claims {device.sm}, or set "
                        f"{force_var}=1 to use it anyway (settings only; kernels will fail and fall back)"
                    )
                log.warning(
                    "%s=%s pins a plugin that does not claim %s (%s); kernels will be built for %s",
                    pin_var, pin, device.sm, device.name, target,
                )
                return Selection(info, target, f"pinned by {pin_var}={pin} (it does not claim {device.sm})")
            return Selection(info, target, f"pinned by {pin_var}={pin}")
        claimants = [p for p in self.arch_plugins if p.arch is not None and p.arch.target_for(cc) is not None]
        if len(claimants) > 1:
            who = " and ".join(p.label for p in claimants)
            raise PluginError(
                f"{who} both claim compute capability {cc[0]}.{cc[1]} ({device.name}); uninstall one, "
                f"or pin one with {pin_var}=<name>, or disable one with {disable}=<name>"
            )
        if not claimants:
            return Selection(None, None, f"no installed architecture plugin serves {device.sm} ({device.name}); core defaults apply")
        p = claimants[0]
        assert p.arch is not None
        return Selection(p, p.arch.target_for(cc), f"{p.name} claims compute capability {cc[0]}.{cc[1]}")
