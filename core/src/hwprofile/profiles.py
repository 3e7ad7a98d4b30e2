"""The resolved result for one device: device facts, selected plugin, settings, env defaults, kernels.

``profile(device)`` is cached per device and process; :func:`reset` forgets everything (after the
environment or the installed plugins change). Resolving imports neither torch nor CUDA.
Tuned files, stamps and staleness live in :mod:`hwprofile.tuning`. Never imports the plugin-author
API (:mod:`hwprofile.plugin`), which builds on this module.

:func:`detect` (``hwprofile.detect``) lives here, not in :mod:`hwprofile.device`: a simulated
device may be named by a plugin's catalog entry, which only the registry knows, and detection sits
below the registry.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator, KeysView, Mapping, MutableMapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from . import _state
from . import device as _device
from ._log import get_logger
from ._record import Record, final
from .errors import PluginError, SettingError

if TYPE_CHECKING:  # imported inside functions: a first profile() loads them while NVML starts (_first_profile)
    from .catalog import CatalogEntry
    from .kernels.spec import KernelSpec
    from .registry import PluginInfo, Registry, Selection
    from .settings import ResolvedEnvDefault, ResolvedSetting

log = get_logger(__name__)

_T = TypeVar("_T", bool, int, float, str)


class DispatchStats:
    """Per-op counters of kernel vs fallback calls in this process (mutable, thread-tolerant), and
    what getting this profile's kernels cost: NVRTC compiles, module loads, in-process memo hits and
    cache hits per layer (``record`` is what the ops hand the kernel pipeline)."""

    #: the key of the kernel counters in :meth:`as_dict` (no op is named so: op names come from the op table)
    KERNELS = "kernels"

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}
        self.kernels: dict[str, int] = {}
        self.hits: dict[str, int] = {}
        self._lock = threading.Lock()

    def record(self, event: str, layer: str = "") -> None:
        """Count one pipeline event: ``compiles``, ``loads``, ``memo``, or ``hits`` from cache layer ``layer``."""
        with self._lock:
            if event == "hits":
                self.hits[layer] = self.hits.get(layer, 0) + 1
            else:
                self.kernels[event] = self.kernels.get(event, 0) + 1

    def kernel_counts(self) -> dict[str, Any]:
        """``{"compiles": n, "loads": n, "memo": n, "hits": {layer: n}}``."""
        with self._lock:
            return {**{e: self.kernels.get(e, 0) for e in ("compiles", "loads", "memo")}, "hits": dict(sorted(self.hits.items()))}

    def as_dict(self) -> dict[str, Any]:
        """Per-op counts by op name, plus :attr:`KERNELS` once a kernel was compiled, loaded or read for this profile."""
        out: dict[str, Any] = {op: dict(c) for op, c in sorted(self.counts.items())}
        if self.kernels or self.hits:
            out[self.KERNELS] = self.kernel_counts()
        return out


@final
class Profile(Record):
    """Everything hwprofile decided for one device. Frozen; read values with ``profile[key]``.

    Typed code reads a value with :meth:`get` (``prof.get("router_gemm.max_tokens", int)``), which
    checks the type. Two profiles are equal only when they are the same object: each one carries its
    own dispatch counters, and ``hwprofile.profile()`` returns the cached one.
    """

    device: _device.DeviceInfo
    #: The architecture plugin chosen for the device, its NVRTC target, and why.
    selection: Selection
    #: Plugins that supplied settings, lowest priority first: the architecture plugin, then downstream ones.
    participants: tuple[PluginInfo, ...]
    #: Every declared setting, resolved, with its chain of layers; read-only.
    settings: Mapping[str, ResolvedSetting]
    #: Environment defaults the plugins propose, by variable name; read-only.
    env_defaults: Mapping[str, ResolvedEnvDefault]
    #: Kernel specs by op, for the selected target; empty when no architecture plugin serves the device.
    kernels: Mapping[str, KernelSpec]
    #: Stable 16-hex-digit hash of what decides dispatch (see :func:`fingerprint`), not of the device's UUID.
    fingerprint: str
    #: Kernel-vs-fallback counters of this process; the one mutable part.
    stats: DispatchStats

    __eq__ = object.__eq__  # identity, see above
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        p = self.plugin
        return f"<Profile {self.fingerprint} device {self.device.index} {self.device.name!r} plugin {p.name if p else None}>"

    @property
    def plugin(self) -> PluginInfo | None:
        return self.selection.plugin

    @property
    def target(self) -> str | None:
        """NVRTC target (``"sm_90a"``) of the selected plugin for this device, or ``None``."""
        return self.selection.target

    def __getitem__(self, key: str) -> Any:
        """The value of setting ``key`` (untyped: typed code uses :meth:`get`); unknown keys raise SettingError."""
        return self.explain(key).value

    def __contains__(self, key: object) -> bool:
        """``"myengine.flag" in prof``: whether ``key`` is a declared setting of this profile (any other object: False).

        What a downstream reader asks before reading a setting that an optional plugin declares.
        """
        return isinstance(key, str) and key in self.settings

    def __iter__(self) -> Iterator[str]:
        """The setting keys, sorted (as :attr:`settings` holds them): ``for key in prof: prof[key]``."""
        return iter(self.settings)

    def keys(self) -> KeysView[str]:
        """The setting keys, sorted; with ``prof[key]`` this makes ``dict(prof)`` the settings' values by key."""
        return self.settings.keys()

    def get(self, key: str, kind: type[_T]) -> _T:
        """The value of setting ``key``, checked to be a ``kind`` (``bool``, ``int``, ``float`` or ``str``).

        A mismatch (``get("gemv.split_k", int)`` on a bool setting) is a :class:`SettingError` naming
        the setting's declared type: a value never silently converts (an int setting is not a float).
        """
        resolved = self.explain(key)
        value, s = resolved.value, resolved.setting
        if kind is float and s.type == "float" and type(value) is int:
            return float(value)  # a float setting's declared default may be written 1
        if type(value) is not kind:
            raise SettingError(
                f"setting {key} is declared {s.type!r} and holds {value!r} ({type(value).__name__}), not {kind.__name__}; "
                f"read it with .get({key!r}, {type(value).__name__})"
            )
        return value

    def get_bool(self, key: str) -> bool:
        return self.get(key, bool)

    def get_int(self, key: str) -> int:
        return self.get(key, int)

    def get_float(self, key: str) -> float:
        return self.get(key, float)

    def get_str(self, key: str) -> str:
        """A ``"str"`` or ``"enum"`` setting's value."""
        return self.get(key, str)

    def explain(self, key: str) -> ResolvedSetting:
        """The setting's value with its whole chain of layers."""
        try:
            return self.settings[key]
        except KeyError:
            from .settings import unknown_key_hint

            raise SettingError(f"unknown setting {key!r}; {unknown_key_hint(key, self.settings)}") from None

    def pending_env(self, environ: Mapping[str, str] | None = None) -> dict[str, ResolvedEnvDefault]:
        """Env defaults that :meth:`apply_env` would write now (those the user has not set)."""
        env = os.environ if environ is None else environ
        return {n: d for n, d in self.env_defaults.items() if n not in env}

    def apply_env(self, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
        """Write env defaults the user did not set into ``environ`` (default ``os.environ``); return them."""
        from .settings import apply_env_defaults

        written = apply_env_defaults(self.env_defaults, environ)
        if written:
            log.info("hwprofile %s applied env defaults: %s", self.fingerprint, written)
        return written

    def as_dict(self) -> dict[str, Any]:
        p = self.plugin
        return {
            "fingerprint": self.fingerprint,
            "device": _device.with_details(self.device).as_dict(),
            "plugin": {
                "name": p.name if p else None,
                "distribution": p.distribution if p else None,
                "version": p.version if p else None,
                "nvrtc_arch": self.target,
                "reason": self.selection.reason,
            },
            "participants": [x.name for x in self.participants],
            "settings": {k: s.as_dict() for k, s in self.settings.items()},
            "env_defaults": {k: d.as_dict() for k, d in self.env_defaults.items()},
            "kernels": {k: spec.describe() for k, spec in self.kernels.items()},
            "stats": self.stats.as_dict(),
        }


# --- process-wide state --------------------------------------------------------------------------

_lock = threading.RLock()
_registry: Registry | None = None
_profiles: dict[int, Profile] = {}
#: How long a fork waits for another thread to finish resolving a profile before forking anyway.
FORK_WAIT_S = 30.0
_fork_held = False


def _before_fork() -> None:
    """Fork only between resolutions: wait for a thread inside profile() (bounded) so the child
    inherits either no state or complete state, and a lock nobody in the child could release."""
    global _fork_held
    _fork_held = _lock.acquire(timeout=FORK_WAIT_S)


def _after_fork_parent() -> None:
    if _fork_held:
        _lock.release()


def _after_fork_child() -> None:
    global _lock, _registry
    if _fork_held:
        _lock.release()  # the forking thread is the child's only thread, and owns the lock there too
        return
    # another thread was stuck inside profile() for FORK_WAIT_S: its lock and half-built state are
    # unusable in the child, which starts over
    _lock = threading.RLock()
    _registry = None
    _profiles.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child)


