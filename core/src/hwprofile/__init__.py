"""hwprofile: one plugin per GPU architecture for every per-architecture decision of an engine.

``import hwprofile`` has no side effects: it imports neither torch nor CUDA, reads no device and
writes no environment variable. Everything below is loaded on first use.

    import hwprofile
    prof = hwprofile.profile()                        # device 0 (or torch's current device)
    prof.get("router_gemm.max_tokens", int)           # 16, type-checked; provenance in prof.explain(...)
    prof.apply_env()                                  # writes only env defaults the user did not set
    hwprofile.tune(0)                                 # re-measure what went stale (after model load, before capture)

Plugin authors import from :mod:`hwprofile.plugin`.
"""

# Every public name is loaded on first access, not here: engines import hwprofile at start-up, and
# its first profile() overlaps plugin loading with NVML's start (hwprofile._first_profile), which only
# works if importing hwprofile loaded nothing yet (import 0.3 ms; benchmarks/RESULTS.md). So this
# module imports nothing at run time, ``typing`` included; the TYPE_CHECKING block below gives type
# checkers the same names, and tests/package/test_public_api.py keeps the three lists in step.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._version import __version__
    from .device import DeviceInfo
    from .errors import AgreementError, DeviceError, HwprofileError, KernelError, PluginError, SettingError, WriteError
    from .hookspecs import hookimpl
    from .kernels.spec import KernelSpec, Launch
    from .profiles import Profile, detect, profile, reset
    from .registry import ArchSpec, PluginInfo
    from .retune import tune
    from .settings import EnvDefault, ResolvedSetting, Setting, Value

__all__ = [
    "AgreementError",
    "ArchSpec",
    "DeviceError",
    "DeviceInfo",
    "EnvDefault",
    "HwprofileError",
    "KernelError",
    "KernelSpec",
    "Launch",
    "PluginError",
    "PluginInfo",
    "Profile",
    "ResolvedSetting",
    "Setting",
    "SettingError",
    "Value",
    "WriteError",
    "__version__",
    "detect",
    "hookimpl",
    "profile",
    "reset",
    "tune",
]

_LAZY = {
    "AgreementError": "errors",
    "ArchSpec": "registry",
    "DeviceError": "errors",
    "DeviceInfo": "device",
    "EnvDefault": "settings",
    "HwprofileError": "errors",
    "KernelError": "errors",
    "KernelSpec": "kernels.spec",
    "Launch": "kernels.spec",
    "PluginError": "errors",
    "PluginInfo": "registry",
    "Profile": "profiles",
    "ResolvedSetting": "settings",
    "Setting": "settings",
    "SettingError": "errors",
    "Value": "settings",
    "WriteError": "errors",
    "__version__": "_version",
    "detect": "profiles",
    "hookimpl": "hookspecs",
    "profile": "profiles",
    "reset": "profiles",
    "tune": "retune",
}


def __getattr__(name: str) -> object:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'hwprofile' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value
