"""Dispatch: the routing function, per-device tables, route memos, the eager front. Never imports torch at import.

:func:`route` is the only place that decides kernel or fallback. Its inputs are read once per
device into a :class:`_Route` per op (thresholds and bounds from the profile, the per-shape
decisions of ``<op>.measured`` parsed into a dict, the cost model ``<op>.model`` parsed, availability
of the kernel, deterministic mode): the kernel's limits are the only box, inside it a measured shape
decides, elsewhere the model's faster predicted path. The ops remember the answer per (device, M,
N, K) in their entry's memo (one lookup per call, on either path), and :func:`decide` turns it into
words with both paths' times (saying whether a measurement at that shape, the model or a limit decided).

:func:`call` is every public op's eager entry. The common call (2-D operands of the contract dtypes
on one device, no ``out``) is checked and routed inline, with a few tensor attribute reads and one
memo lookup: the target is at most 1.5 µs over the fallback (the design guide, section 6), and
benchmarks/RESULTS.md (Current, "eager fallback path", 2026-12-02) has the op's own cost at 1.18-1.39 µs
(router, linear, gemv) and 1.59-2.04 µs (fp8) on the H200, end to end noise-bound: not met. Anything else goes through
:func:`general`, which validates (errors name the argument), flattens batch dimensions and fills
``out``. Under ``torch.compile``
:func:`call` routes while tracing (:func:`_compiled`): a fallback route is the fallback's torch ops
in the graph, a kernel route or a dynamic shape the ``torch.ops.hwprofile.<op>`` custom op
(``_library``). A call that needs gradients goes through the custom op and its autograd formula.

A kernel that fails to build, load or launch (or its verification against float64, or the self-test) warns once and the op
falls back from then on (``HWPROFILE_STRICT=1`` raises instead): :meth:`_Table.fail`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, NoReturn, final

from .. import _env, _state, costmodel, tuning
from .. import profiles as _profile_mod
from ..errors import SettingError
from ..optable import GATES, NO_SCALE, OPS, ROW_SCALE, TABLE, TENSOR_SCALE, OpDef
from ..profiles import Profile, profile
from . import _fallbacks, _kernel
from ._fallbacks import FALLBACKS

if TYPE_CHECKING:
    from typing import Literal

    Path = Literal["kernel", "fallback"]  #: where a Decision sends a call

#: test seam: the device index CPU tensors are routed as (-1: CPU tensors always take the fallback).
#: Tests set it to 0 together with a fake ``_kernel.launch`` to drive every gate through the public ops.
_cpu_index: int = -1


@final
class Decision:
    """Which path an op takes for a shape, and why (what :func:`decide` returns: for tests, logs and engines)."""

    __slots__ = ("basis", "fallback_us", "gate", "kernel_us", "op", "path", "reason")

    op: str
    path: Path  #: "kernel" | "fallback"
    reason: str  #: in words, naming the setting or bound that decided and what it rests on
    gate: str | None  #: the gate that sent the call to the fallback (None: kernel); see :func:`route`
    #: what decided: "measured" (a sweep measured this very shape: ``<op>.measured``), "model" (the
    #: cost model's prediction, ``<op>.model``), "limit" (outside what the kernel takes: its limits,
    #: multiples, plan, or a configured roof range), or "fixed" (no choice: empty problem,
    #: deterministic mode, no kernel, a failed kernel, an operand layout)
    basis: str
    kernel_us: float | None  #: the kernel's µs: measured at this shape or predicted (None: neither was asked)
    fallback_us: float | None  #: the fallback's µs, likewise

    def __init__(
        self, op: str, path: Path, reason: str, gate: str | None = None, basis: str = "limit",
        kernel_us: float | None = None, fallback_us: float | None = None,
    ) -> None:
        self.op, self.path, self.reason, self.gate, self.basis = op, path, reason, gate, basis
        self.kernel_us, self.fallback_us = kernel_us, fallback_us

    def __repr__(self) -> str:
        return f"Decision({self.op!r}, {self.path!r}, {self.reason!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Decision) and (self.op, self.path, self.reason) == (other.op, other.path, other.reason)

    __hash__ = None  # type: ignore[assignment]


@final
class _Route:
    """One op's dispatch facts on one device, resolved from the profile once (plain ints)."""

    __slots__ = (
        "counts",
        "k_multiple",
        "max_k",
        "max_m",
        "max_n",
        "measured",
        "measured_from",
        "min_k",
        "min_n",
        "model",
        "model_basis",
        "n_multiple",
        "off",
        "op",
        "plan_problem",
        "plan_with",
        "roof_hi",
        "roof_lo",
        "split_default",
        "split_fixed",
        "splits",
        "times",
        "variants",
        "who",
    )

    def __init__(self, op: OpDef, prof: Profile, overrides: Mapping[str, Any] | None = None) -> None:
        """``overrides`` (setting key -> value) stand above the profile's values: what a sweep's
        tuned result would decide before it is written (``hwprofile.sweep.report``)."""
        settings: Any = prof  # Profile[key] is the setting's value, typed Any (bounds are read as int below)
        over = overrides or {}

        def get(key: str) -> Any:
            return over[key] if key in over else settings[key]

        def val(b: int | str) -> int:
            return b if isinstance(b, int) else int(get(b))

        self.op = op
        self.who = prof.plugin.name if prof.plugin else "no architecture plugin"
        self.off: str | None = None  #: "deterministic" | "no_kernel" | "failed" | None
        if prof["deterministic"]:
            self.off = "deterministic"
        elif op.name not in prof.kernels:
            self.off = "no_kernel"
        self.max_m, self.min_n, self.max_n = val(op.max_m), val(op.min_n), val(op.max_n)
        self.n_multiple = val(op.n_multiple)
        self.min_k, self.max_k = val(op.min_k), val(op.max_k)
        self.k_multiple = math.lcm(val(op.k_multiple), op.k_vec)  # the kernels' 16-byte loads need k_vec too
        self.roof_lo, self.roof_hi = (val(op.roof[0]), val(op.roof[1])) if op.roof else (0, 0)
        key = tuning.measured_key(op.name)
        text = get(key) if key in over or key in prof else ""
        self.measured_from = "the sweep result being reported" if key in over else (prof.explain(key).winner.source if text else "")
        #: per-shape decisions (``<op>.measured``): (M, N, K) -> tuning.Measured; route() consults it first
        self.measured = tuning.parse_measured(op.name, text, where=self.measured_from) if text else {}
        stamp = None if key in over or not text else prof.explain(key).winner.stamp
        loose = tuning.uncovered(self.measured, stamp) if isinstance(stamp, tuning.Stamp) else []
        if loose:
            raise SettingError(
                f"{self.measured_from}: {key} decides shape(s) {', '.join(map(tuning.shape_text, loose[:4]))}"
                f"{' ...' if len(loose) > 4 else ''} that its stamp's launch plan (stamp.shapes) does not cover; ship the file "
                f"'hwprofile sweep {op.name}' wrote (its [stamp] lists them) or remove those entries; nothing is routed by them"
            )
        if self.measured and self.off is None:
            self._check_takeable(prof.kernels[op.name])
        #: the measured times the cost model's local correction reads: shape -> (kernel µs or None, fallback µs)
        self.times = {s: (d.kernel_us, d.fallback_us) for s, d in self.measured.items()}
        mkey = costmodel.model_key(op.name)
        mtext = get(mkey) if mkey in over or mkey in prof else ""
        #: the cost model (None: no ``<op>.model``: the fallback wherever nothing was measured)
        self.model: costmodel.CostModel | None = None
        #: what the model's predictions rest on, in words (``Decision.reason``)
        self.model_basis = ""
        if mtext:
            if mkey in over:
                where, self.model_basis = "the sweep result being reported", "the sweep result being reported"
            else:
                w = prof.explain(mkey).winner
                where = w.source
                self.model_basis = _model_basis(prof, mkey, w)
            self.model = costmodel.parse(op.name, mtext, where=where)
        self.counts = prof.stats.counts.setdefault(op.name, {"kernel": 0, "fallback": 0})
        # the "plan" gate: why the kernel's planner cannot plan a shape (None: it can); see _kernel.unplannable
        split = bool(prof["gemv.split_k"])
        self.plan_problem: Callable[[int, int, int], str | None] = (
            lambda m, n, k: _kernel.unplannable(prof, op.name, m, n, k, split)
        )
        self.plan_with: Callable[[int, int, int, bool], str | None] = (
            lambda m, n, k, sk: _kernel.unplannable(prof, op.name, m, n, k, sk)
        )
        #: the kernel variants (split-K on / off) a sweep found faster, per measured shape; split_k() chooses by them
        self.variants = {s: d.variant for s, d in self.measured.items() if d.variant is not None}
        #: the profile's split-K, and whether it is fixed: the user set gemv.split_k (an explicit value is never
        #: overridden, it changes the summation order) or nothing measured names a variant
        self.split_default = split
        self.split_fixed = not self.variants or ("gemv.split_k" not in over and prof.explain("gemv.split_k").winner.kind == "env")
        #: (m, n, k) -> (split_k for the launch, or None: the profile's; the variant's name; why), memoised
        self.splits: dict[tuple[int, int, int], tuple[bool | None, str]] = {}

    def split_k(self, m: int, n: int, k: int) -> bool | None:
        """The split-K of the kernel variant to launch at (m, n, k) (None: the profile's ``gemv.split_k``)."""
        hit = self.splits.get((m, n, k))
        return hit[0] if hit is not None else self._choose_split(m, n, k)[0]

    def _choose_split(self, m: int, n: int, k: int) -> tuple[bool | None, str]:
        from ..tuning import VARIANTS

        default = f"split-K {'on' if self.split_default else 'off'}"
        if self.split_fixed:
            why = (
                f"{default}: gemv.split_k set by the user, never overridden" if self.variants
                else f"{default} (gemv.split_k): no measured shape names a faster variant"
            )
            found: tuple[bool | None, str] = (None, why)
        else:
            c = costmodel.predict_variant(self.model, self.variants, m, n, k)
            assert c.variant is not None
            sk = VARIANTS[c.variant]
            basis = (
                "the faster variant measured at this shape" if c.neighbours == ((m, n, k),)
                else f"{c.weight:.0%} of the weight of the nearest measured shapes ({', '.join(map(tuning.shape_text, c.neighbours))})"
            )
            found = (sk, f"split-K {'on' if sk else 'off'} ({basis})")
            if self.plan_with(m, n, k, sk) is not None:
                found = (None, f"{default}: the measured variant's plan does not take this shape")
        if len(self.splits) < 4096:
            self.splits[(m, n, k)] = found
        return found

    def variant_reason(self, m: int, n: int, k: int) -> str:
        """The kernel variant :meth:`split_k` launches at (m, n, k) and why, in words (``Decision.reason``)."""
        hit = self.splits.get((m, n, k))
        return (hit if hit is not None else self._choose_split(m, n, k))[1]

    def _check_takeable(self, spec: Any) -> None:
        """Refuse a measured kernel decision for a shape this kernel cannot take (its multiples, its plan)."""
        op = self.op
        bad = untakeable(self, self.measured, spec)
        if bad:
            listed = "; ".join(f"{tuning.shape_text(s)} ({why})" for s, why in list(bad.items())[:3])
            raise SettingError(
                f"{self.measured_from}: {op.name}.measured sends shape(s) to the {op.name} kernel of {self.who} that it cannot "
                f"take: {listed}{' ...' if len(bad) > 3 else ''}. Re-measure with 'hwprofile sweep {op.name}' on "
                "this plugin, or remove those entries; nothing is routed by them"
            )