def _refuse_reentry(what: str) -> None:
    """A plugin calling back into hwprofile while it is being imported or run would get a second,
    different profile or recurse forever: say which plugin did it instead.

    Runs before the lock is taken, so the registry module may be one that another thread is still
    importing (its first profile(), or ``import hwprofile.plugin``): it is asked only once imported
    in full. No module in the registry yet means no plugin was ever loaded, so none is running here;
    one in ``sys.modules`` is imported through the import system, which waits for the thread
    importing it to finish (reading ``sys.modules`` directly gave a half-initialised module without
    ``current_activity``: tests/profiles/test_threads.py). This thread cannot be the one importing
    it: importing the registry runs no plugin and no profile().
    """
    if "hwprofile.registry" not in sys.modules:
        return
    from . import registry as reg

    doing = reg.current_activity()
    if doing is not None:
        raise PluginError(
            f"hwprofile.{what} was called while {doing}; a plugin must not resolve profiles from its import "
            "or its hooks (use the device and settings the hook receives)"
        )


def registry() -> Registry:
    """The process's plugin registry, loaded from entry points on first use."""
    global _registry
    _refuse_reentry("registry()")
    with _lock:
        if _registry is None:
            # Every plugin imports the plugin API (hwprofile.plugin, which builds on this module and
            # so is not imported here), and every profile needs these modules of it: loaded before
            # the first plugin, their cost is not charged to whichever plugin loads first in
            # Registry.import_seconds (the plugin API's own module is, a few ms).
            from . import settings, tuning  # noqa: F401
            from .kernels import spec  # noqa: F401
            from .registry import Registry

            _registry = Registry().load_entry_points()
        return _registry


