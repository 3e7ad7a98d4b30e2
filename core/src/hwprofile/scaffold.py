"""``hwprofile new-plugin``: a working architecture-plugin package from nothing.

The generated package is the one ``docs/writing-a-plugin.md`` walks through (a test keeps the two
identical): pyproject with the entry point, hook implementations, a sample kernel shipped as
package data, and a test that passes as generated once the package is installed. With ``family``
(``--family``, compute capability 9.0 and later: the kernels use clusters) the package is a plugin on
hwprofile's shared skinny-GEMM family instead, as hwprofile-sm100 and -sm120 are: every op of the table
and the fused MoE gate from one short source, through ``hwprofile.plugin``'s helpers, and tests that
subclass ``pytest_hwprofile.family``'s checks.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

from . import _env
from ._install import REPOSITORY
from .errors import HwprofileError

_NAME = re.compile(r"^[a-z][a-z0-9_]*\Z")
_MAX_NAME = 64  # becomes a directory, a distribution and a module name: keep it well inside every filesystem's limit
_TARGET = re.compile(r"^sm_\d{2,3}[af]?\Z")
#: The plugins this project ships (``plugins/<name>``, distribution ``hwprofile-<name>``): a scaffold
#: must never take one of their names, installed here or not, or installing it would replace ours.
SHIPPED_PLUGINS = ("sm90", "sm100", "sm120")

PYPROJECT = '''[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "hwprofile-{name}"
version = "0.1.0"
description = "hwprofile architecture plugin for compute capability {major}.{minor} ({target})"
readme = "README.md"
requires-python = ">=3.11"
# The hwprofile minor series this was generated with: 0.x minors may change the plugin API.
dependencies = ["{core_pin}"]

[project.entry-points."hwprofile.plugins"]
{name} = "hwprofile_{name}"

[tool.setuptools.packages.find]
where = ["src"]

[tool.setuptools.package-data]
hwprofile_{name} = ["kernels/*.cu"]
'''

#: the hwprofile_catalog hook both templates write: the plugin's simulated device, for CI without the GPU
_CATALOG_HOOK = '''@hookimpl
def hwprofile_catalog() -> dict[str, CatalogEntry]:
    # A simulated device for CI without the GPU ({device_var}={device}); the numbers are those of hwprofile's
    # nearest built-in GPU ({base}): replace them with your GPU's published ones.
    return {{
        "{device}": CatalogEntry(
            name="{device_name}", compute_capability=({major}, {minor}), memory_bytes={memory_bytes}, sm_count={sm_count},
            l2_cache_bytes={l2_cache_bytes}, max_shared_memory_per_block_optin={smem}, memory_bus_width_bits={bus},
            max_sm_clock_mhz={sm_clock}, max_memory_clock_mhz={mem_clock},
        ),
    }}
'''

MODULE = '''"""hwprofile-{name}: the architecture plugin for compute capability {major}.{minor} ({target})."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hwprofile.plugin import ArchSpec, CatalogEntry, DeviceInfo, EnvDefault, KernelSpec, Launch, Setting, Value, hookimpl

NAME = "{name}"


@hookimpl
def hwprofile_arch() -> ArchSpec:
    # Exact capabilities only: a device of another minor version is not served by this plugin.
    return ArchSpec({{({major}, {minor}): "{target}"}}, "compute capability {major}.{minor}")


''' + _CATALOG_HOOK + '''

@hookimpl
def hwprofile_declare_settings() -> list[Setting]:
    # Settings of your own live in your plugin's namespace and get an env override:
    # HWPROFILE_{upper}_EXAMPLE_FLAG.
    return [Setting(f"{{NAME}}.example_flag", "bool", False, "an example feature flag of this plugin")]


