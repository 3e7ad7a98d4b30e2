"""Stamps: what a threshold was measured against, and whether that still holds.

A threshold tuned against one fallback silently goes wrong when the fallback changes (the design
guide's case 1). So every tuned value, and every shipped plugin threshold that was measured, carries
a :class:`Stamp`: the device (UUID-free), the plugin and its version, the kernel's source digest,
and the **fallback identity** (the fallback function, torch's version, cuBLAS/cuBLASLt's version).
:func:`changes` compares a stamp with what is running now, from package metadata only (no torch
import), and says in words what changed.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from .device import DeviceInfo
from .optable import OPS
from .registry import installed_version

FALLBACK_FUNCTION = {name: op.fallback for name, op in OPS.items()}  # declared once, in the op table
_CUBLAS_DISTS = ("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12")


def device_identity(d: DeviceInfo) -> str:
    """A UUID-free identity: two cards of one model share it, a different model does not."""
    mem = f" {round(d.memory_bytes / 2**30)} GiB" if d.memory_bytes else ""
    return f"{d.name} {d.sm}{mem}"


def fallback_identity(op: str) -> dict[str, str]:
    """What decides which library kernel the op's fallback runs, read from package metadata."""
    cublas = installed_version(*_CUBLAS_DISTS) or "unknown"
    return {
        "function": FALLBACK_FUNCTION[op],
        "torch": installed_version("torch") or "not installed",
        "cublas": cublas,
        "cublaslt": cublas,  # shipped in the same wheel as cuBLAS
    }


class Stamp(NamedTuple):
    """What a threshold was measured against."""

    op: str
    device: str  # device_identity()
    compute_capability: tuple[int, int]
    plugin: str
    plugin_version: str
    kernel: str  # source digest of the op's kernel (plugin + hwprofile headers)
    fallback: Mapping[str, str] = MappingProxyType({})
    date: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "device": self.device,
            "compute_capability": list(self.compute_capability),
            "plugin": self.plugin,
            "plugin_version": self.plugin_version,
            "kernel": self.kernel,
            "fallback": dict(self.fallback),
            "date": self.date,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str) -> Stamp:
        from .errors import SettingError

        try:
            return cls(
                op=str(d["op"]),
                device=str(d["device"]),
                compute_capability=(int(d["compute_capability"][0]), int(d["compute_capability"][1])),
                plugin=str(d["plugin"]),
                plugin_version=str(d["plugin_version"]),
                kernel=str(d["kernel"]),
                fallback={str(k): str(v) for k, v in dict(d.get("fallback", {})).items()},
                date=str(d.get("date", "")),
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise SettingError(f"{where}: [stamp] is incomplete or malformed ({type(exc).__name__}: {exc}); regenerate it with 'hwprofile sweep'") from None


def current(op: str, device: DeviceInfo, plugin: str, plugin_version: str, kernel: str, date: str = "") -> Stamp:
    """The stamp that a sweep run now, here, would write."""
    return Stamp(op, device_identity(device), device.compute_capability, plugin, plugin_version, kernel, fallback_identity(op), date)


def changes(stamp: Stamp, now: Stamp, *, check_device: bool = True) -> list[str]:
    """What differs between a stamp and the running system, in words; empty when it still holds."""
    out = []
    if check_device and stamp.compute_capability != now.compute_capability:
        out.append(f"device capability {stamp.compute_capability} -> {now.compute_capability}")
    elif check_device and stamp.device != now.device:
        out.append(f"device {stamp.device!r} -> {now.device!r}")
    if stamp.plugin != now.plugin or stamp.plugin_version != now.plugin_version:
        out.append(f"plugin {stamp.plugin} {stamp.plugin_version} -> {now.plugin} {now.plugin_version}")
    if stamp.kernel != now.kernel:
        out.append(f"kernel source {stamp.kernel[:12]} -> {now.kernel[:12]}")
    for k in ("function", "torch", "cublas", "cublaslt"):
        a, b = stamp.fallback.get(k), now.fallback.get(k)
        if a is not None and a != b:
            out.append(f"fallback {k} {a} -> {b}")
    return out