def _plugin_catalog() -> dict[str, CatalogEntry]:
    """The process registry's catalog entries (loads the plugins): what detection asks for a plugin's device name."""
    return registry().catalog_entries()


def detect(environ: Mapping[str, str] | None = None) -> _device.Detection:
    """Detect the visible devices (``hwprofile.detect``): :func:`hwprofile.device.detect`, where a
    simulated device (``HWPROFILE_DEVICE``) may also be one an installed plugin's catalog entry names.

    Cached per relevant environment; the plugins are loaded only for a name that is neither built in
    nor a capability.
    """
    return _device.detect(environ, plugin_catalog=_plugin_catalog)


def reset() -> None:
    """Forget everything this process remembered: call after changing the environment or the plugins.

    Runs every callback registered with :func:`hwprofile._state.on_reset`: the registry and profiles
    (here), detected devices, directory listings, source digests, and whatever other modules
    registered (compiled-kernel memos, dispatch tables).
    """
    with _lock:
        _state.reset_all()


@_state.on_reset
def _forget_profiles() -> None:
    global _registry
    with _lock:
        _registry = None
        _profiles.clear()


def _current_device_index() -> int:
    torch = sys.modules.get("torch")  # never import torch here; ask it only if the process already has it
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return int(torch.cuda.current_device())
        except Exception:  # noqa: BLE001 - a half-initialised torch must not break profiling
            pass
    return 0


