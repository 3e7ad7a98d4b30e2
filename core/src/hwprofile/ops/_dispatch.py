"""Dispatch: the per-device tables, the route memos, the eager call path. Never imports torch at import, never decides a route itself.

What a call takes is :func:`route`'s answer (``_route``: the routing function, its per-device
facts :class:`_Route` and the words of :func:`decide`), computed on device tables held here: one
:class:`_Table` per device, rebuilt when its profile changes. The ops remember the answer per
(device, M, N, K) in their entry's memo (one lookup per call, on either path), and :func:`decide`
turns it into words with both paths' times (saying whether a measurement at that shape, the model
or a limit decided). ``route``, ``table`` and ``_cpu_index`` are read here at call time, so a test
that patches them on this module reaches every caller.

:func:`call` is every public op's eager entry. The common call (2-D operands of the contract dtypes
on one device, no ``out``) is checked and routed inline, with a few tensor attribute reads and one
memo lookup: the target is at most 1.5 µs over the fallback (the design guide, section 6), and
benchmarks/RESULTS.md (Current, "eager fallback path", 2026-12-02) has the op's own cost at 1.18-1.39 µs
(router, linear, gemv) and 1.59-2.04 µs (fp8) on the H200, end to end noise-bound: not met. Anything else goes through
:func:`general`, which validates (``_args``: errors name the argument), flattens batch dimensions and fills
``out``. Under ``torch.compile``
:func:`call` routes while tracing (:func:`_compiled`): a fallback route is the fallback's torch ops
in the graph, a kernel route or a dynamic shape the ``torch.ops.hwprofile.<op>`` custom op
(``_library``). A call that needs gradients goes through the custom op and its autograd formula.

A kernel that fails to build, load or launch (or its verification against float64, or the self-test) warns once and the op
falls back from then on (``HWPROFILE_STRICT=1`` raises instead): :meth:`_Table.fail`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Final, final

from .. import _state
from .. import profiles as _profile_mod
from ..optable import GATES, NO_SCALE, OPS, ROW_SCALE, TABLE, TENSOR_SCALE, OpDef
from ..profiles import Profile, profile
from . import _fallbacks, _kernel
from ._args import _overlap as _overlap
from ._args import _self_overlapping as _self_overlapping
from ._args import validate as validate
from ._fallbacks import FALLBACKS
from ._route import Decision as Decision
from ._route import _misplaced as _misplaced
from ._route import _reason as _reason
from ._route import _Route as _Route
from ._route import basis as basis
from ._route import route as route  # defined there, looked up here at call time: patching _dispatch.route reaches the ops
from ._route import times as times
from ._route import untakeable as untakeable

#: test seam: the device index CPU tensors are routed as (-1: CPU tensors always take the fallback).
#: Tests set it to 0 together with a fake ``_kernel.launch`` to drive every gate through the public ops.
_cpu_index: int = -1


@final
class _Table:
    """Everything dispatch needs for one device, resolved once per profile."""

    __slots__ = ("errors", "index", "launches", "prof", "routes", "split_k", "strict")

    def __init__(self, prof: Profile) -> None:
        self.prof = prof
        self.index = prof.device.index
        self.strict = bool(prof["strict"])
        self.split_k = bool(prof["gemv.split_k"])
        self.routes = {name: _Route(op, prof) for name, op in OPS.items()}
        self.launches: dict[tuple[Any, ...], Callable[..., None]] = {}  # (op, m, n, k, scale mode, split) -> launcher
        self.errors: dict[str, str] = {}  #: op -> why its kernel failed here (see fail)

    @property
    def failed(self) -> set[str]:
        """Ops whose kernel failed to build or load on this device."""
        return {name for name, r in self.routes.items() if r.off == "failed"}

    def fail(self, op: str, why: str = "") -> None:
        """``op``'s kernel cannot be built, loaded or launched here (or failed its verification or self-test): the fallback from now on.

        ``why`` (the error, in words) is kept in :attr:`errors` for ``explain`` and ``doctor``; the
        caller warns once. Its launchers go too, so no later call (``run_kernel`` included) launches it.
        """
        self.routes[op].off = "failed"
        self.errors[op] = why or "failed"
        for key in [key for key in self.launches if key[0] == op]:
            del self.launches[key]
        _forget(op)


@final
class _Entry:
    """One op at run time: its table entry, fallback, memo, and the torch objects ``bind`` resolves once."""

    __slots__ = ("custom", "fallback", "memo", "name", "op", "out_dtype", "scaled", "w_dtype", "x_dtype")

    def __init__(self, op: OpDef, fallback: Callable[..., Any]) -> None:
        self.op, self.name, self.fallback = op, op.name, fallback
        self.memo: dict[tuple[int, int, int, int], tuple[_Table, _Route, str | None]] = {}  # see _remember
        self.x_dtype: Any = None  # torch dtypes and the custom op, bound by bind()
        self.w_dtype: Any = None
        self.out_dtype: Any = None
        self.custom: Any = None  # torch.ops.hwprofile.<op>.default, bound by _library.define()
        self.scaled = op.scaled

    def bind(self, torch: Any) -> None:
        op = self.op
        self.x_dtype, self.w_dtype, self.out_dtype = (getattr(torch, d) for d in (op.x_dtype, op.w_dtype, op.out_dtype))


#: op name -> its run-time entry, one per op of the op table
#: (an op without a fallback has none: ``hwprofile.ops`` then refuses to import, naming every missing piece)
ENTRIES: dict[str, _Entry] = {name: _Entry(op, FALLBACKS[name]) for name, op in OPS.items() if name in FALLBACKS}

_tables: dict[int, _Table] = {}
_tables_lock = threading.RLock()
_generation = 0  # bumped (under _tables_lock) whenever tables or memos are dropped; see _remember
_profiles = _profile_mod._profiles
_MEMO_SIZE: Final = 4096  # distinct (device, M, N, K) remembered per op before the memo starts over


@_state.in_forked_child
def _reinit_locks_in_child() -> None:
    global _tables_lock
    # a thread of the parent may have held it at the fork (a table build waits on profile()); it
    # does not exist in the child, which must still route
    _tables_lock = threading.RLock()


#: called with each new dispatch table before any op uses it (``hwprofile.ops`` adds the opt-in self-test)
on_new_table: list[Callable[[_Table], None]] = []
#: the gate kind's :func:`decide` (``_gate.decide``, set when ``_gate`` loads): ``_gate`` routes through this module,
#: so this module must not import it, not even inside a function (an import circle: tests/package/test_import_graph.py)
decide_gate: Callable[..., Decision] | None = None


def table(index: int) -> _Table:
    """Device ``index``'s dispatch table, rebuilt when its profile changed (the memos go with the old one)."""
    t = _tables.get(index)
    if t is None or t.prof is not _profiles.get(index):
        with _tables_lock:
            t = _tables.get(index)
            if t is None or t.prof is not _profiles.get(index):
                if t is not None:
                    _forget()  # memo entries hold the replaced table
                t = _Table(profile(index))
                _tables[index] = t
                for hook in on_new_table:  # under the lock: other threads wait for the table's self-test
                    hook(t)
    return t


