"""The plugin-author API: everything a hwprofile plugin and its tests import, from one module.

Never imports torch, CUDA or the kernel pipeline's compiler stages at import: plugins are imported
while the first ``profile()`` runs, so this module imports only the light records and tables
(``kernels.spec``, ``kernels.skinny_gemm``, ``optable``, ``catalog``, ``tuning``) that resolving needs. What is not exported here (or from
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
* ``Planner(fn, tuning, device=None)``: a ``configure`` calling ``fn(tuning, **shape)`` with the device's
  tuning (a real GPU's read from the driver on the first plan, not while a profile resolves), which it
  carries into the plan digest stamps record.
* ``tuning_for_device(tuning, device)``: ``tuning`` with the device's own SM count and shared memory
  (the driver's on a real GPU, the catalog's on a simulated one).
* ``kernel_specs(package, source, tuning, device=None)``: the family's op kernels for one SM (every op of
  ``PREBUILT_SHAPES``), planned for ``device``'s own SM count and shared memory, ready to return from
  ``hwprofile_kernels``.
* ``plan_skinny_gemm(tuning, m=, n=, k=, fp8=, out=, scale=, split_k=)``: the family's launch for one
  call, for a plugin that routes some shapes to the family and others to kernels of its own.
* ``plan_skinny_gate(tuning, m=, n=, k=, split_k=, n_group=, topk_group=, top_k=)``: the fused MoE gate
  (``ops.moe_gate``) on the family's GEMM, entry ``HWP_MOE_GATE_ENTRY_POINT`` of ``hwprofile/moe_gate.cuh``;
  ``check_gate_shape(m=, n=, k=, n_group=, topk_group=, top_k=, what=)`` is its bounds' ``ValueError``
  (and returns the ``MAX_N`` template argument), for a plugin planning the gate on a GEMM of its own;
  ``gate_kernel_spec(package, source, tuning, device)`` the whole spec of a plugin on the family.
* ``family_kernels(package, source, tuning, device)``: everything a plugin on the family returns from
  ``hwprofile_kernels``: the op kernels (``kernel_specs``) and the fused gate (``gate_kernel_spec``), one source.
* ``check_kernel_shape(m=, n=, k=, vec=, max_m=, what=)``: the ``ValueError`` (naming the limit) a
  planner raises for a shape no kernel of the family takes, so a gate can refuse it.
* ``PREBUILT_SHAPES``: the ops the family computes, each with the (M, N, K) shapes whose instances
  ``hwprofile compile`` pre-builds.
* ``prebuilt_instances(op, configure)``: the name expressions ``configure`` plans for those shapes
  (every scale mode of the op, split-K on and off): a ``KernelSpec``'s ``instances``.

Measured thresholds:

* ``Stamp``: what a threshold was measured against: the ``[stamp]`` of a sweep file.
* ``shipped_stamp(package, file, op=None)``: the ``[stamp]`` of a sweep file a plugin ships as
  package data, exactly as ``hwprofile sweep OP`` wrote it: the fallback it records is the one the
  sweep measured, so the value goes stale at run time when hwprofile's fallback for the op changes.
* ``shipped_values(package, file, op, reason)``: every ``[thresholds]`` value of such a file as a
  ``Value`` carrying that stamp (the per-shape table and the cost model a sweep wrote).
* ``unmeasured_settings(device, sku=, split_k_reason=)``: what a plugin of an unmeasured SKU states
  (the cost model's bandwidth-rule defaults, split-K), each saying "not measured on" the SKU;
  ``rule_model(op, device, sku=)`` is one op's ``<op>.model`` by that rule (an op a measured plugin has not swept).

Environment defaults:

* ``arch_env_defaults(device, targets, why)``: ``TORCH_CUDA_ARCH_LIST`` for the device's own target (``sm_103a``
  gives ``10.3a``) saying ``why`` that target, and ``CUDA_MODULE_LOADING=LAZY``: what every architecture plugin proposes.

A plugin on the shared family is then its ``ArchSpec``, its ``ArchTuning``, and one call of each of
``family_kernels``, ``unmeasured_settings`` and ``arch_env_defaults`` (``hwprofile new-plugin --family`` writes
one); its tests subclass ``pytest_hwprofile.family``'s checks.

For a plugin's tests:

* ``simulated_device(capability)``: a simulated device of an exact capability (no GPU, no NVML).
* ``profile_for(device)``: a profile from the installed plugins, uncached, without the machine's environment.
* ``compile_kernel(spec, target)``: compile every instance of a spec with NVRTC (no GPU needed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from . import _state
from .catalog import CatalogEntry
from .device import DeviceInfo
from .errors import PluginError, SettingError
from .hookspecs import hookimpl
from .kernels.gate_plan import check_gate as check_gate_shape
from .kernels.gate_plan import plan_skinny_gate
from .kernels.gate_plan import skinny_gate_spec as gate_kernel_spec
from .kernels.skinny_gemm import PREBUILT_SHAPES, ArchTuning, Planner, kernel_specs, prebuilt_instances
from .kernels.skinny_gemm import check_shape as check_kernel_shape
from .kernels.skinny_gemm import for_device as tuning_for_device
from .kernels.skinny_gemm import plan as plan_skinny_gemm
from .kernels.spec import KernelSpec, Launch, _package_dir
from .optable import NO_SCALE, OPS, ROW_SCALE, TABLE, TENSOR_SCALE, GateDef, OpDef
from .optable import get as op_def
from .registry import ArchSpec, PluginInfo
from .settings import EnvDefault, Setting, Value
from .tuning import Stamp, read_tuned

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
    "Planner",
    "PluginInfo",
    "Setting",
    "Stamp",
    "Value",
    "arch_env_defaults",
    "check_gate_shape",
    "check_kernel_shape",
    "compile_kernel",
    "family_kernels",
    "gate_kernel_spec",
    "hookimpl",
    "kernel_specs",
    "op_def",
    "plan_skinny_gate",
    "plan_skinny_gemm",
    "prebuilt_instances",
    "profile_for",
    "rule_model",
    "shipped_stamp",
    "shipped_values",
    "simulated_device",
    "tuning_for_device",
    "unmeasured_settings",
]


_shipped: dict[tuple[str, str], Stamp] = {}  # shipped_stamp per (package, file); reset() clears it


@_state.on_reset
def _forget_shipped_stamps() -> None:
    _shipped.clear()


def shipped_stamp(package: str, file: str, *, op: str | None = None) -> Stamp:
    """The ``[stamp]`` of a sweep file that plugin ``package`` ships: what its measured thresholds were measured against.

    ``file`` is a path inside the package (``"measured/gemv.toml"``), shipped as package data: the
    ``[stamp]`` (with ``[stamp.fallback]``) and ``[thresholds]`` tables that ``hwprofile sweep OP``
    wrote, copied as they are (the raw measurements may stay out). The fallback identity is the
    measurement's, never the op table's: when hwprofile's fallback for the op changes, the value is
    reported stale at run time, whichever core the plugin is installed beside. ``op``, when given,
    is the op the file's stamp must name (a sweep file copied under the wrong name is an error).

    Call it from a hook (``hwprofile_settings``), not at import: it reads the file on the first
    call and remembers the stamp per (package, file) until ``hwprofile.reset()``. A package that
    is not importable, a missing file or one without a complete ``[stamp]`` or ``[thresholds]`` is
    a :class:`~hwprofile.errors.PluginError` naming the package and the file, and saying what to do.
    """
    found = _shipped.get((package, file))
    if found is None:
        found = _shipped[(package, file)] = _read_shipped_stamp(package, file)
    if op is not None and found.op != op:
        raise PluginError(
            f"plugin package {package!r}: sweep file {file!r} holds the stamp of op {found.op!r}, not {op!r}; "
            f"ship the file 'hwprofile sweep {op}' wrote there"
        )
    return found


def _read_shipped_stamp(package: str, file: str) -> Stamp:
    pkg = _package_dir(package)
    if pkg is None:
        raise PluginError(f"shipped_stamp({package!r}, {file!r}): package {package!r} is not importable; pass the plugin's own __name__")
    path = pkg / file
    if not path.is_file():
        raise PluginError(
            f"plugin package {package!r} ships no sweep file {file!r} (looked for {path}): copy the [stamp] and [thresholds] "
            "that 'hwprofile sweep OP --output FILE' wrote there, and ship it as package data "
            "([tool.setuptools.package-data] in the plugin's pyproject.toml)"
        )
    try:
        stamp, _ = read_tuned(path)
    except SettingError as exc:
        why = str(exc).removeprefix(f"tuned file {path}: ")
        raise PluginError(
            f"plugin package {package!r}, sweep file {file!r} ({path}): {why}, and ship its [stamp] and [thresholds] as this file"
        ) from None
    return stamp


def shipped_values(package: str, file: str, op: str, reason: str) -> dict[str, Value]:
    """Every ``[thresholds]`` value of the sweep file ``file`` of ``package`` as a :class:`Value` with the file's
    stamp and ``reason`` (read on the first call, like :func:`shipped_stamp`): a plugin ships a sweep's result as written."""
    stamp = shipped_stamp(package, file, op=op)
    pkg = _package_dir(package)
    assert pkg is not None  # shipped_stamp refused a package that is not importable
    _, thresholds = read_tuned(pkg / file)
    return {key: Value(value, reason, stamp) for key, value in thresholds.items()}