def device_index(device: Any) -> int:
    """The CUDA index named by ``device``: an int, ``"cuda"``, ``"cuda:1"`` or a ``torch.device`` (read, not imported).

    A ``bool`` is refused: it is an ``int`` to Python, but ``profile(True)`` meaning device 1 is a
    bug of the caller's (a flag passed where the device goes), never a device choice.
    """
    if isinstance(device, bool):
        from .errors import DeviceError

        raise DeviceError(
            f"device {device!r} is a bool, not a device: pass an index (0, 1, ...), 'cuda', 'cuda:N' or torch.device('cuda', N), "
            "or nothing for the current device"
        )
    if isinstance(device, int):
        return device
    kind: str | None
    index: Any
    if isinstance(device, str):
        kind, index = device.partition(":")[::2]
    else:
        kind, index = getattr(device, "type", None), getattr(device, "index", None)
    if kind == "cuda" and (index is None or index == "" or str(index).isdigit()):
        return _current_device_index() if index in (None, "") else int(index)
    from .errors import DeviceError

    raise DeviceError(f"device {device!r} is not a CUDA device: pass an index, 'cuda', 'cuda:N' or torch.device('cuda', N)")


def profile(device: int | str | Any = None) -> Profile:
    """The frozen profile of CUDA device ``device`` (default: the current one), cached per process.

    ``device`` is an index, ``"cuda"``, ``"cuda:1"`` or a ``torch.device``.
    """
    _refuse_reentry("profile()")
    index = _current_device_index() if device is None else device_index(device)
    with _lock:
        cached = _profiles.get(index)
        if cached is not None:
            return cached
        if _registry is not None:
            prof = build_profile(detect().device(index), _registry, os.environ)
        else:
            from ._first_profile import first_profile

            prof = first_profile(index, registry, build_profile)
        _profiles[index] = prof
        log.debug(
            "profile for device %d (%s): plugin %s, fingerprint %s",
            index, prof.device.name, prof.plugin and prof.plugin.name, prof.fingerprint,
        )
    # the first-profile hook (core's: HWPROFILE_TUNE=stale, default off) may measure and re-resolve: outside the lock,
    # so that another thread's op (whose dispatch table waits on profile() under its own lock) cannot deadlock with it
    return _hand_over(prof)


# --- the hand-over of a device's first profile (hook hwprofile_first_profile; core's re-tuner implements it) --------

#: The hook the first profile() of a real device calls (hwprofile.hookspecs): the tools that measure through
#: hwprofile.ops (hwprofile.retune) sit above this module, so they are reached as plugins, never imported here.
FIRST_PROFILE_HOOK = "hwprofile_first_profile"
_handing_over = threading.local()  # set while this thread is inside the hook: profiles it resolves meanwhile do not call it


def _hand_over(prof: Profile) -> Profile:
    """The profile a device's first ``profile()`` returns: ``prof``, or the one the plugins' first-profile hooks return.

    Runs with ``prof`` already cached and the lock released, so a hook (core's re-tuner asks ``profile()``
    for the device) finds it, and other threads get it meanwhile. Never on a simulated device, never while
    this thread is inside the hook already. A profile a hook returns is cached for the device.
    """
    reg = _registry
    if prof.device.simulated or reg is None or getattr(_handing_over, "active", False):
        return prof
    from .errors import PluginError

    current = prof
    _handing_over.active = True
    try:
        for p in reg.participants(prof.plugin, FIRST_PROFILE_HOOK):
            for _, out in reg.call_layers(FIRST_PROFILE_HOOK, [p], profile=current):
                if out is None:
                    continue
                if not isinstance(out, Profile) or out.device.index != prof.device.index:
                    raise PluginError(
                        f"plugin {p.label}: {FIRST_PROFILE_HOOK} must return None or a Profile of device "
                        f"{prof.device.index}, got {type(out).__name__}"
                    )
                current = out
    finally:
        _handing_over.active = False
    if current is not prof:
        with _lock:
            _profiles[prof.device.index] = current
    return current


def _rebuild(index: int) -> Profile:
    """Resolve device ``index`` again (its tuned files changed) and cache the new profile; dispatch tables follow it."""
    with _lock:
        prof = build_profile(detect().device(index), registry(), os.environ)
        _profiles[index] = prof
        return prof


# --- end of the hand-over ---------------------------------------------------------------------------------------