def untakeable(r: _Route, table: Mapping[tuple[int, int, int], tuning.Measured], spec: Any) -> dict[tuple[int, int, int], str]:
    """The kernel decisions of ``table`` that dispatch cannot send to ``spec``'s kernel on ``r``'s device, with why:
    the N and K multiples ``r`` resolved, then the plugin's own plan (:func:`hwprofile.tuning.untakeable`)."""
    bad = {
        s: f"N % {r.n_multiple} or K % {r.k_multiple} is not 0"
        for s, d in sorted(table.items())
        if d.kernel and (s[1] % r.n_multiple or s[2] % r.k_multiple)
    }
    for s, why in tuning.untakeable(r.op.name, table, spec).items():
        bad.setdefault(s, why)
    return dict(sorted(bad.items()))


def route(r: _Route, m: int, n: int, k: int, operands: tuple[Any, ...] | None = None) -> str | None:
    """The routing function: ``None`` (take the kernel) or the name of the first gate that says no.

    Gates, in order: ``empty`` (M, N or K is 0: nothing to launch), ``deterministic``,
    ``no_kernel``, ``failed`` (the kernel did not build, load or launch here, or failed its
    verification against float64 or the self-test); then the kernel's limits, the only box: ``m``, ``n``, ``n_multiple``, ``k``,
    ``k_multiple``, ``roof`` (a configured N range always left to the fallback; none by default);
    inside them, at a shape the sweep measured (``<op>.measured``), its decision: ``measured`` (the
    fallback was faster) or the kernel; elsewhere ``plan`` (the kernel's planner cannot plan the
    shape, or plans past the target's limits: a gate that refuses, so no planner error reaches the
    op), then ``model`` (the cost model, ``<op>.model``, does not predict the kernel faster, or
    there is no model), last ``layout`` (an operand is not contiguous or not 16-byte aligned;
    checked only when ``operands`` are given). The ops memoise the answer per shape, so neither the
    per-shape lookup nor the prediction costs anything on the hot path.
    """
    if not (m and n and k):
        return "empty"
    if r.off is not None:
        return r.off
    if m > r.max_m:
        return "m"
    if n < r.min_n or n > r.max_n:
        return "n"
    if n % r.n_multiple:
        return "n_multiple"
    if k < r.min_k or k > r.max_k:
        return "k"
    if k % r.k_multiple:
        return "k_multiple"
    if r.roof_lo <= n < r.roof_hi:
        return "roof"
    if r.measured:
        d = r.measured.get((m, n, k))
        if d is not None:
            if not d.kernel:
                return "measured"
            return "layout" if operands is not None and _misplaced(operands) else None
    if r.plan_problem(m, n, k) is not None:
        return "plan"
    if r.model is None or not costmodel.predict(r.model, r.times, m, n, k).kernel:
        return "model"
    if operands is not None and _misplaced(operands):
        return "layout"
    return None


