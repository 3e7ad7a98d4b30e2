"""The plugin-author API: everything a hwprofile plugin and its tests import, from one module.

Never imports torch, CUDA or the JIT at import: plugins are imported while the first ``profile()``
runs, and every module this one imports is loaded by then anyway. What is not exported here (or from
``hwprofile``) is internal and may change without notice.

    from hwprofile.plugin import ArchSpec, DeviceInfo, EnvDefault, Setting, Value, hookimpl

The hooks a plugin implements, and their contracts, are in :mod:`hwprofile.hookspecs`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .catalog import CatalogEntry
from .device import DeviceInfo
from .hookspecs import hookimpl
from .kernels.skinny_gemm import ArchTuning, kernel_specs
from .kernels.spec import KernelSpec, Launch
from .registry import ArchSpec, PluginInfo
from .settings import EnvDefault, Setting, Value
from .tuning import Stamp

if TYPE_CHECKING:
    from .kernels import CompiledKernel
    from .profiles import Profile

__all__ = [
    "ArchSpec",
    "ArchTuning",
    "CatalogEntry",
    "DeviceInfo",
    "EnvDefault",
    "KernelSpec",
    "Launch",
    "PluginInfo",
    "Setting",
    "Stamp",
    "Value",
    "compile_kernel",
    "hookimpl",
    "kernel_specs",
    "profile_for",
    "simulated_device",
]


def simulated_device(capability: tuple[int, int], name: str | None = None, *, index: int = 0) -> DeviceInfo:
    """A simulated device of an exact compute capability, for a plugin's tests (no GPU, no NVML)."""
    major, minor = capability
    return DeviceInfo(index, name or f"simulated sm_{major}{minor}", (major, minor), simulated=True)


def profile_for(device: DeviceInfo, environ: Mapping[str, str] | None = None) -> Profile:
    """Resolve a profile for ``device`` from the installed plugins, uncached.

    ``environ`` stands in for the process environment (default: empty, so no user ``HWPROFILE_*``
    variable, pin or disable list of the machine running the tests leaks into them). Each call loads
    the entry points afresh, so a plugin installed since the last call takes part.
    """
    from .profiles import build_profile
    from .registry import Registry

    env = {} if environ is None else environ
    return build_profile(device, Registry(env).load_entry_points(), env)


def compile_kernel(spec: KernelSpec, target: str) -> CompiledKernel:
    """Compile every instance of ``spec`` for ``target`` with NVRTC, through the kernel cache (no GPU needed).

    Needs ``hwprofile[cu13]`` (or ``[cu12]``): a missing NVRTC is a ``ToolchainError`` that says so.
    """
    from .kernels import compile_spec

    return compile_spec(spec, target)