def build_profile(info: _device.DeviceInfo, reg: Registry, environ: Mapping[str, str]) -> Profile:
    """Resolve a profile for ``info`` from ``reg`` and ``environ`` (no caching; used by tests and tools)."""
    selection = reg.select(info)
    kernels: dict[str, Any] = {}
    if selection.target is not None:
        from .kernels.spec import collect_kernels

        kernels = collect_kernels(reg, selection, info)

    from .settings import CORE_SETTINGS, EnvDefault, ResolvedEnvDefault, SettingsResolver, check_env_default, check_environment

    resolver = SettingsResolver()
    resolver.declare(CORE_SETTINGS, by="hwprofile core")
    for p, decl in reg.call_layers("hwprofile_declare_settings", reg.participants(selection.plugin, "hwprofile_declare_settings")):
        if decl is not None:
            resolver.declare(decl, by=p.label, namespace=p.name, source=p.source)  # one plugin, one name in provenance
    check_environment(environ, (s.env_var for s in resolver.declared.values()))
    from . import tuned_layers, tuning

    staleness = tuning.Staleness(info, selection, kernels)
    participants = reg.participants(selection.plugin, "hwprofile_settings")
    for p in participants:
        values = reg._call_plugin("hwprofile_settings", p, device=info, resolved=MappingProxyType(resolver.current()))
        who = f"plugin {p.label}"

        def shipped(key: str, stamp: Any, who: str = who) -> str:
            return staleness.shipped(key, stamp, who=who)

        resolver.add("arch" if p.arch else "downstream", p.source, values, who=who, check=shipped)
    tuned_layers.add_tuned_layers(resolver, info, staleness, environ)
    resolver.add_user_env(environ)
    settings = resolver.resolved()
    staleness.report(settings["strict"])  # after resolving: the one reading of strict is the setting's value
    values = MappingProxyType({k: s.value for k, s in settings.items()})

    env_defaults: dict[str, ResolvedEnvDefault] = {}
    env_participants = reg.participants(selection.plugin, "hwprofile_env_defaults")
    for p, out in reg.call_layers("hwprofile_env_defaults", env_participants, device=info, settings=values):
        if out is None:
            continue
        if not isinstance(out, Mapping):
            raise PluginError(f"plugin {p.label}: hwprofile_env_defaults must return a dict of name -> EnvDefault")
        for name, d in out.items():
            check_env_default(name, getattr(d, "value", None), who=f"plugin {p.label}")
            if not isinstance(d, EnvDefault) or not isinstance(d.value, str):
                raise PluginError(
                    f"plugin {p.label}: env default {name!r} must be hwprofile.EnvDefault(value=str, reason=...), got {d!r}"
                )
            env_defaults[name] = ResolvedEnvDefault(name, d.value, d.reason, d.bit_identical, p.source, environ.get(name))

    fp = fingerprint(selection, settings, env_defaults, kernels)
    return Profile(
        device=info,
        selection=selection,
        participants=tuple(participants),
        settings=MappingProxyType(settings),
        env_defaults=MappingProxyType(dict(sorted(env_defaults.items()))),
        kernels=MappingProxyType(kernels),
        fingerprint=fp,
        stats=DispatchStats(),
    )


def fingerprint(
    selection: Selection, settings: Mapping[str, ResolvedSetting], env: Mapping[str, ResolvedEnvDefault], kernels: Mapping[str, Any]
) -> str:
    """Stable hash of what decides dispatch: plugin identity, settings, env defaults, kernel keys."""
    import hashlib  # here, not at import: only resolving a profile needs it

    p = selection.plugin
    # repr() of sorted tuples of plain values (str, int, float, bool, None) is stable across processes
    # and Python versions, and needs no json import.
    doc = (
        ("plugin", (p.name, p.distribution, p.version) if p else None),
        ("target", selection.target),
        ("settings", tuple(sorted((k, s.value) for k, s in settings.items()))),
        ("env", tuple(sorted((k, d.value) for k, d in env.items()))),
        ("kernels", tuple(sorted((k, spec.source_digest(), tuple(spec.instances)) for k, spec in kernels.items()))),
    )
    return hashlib.sha256(repr(doc).encode()).hexdigest()[:16]