#: the bandwidth rule's fixed per-call costs (µs): the H200 catalog fit's trends (hwprofile_sm90/measured/): the
#: fp32-output kernel 1.3 against cuBLAS's 4.7, the bf16 GEMVs 3.0 both, the FP8 kernel 3.3 against 9.7
_KERNEL_LAUNCH_US = {"float32": 1.3, "bfloat16": 3.0}
_FALLBACK_LAUNCH_US = {"float32": 4.7, "bfloat16": 3.0}
#: a gate's fixed costs (µs): the fused kernel (router GEMM + selection in one launch) against torch's step (the
#: router GEMM and about a dozen selection launches); the H200's bench_moe_gate before the fusion: torch's step
#: 35-55 µs in graph replay, the GEMM alone 3 (benchmarks/RESULTS.md)
_GATE_LAUNCH_US = (4.0, 30.0)


def _rule_model(op: OpDef | GateDef, tbps: float) -> str:
    """A cost model by the bandwidth rule: both paths move the call's bytes at 0.85 x the device's peak after
    a fixed per-call cost (the H200 fit's, by output dtype; a gate's, :data:`_GATE_LAUNCH_US`); an FP8 fallback
    that dequantises moves 3x the bytes."""
    from .costmodel import CostModel, PathFit, format_model

    bw = round(0.85 * tbps, 3)
    if isinstance(op, GateDef):
        kernel, fallback = PathFit(_GATE_LAUNCH_US[0], ((10, bw),)), PathFit(_GATE_LAUNCH_US[1], ((10, bw),))
        return format_model(CostModel(op.name, kernel, fallback, samples=0))
    fp8 = op.scaled
    kernel = PathFit(3.3 if fp8 else _KERNEL_LAUNCH_US[op.out_dtype], ((10, bw),))
    fallback = PathFit(9.7 if fp8 else _FALLBACK_LAUNCH_US[op.out_dtype], ((10, round(bw / 3, 3) if fp8 else bw),))
    return format_model(CostModel(op.name, kernel, fallback, samples=0))