def _model_basis(prof: Profile, key: str, winner: Any) -> str:
    """What the cost model of ``key``'s winning layer rests on: a fit on this SKU, another's, or a default."""
    here = tuning.device_identity(prof.device)
    stamp = winner.stamp
    if isinstance(stamp, tuning.Stamp) and stamp.device == here:
        return f"{key} from {winner.source}, fitted on {stamp.device} ({stamp.date or 'undated'})"
    if isinstance(stamp, tuning.Stamp):
        return f"predicted, not measured on this SKU: {key} from {winner.source} was fitted on {stamp.device}"
    if getattr(winner, "kind", None) == "env":  # the user's own model: theirs to vouch for, nobody's default
        return f"{key} set by the user ({winner.source}), unstamped"
    why = f" ({winner.reason})" if getattr(winner, "reason", "") else ""
    return f"predicted, not measured on this SKU: {key} is {winner.source}'s default{why}"


def _misplaced(operands: tuple[Any, ...]) -> bool:
    """True if an operand (None: absent) is not contiguous or not 16-byte aligned: the kernels cannot take it."""
    return any(t is not None and (not t.is_contiguous() or t.data_ptr() % 16) for t in operands)


def _predicted(r: _Route, m: int, n: int, k: int) -> str:
    """The cost model's prediction at (m, n, k) and what it rests on, in words."""
    model = r.model
    if model is None:
        key = costmodel.model_key(r.op.name)
        return f"no cost model ({key} is empty on this profile): nothing predicts the kernel faster, so the fallback"
    p = costmodel.predict(model, r.times, m, n, k)
    kern = "no kernel trend" if math.isinf(p.kernel_us) else f"{p.kernel_us:.3g} µs"
    near = (
        f", corrected by the {len(p.neighbours)} nearest measured shapes ({', '.join(map(tuning.shape_text, p.neighbours))})"
        if p.neighbours else ", the trend alone (no measured shape to correct it)"
    )
    fitted = f"the model fitted on {model.samples} samples" if model.samples else "a default model (not fitted)"
    return f"predicted: kernel {kern} vs fallback {p.fallback_us:.3g} µs by {fitted}{near}; {r.model_basis}"


