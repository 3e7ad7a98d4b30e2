"""Process state: every module-level cache or memo registers here how to forget itself.

Never imports anything and never runs a callback at import: registering costs a dict insert.

``hwprofile.reset()`` calls :func:`reset_all`, so one call forgets everything the process remembered
(profiles, the registry, detected devices, directory listings, source digests, compiled-kernel memos,
dispatch tables). A module registers its callback when it is imported; a module never imported has
nothing to forget. Callbacks are keyed by qualified name, so reloading a module replaces its callback.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    _F = Callable[[], object]

_callbacks: dict[str, _F] = {}


def on_reset(fn: _F) -> _F:
    """Register ``fn`` (no arguments) to run on every :func:`reset_all`; usable as a decorator."""
    owner = getattr(fn, "__self__", None)  # a bound method, e.g. an lru_cache's cache_clear: named by its owner
    if owner is None:
        key = f"{fn.__module__}.{fn.__qualname__}"
    else:
        key = f"{owner.__module__}.{owner.__qualname__}.{fn.__name__}"
    _callbacks[key] = fn
    return fn


def reset_all() -> None:
    """Run every registered callback, in registration order."""
    for fn in list(_callbacks.values()):
        fn()


def registered() -> list[str]:
    """Qualified names of the registered callbacks (for tests and ``hwprofile doctor``)."""
    return list(_callbacks)
