"""The resolved result for one device: device facts, selected plugin, settings, env defaults, kernels.

``profile(device)`` is cached per device and process; :func:`reset` forgets everything (after the
environment or the installed plugins change). Resolving imports neither torch nor CUDA.
Tuned files, stamps and staleness live in :mod:`hwprofile.tuning`.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping, MutableMapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from . import device as _device
from ._log import get_logger
from .errors import PluginError, SettingError

if TYPE_CHECKING:  # imported inside functions: a first profile() loads them while NVML starts (_first_profile)
    from .registry import PluginInfo, Registry, Selection
    from .settings import ResolvedEnvDefault, ResolvedSetting

log = get_logger(__name__)

class DispatchStats:
    """Per-op counters of kernel vs fallback calls in this process (mutable, thread-tolerant)."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {op: dict(c) for op, c in sorted(self.counts.items())}


class _ProfileFields(NamedTuple):
    device: _device.DeviceInfo
    selection: Selection
    participants: tuple[PluginInfo, ...]
    settings: Mapping[str, ResolvedSetting]
    env_defaults: Mapping[str, ResolvedEnvDefault]
    kernels: Mapping[str, Any]
    fingerprint: str
    stats: DispatchStats


class Profile(_ProfileFields):
    """Everything hwprofile decided for one device. Frozen; read values with ``profile[key]``."""

    __slots__ = ()

    @property
    def plugin(self) -> PluginInfo | None:
        return self.selection.plugin

    @property
    def target(self) -> str | None:
        """NVRTC target (``"sm_90a"``) of the selected plugin for this device, or ``None``."""
        return self.selection.target

    def __getitem__(self, key: str) -> Any:
        return self.explain(key).value

    def explain(self, key: str) -> ResolvedSetting:
        """The setting's value with its whole chain of layers."""
        try:
            return self.settings[key]
        except KeyError:
            raise SettingError(f"unknown setting {key!r}; known settings: {', '.join(self.settings)}") from None

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


def registry() -> Registry:
    """The process's plugin registry, loaded from entry points on first use."""
    global _registry
    with _lock:
        if _registry is None:
            from .registry import Registry

            _registry = Registry().load_entry_points()
        return _registry


def reset() -> None:
    """Forget the registry, detected devices and profiles (call after changing env or plugins)."""
    global _registry
    with _lock:
        _registry = None
        _profiles.clear()
        _device.clear_cache()
        if "hwprofile.registry" in sys.modules:
            sys.modules["hwprofile.registry"].clear_cache()


def _current_device_index() -> int:
    torch = sys.modules.get("torch")  # never import torch here; ask it only if the process already has it
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return int(torch.cuda.current_device())
        except Exception:  # noqa: BLE001 - a half-initialised torch must not break profiling
            pass
    return 0


def profile(device: int | None = None) -> Profile:
    """The frozen profile of CUDA device ``device`` (default: the current one), cached per process."""
    index = _current_device_index() if device is None else int(device)
    with _lock:
        cached = _profiles.get(index)
        if cached is not None:
            return cached
        if _registry is not None:
            prof = build_profile(_device.detect().device(index), _registry, os.environ)
        else:
            prof = _first_profile(index)
        _profiles[index] = prof
        log.debug("profile for device %d (%s): plugin %s, fingerprint %s", index, prof.device.name, prof.plugin and prof.plugin.name, prof.fingerprint)
        return prof


def _first_profile(index: int) -> Profile:
    """The first profile of the process, with NVML's start-up overlapped.

    NVML starts in a helper thread (:func:`hwprofile.device.detect_in_background`) while this
    thread imports and registers the plugins: the two do not depend on each other, and NVML's
    start-up is mostly time spent in the driver. Resolving then overlaps NVML's teardown. So a
    first ``profile()`` costs little more than NVML's own start (benchmarks/RESULTS.md, "Start-up").
    """
    probe = _device.detect_in_background()
    try:
        error: Exception | None = None
        try:
            reg = registry()
            import hashlib  # noqa: F401 - resolving needs it (digests, fingerprint): import it while NVML starts
        except Exception as exc:  # noqa: BLE001 - re-raised below, after a missing device is reported (as when detection ran first)
            error = exc
        info = probe.result().device(index)
        if error is not None:
            raise error
        return build_profile(info, reg, os.environ)
    finally:
        probe.close()  # no thread outlives profile(): the process may fork next


def build_profile(info: _device.DeviceInfo, reg: Registry, environ: Mapping[str, str]) -> Profile:
    """Resolve a profile for ``info`` from ``reg`` and ``environ`` (no caching; used by tests and tools)."""
    selection = reg.select(info)
    kernels: dict[str, Any] = {}
    if selection.target is not None:
        from .kernelspec import collect_kernels

        kernels = collect_kernels(reg, selection, info)

    from .settings import CORE_SETTINGS, EnvDefault, ResolvedEnvDefault, SettingsResolver

    resolver = SettingsResolver()
    resolver.declare(CORE_SETTINGS, by="hwprofile core")
    for p, decl in reg.call_layers("hwprofile_declare_settings", reg.participants(selection.plugin, "hwprofile_declare_settings")):
        if decl is not None:
            resolver.declare(decl, by=p.label, namespace=p.name)
    from . import tuning

    staleness = tuning.Staleness(info, selection, kernels, environ)
    participants = reg.participants(selection.plugin, "hwprofile_settings")
    for p in participants:
        values = reg._call_plugin("hwprofile_settings", p, device=info, resolved=MappingProxyType(resolver.current()))
        resolver.add("arch" if p.arch else "downstream", p.source, values, who=f"plugin {p.label}", check=staleness.shipped)
    staleness.report()
    tuning.add_tuned_layers(resolver, info, staleness, environ)
    resolver.add_user_env(environ)
    settings = resolver.resolved()
    values = MappingProxyType({k: s.value for k, s in settings.items()})

    env_defaults: dict[str, ResolvedEnvDefault] = {}
    for p, out in reg.call_layers("hwprofile_env_defaults", reg.participants(selection.plugin, "hwprofile_env_defaults"), device=info, settings=values):
        if out is None:
            continue
        if not isinstance(out, Mapping):
            raise PluginError(f"plugin {p.label}: hwprofile_env_defaults must return a dict of name -> EnvDefault")
        for name, d in out.items():
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


def fingerprint(selection: Selection, settings: Mapping[str, ResolvedSetting], env: Mapping[str, ResolvedEnvDefault], kernels: Mapping[str, Any]) -> str:
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
        ("kernels", tuple(sorted((k, spec.source_digest(with_cuda_headers=False), tuple(spec.instances)) for k, spec in kernels.items()))),
    )
    return hashlib.sha256(repr(doc).encode()).hexdigest()[:16]
