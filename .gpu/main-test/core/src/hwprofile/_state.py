"""Process state: every module-level cache or memo registers here how to forget itself.

Never runs a callback at import: registering costs a dict insert (or, for a fork callback, one
``os.register_at_fork``).

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


def in_forked_child(fn: _F) -> _F:
    """Register ``fn`` (no arguments) to run in the child after every ``os.fork()``; usable as a decorator.

    Where a module re-creates the locks it guards its memos with: a thread of the parent may have
    held one at the fork, and that thread does not exist in the child, which would wait forever.
    """
    import os

    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=fn)
    return fn


def reset_all() -> None:
    """Run every registered callback, in registration order."""
    for fn in list(_callbacks.values()):
        fn()


def registered() -> list[str]:
    """Qualified names of the registered callbacks (for tests and ``hwprofile doctor``)."""
    return list(_callbacks)