def _peak_tbps(device: DeviceInfo) -> float:
    """The device's peak memory bandwidth: bus width x memory clock x 2 (DDR); 1 TB/s where NVML gave neither."""
    width, clock = getattr(device, "memory_bus_width_bits", 0), getattr(device, "max_memory_clock_mhz", 0)
    return width / 8 * clock * 2 / 1e6 if width and clock else 1.0


def rule_model(op: str, device: DeviceInfo, *, sku: str) -> Value:
    """``op``'s ``<op>.model`` by the bandwidth rule on ``device``, for an op a plugin has not swept on ``sku``:
    ``explain`` says "predicted, not measured on this SKU" and ``hwprofile tune`` measures it first."""
    tbps = _peak_tbps(device)
    why = f"not measured on {sku}; bandwidth rule at {tbps:.2f} TB/s peak (hwprofile.plugin.rule_model)"
    return Value(_rule_model(TABLE[op], tbps), why)


def unmeasured_settings(device: DeviceInfo, *, sku: str, split_k_reason: str) -> dict[str, Value]:
    """The settings a plugin for an SKU nobody measured states, the same rule for each (sm100 and sm120 call it).

    * ``<op>.model`` for every op of the table (both kinds): the bandwidth rule (:func:`_rule_model`) at the device's peak
      bandwidth (bus width x memory clock x 2; 1 TB/s where unknown). A kernel with a smaller fixed cost is
      predicted faster at every shape (the router GEMM and the small-M linear, as on the H200), an equal one
      never (the bf16 GEMV: a tie goes to the fallback), the FP8 kernel wherever its third of the bytes wins.
      ``explain`` says "predicted, not measured on this SKU"; ``hwprofile tune`` measures it first.
    * the M limits of the fp32-output kernels (16), and ``gemv.split_k`` on (``split_k_reason`` says why).
    """
    tbps = _peak_tbps(device)
    why = f"not measured on {sku}; bandwidth rule at {tbps:.2f} TB/s peak (hwprofile.plugin.unmeasured_settings)"
    out = {f"{name}.model": Value(_rule_model(op, tbps), why) for name, op in TABLE.items()}
    for op in OPS.values():
        if isinstance(op.max_m, str):
            out[op.max_m] = Value(16, f"the kernel's limit (M <= 16); inside it the cost model decides; {why}")
    out["gemv.split_k"] = Value(True, f"{split_k_reason}; not bit-identical, opt out with HWPROFILE_GEMV_SPLIT_K=0; not measured on {sku}")
    return out