def _reason(r: _Route, gate: str | None, m: int, n: int, k: int) -> str:
    """Words for :func:`route`'s answer, naming the setting behind each bound and what a choice rests on.

    The kernel's own limits (``m`` onwards in :func:`route`'s order) are worded by :func:`_limit_reason`,
    so each function stays one screen and one concern: why a choice was made here, which bound refused there.
    """
    op = r.op
    d = r.measured.get((m, n, k)) if gate in (None, "measured") else None
    if d is not None:
        us = "could not run" if d.kernel_us is None else f"{d.kernel_us:g} µs"
        times = f"kernel {us} vs fallback {d.fallback_us:g} µs" if d.kernel else f"fallback {d.fallback_us:g} µs vs kernel {us}"
        return f"measured at this shape (M={m}, N={n}, K={k}): {times} ({op.name}.measured from {r.measured_from})"
    if gate is None or gate == "model":
        return _predicted(r, m, n, k)
    if gate == "empty":
        return f"empty problem (M={m}, N={n}, K={k}): nothing to launch; the result is {'zeros' if m and n else 'empty'}"
    if gate == "deterministic":
        return f"deterministic mode ({_env.DETERMINISTIC.name}) keeps ops on their fallback"
    if gate == "no_kernel":
        if r.who == "no architecture plugin":
            return f"no architecture plugin serves this device, so no {op.name} kernel"
        return f"{r.who} provides no {op.name} kernel for this device"
    if gate == "failed":
        strict = _env.STRICT.name
        return (
            f"the {op.name} kernel failed to build, load, launch or pass its verification against float64 (or self-test) "
            f"in this process (warned once); set {strict}=1 to see the error raised"
        )
    return _limit_reason(r, gate, m, n, k)


