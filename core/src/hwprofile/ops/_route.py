"""Routing: kernel or fallback for one op and shape from one device's facts, and why, in words. Never holds a table or a memo.

:func:`route` is the only place that decides kernel or fallback. Its inputs are read once per
device into a :class:`_Route` per op (thresholds and bounds from the profile, the per-shape
decisions of ``<op>.measured`` parsed into a dict, the cost model ``<op>.model`` parsed, availability
of the kernel, deterministic mode): the kernel's limits are the only box, inside it a measured shape
decides, elsewhere the model's faster predicted path. :func:`_reason`, :func:`basis` and :func:`times`
turn an answer into words, what decided it and both paths' times (``_dispatch.decide``'s
:class:`Decision`). The per-device tables that hold the routes, and the memos of their answers,
are ``_dispatch``'s; this module never imports it (``_dispatch`` imports this one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, final

from .. import _env, costmodel, tuning
from ..errors import SettingError
from ..optable import OpDef
from . import _kernel

if TYPE_CHECKING:
    from typing import Literal

    from ..profiles import Profile

    Path = Literal["kernel", "fallback"]  #: where a Decision sends a call


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
