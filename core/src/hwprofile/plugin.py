"""The plugin-author API: everything a hwprofile plugin and its tests import, from one module.

Never imports torch, CUDA or the JIT at import: plugins are imported while the first ``profile()``
runs, and every module this one imports is loaded by then anyway. What is not exported here (or from
``hwprofile``) is internal and may change without notice; every module of the shipped plugins
imports only this module and ``hwprofile`` (``tests/package/test_import_graph.py`` holds it).

    from hwprofile.plugin import ArchSpec, DeviceInfo, EnvDefault, Setting, Value, hookimpl

The hooks a plugin implements, and their contracts, are in :mod:`hwprofile.hookspecs`.

Records and the hook marker:

* ``hookimpl``: marks a plugin's hook implementations.
* ``ArchSpec``: what an architecture plugin claims (exact capabilities -> NVRTC target) and says about it.
* ``PluginInfo``: an installed plugin as the registry saw it (name, distribution, version, module).
* ``DeviceInfo``: the device a hook is asked about.
* ``CatalogEntry``: a simulated device a plugin contributes (``hwprofile_catalog``).
* ``Setting``: a setting a plugin declares in its own namespace; ``Value``: a value with its reason
  (and, for a measured threshold, its :class:`Stamp`); ``EnvDefault``: a proposed environment variable.
* ``KernelSpec``: a kernel a plugin contributes (source, pre-built instances, ``configure``);
  ``Launch``: what ``configure`` returns for one call.

Op facts, read from hwprofile's op table (``hwprofile.optable``, the one place they are declared):

* ``OPS``: every op by name (an :class:`OpDef` each), in table order; read it, never change it.
* ``OpDef``: one op's contract, gates, fallback identity and sweep grid.
* ``op_def(name)``: the op called ``name``; an unknown name is a ``KeyError`` listing the known ones.
* ``NO_SCALE``, ``TENSOR_SCALE``, ``ROW_SCALE``: the scale modes (``OpDef.scale_modes``), which are
  the kernels' ``SCALE`` template argument and the ``scale=`` a ``configure`` receives.

The shared skinny-GEMM kernel family (``hwprofile/gemv.cuh``, planned by ``hwprofile.kernels.skinny_gemm``):

* ``ArchTuning``: one SM's planning constants (SM count, shared memory, cluster size, entry-point prefix).
* ``kernel_specs(package, source, tuning)``: the family's op kernels for one SM (every op of
  ``PREBUILT_SHAPES``), ready to return from ``hwprofile_kernels``.
* ``plan_skinny_gemm(tuning, m=, n=, k=, fp8=, out=, scale=, split_k=)``: the family's launch for one
  call, for a plugin that routes some shapes to the family and others to kernels of its own.
* ``PREBUILT_SHAPES``: the ops the family computes, each with the (M, N, K) shapes whose instances
  ``hwprofile compile`` pre-builds.
* ``prebuilt_instances(op, configure)``: the name expressions ``configure`` plans for those shapes
  (every scale mode of the op, split-K on and off): a ``KernelSpec``'s ``instances``.

Measured thresholds:

* ``Stamp``: what a threshold was measured against (read from a tuned file, or built below).
* ``measured_stamp(op, ...)``: the stamp of a shipped measured threshold, whose fallback function
  is the op table's: a plugin names the op and the library versions, never the fallback.

For a plugin's tests:

* ``simulated_device(capability)``: a simulated device of an exact capability (no GPU, no NVML).
* ``profile_for(device)``: a profile from the installed plugins, uncached, without the machine's environment.
* ``compile_kernel(spec, target)``: compile every instance of a spec with NVRTC (no GPU needed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .catalog import CatalogEntry
from .device import DeviceInfo
from .hookspecs import hookimpl
from .kernels.skinny_gemm import PREBUILT_SHAPES, ArchTuning, kernel_specs, prebuilt_instances
from .kernels.skinny_gemm import plan as plan_skinny_gemm
from .kernels.spec import KernelSpec, Launch
from .optable import NO_SCALE, OPS, ROW_SCALE, TENSOR_SCALE, OpDef
from .optable import get as op_def
from .registry import ArchSpec, PluginInfo
from .settings import EnvDefault, Setting, Value
from .tuning import Stamp

if TYPE_CHECKING:
    from .kernels import CompiledKernel
    from .profiles import Profile

__all__ = [
    "NO_SCALE",
    "OPS",
    "PREBUILT_SHAPES",
    "ROW_SCALE",
    "TENSOR_SCALE",
    "ArchSpec",
    "ArchTuning",
    "CatalogEntry",
    "DeviceInfo",
    "EnvDefault",
    "KernelSpec",
    "Launch",
    "OpDef",
    "PluginInfo",
    "Setting",
    "Stamp",
    "Value",
    "compile_kernel",
    "hookimpl",
    "kernel_specs",
    "measured_stamp",
    "op_def",
    "plan_skinny_gemm",
    "prebuilt_instances",
    "profile_for",
    "simulated_device",
]


def measured_stamp(
    op: str,
    *,
    device: str,
    compute_capability: tuple[int, int],
    plugin: str,
    plugin_version: str,
    kernel: str,
    libraries: Mapping[str, str],
    date: str = "",
    plan: str = "",
) -> Stamp:
    """The stamp of a threshold a plugin ships, measured by ``hwprofile sweep op``: the sweep file's ``[stamp]``.

    The fallback function is the op table's (``op_def(op).fallback``), so no plugin copies it;
    ``libraries`` are the versions the sweep recorded beside it (``torch``, ``cublas``,
    ``cublaslt``). By calling this a plugin says its threshold was measured against the fallback
    the op table names *now*: when hwprofile changes an op's fallback, re-sweep (or withdraw) the
    thresholds of that op, because the stamp follows the table and cannot go stale on the function.
    An unknown ``op`` is a ``KeyError`` listing the known ones; ``libraries`` naming ``function``
    is a ``ValueError``.
    """
    d = op_def(op)
    if "function" in libraries:
        raise ValueError(f"measured_stamp({op!r}): libraries names 'function'; the fallback function is the op table's ({d.fallback!r})")
    return Stamp(op, device, compute_capability, plugin, plugin_version, kernel, {"function": d.fallback, **libraries}, date, plan=plan)


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