def _limit_reason(r: _Route, gate: str, m: int, n: int, k: int) -> str:
    """:func:`_reason`'s words for a kernel limit: the bound, its value here, and the setting or kernel constant behind it."""
    op = r.op

    def name(b: int | str, what: str) -> str:
        return f"{b}" if isinstance(b, str) else f"the {op.name} kernel's {what}"

    if gate == "m":
        if isinstance(op.max_m, int):
            return f"kernel limit: M={m}: the {op.name} kernel takes M <= {r.max_m} only"
        return f"kernel limit: M={m} > {op.max_m}={r.max_m}"
    if gate == "n":
        bounds = f"{name(op.min_n, 'smallest N')} .. {name(op.max_n, 'largest N')}"
        return f"kernel limit: N={n} outside [{r.min_n}, {r.max_n}] ({bounds})"
    if gate == "n_multiple":
        return f"kernel limit: N={n} is not a multiple of {r.n_multiple} ({name(op.n_multiple, 'N multiple')})"
    if gate == "k":
        bounds = f"{name(op.min_k, 'smallest K')} .. {name(op.max_k, 'largest K')}"
        return f"kernel limit: K={k} outside [{r.min_k}, {r.max_k}] ({bounds})"
    if gate == "k_multiple":
        what = name(op.k_multiple, "K multiple")
        return f"kernel limit: K={k} is not a multiple of {r.k_multiple} ({what}, and 16-byte loads need {op.k_vec})"
    if gate == "roof":
        lo, hi = op.roof or ("", "")
        return f"N={n} in [{r.roof_lo}, {r.roof_hi}) ({lo} .. {hi}): a range configured to take the fallback"
    if gate == "plan":
        return f"the {op.name} kernel cannot take M={m}, N={n}, K={k} here: {r.plan_problem(m, n, k)}"
    if gate == "layout":
        return "an operand is not contiguous or not 16-byte aligned (e.g. a padded weight row stride): the fallback takes it"
    raise AssertionError(f"unknown gate {gate!r}")


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


#: the gates of the kernel's limits (what it can take, and a configured roof range)
_LIMIT_GATES: Final = frozenset({"m", "n", "n_multiple", "k", "k_multiple", "roof", "plan"})


def basis(r: _Route, gate: str | None, m: int, n: int, k: int) -> str:
    """What decided :func:`route`'s answer ``gate``: "measured", "model", "limit" or "fixed" (:attr:`Decision.basis`)."""
    if gate in (None, "measured") and (m, n, k) in r.measured:
        return "measured"
    if gate is None or gate == "model":
        return "model"
    return "limit" if gate in _LIMIT_GATES else "fixed"


def times(r: _Route, gate: str | None, m: int, n: int, k: int) -> tuple[float | None, float | None]:
    """The kernel's and the fallback's µs behind :func:`route`'s answer: measured at this shape, or the model's
    prediction where it decided (``None`` where neither did: a limit or a fixed gate)."""
    d = r.measured.get((m, n, k)) if gate in (None, "measured") else None
    if d is not None:
        return d.kernel_us, d.fallback_us
    if (gate is None or gate == "model") and r.model is not None:
        p = costmodel.predict(r.model, r.times, m, n, k)
        return (None if math.isinf(p.kernel_us) else p.kernel_us), p.fallback_us
    return None, None


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


