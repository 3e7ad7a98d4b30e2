"""Built-in catalog of real GPUs, used to simulate devices on machines that lack them.

Values are the vendors' published specifications (memory as NVML reports it where known). They
feed everything that is decided from device facts, so CI can exercise an architecture's code paths
on a CPU-only machine: ``HWPROFILE_DEVICE=rtx-pro-6000`` behaves like that card for selection,
settings and kernel compilation (not for running kernels).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .errors import DeviceError

_MIB = 1024 * 1024


class CatalogEntry(NamedTuple):
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


def lookup(name: str) -> CatalogEntry:
    """Return the catalog entry for ``name`` (case-insensitive), or raise listing the known names."""
    key = name.strip().lower()
    key = re.sub(r"[-_]", "", key) if re.fullmatch(r"sm[-_]?\d+", key) else key.replace("_", "-")
    try:
        return CATALOG[key]
    except KeyError:
        known = ", ".join(sorted(CATALOG))
        raise DeviceError(
            f"unknown simulated device {name!r} (from HWPROFILE_DEVICE or --simulate); known devices: {known}"
        ) from None