def family_kernels(package: str, source: str, tuning: ArchTuning, device: DeviceInfo) -> list[KernelSpec]:
    """``hwprofile_kernels``' answer of a plugin on the shared skinny-GEMM family: every op of the family
    (:func:`kernel_specs`) and the fused MoE gate (:func:`gate_kernel_spec`), all from ``source``, planned for
    ``device``'s own SM count and shared memory. ``source`` invokes ``HWP_SKINNY_GEMM_ENTRY_POINTS`` and
    ``HWP_MOE_GATE_ENTRY_POINT`` with the tuning's prefix (sm100's ``kernels/sm100_gemv.cu`` is one)."""
    return [*kernel_specs(package, source, tuning, device=device), gate_kernel_spec(package, source, tuning, device)]


#: what every architecture plugin proposes besides its target, and why
_LAZY = EnvDefault("LAZY", "load kernels on first use: less context memory, faster start")


def arch_env_defaults(device: DeviceInfo, targets: Mapping[tuple[int, int], str], why: str) -> dict[str, EnvDefault]:
    """``hwprofile_env_defaults``' answer of an architecture plugin: ``TORCH_CUDA_ARCH_LIST`` for ``device``'s own
    NVRTC target of ``targets`` (its ``ArchSpec``'s; ``sm_103a`` -> ``10.3a``; the first target for a device it does not
    list), the reason saying ``why`` that target, and ``CUDA_MODULE_LOADING=LAZY``."""
    target = targets.get(device.compute_capability) or next(iter(targets.values()))
    digits = target.removeprefix("sm_").rstrip("af")
    arch = f"{digits[:-1]}.{digits[-1]}{target[len('sm_') + len(digits):]}"
    return {"TORCH_CUDA_ARCH_LIST": EnvDefault(arch, f"build torch extensions for {target}: {why}"), "CUDA_MODULE_LOADING": _LAZY}


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