def validate(op: OpDef, x: Any, w: Any, scale: Any, out: Any) -> tuple[int, int, int, int]:
    """Check the arguments against the op's contract; returns (M, N, K, scale mode). Errors name the argument."""
    import torch

    xn, wn = op.args[0], op.args[1]
    for name, t in ((xn, x), (wn, w)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op.name}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dtype != getattr(torch, op.x_dtype):
        raise ValueError(f"{op.name}: {xn} must be torch.{op.x_dtype}, got {x.dtype}")
    if w.dtype != getattr(torch, op.w_dtype):
        raise ValueError(f"{op.name}: {wn} must be torch.{op.w_dtype}, got {w.dtype}")
    if w.dim() != 2:
        raise ValueError(f"{op.name}: {wn} must have 2 dimensions [N, K], got shape {tuple(w.shape)}")
    n, k = w.shape
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"{op.name}: {xn} must be [..., K] with K={k} (from {wn} {tuple(w.shape)}), got {tuple(x.shape)}")
    dev = x.device
    if w.device != dev:
        raise ValueError(f"{op.name}: {wn} is on {w.device} but {xn} is on {dev}; put them on one device")
    m = math.prod(x.shape[:-1])
    mode = NO_SCALE
    if op.scaled:
        sn = op.args[2]
        if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
            raise ValueError(f"{op.name}: {sn} must be a float32 tensor, got {getattr(scale, 'dtype', type(scale).__name__)}")
        if scale.device != dev:
            raise ValueError(f"{op.name}: {sn} is on {scale.device} but {xn} is on {dev}; put them on one device")
        if scale.numel() == 1 and scale.dim() <= 1:
            mode = TENSOR_SCALE
        elif scale.dim() == 1 and scale.numel() == n:
            mode = ROW_SCALE
        else:
            raise ValueError(
                f"{op.name}: {sn} must have 1 element (per tensor) or N={n} elements (per row), got shape {tuple(scale.shape)}"
            )
    elif scale is not None:
        raise TypeError(f"{op.name}: takes no scale, got {type(scale).__name__}")
    if out is not None and (
        not isinstance(out, torch.Tensor)
        or out.dtype != getattr(torch, op.out_dtype)
        or tuple(out.shape) != (*x.shape[:-1], n)
        or out.device != dev
    ):
        _bad_out(op, out, (*x.shape[:-1], n), dev)
    return m, n, k, mode


def _bad_out(op: OpDef, out: Any, want: tuple[int, ...], dev: Any) -> NoReturn:
    """:func:`validate`'s error for an ``out`` of the wrong type, dtype, shape or device; out of line, off the per-call path."""
    import torch

    got = f"{out.dtype} {tuple(out.shape)} on {out.device}" if isinstance(out, torch.Tensor) else type(out).__name__
    raise ValueError(f"{op.name}: out must be torch.{op.out_dtype} of shape {want} on {dev}, got {got}")


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


def _span(t: Any) -> tuple[int, int]:
    """The byte range ``[lo, hi)`` ``t``'s elements occupy (torch strides are never negative)."""
    lo = t.data_ptr()
    last = sum((d - 1) * st for d, st in zip(t.shape, t.stride(), strict=True))
    return lo, lo + (last + 1) * t.element_size()


def _overlap(a: Any, b: Any) -> bool:
    """True if ``b`` (None: absent) may share memory with ``a``: their byte ranges intersect (conservative for interleaved views)."""
    if b is None or a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    (alo, ahi), (blo, bhi) = _span(a), _span(b)
    return alo < bhi and blo < ahi


def _self_overlapping(t: Any) -> bool:
    """True if two elements of ``t`` share memory: a stride 0 over a dimension of size > 1, or strides that interleave."""
    dims = sorted((st, d) for d, st in zip(t.shape, t.stride(), strict=True) if d > 1)
    extent = 1  # elements spanned by the dimensions of smaller stride
    for st, d in dims:
        if st < extent:
            return True
        extent = st * (d - 1) + extent
    return False
