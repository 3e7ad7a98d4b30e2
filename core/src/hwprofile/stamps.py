"""Stamps: what a measured threshold was measured against (device, plugin, kernel, fallback). Never imports torch.

A leaf beside :mod:`hwprofile.tuning` (which compares stamps, reads tuned files and re-exports these names):
settings and the registry's records type a :class:`Stamp` without importing tuning. The design of stamps is
:mod:`hwprofile.tuning`'s docstring.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ._entrypoints import installed_version
from ._record import Record, _set, final
from .errors import SettingError
from .optable import TABLE

if TYPE_CHECKING:
    from .device import DeviceInfo

Shape = tuple[int, int, int]  #: (M, N, K)

_CUBLAS_DISTS = ("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12")


# --- stamps --------------------------------------------------------------------------------------


def device_identity(d: DeviceInfo) -> str:
    """A UUID-free identity: two cards of one model share it, a different model does not."""
    mem = f" {round(d.memory_bytes / 2**30)} GiB" if d.memory_bytes else ""
    return f"{d.name} {d.sm}{mem}"


def fallback_identity(op: str) -> dict[str, str]:
    """What decides which library kernel the op's fallback runs, read from package metadata."""
    cublas = installed_version(*_CUBLAS_DISTS) or "unknown"
    return {
        "function": TABLE[op].fallback,  # the op table at call time, not a copy taken at import
        "torch": installed_version("torch") or "not installed",
        "cublas": cublas,
        "cublaslt": cublas,  # shipped in the same wheel as cuBLAS
    }


@final
class Stamp(Record):
    """What a threshold was measured against: where, with which plugin and kernel, against which fallback."""

    #: The op whose threshold this is (an op-table name).
    op: str
    #: The measured device, as :func:`device_identity` writes it.
    device: str
    #: Its compute capability (major, minor).
    compute_capability: tuple[int, int]
    #: The plugin whose kernel was measured, and its version.
    plugin: str
    plugin_version: str
    #: Source digest of the op's kernel (plugin source + hwprofile headers).
    kernel: str
    #: The fallback measured against: its function identity and library versions (read-only).
    fallback: Mapping[str, str] = MappingProxyType({})
    #: When it was measured (ISO date), or "".
    date: str = ""
    #: Digest of the launches the plugin planned for the op's sweep grid (:func:`plan_digest`), or ""
    #: when the sweep did not record one: a threshold holds for a launch plan (tile, grid, PDL) as
    #: much as for a kernel source, and a plan can change while the source stays the same.
    plan: str = ""
    #: The measured shapes outside the op's sweep grid that :attr:`plan` also covers (a per-shape
    #: table's shapes, :func:`parse_measured`), sorted: the plan is recomputed over the same shapes.
    shapes: tuple[Shape, ...] = ()

    def __post_init__(self) -> None:
        _set(self, "compute_capability", tuple(self.compute_capability))
        _set(self, "fallback", MappingProxyType(dict(self.fallback)))
        _set(self, "shapes", tuple(sorted({(int(m), int(n), int(k)) for m, n, k in self.shapes})))

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
            "plan": self.plan,
            "shapes": [shape_text(s) for s in self.shapes],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str) -> Stamp:
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
                plan=str(d.get("plan", "")),
                shapes=tuple(_shape(str(s)) for s in d.get("shapes", [])),
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise SettingError(
                f"{where}: [stamp] is incomplete or malformed ({type(exc).__name__}: {exc}); regenerate it with 'hwprofile sweep'"
            ) from None


def current(
    op: str, device: DeviceInfo, plugin: str, plugin_version: str, kernel: str, date: str = "", *, plan: str = "",
    shapes: Iterable[Shape] = (),
) -> Stamp:
    """The stamp that a sweep run now, here, would write."""
    return Stamp(
        op, device_identity(device), device.compute_capability, plugin, plugin_version, kernel, fallback_identity(op), date, plan=plan,
        shapes=tuple(shapes),
    )


def shape_text(shape: Shape) -> str:
    """``(1, 4096, 7168)`` -> ``"1x4096x7168"``."""
    return "x".join(map(str, shape))


def _shape(text: str) -> Shape:
    parts = text.strip().lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"shape {text!r} is not MxNxK")
    m, n, k = (int(p) for p in parts)
    return m, n, k