def _forget(op: str | None = None) -> None:
    """Drop the routing memos (of ``op``, or all) so that no entry computed before survives."""
    global _generation
    with _tables_lock:
        _generation += 1
        for name, e in ENTRIES.items():
            if op is None or name == op:
                e.memo.clear()


@_state.on_reset
def reset_dispatch() -> None:
    """Forget dispatch tables and routing memos (``hwprofile.reset()`` calls it)."""
    with _tables_lock:
        _tables.clear()
        _forget()


def decide(op: str, prof: Profile, *, m: int, n: int, k: int) -> Decision:
    """The path ``op`` takes on ``prof``'s device for an ``[m, k] x [n, k]`` problem, with the reason.

    It is :func:`route` on the same per-device facts the ops use (contiguous, aligned operands
    assumed), so it also reports a kernel that failed to load in this process.
    """
    for dim, v in (("m", m), ("n", n), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"decide({op!r}): {dim} must be an int >= 0, got {v!r}")
    if op in GATES:  # the gate kind: its own route, with a plain top-min(8, N) selection (ops.decide_moe_gate takes the rest)
        if decide_gate is None:  # unreachable through hwprofile.ops, whose import loads _gate
            raise AssertionError("hwprofile.ops._gate is not loaded: import hwprofile.ops")
        return decide_gate(prof, m=m, n=n, k=k, top_k=max(1, min(8, n)))
    t = _tables.get(prof.device.index)
    if t is None or t.prof is not prof:
        t = _Table(prof)
    r = t.routes.get(op)
    if r is None:
        raise KeyError(f"no op {op!r}; known ops: {', '.join(TABLE)}")
    gate = route(r, m, n, k)
    kernel_us, fallback_us = times(r, gate, m, n, k)
    reason = _reason(r, gate, m, n, k)
    if gate is None:  # the kernel: which variant it launches, and why
        reason += f"; variant: {r.variant_reason(m, n, k)}"
    return Decision(op, "kernel" if gate is None else "fallback", reason, gate, basis(r, gate, m, n, k), kernel_us, fallback_us)


