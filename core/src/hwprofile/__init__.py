"""hwprofile: one plugin per GPU architecture for every per-architecture decision of an engine.

``import hwprofile`` has no side effects: it imports neither torch nor CUDA, reads no device and
writes no environment variable. Everything below is loaded on first use.

    import hwprofile
    prof = hwprofile.profile()           # device 0 (or torch's current device)
    prof["router_gemm.max_tokens"]       # 16, with provenance in prof.explain(...)
    prof.apply_env()                     # writes only env defaults the user did not set
"""

# No ``from __future__`` and no ``typing`` at run time: each is a module import (typing pulls in re,
# collections, contextlib...: 5-18 ms in a clean venv) that ``import hwprofile`` does not need.
# Type checkers treat any name TYPE_CHECKING as true.
TYPE_CHECKING = False

__version__ = "0.1.0"

_LAZY = {
    "hookimpl": "hookspecs",
    "profile": "profiles",
    "reset": "profiles",
    "Profile": "profiles",
    "detect": "device",
    "DeviceInfo": "device",
    "CatalogEntry": "catalog",
    "ArchSpec": "registry",
    "PluginInfo": "registry",
    "Setting": "settings",
    "Value": "settings",
    "EnvDefault": "settings",
    "KernelSpec": "kernelspec",
    "Launch": "kernelspec",
    "HwprofileError": "errors",
    "PluginError": "errors",
    "SettingError": "errors",
    "DeviceError": "errors",
    "KernelError": "errors",
}

__all__ = [
    "ArchSpec", "CatalogEntry", "DeviceError", "DeviceInfo", "EnvDefault", "HwprofileError", "KernelError", "KernelSpec", "Launch",
    "PluginError", "PluginInfo", "Profile", "Setting", "SettingError", "Value", "__version__", "detect", "hookimpl",
    "profile", "reset",
]


def __getattr__(name: str) -> "Any":
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'hwprofile' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from typing import Any

    from .catalog import CatalogEntry
    from .device import DeviceInfo, detect
    from .errors import DeviceError, HwprofileError, KernelError, PluginError, SettingError
    from .hookspecs import hookimpl
    from .kernelspec import KernelSpec, Launch
    from .profiles import Profile, profile, reset
    from .registry import ArchSpec, PluginInfo
    from .settings import EnvDefault, Setting, Value
