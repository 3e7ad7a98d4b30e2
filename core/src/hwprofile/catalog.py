"""Built-in catalog of real GPUs, used to simulate devices on machines that lack them. Never loads plugins.

Values are the vendors' published specifications (memory as NVML reports it where known). They
feed everything that is decided from device facts, so CI can exercise an architecture's code paths
on a CPU-only machine: ``HWPROFILE_DEVICE=rtx-pro-6000`` behaves like that card for selection,
settings and kernel compilation (not for running kernels). Any other capability can be simulated
by name (``sm_110``, ``11.0``), and plugins add entries for the GPUs they serve through the
``hwprofile_catalog`` hook: the registry collects them (``Registry.catalog_entries``, checked by
:func:`merge_plugin_entries`) and the caller of :func:`lookup` passes them in, so detection, which
sits below the plugins, never imports the registry or the profiles.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from . import _env
from ._record import Record, final
from .errors import DeviceError, PluginError

_MIB = 1024 * 1024


@final
class CatalogEntry(Record):
    """Published facts about one GPU model."""

    name: str
    compute_capability: tuple[int, int]
    memory_bytes: int
    sm_count: int
    l2_cache_bytes: int
    max_shared_memory_per_block_optin: int
    memory_bus_width_bits: int
    max_sm_clock_mhz: int
    max_memory_clock_mhz: int


def _gib(n: float) -> int:
    return int(n * 1024 * _MIB)


# Shared memory per block (opt-in) by capability, from the CUDA programming guide's table.
_SMEM_227K = 227 * 1024
_SMEM_99K = 99 * 1024

CATALOG: dict[str, CatalogEntry] = {
    "a100": CatalogEntry("NVIDIA A100-SXM4-80GB", (8, 0), 81920 * _MIB, 108, 40 * _MIB, 163 * 1024, 5120, 1410, 1593),
    "l40s": CatalogEntry("NVIDIA L40S", (8, 9), 46068 * _MIB, 142, 96 * _MIB, _SMEM_99K, 384, 2520, 9001),
    "h100": CatalogEntry("NVIDIA H100 80GB HBM3", (9, 0), 81559 * _MIB, 132, 50 * _MIB, _SMEM_227K, 5120, 1980, 2619),
    "h200": CatalogEntry("NVIDIA H200", (9, 0), 143771 * _MIB, 132, 60 * _MIB, _SMEM_227K, 6144, 1980, 3201),
    "b200": CatalogEntry("NVIDIA B200", (10, 0), 183359 * _MIB, 148, 126 * _MIB, _SMEM_227K, 8192, 1965, 3996),
    "b300": CatalogEntry("NVIDIA B300 SXM6 AC", (10, 3), 275040 * _MIB, 148, 126 * _MIB, _SMEM_227K, 8192, 2032, 3996),
    "gb300": CatalogEntry("NVIDIA GB300", (10, 3), 284208 * _MIB, 152, 126 * _MIB, _SMEM_227K, 8192, 2032, 3996),
    "rtx-pro-6000": CatalogEntry(
        "NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0), 97887 * _MIB, 188, 128 * _MIB, _SMEM_99K, 512, 2617, 14001
    ),
    "rtx-5090": CatalogEntry("NVIDIA GeForce RTX 5090", (12, 0), 32607 * _MIB, 170, 96 * _MIB, _SMEM_99K, 512, 2407, 14001),
    "dgx-spark": CatalogEntry("NVIDIA GB10", (12, 1), _gib(119.7), 48, 24 * _MIB, _SMEM_99K, 256, 2418, 4266),
}

# Generic entries: one per exact capability, borrowing a representative card's resources.
_GENERIC = {"sm80": "a100", "sm89": "l40s", "sm90": "h100", "sm100": "b200", "sm103": "b300", "sm120": "rtx-pro-6000", "sm121": "dgx-spark"}
for _alias, _base in _GENERIC.items():
    _b = CATALOG[_base]
    _cc = _b.compute_capability
    CATALOG[_alias] = CatalogEntry(
        f"Simulated sm_{_cc[0]}{_cc[1]}",
        _cc,
        _b.memory_bytes,
        _b.sm_count,
        _b.l2_cache_bytes,
        _b.max_shared_memory_per_block_optin,
        _b.memory_bus_width_bits,
        _b.max_sm_clock_mhz,
        _b.max_memory_clock_mhz,
    )


_GENERIC_RE = re.compile(r"(?:sm[-_]?(\d{2,3})[af]?|(\d{1,2})\.(\d))")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def _key(name: str) -> str:
    key = name.strip().lower()
    return re.sub(r"[-_]", "", key) if re.fullmatch(r"sm[-_]?\d+", key) else key.replace("_", "-")


def parse_capability(name: str) -> tuple[int, int] | None:
    """``"sm_110"``, ``"sm110a"``, ``"11.0"`` -> ``(11, 0)``; ``None`` for anything else."""
    m = _GENERIC_RE.fullmatch(name.strip().lower())
    if m is None:
        return None
    if m.group(1):
        digits = m.group(1)
        return int(digits[:-1]), int(digits[-1])
    return int(m.group(2)), int(m.group(3))


def generic(cc: tuple[int, int]) -> CatalogEntry:
    """A simulated device of exactly capability ``cc``, named ``"Simulated sm_XY"``.

    Selection and kernel targets depend only on the capability; the resources (SM count, shared
    memory, L2, memory) are borrowed from a built-in GPU of that capability when there is one, else
    from the closest lower capability, so launch planning sees plausible numbers. A plugin's named
    entry (hook ``hwprofile_catalog``) is the way to simulate a GPU whose numbers matter.
    """
    real = [e for e in CATALOG.values() if not e.name.startswith("Simulated ")]
    same = [e for e in real if e.compute_capability == cc]
    lower = sorted((e for e in real if e.compute_capability <= cc), key=lambda e: e.compute_capability)
    base = same[0] if same else (lower[-1] if lower else min(real, key=lambda e: e.compute_capability))
    return base.replace(name=f"Simulated sm_{cc[0]}{cc[1]}", compute_capability=cc)


def merge_plugin_entries(contributions: Iterable[tuple[str, object]]) -> dict[str, CatalogEntry]:
    """The plugins' catalog entries by name, from ``(plugin label, hwprofile_catalog result)`` pairs.

    Every entry is checked: a result that is not a dict, a name that is not lower-case letters,
    digits and '-' (or is a generic ``sm_XY`` / ``X.Y`` name), a value that is not a
    :class:`CatalogEntry`, a built-in name, or a name two plugins contribute is a
    :class:`~hwprofile.errors.PluginError` naming the plugin. ``None`` (no entries) is skipped.
    """
    out: dict[str, CatalogEntry] = {}
    by: dict[str, str] = {}
    for label, got in contributions:
        if got is None:
            continue
        if not isinstance(got, Mapping):
            raise PluginError(
                f"plugin {label}: hwprofile_catalog must return a dict of name -> hwprofile.plugin.CatalogEntry, "
                f"got {type(got).__name__}"
            )
        for name, entry in got.items():
            key = _key(str(name))
            if not isinstance(name, str) or not _NAME_RE.match(key) or parse_capability(key) is not None:
                raise PluginError(
                    f"plugin {label}: catalog name {name!r} is invalid; use lower-case letters, digits and '-' "
                    "(e.g. 'jetson-thor'); 'sm_XY' and 'X.Y' names are generic and built in"
                )
            if not isinstance(entry, CatalogEntry):
                raise PluginError(
                    f"plugin {label}: catalog entry {name!r} must be a hwprofile.plugin.CatalogEntry, got {type(entry).__name__}"
                )
            if key in CATALOG:
                raise PluginError(f"plugin {label}: catalog entry {name!r} is built into hwprofile; choose another name")
            if key in out:
                raise PluginError(f"catalog entry {name!r} is contributed twice: by {by[key]} and by {label}")
            out[key], by[key] = entry, label
    return out


def lookup(name: str, plugin_entries: Callable[[], Mapping[str, CatalogEntry]] | None = None) -> CatalogEntry:
    """The catalog entry for ``name`` (case-insensitive): a built-in GPU, a generic capability
    (``sm_110``, ``11.0``) or a plugin's entry; otherwise an error listing what is known.

    ``plugin_entries`` returns the installed plugins' entries (``Registry.catalog_entries``); it is
    called only for a name that is neither built in nor a capability, so simulating a built-in or
    generic device loads no plugin. Without it only those two kinds are known.
    """
    key = _key(name)
    found = CATALOG.get(key)
    if found is not None:
        return found
    cc = parse_capability(key)
    if cc is not None:
        return generic(cc)
    extra = plugin_entries() if plugin_entries is not None else {}
    if key in extra:
        return extra[key]
    known = ", ".join(sorted({*CATALOG, *extra}))
    raise DeviceError(
        f"unknown simulated device {name!r} (from {_env.DEVICE.name}, --simulate or --hwprofile-device); known devices: {known}; "
        "or any capability as sm_XY or X.Y (e.g. sm_110); list them with 'hwprofile devices'"
    )