# --- the eager path --------------------------------------------------------------------------------

_F32: Any = None  # torch.float32, bound by bind()


def _not_bound() -> bool:
    # reached only by calling this module's entry directly before hwprofile.ops.register(): the public ops bind first
    raise AssertionError("hwprofile.ops: an op ran before register(); call hwprofile.ops.register() (the public ops do)")


_compiling: Callable[[], bool] = _not_bound  # torch.compiler.is_compiling once bound
_grad_enabled: Callable[[], bool] = _not_bound  # torch.is_grad_enabled once bound
_static: Callable[..., bool] = _not_bound  # torch.fx.experimental.symbolic_shapes.has_static_value once bound
_traced_gate: Callable[..., Any] = _not_bound  # _trace_gate under torch.compiler.assume_constant_result


def bind(torch: Any) -> None:
    """Bind the torch objects the eager path compares with (``hwprofile.ops.register`` calls it once)."""
    global _F32, _compiling, _grad_enabled, _static, _traced_gate
    from torch.fx.experimental import symbolic_shapes

    _F32 = torch.float32
    for e in ENTRIES.values():
        e.bind(torch)
    _compiling = torch.compiler.is_compiling
    _grad_enabled = torch.is_grad_enabled
    _static = symbolic_shapes.has_static_value
    _traced_gate = torch.compiler.assume_constant_result(_trace_gate)


def _remember(e: _Entry, idx: int, m: int, n: int, k: int) -> tuple[_Table, _Route, str | None]:
    """Look up device ``idx``'s table and :func:`route` (without operands) for one shape, and remember them.

    The entry is stored only if no reset, table rebuild or kernel failure dropped the memos while it
    was computed (another thread): an entry of a dropped table would otherwise outlive the reset.
    """
    gen = _generation
    t = table(idx)
    r = t.routes[e.name]
    hit = (t, r, route(r, m, n, k))
    with _tables_lock:
        if gen == _generation:
            if len(e.memo) >= _MEMO_SIZE:
                e.memo.clear()
            e.memo[(idx, m, n, k)] = hit
    return hit


def _one_device(x: Any, w: Any, scale: Any) -> int:
    """The device index a call runs on, or -1 if the operands are not on one device the ops route."""
    i = x.get_device()
    if i >= 0:
        return i if w.get_device() == i and (scale is None or scale.get_device() == i) else -1
    # CPU tensors count only under the test seam, and only when all are CPU (a meta tensor is also -1)
    return _cpu_index if x.is_cpu and w.is_cpu and (scale is None or scale.is_cpu) else -1


def _dispatch(
    e: _Entry, idx: int, x: Any, w: Any, scale: Any, m: int, n: int, k: int, mode: int, out: Any,
    hit: tuple[_Table, _Route, str | None] | None = None,
) -> Any:
    """Route a checked 2-D call on device ``idx``, then run the kernel or the fallback.

    The operands are those of the contract ([M, K] and [N, K] on one device, contract dtypes);
    ``out`` is a contiguous [M, N] result for the kernel to write, or None. The layout gate depends
    on the operands and is checked here by the helper :func:`route` uses. ``hit``: the memo entry the
    caller already looked up (:func:`call`), so a call looks its memo up once.
    """
    if hit is None:
        hit = e.memo.get((idx, m, n, k))
    t, r, gate = hit if hit is not None else _remember(e, idx, m, n, k)
    if gate is None:
        if not (x.is_cuda or idx == _cpu_index) or _misplaced((x, w, scale, out)):  # a pointer the kernel cannot take
            gate = "layout"
        else:
            res = out if out is not None else x.new_empty((m, n), dtype=e.out_dtype)
            if _kernel.launch(t, e.name, res, x, w, scale, m, n, k, mode, r.split_k(m, n, k)):
                r.counts["kernel"] += 1
                return res
    r.counts["fallback"] += 1
    if gate == "empty":
        return x.new_zeros((m, n), dtype=e.out_dtype)
    if (e.name, idx, _thread_id()) not in _kernel.fallback_ready:  # its first run here: never inside a capture (_kernel.first_fallback)
        _kernel.first_fallback(e.name, idx, f"M={m}, N={n}, K={k}")
    return e.fallback(x, w) if scale is None else e.fallback(x, w, scale)


