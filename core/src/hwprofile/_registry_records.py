"""The registry's records: what an architecture plugin serves, a plugin's identity, which plugin serves a device.

A leaf: it imports only :mod:`hwprofile._record`, so the hook specifications, tuning stamps and profiles type
these records without importing the registry (``hwprofile.registry`` re-exports them; the registry is where
they are made).
"""

from __future__ import annotations

from ._record import Record, final

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


@final
class ArchSpec(Record):
    """What an architecture plugin serves: exact compute capability -> NVRTC target."""

    #: ``{(9, 0): "sm_90a"}``: each exact capability served and the NVRTC target its kernels are built for.
    targets: Mapping[tuple[int, int], str]
    #: One line for ``hwprofile plugins``.
    description: str = ""

    def target_for(self, capability: tuple[int, int]) -> str | None:
        """The NVRTC target for this exact capability, or ``None`` if not served."""
        return self.targets.get((capability[0], capability[1]))

    @property
    def capabilities(self) -> tuple[tuple[int, int], ...]:
        return tuple(sorted(self.targets))


@final
class PluginInfo(Record):
    """Identity of one registered plugin."""

    #: The entry-point name (or the name given to :meth:`Registry.register`); a plugin's settings start with it.
    name: str
    #: The distribution that installed it; ``None`` for a plugin registered by hand.
    distribution: str | None
    version: str | None
    #: The module (or the class's module) holding the hook implementations.
    module: str
    #: What it serves, for an architecture plugin; ``None`` for any other plugin.
    arch: ArchSpec | None = None

    @property
    def label(self) -> str:
        """``"sm90 (hwprofile-sm90 0.1.0)"``: how messages name a plugin."""
        dist = f"{self.distribution} {self.version}" if self.distribution else "not installed as a distribution"
        return f"{self.name} ({dist})"

    @property
    def source(self) -> str:
        """``"hwprofile-sm90 0.1.0"``: who supplied a value, for provenance."""
        return f"{self.distribution} {self.version}" if self.distribution else f"plugin {self.name}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "module": self.module,
            "architecture": self.arch is not None,
            "capabilities": [list(c) for c in self.arch.capabilities] if self.arch else [],
            "targets": {f"{c[0]}.{c[1]}": t for c, t in self.arch.targets.items()} if self.arch else {},
        }


@final
class Selection(Record):
    """Which architecture plugin serves a device, its NVRTC target, and why."""

    #: ``None`` when no installed architecture plugin serves the device (core defaults apply).
    plugin: PluginInfo | None
    #: The NVRTC target (``"sm_90a"``), ``None`` exactly when ``plugin`` is.
    target: str | None
    #: In words, for ``hwprofile show``: claimed, pinned, or why none.
    reason: str
