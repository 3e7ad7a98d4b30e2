"""``torch.ops.hwprofile.<op>``: the custom-op definitions and fake implementations. Imports torch only in :func:`register`.

Each GEMM op of the table becomes one custom op whose schema takes the op table's argument names;
the gate op ``moe_gate`` one of its own (``_gate.define``: two outputs, the selection's arguments). Its
implementation is the op's eager entry (:func:`hwprofile.ops._dispatch.call`), which is what a
compiled graph calls at run time; its fake checks the contract and returns an empty result of the
right shape and dtype, so ``torch.compile(fullgraph=True)`` traces the op without running it.

Autograd (eager and compiled): each custom op carries ``torch.library.register_autograd`` with the
gradient formula its ``OpDef.backward`` names (``_fallbacks.BACKWARDS``; ``"gemm"``: the backward of
``x . (w * scale)^T`` in float32 accumulation), whichever path ran the forward. The arguments the op
table does not list in ``OpDef.grads`` (fp8_gemv's e4m3 weight and scale; every argument of an op
with ``backward=None``) are refused in the forward when they require grad in grad mode, naming the
op and the argument: a gradient is never dropped silently. The eager entry sends a call that needs
gradients through this custom op (``_dispatch.call``).
"""

from __future__ import annotations

import threading
from typing import Any

from .. import _state
from ..errors import HwprofileError
from . import _dispatch, _fallbacks, _gate
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
        _gate.define(torch, lib)  # the gate kind (optable.GATES): its own schema, two outputs
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

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        _dispatch.refuse_grads(op, inputs, recording=True)
        x, w, scale = (*inputs, None)[:3]
        ctx.save_for_backward(x, w, scale)

    formula = _fallbacks.BACKWARDS[op.backward] if op.backward is not None else None

    def backward(ctx: Any, g: Any) -> tuple[Any, ...]:
        if formula is None:  # setup_context refused every operand that requires grad: nothing records this op
            raise HwprofileError(f"{op.name} has no backward (its OpDef declares backward=None)")
        x, w, scale = ctx.saved_tensors
        need = ctx.needs_input_grad
        gx, gw = formula(g, x, w, scale, need[0], need[1])
        return (gx, gw, None)[: len(op.args)]

    qualname = f"{lib.ns}::{op.name}"
    lib.impl(op.name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(qualname, fake, lib=lib)
    torch.library.register_autograd(qualname, backward, setup_context=setup_context, lib=lib)
    e.custom = getattr(getattr(torch.ops, lib.ns), op.name).default