_thread_id = _kernel.thread_id


def call(e: _Entry, x: Any, w: Any, scale: Any, out: Any) -> Any:
    """Every public op's eager entry: the common call inline, the rest through :func:`general`, compiled through :func:`_compiled`.

    A call that needs gradients (an operand requires grad, grad mode on) goes through the custom
    op, whose autograd formula covers the kernel and the fallback alike (``_library``).
    """
    if out is None and not _compiling():
        try:
            m, k = x.shape
            n, wk = w.shape
            idx = x.get_device()
            if e.scaled:
                ss = scale.shape
                s0 = ss[0] if len(ss) == 1 else -1  # -1: not a 1-D scale (never a size)
                mode = TENSOR_SCALE if not ss or s0 == 1 else ROW_SCALE if s0 == n else NO_SCALE
                if idx < 0 or w.get_device() != idx or scale.get_device() != idx:
                    idx = _one_device(x, w, scale)
                fast = mode and scale.dtype is _F32 and not scale.requires_grad
            else:
                mode = NO_SCALE
                if idx < 0 or w.get_device() != idx:
                    idx = _one_device(x, w, None)
                fast = scale is None
            fast = fast and k == wk and x.dtype is e.x_dtype and w.dtype is e.w_dtype and idx >= 0
        except (AttributeError, ValueError, TypeError):
            fast = False
        if fast and not ((x.requires_grad or w.requires_grad) and _grad_enabled()):
            # the fallback side inline (the host-bound case); the kernel side through _dispatch
            hit = e.memo.get((idx, m, n, k))
            if hit is None:
                hit = _remember(e, idx, m, n, k)
            _, r, gate = hit
            if gate is None:
                return _dispatch(e, idx, x, w, scale, m, n, k, mode, None, hit)  # the entry travels: one lookup per call
            r.counts["fallback"] += 1
            if gate == "empty":
                return x.new_zeros((m, n), dtype=e.out_dtype)
            # its first run here: never inside a capture (_kernel.first_fallback)
            if (e.name, idx, _thread_id()) not in _kernel.fallback_ready:
                _kernel.first_fallback(e.name, idx, f"M={m}, N={n}, K={k}")
            return e.fallback(x, w) if scale is None else e.fallback(x, w, scale)
    if _compiling():
        return _compiled(e, x, w, scale, out)
    return general(e, x, w, scale, out)


def _needs_grad(x: Any, w: Any, scale: Any) -> bool:
    return _grad_enabled() and any(getattr(t, "requires_grad", False) for t in (x, w, scale))


def refuse_grads(op: OpDef, operands: tuple[Any, ...], recording: bool = False) -> None:
    """Raise if an operand the op has no gradient for requires grad (grad mode on): never drop a gradient silently.

    ``recording``: autograd is known to record this call (the custom op's ``setup_context``, which
    runs with grad mode off).
    """
    if not (recording or _grad_enabled()):
        return
    for name, t in zip(op.args, operands, strict=False):
        if name not in op.grads and getattr(t, "requires_grad", False):
            if op.backward is None:
                raise ValueError(
                    f"{op.name}: {name} requires grad, but {op.name} has no backward (its OpDef declares backward=None); "
                    f"detach {name} (or call it under torch.no_grad())"
                )
            has = ", ".join(op.grads) or "no argument"
            raise ValueError(
                f"{op.name}: {name} requires grad, but {op.name} has gradients for {has} only; "
                f"detach {name} (or call it under torch.no_grad()) to train the others"
            )


def _with_grad(e: _Entry, x: Any, w: Any, scale: Any, out: Any) -> Any:
    """A call that needs gradients: through the custom op and its autograd formula (``out=`` cannot carry them)."""
    refuse_grads(e.op, (x, w, scale))
    if out is not None:
        raise ValueError(f"{e.name}: out= cannot be used when an operand requires grad (grad mode on): the result would carry no gradient")
    return e.custom(x, w) if scale is None else e.custom(x, w, scale)