@hookimpl
def hwprofile_settings(device: DeviceInfo, resolved: Mapping[str, Any]) -> dict[str, Any]:
    # Each value says why; a measured threshold also carries its sweep's stamp (hwprofile.plugin.shipped_stamp).
    return {{
        f"{{NAME}}.example_flag": Value(True, "why this architecture wants the flag on"),
        "router_gemm.max_tokens": Value(0, "no router GEMM kernel for this architecture yet"),
    }}


@hookimpl
def hwprofile_env_defaults(device: DeviceInfo, settings: Mapping[str, Any]) -> dict[str, EnvDefault]:
    return {{"TORCH_CUDA_ARCH_LIST": EnvDefault("{major}.{minor}", "build torch extensions for this SM")}}


def _configure(*, n: int, **_: Any) -> Launch:
    return Launch("scale_kernel<2>", (-(-n // 256), 1, 1), (256, 1, 1))


@hookimpl
def hwprofile_kernels(device: DeviceInfo, target: str) -> list[KernelSpec]:
    return [KernelSpec(f"{{NAME}}_scale", __name__, "kernels/scale.cu", ("scale_kernel<2>",), _configure, doc="sample kernel")]
'''

KERNEL = '''// hwprofile-{name} sample kernel: out[i] = S * x[i], built by NVRTC for {target} only.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != {arch_num})
#error "hwprofile-{name} kernels are built for {target} only"
#endif
#include <cuda_bf16.h>

template <int S>
__global__ void scale_kernel(float* out, const __nv_bfloat16* x, int n) {{
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = S * __bfloat162float(x[i]);
}}
'''

TEST = '''"""Runs as generated once the package is installed: pip install . && pytest tests"""

import pytest

from hwprofile.plugin import compile_kernel, profile_for, simulated_device

DEVICE = simulated_device(({major}, {minor}))


def profile():
    return profile_for(DEVICE)  # the installed plugins, none of this machine's HWPROFILE_* variables


def test_selected_for_its_capability():
    prof = profile()
    assert prof.plugin.name == "{name}" and prof.target == "{target}"
    assert prof.env_defaults["TORCH_CUDA_ARCH_LIST"].value == "{major}.{minor}"


def test_simulated_device_from_its_catalog_entry():
    from hwprofile import detect

    device = detect({{"{device_var}": "{device}"}}).devices[0]  # found through this plugin's hwprofile_catalog
    assert device.simulated and device.compute_capability == ({major}, {minor})


def test_settings_have_provenance():
    flag = profile().explain("{name}.example_flag")
    assert flag.value is True and flag.winner.source.startswith("hwprofile-{name}")


def test_kernel_compiles_for_its_target():
    pytest.importorskip("cuda.bindings.nvrtc")
    prof = profile()
    spec = prof.kernels["{name}_scale"]
    compiled = compile_kernel(spec, prof.target)
    assert compiled.cubin[:4] == b"\\x7fELF"
'''

FAMILY_PYPROJECT = PYPROJECT

FAMILY_MODULE = '''"""hwprofile-{name}: the architecture plugin for compute capability {major}.{minor} ({target}), on hwprofile's
shared skinny-GEMM family: every op of the table and the fused MoE gate, planned for the device in hand."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hwprofile.plugin import (
    ArchSpec,
    ArchTuning,
    CatalogEntry,
    DeviceInfo,
    EnvDefault,
    KernelSpec,
    arch_env_defaults,
    family_kernels,
    hookimpl,
    unmeasured_settings,
)

NAME = "{name}"
ARCH = ArchSpec({{({major}, {minor}): "{target}"}}, "compute capability {major}.{minor}")
# Your reference card's SM count and opt-in shared memory per block (plans take the device's own where it is
# known); the prefix names the kernels' entry points in kernels/{name}_gemv.cu.
TUNING = ArchTuning(sm_count={sm_count}, max_shared_bytes={smem}, max_cluster=8, prefix="{prefix}")


@hookimpl
def hwprofile_arch() -> ArchSpec:
    return ARCH


''' + _CATALOG_HOOK + '''

@hookimpl
def hwprofile_settings(device: DeviceInfo, resolved: Mapping[str, Any]) -> dict[str, Any]:
    # Nothing measured yet: the cost model by the bandwidth rule, the kernels' M limits and split-K, each saying
    # "not measured on" this SKU; `hwprofile tune` measures them, and a shipped sweep replaces them.
    return dict(unmeasured_settings(device, sku=NAME.upper(), split_k_reason="spread small N over the SMs with cluster split-K"))


@hookimpl
def hwprofile_env_defaults(device: DeviceInfo, settings: Mapping[str, Any]) -> dict[str, EnvDefault]:
    return arch_env_defaults(device, ARCH.targets, "code paths of this SM are compiled in")


@hookimpl
def hwprofile_kernels(device: DeviceInfo, target: str) -> list[KernelSpec]:
    return family_kernels(__name__, "kernels/{name}_gemv.cu", TUNING, device)
'''

FAMILY_KERNEL = '''// hwprofile-{name}: hwprofile's skinny-GEMM family and fused MoE gate, built by NVRTC for {target} only.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != {arch_num})
#error "hwprofile-{name} kernels are built for {target} only"
#endif
#include <hwprofile/skinny_entry.cuh>
#include <hwprofile/moe_gate.cuh>

namespace {prefix} {{
// compute capability {major}.{minor}: opt-in shared memory per block, as TUNING.max_shared_bytes (check your GPU's number)
using Limits = hwp::FamilyLimits<{smem}>;
}}  // namespace {prefix}

HWP_SKINNY_GEMM_ENTRY_POINTS({prefix}, {prefix}::Limits)
HWP_MOE_GATE_ENTRY_POINT({prefix}, {prefix}::Limits)
'''

FAMILY_TEST = '''"""Runs as generated once the package, pytest and pytest-hwprofile are installed (README.md says how)

pytest-hwprofile comes from the hwprofile source (./pytest-hwprofile of a checkout, or its git URL), never from an
index by name: no package of that name there is ours.

The checks every plugin on hwprofile's shared kernel family runs (pytest_hwprofile.family): the plans on the
simulated device anywhere, the kernels against float64 on your GPU (skipped without it).
"""

import pytest

from hwprofile.plugin import compile_kernel, profile_for, simulated_device
from pytest_hwprofile.family import FamilyGPUChecks, FamilyPlanChecks


class TestPlans(FamilyPlanChecks):
    plugin, prefix = "{name}", "{prefix}"
    devices = ("{device}",)


@pytest.mark.hwprofile_gpu("sm_{major}{minor}")
class TestKernels(FamilyGPUChecks):
    plugin, prefix = "{name}", "{prefix}"


def test_kernels_compile_for_its_target():
    pytest.importorskip("cuda.bindings.nvrtc")
    prof = profile_for(simulated_device(({major}, {minor})))
    compiled = compile_kernel(prof.kernels["gemv"], prof.target)
    assert compiled.cubin[:4] == b"\\x7fELF"
'''

README = '''# hwprofile-{name}

hwprofile architecture plugin for compute capability {major}.{minor} (NVRTC target `{target}`).
Compiling its kernels needs NVRTC: hwprofile installed with its `[cu13]` (CUDA 13 driver, 580+) or
`[cu12]` (CUDA 12 driver) extra, from where you installed hwprofile (`pip install './core[cu13]'` in
its checkout). The tests need pytest{tests_need}.

    pip install ./
    hwprofile show --simulate {device}
    pip install 'pytest>=8'{tests_install}
    python -m pytest tests
    hwprofile compile --arch {target}
'''


def files(name: str, capability: str, target: str | None = None, *, family: bool = False) -> dict[str, str]:
    """The scaffold's files (relative path -> text) for plugin ``name`` serving ``capability`` (``family``: on the shared
    skinny-GEMM family, which needs compute capability 9.0 or later)."""
    if not _NAME.match(name) or len(name) > _MAX_NAME:
        shown = name if len(name) <= _MAX_NAME else name[:_MAX_NAME] + "..."
        raise HwprofileError(f"plugin name {shown!r} is invalid: use at most {_MAX_NAME} lower-case letters, digits and _ (e.g. sm89)")
    major, minor = _capability(capability)
    target = target or f"sm_{major}{minor}"
    if not _TARGET.match(target):
        raise HwprofileError(f"--target {target!r} is invalid: write sm_XY or sm_XYa, e.g. sm_89 or sm_90a")
    own = f"sm_{major}{minor}"
    if target.rstrip("af") != own:
        raise HwprofileError(
            f"--target {target} does not match --capability {major}.{minor}: a plugin serving {major}.{minor} builds its kernels "
            f"for {own}, {own}a or {own}f (the generated kernel checks __CUDA_ARCH__ == {major * 100 + minor * 10}). "
            f"Leave --target out for {own}, or give the --capability that {target} is for"
        )
    arch_num = major * 100 + minor * 10
    if family and major < 9:
        raise HwprofileError(
            f"--family needs compute capability 9.0 or later (the family's kernels use thread-block clusters), got {major}.{minor}; "
            "leave --family out for a plugin with a kernel of its own"
        )
    from . import catalog
    from ._version import __version__

    base_key, base = _nearest(catalog, (major, minor))
    cmaj, cmin = (int(x) for x in __version__.split(".")[:2])
    fmt = {
        "name": name, "major": major, "minor": minor, "target": target, "upper": name.upper(), "arch_num": arch_num,
        "core_pin": f"hwprofile>={cmaj}.{cmin}.0,<{cmaj}.{cmin + 1}", "device": f"{name.replace('_', '-')}-gpu",
        "device_var": _env.DEVICE.name,
        "device_name": f"NVIDIA GPU, compute capability {major}.{minor}", "base": f"{base_key}: {base.name}",
        "memory_bytes": base.memory_bytes, "sm_count": base.sm_count, "l2_cache_bytes": base.l2_cache_bytes,
        "smem": base.max_shared_memory_per_block_optin, "bus": base.memory_bus_width_bits, "sm_clock": base.max_sm_clock_mhz,
        "mem_clock": base.max_memory_clock_mhz, "prefix": f"hwp_{name}",
        "tests_need": " and pytest-hwprofile (from the hwprofile source: never `pip install pytest-hwprofile` from an index)"
        if family else "",
        "tests_install": " ./pytest-hwprofile   # in the hwprofile checkout; or its git URL, "
        f"'pytest-hwprofile @ git+{REPOSITORY}#subdirectory=pytest-hwprofile'" if family else "",
    }
    if family:
        return {
            "pyproject.toml": FAMILY_PYPROJECT.format(**fmt),
            "README.md": README.format(**fmt),
            f"src/hwprofile_{name}/__init__.py": FAMILY_MODULE.format(**fmt),
            f"src/hwprofile_{name}/kernels/{name}_gemv.cu": FAMILY_KERNEL.format(**fmt),
            "tests/test_plugin.py": FAMILY_TEST.format(**fmt),
        }
    return {
        "pyproject.toml": PYPROJECT.format(**fmt),
        "README.md": README.format(**fmt),
        f"src/hwprofile_{name}/__init__.py": MODULE.format(**fmt),
        f"src/hwprofile_{name}/kernels/scale.cu": KERNEL.format(**fmt),
        "tests/test_plugin.py": TEST.format(**fmt),
    }


def _nearest(catalog: Any, cc: tuple[int, int]) -> tuple[str, Any]:
    """The built-in GPU a generic device of capability ``cc`` borrows its numbers from."""
    entry = catalog.generic(cc)
    for key, e in catalog.CATALOG.items():
        if not e.name.startswith("Simulated ") and e.replace(name=entry.name, compute_capability=cc) == entry:
            return key, e
    return "generic", entry


#: The lowest compute capability NVRTC 12 and 13 compile for.
MIN_CAPABILITY = (7, 5)


def _capability(text: str) -> tuple[int, int]:
    """``"8.9"`` -> ``(8, 9)``: a compute capability a plugin can be built for, else an error saying which are."""
    m = re.fullmatch(r"(\d+)\.(\d)", text.strip())
    if not m:
        raise HwprofileError(f"--capability {text!r} is invalid: write major.minor, e.g. 8.9")
    cc = int(m.group(1)), int(m.group(2))
    ask = "give your GPU's own (nvidia-smi --query-gpu=compute_cap --format=csv)"
    if cc < MIN_CAPABILITY:
        raise HwprofileError(
            f"--capability {cc[0]}.{cc[1]} is no GPU a plugin can be built for: NVRTC compiles for compute capability "
            f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} (sm_{MIN_CAPABILITY[0]}{MIN_CAPABILITY[1]}) and later; {ask}"
        )
    try:
        from .kernels import toolchain

        known, v = toolchain.nvrtc_archs(), toolchain.nvrtc_version()
    except Exception:  # noqa: BLE001 - no NVRTC here: only the lower bound can be checked
        return cc
    if cc[0] * 10 + cc[1] not in known:
        names = ", ".join(f"{a // 10}.{a % 10}" for a in known)
        raise HwprofileError(
            f"--capability {cc[0]}.{cc[1]} is no GPU the installed NVRTC {v[0]}.{v[1]} knows (it compiles for {names}), so "
            f"a plugin for it could build no kernel; {ask}, or install a newer NVRTC if the GPU is newer than it"
        )
    return cc


def claimed_by(capability: tuple[int, int]) -> str | None:
    """The installed architecture plugin (its label) that already claims exact ``capability``, or ``None``."""
    from .profiles import registry

    for p in registry().plugins.values():
        if p.arch is not None and capability in p.arch.targets:
            return f"{p.name} ({p.label}: {p.arch.description or 'its ArchSpec'})"
    return None


def hint(directory: Path, target: str, *, family: bool = False) -> str:
    """The next commands, runnable as printed in this environment (the README's venv has no pytest, nor
    pytest-hwprofile, which ``--family`` tests need): a path pip cannot mistake for a package name on an
    index, and what the tests need that is not installed here: pytest from the index (a public
    project), pytest-hwprofile from where hwprofile came (:mod:`hwprofile._install`), never by bare name.
    """
    import importlib.util

    from ._install import requirement

    d = str(directory)
    if not (d.startswith(("/", "./", "../", "~"))):
        d = "./" + d
    need = [] if importlib.util.find_spec("pytest") is not None else ["'pytest>=8'"]
    if family and importlib.util.find_spec("pytest_hwprofile") is None:
        need.append(requirement("pytest-hwprofile"))
    tools = f"pip install {' '.join(need)} && " if need else ""
    return f"next: {tools}pip install {d} && python -m pytest {d}/tests && hwprofile compile --arch {target}"


def name_taken(name: str) -> str | None:
    """Why plugin name ``name`` belongs to a plugin already (in words), or ``None`` when it is free.

    Taken: one of :data:`SHIPPED_PLUGINS`; an installed distribution ``hwprofile-<name>`` (pip would
    replace it with the scaffold); a plugin of that name in the ``hwprofile.plugins`` entry-point
    group (two distributions registering one name is an error at every start-up); an importable
    module ``hwprofile_<name>`` (the scaffold's package would shadow it, or be shadowed).
    """
    import importlib.metadata
    import importlib.util

    from ._entrypoints import ENTRY_POINT_GROUP, find_entry_points

    dist = f"hwprofile-{name}"
    try:
        found = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        found = None
    if found is not None:
        return f"{found.metadata['Name']} {found.version} is installed here"
    if name in SHIPPED_PLUGINS:
        return f"{dist} is a plugin hwprofile ships (plugins/{name} of the hwprofile project)"
    ep = next((e for e in find_entry_points(ENTRY_POINT_GROUP) if e.name == name), None)
    if ep is not None:
        return f"the installed {ep.distribution} {ep.version} registers a plugin named {name!r}"
    try:
        spec = importlib.util.find_spec(f"hwprofile_{name}")
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        return f"a module hwprofile_{name} is importable here ({spec.origin or 'a namespace package'})"
    return None


def write(directory: Path, name: str, capability: str, target: str | None = None, *, family: bool = False) -> list[Path]:
    """Write the scaffold into ``directory`` (which must not exist, or be an empty directory): whole or not at all.

    A ``name`` that :func:`name_taken` says is taken is refused before anything is written: the
    scaffold would replace (or clash with) that plugin once installed. The package is built in a
    private temporary sibling (``.<dir>.tmp-*``) and renamed into place, so a full disk or any other
    write failure leaves no half-written package: the temporary directory is removed and the error
    names the file and what to do.
    """
    import errno
    import shutil
    import tempfile

    from ._files import ensure_directory

    content = files(name, capability, target, family=family)
    taken = name_taken(name)
    if taken is not None:
        raise HwprofileError(
            f"plugin name {name!r} is taken: {taken}. A scaffold named {name} would be distribution hwprofile-{name} and "
            f"module hwprofile_{name}, and installing it would replace or clash with that plugin. "
            f"Choose a name of your own (e.g. my{name}); to change that plugin itself, edit its source instead"
        )
    cc = _capability(capability)
    owner = claimed_by(cc)
    if owner is not None:
        raise HwprofileError(
            f"compute capability {cc[0]}.{cc[1]} is already claimed by the installed plugin {owner}: with both installed, every "
            f"profile() of such a GPU fails (two plugins claim it). To replace that plugin, uninstall it first; to serve "
            f"another GPU, give its --capability"
        )
    directory = Path(directory)
    _check_free(directory)
    ensure_directory(directory.parent.absolute(), what="plugin package")
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name[:100]}.tmp-", dir=directory.parent))
    except OSError as exc:
        raise HwprofileError(f"cannot write the plugin into {directory}: {exc.strerror or exc}; choose another --dir") from exc
    where = tmp
    try:
        for rel, text in content.items():
            where = tmp / rel
            where.parent.mkdir(parents=True, exist_ok=True)
            _write_new(where, text.encode())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp made it private; the package gets the user's usual mode
        where = directory
        os.rename(tmp, directory)  # replaces an empty directory; refuses anything else (raced in meanwhile)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if where == directory and exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise HwprofileError(f"{directory} appeared while the plugin was written and is not empty; choose another --dir") from None
        file = directory / where.relative_to(tmp) if where != directory and where.is_relative_to(tmp) else directory
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        fix = "free some space and run it again" if full else "choose another --dir"
        raise HwprofileError(
            f"cannot write the plugin into {directory}: {exc.strerror or exc} (writing {file}); nothing was left behind; {fix}"
        ) from exc
    return [directory / rel for rel in content]


def _check_free(directory: Path) -> None:
    """``directory`` must be absent, or an empty directory (not a link to one): the scaffold never mixes with other files."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise HwprofileError(f"cannot write the plugin into {directory}: {exc.strerror or exc}; choose another --dir") from None
    if stat.S_ISLNK(st.st_mode):
        raise HwprofileError(f"{directory} is a symbolic link; hwprofile never writes through one: choose another --dir")
    if not stat.S_ISDIR(st.st_mode):
        raise HwprofileError(f"{directory} exists and is not a directory; choose another --dir")
    if any(directory.iterdir()):
        raise HwprofileError(f"{directory} exists and is not empty; choose another --dir")


def _write_new(path: Path, data: bytes) -> None:
    """Create ``path`` (never an existing file, never through a link), write ``data`` whole and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
