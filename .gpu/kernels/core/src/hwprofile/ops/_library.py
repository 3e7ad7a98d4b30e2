"""``torch.ops.hwprofile.<op>``: the custom-op definitions and fake implementations. Imports torch only in :func:`register`.

Each op of the table becomes one custom op whose schema takes the op table's argument names. Its
implementation is the op's eager entry (:func:`hwprofile.ops._dispatch.call`), which is what a
compiled graph calls at run time; its fake checks the contract and returns an empty result of the
right shape and dtype, so ``torch.compile(fullgraph=True)`` traces the op without running it.
"""

from __future__ import annotations

import threading
from typing import Any

from .. import _state
from . import _dispatch, _fallbacks
from ._dispatch import _Entry

_registered = threading.Event()  # register() has run to its end
_register_lock = threading.Lock()
_library: Any = None  # the torch.library.Library fragment; kept alive, or torch forgets the definitions


@_state.in_forked_child
def _reinit_lock_in_child() -> None:
    global _register_lock
    _register_lock = threading.Lock()  # a thread of the parent may have held it at the fork


def registered() -> bool:
    return _registered.is_set()


def register() -> None:
    """Bind torch into the eager path and define ``torch.ops.hwprofile.<op>`` for every op (idempotent)."""
    global _library
    if _registered.is_set():
        return
    import torch

    with _register_lock:
        if _registered.is_set():
            return
        _fallbacks.bind(torch)
        _dispatch.bind(torch)
        library: Any = torch.library.Library  # untyped in some torch builds
        lib = library("hwprofile", "FRAGMENT")
        for e in _dispatch.ENTRIES.values():
            define(torch, lib, e)
        _library = lib
        _registered.set()


def define(torch: Any, lib: Any, e: _Entry) -> None:
    """Define ``torch.ops.hwprofile.<op>`` on ``lib``: its kernel is the op's eager entry, plus a fake."""
    op = e.op
    params = ", ".join(f"Tensor {a}" for a in op.args)
    lib.define(f"{op.name}({params}) -> Tensor")

    def impl(*args: Any) -> Any:
        x, w, scale = (*args, None)[:3]
        # inside a compile session (inductor constant folding, a backend running the graph) the eager
        # entry would hand the call back to this custom op: run the general path itself there
        return _dispatch.call(e, x, w, scale, None) if not _dispatch._compiling() else _dispatch.general(e, x, w, scale, None)

    def fake(*args: Any) -> Any:
        x, w, scale = (*args, None)[:3]
        _dispatch.validate(op, x, w, scale, None)
        return x.new_empty((*x.shape[:-1], w.shape[0]), dtype=e.out_dtype)

    lib.impl(op.name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{lib.ns}::{op.name}", fake, lib=lib)
    e.custom = getattr(getattr(torch.ops, lib.ns), op.name).default