def _trace_gate(name: str, idx: int, m: int, n: int, k: int, contiguous: bool, cuda: bool) -> str | None:
    """:func:`route` at trace time, for ``torch.compile`` with static shapes (under ``assume_constant_result``).

    ``idx`` -1 (CPU tensors outside the test seam): "cpu", the fallback. A kernel route here is
    still checked for alignment by the custom op at run time; a non-contiguous operand is "layout" now.
    """
    if idx < 0:
        return "cpu"
    t = table(idx)
    gate = route(t.routes[name], m, n, k)
    if gate is None and not contiguous:
        gate = "layout"
    if gate is not None and cuda:
        _fallbacks.probe_mm_out_dtype(idx)  # the traced fallback then reads a settled answer
    return gate


def _compiled(e: _Entry, x: Any, w: Any, scale: Any, out: Any) -> Any:
    """The op while ``torch.compile`` traces it: routed now where the shapes are static, at run time where not.

    A fallback route becomes the fallback's plain torch ops in the graph (inductor sees and fuses
    them; nothing of hwprofile runs per step); a kernel route, an operand that needs gradients, or a
    dynamic shape becomes the custom op, which routes at run time. The trace-time decision is fixed
    in the compiled graph: settings changed later apply after ``torch._dynamo.reset()``. ``out=`` is
    filled from a fresh result (``copy_``), so an ``out`` that overlaps an input is computed correctly.
    """
    if _needs_grad(x, w, scale):
        return _with_grad(e, x, w, scale, out)
    res = None
    if all(_static(d) for d in (*x.shape, *w.shape)):
        m, n, k, _ = validate(e.op, x, w, scale, out)
        dev = x.device
        idx = dev.index if dev.type == "cuda" else _cpu_index if dev.type == "cpu" else -1
        contiguous = x.is_contiguous() and w.is_contiguous() and (scale is None or scale.is_contiguous())
        gate = _traced_gate(e.name, -1 if idx is None else idx, m, n, k, contiguous, dev.type == "cuda")
        if gate is not None:
            if gate == "empty":
                res = x.new_zeros((*x.shape[:-1], n), dtype=e.out_dtype)
            else:
                x2 = x.reshape(m, k)
                res = e.fallback(x2, w) if scale is None else e.fallback(x2, w, scale)
                res = res.reshape(*x.shape[:-1], n)
    if res is None:
        res = e.custom(x, w) if scale is None else e.custom(x, w, scale)
    if out is not None:
        out.copy_(res)
        return out
    return res


def general(e: _Entry, x: Any, w: Any, scale: Any, out: Any) -> Any:
    """The general eager path: validate (errors name the argument), flatten batch dims, dispatch, fill ``out``.

    An ``out`` that overlaps an operand is computed through a temporary and copied (the kernels
    declare their pointers ``__restrict__`` and must never be handed one); an ``out`` whose own
    elements overlap (an expanded tensor) is a ValueError. Inputs may overlap each other or themselves
    (an expanded ``x``): only contiguous operands reach a kernel, the fallback reads the rest.
    """
    m, n, k, mode = validate(e.op, x, w, scale, out)
    if _needs_grad(x, w, scale):
        return _with_grad(e, x, w, scale, out)
    if out is not None and _self_overlapping(out):
        raise ValueError(
            f"{e.name}: out has overlapping elements (shape {tuple(out.shape)}, strides {out.stride()}, e.g. an expanded tensor); "
            "pass a tensor whose elements are distinct"
        )
    x2 = x if x.dim() == 2 else x.reshape(m, k)
    idx = x.get_device()
    if idx < 0:
        idx = _cpu_index
    if idx < 0:  # CPU tensors: torch's own implementation, no dispatch table
        if not (m and n and k):
            res = x2.new_zeros((m, n), dtype=e.out_dtype)
        else:
            res = e.fallback(x2, w) if scale is None else e.fallback(x2, w, scale)
    else:
        o2 = None if out is None else (out if out.dim() == 2 else out.view(m, n) if out.is_contiguous() else None)
        if o2 is not None and any(_overlap(o2, t) for t in (x2, w, scale)):
            o2 = None  # through a temporary: the kernel must not write what it reads
        res = _dispatch(e, idx, x2, w, scale, m, n, k, mode, o2)
        if res is o2:
            return out
    if out is not None:
        out.copy_(res.view(out.shape))
        return out
    return res if x2 is x else res.view(*x.shape[:-1], n)
