"""What the modules that launch and verify kernels read of a device's dispatch table: a protocol. Imports nothing at run time.

``_dispatch._Table`` is the table; ``_kernel`` and ``_verify`` type it through this protocol, so neither imports
``_dispatch``, which imports them (no import circle, type-checking imports counted: tests/package/test_import_graph.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..profiles import Profile


class Table(Protocol):
    """What a launch or a verification reads and updates of one device's dispatch table (``_dispatch._Table``)."""

    prof: Profile
    index: int
    strict: bool
    split_k: bool
    launches: dict[tuple[Any, ...], Callable[..., None]]
    errors: dict[str, str]

    def fail(self, op: str, why: str = "") -> None: ...
