"""The cost model: each path's predicted time over (M, N, K), fitted from a sweep's samples. Never imports torch (or numpy).

A per-shape table says nothing about the shape next to it, and a box around it is wrong where the
kernel's plan changes (the H200 catalog: the bf16 GEMV kernel loses at N = 4608-6144 and wins at
4096 and 7168; the router kernel wins at every expert count the box left out). So dispatch
predicts both paths' times at a shape nobody measured and takes the faster (``ops._dispatch.route``).

The model of one path has two parts, each explainable in a sentence:

* **trend**: ``launch + bytes / bandwidth(bytes)``; ``bytes`` is what the call moves (weight, x, out),
  ``launch`` is 0.9 x the fastest sample (the per-call floor), and ``bandwidth`` a curve over
  ``log2(bytes)`` knots (the median achieved bandwidth of the samples of each power of two), made
  non-decreasing (pool-adjacent-violators) and never growing faster than ``bytes``, so the trend's time
  never falls as a problem grows;
* **local correction**: the trend is scaled by the geometric mean of ``measured / trend`` at the
  ``near`` nearest measured shapes (the op's ``<op>.measured`` entries, inverse-square distance
  weights; distance over ``log M``, ``n_weight * log N``, ``log K``: N weighs more because N decides
  the kernel's plan, its grid and its waves). Where nothing is measured (a default for an unmeasured
  SKU) the trend alone predicts.

Chosen by leave-one-model-out cross-validation on the H200 catalog (``benchmarks/h200/2026-12-02-catalog-2``):
bf16 GEMV held-out regret geomean 1.006 (worst 1.131) with the correction, 1.037 (worst 1.61) with
the trend alone, 1.033 (worst 1.19) always taking the kernel; the router, linear and FP8 GEMV
held-out shapes all at 1.000 (``docs/architecture.md``, "Dispatch by a cost model").

The parameters are one setting per op, ``<op>.model`` (format :data:`MODEL_FORMAT`), so layers,
provenance, stamps, staleness, ``explain`` and the cross-rank agreement cover them as any threshold.
:func:`fit` makes one from samples, :func:`parse`/:func:`format_model` read and write the text,
:func:`predict` evaluates it, :func:`cross_validate` holds out whole models.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from ._record import Record, _set, final
from .errors import SettingError
from .optable import TABLE

Shape = tuple[int, int, int]

#: the local correction's defaults (the held-out choice on the H200 catalog; module docstring)
NEAR: Final = 4
N_WEIGHT: Final = 4.0
LAUNCH_FRACTION: Final = 0.9  #: launch = this x the fastest sample of the path
MIN_SAMPLES: Final = 2  #: the fewest measured shapes :func:`fit` takes

MODEL_FORMAT: Final = (
    "'kernel=LAUNCH_US|L2B:TBPS,L2B:TBPS,...; fallback=LAUNCH_US|L2B:TBPS,...; near=N; n_weight=W; samples=S' "
    "(L2B: log2 of the bytes a call moves, TBPS: achieved bandwidth there in TB/s; e.g. "
    "'kernel=2.6|20:0.8,24:3.2; fallback=4.1|20:0.5,24:3.0; near=4; n_weight=4; samples=115')"
)


@final
class Sample(Record):
    """One measured shape: both paths' median times in µs (``kernel_us`` None: the kernel could not run it)."""

    m: int
    n: int
    k: int
    kernel_us: float | None
    fallback_us: float


@final
class PathFit(Record):
    """One path's trend: ``launch_us + bytes / bandwidth(bytes)``."""

    #: the per-call floor in µs
    launch_us: float
    #: (log2 bytes, TB/s) knots, sorted, bandwidth non-decreasing; log-log interpolation between, flat outside
    knots: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        _set(self, "launch_us", float(self.launch_us))
        _set(self, "knots", tuple((int(b), float(w)) for b, w in self.knots))

    def bandwidth(self, nbytes: float) -> float:
        """TB/s at ``nbytes`` (log-log between knots, the end knots' value outside)."""
        ks = self.knots
        lb = math.log2(max(nbytes, 1.0))
        if lb <= ks[0][0]:
            return ks[0][1]
        for (b0, w0), (b1, w1) in itertools.pairwise(ks):
            if lb <= b1:
                f = (lb - b0) / (b1 - b0)
                return math.exp(math.log(w0) + f * (math.log(w1) - math.log(w0)))
        return ks[-1][1]

    def time(self, nbytes: float) -> float:
        """The trend's µs for a call that moves ``nbytes``."""
        return self.launch_us + nbytes / (self.bandwidth(nbytes) * 1e6)


@final
class CostModel(Record):
    """Both paths' trends of one op, and how the local correction weighs the measured shapes."""

    op: str  #: the op (its dtypes give the bytes a call moves)
    kernel: PathFit | None  #: None: no kernel sample (the kernel never ran): the kernel is never predicted faster
    fallback: PathFit
    near: int = NEAR  #: measured shapes the local correction averages (0: trend only)
    n_weight: float = N_WEIGHT  #: weight of log N against log M and log K in the distance
    samples: int = 0  #: how many samples the trends were fitted on (0: a default, not fitted)

    def __post_init__(self) -> None:
        _set(self, "near", int(self.near))
        _set(self, "n_weight", float(self.n_weight))
        _set(self, "samples", int(self.samples))


def call_bytes(op: str, m: int, n: int, k: int) -> int:
    """Bytes one call moves: the weight (its dtype's width), x (bf16) and the output (the contract's dtype;
    a gate's fp32 logits, which its fallback writes and reads back and its kernel keeps on chip)."""
    d = TABLE[op]
    w = 1 if d.w_dtype.startswith("float8") else 2
    out = 2 if getattr(d, "out_dtype", "float32") == "bfloat16" else 4
    return n * k * w + m * k * 2 + m * n * out


# --- fitting -------------------------------------------------------------------------------------


def _refuse(op: str, why: str) -> SettingError:
    return SettingError(f"cost model of {op}: {why}; re-measure with 'hwprofile sweep {op}'")


def _check(op: str, samples: Sequence[Sample]) -> None:
    if op not in TABLE:
        raise SettingError(f"cost model: no op {op!r} in the op table (ops: {', '.join(TABLE)})")
    seen: set[Shape] = set()
    for s in samples:
        shape = (s.m, s.n, s.k)
        if min(shape) < 1:
            raise _refuse(op, f"sample {shape} has an empty dimension (M, N and K must be >= 1)")
        for what, t in (("kernel", s.kernel_us), ("fallback", s.fallback_us)):
            if t is not None and not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
                raise _refuse(op, f"sample {'x'.join(map(str, shape))} has {what} time {t!r}, not a positive number of µs")
        if shape in seen:
            raise _refuse(op, f"sample {'x'.join(map(str, shape))} appears twice")
        seen.add(shape)
    if len(samples) < MIN_SAMPLES:
        raise _refuse(op, f"{len(samples)} sample(s): a fit needs at least {MIN_SAMPLES} measured shapes")


def _pava(values: list[float], weights: list[float]) -> list[float]:
    """Non-decreasing least-squares fit of ``values`` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [value, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            b = blocks.pop()
            a = blocks.pop()
            wt = a[1] + b[1]
            blocks.append([(a[0] * a[1] + b[0] * b[1]) / wt, wt, a[2] + b[2]])
    out: list[float] = []
    for v, _, c in blocks:
        out += [v] * int(c)
    return out


def fit_path(op: str, points: Sequence[tuple[int, float]]) -> PathFit:
    """One path's trend from (bytes, µs) points (module docstring): launch, then a monotone bandwidth curve."""
    launch = LAUNCH_FRACTION * min(t for _, t in points)
    buckets: dict[int, list[float]] = {}
    for b, t in points:
        buckets.setdefault(round(math.log2(b)), []).append(b / ((t - launch) * 1e6))
    keys = sorted(buckets)
    med = [sorted(buckets[x])[len(buckets[x]) // 2] for x in keys]
    bw = _pava(med, [float(len(buckets[x])) for x in keys])
    # never faster than bytes grow: bandwidth at most doubles per doubling of bytes, so time never falls
    for i in range(1, len(bw)):
        bw[i] = min(bw[i], bw[i - 1] * 2.0 ** (keys[i] - keys[i - 1]))
    return PathFit(round(launch, 3), tuple((x, float(f"{w:.4g}")) for x, w in zip(keys, bw, strict=True)))


def fit(op: str, samples: Sequence[Sample], *, near: int = NEAR, n_weight: float = N_WEIGHT) -> CostModel:
    """The cost model of ``op`` from ``samples`` (every measured shape: catalog and box edges).

    Refused with a :class:`SettingError` naming the op, the sample and what to do: fewer than two
    samples, a repeated shape, an empty dimension, a time that is not a positive number, an op not in the table.
    """
    _check(op, samples)
    fallback = fit_path(op, [(call_bytes(op, s.m, s.n, s.k), s.fallback_us) for s in samples])
    ks = [(call_bytes(op, s.m, s.n, s.k), s.kernel_us) for s in samples if s.kernel_us is not None]
    kernel = fit_path(op, ks) if ks else None
    return CostModel(op, kernel, fallback, near, n_weight, len(samples))


# --- predicting ----------------------------------------------------------------------------------


@final
class Prediction(Record):
    """Both paths' predicted µs at one shape and what they rest on."""

    kernel_us: float  #: math.inf when the model has no kernel trend
    fallback_us: float
    neighbours: tuple[Shape, ...]  #: the measured shapes the local correction used (empty: the trend alone)

    @property
    def kernel(self) -> bool:
        """True when the kernel is predicted faster (a tie goes to the fallback)."""
        return self.kernel_us < self.fallback_us


def _distance(model: CostModel, a: Shape, b: Shape) -> float:
    return math.sqrt(
        math.log(a[0] / b[0]) ** 2 + (model.n_weight * math.log(a[1] / b[1])) ** 2 + math.log(a[2] / b[2]) ** 2
    )


def predict(model: CostModel, measured: Mapping[Shape, tuple[float | None, float]], m: int, n: int, k: int) -> Prediction:
    """Both paths' µs at (m, n, k): the trends, corrected by the ``model.near`` nearest shapes of ``measured``.

    ``measured``: shape -> (kernel µs or None, fallback µs), the op's ``<op>.measured`` times. Each
    path's correction uses the shapes where that path has a time.
    """
    nbytes = call_bytes(model.op, m, n, k)
    shape = (m, n, k)
    near = sorted(((_distance(model, shape, s), s) for s in measured), key=lambda x: x[0])[: model.near] if model.near else []

    def corrected(fit_: PathFit, index: int) -> float:
        base = fit_.time(nbytes)
        num = den = 0.0
        for dist, s in near:
            t = measured[s][index]
            if t is None:
                continue
            resid = math.log(t / fit_.time(call_bytes(model.op, *s)))
            if dist < 1e-12:
                return base * math.exp(resid)
            w = 1.0 / (dist * dist)
            num, den = num + w * resid, den + w
        return base * math.exp(num / den) if den else base

    kernel = corrected(model.kernel, 0) if model.kernel is not None else math.inf
    return Prediction(kernel, corrected(model.fallback, 1), tuple(s for _, s in near))


@final
class VariantChoice(Record):
    """The kernel variant predicted fastest at one shape, and what the choice rests on."""

    variant: str | None  #: a key of ``tuning.VARIANTS``; None: no measured shape names one (the profile's default)
    weight: float  #: the share of the neighbours' weight that voted for it (1.0: unanimous or measured here)
    neighbours: tuple[Shape, ...]  #: the measured shapes that voted (empty: none)


def predict_variant(model: CostModel | None, variants: Mapping[Shape, str], m: int, n: int, k: int) -> VariantChoice:
    """The kernel variant (split-K on or off) to run at (m, n, k): the one that was faster at this very shape
    if it was measured, else the inverse-square-distance weighted vote of the ``near`` nearest measured shapes
    that name a variant (the local correction's distance: N weighs ``n_weight`` x, since N decides the grid and
    so whether splitting K fills the SMs). ``variants``: shape -> the faster variant there (``<op>.measured``'s
    ``@variant``). A tie in the vote goes to the variant of the nearest shape. Without a model the defaults
    (:data:`NEAR`, :data:`N_WEIGHT`) weigh the distance."""
    shape = (m, n, k)
    if shape in variants:
        return VariantChoice(variants[shape], 1.0, (shape,))
    if not variants:
        return VariantChoice(None, 0.0, ())
    probe = model if model is not None else CostModel("", None, PathFit(0.0, ((0, 1.0),)))
    near = sorted(((_distance(probe, shape, s), s) for s in variants), key=lambda x: (x[0], x[1]))[: max(probe.near, 1)]
    votes: dict[str, float] = {}
    for dist, s in near:
        votes[variants[s]] = votes.get(variants[s], 0.0) + 1.0 / max(dist * dist, 1e-12)
    total = sum(votes.values())
    first = variants[near[0][1]]
    best = max(votes, key=lambda v: (votes[v], v == first))
    return VariantChoice(best, votes[best] / total, tuple(s for _, s in near))


# --- the setting's text --------------------------------------------------------------------------


def _num(x: float) -> str:
    return f"{x:.4g}"


def format_model(model: CostModel) -> str:
    """The ``<op>.model`` text of ``model`` (:data:`MODEL_FORMAT`)."""
    def path(p: PathFit) -> str:
        return f"{_num(p.launch_us)}|" + ",".join(f"{b}:{_num(w)}" for b, w in p.knots)

    parts = [f"kernel={path(model.kernel)}"] if model.kernel is not None else ["kernel=none"]
    parts += [f"fallback={path(model.fallback)}", f"near={model.near}", f"n_weight={_num(model.n_weight)}", f"samples={model.samples}"]
    return "; ".join(parts)


def model_key(op: str) -> str:
    """The setting that holds ``op``'s cost model."""
    return f"{op}.model"


_parsed: dict[tuple[str, str], CostModel] = {}  # parse per (op, text); only valid texts (pure: no reset needed)


def parse(op: str, text: str, *, where: str) -> CostModel:
    """The cost model in ``text``; anything not in :data:`MODEL_FORMAT` is a :class:`SettingError` naming ``where``."""
    found = _parsed.get((op, text))
    if found is not None:
        return found
    key = model_key(op)

    def bad(why: str) -> SettingError:
        return SettingError(
            f"{where}: {key} {why}; write {MODEL_FORMAT}, or regenerate it with 'hwprofile sweep {op}'. The model is not applied"
        )

    fields: dict[str, str] = {}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        name, eq, value = part.partition("=")
        name = name.strip()
        if not eq or name not in ("kernel", "fallback", "near", "n_weight", "samples") or name in fields:
            raise bad(f"has {part!r}: not one of kernel=, fallback=, near=, n_weight=, samples= (each once)")
        fields[name] = value.strip()
    if "fallback" not in fields or "kernel" not in fields:
        raise bad("lacks kernel= or fallback=")

    def path(what: str, value: str) -> PathFit:
        launch_s, bar, knots_s = value.partition("|")
        try:
            launch = float(launch_s)
            knots = [(int(b), float(w)) for b, w in (kv.split(":") for kv in knots_s.split(","))]
        except ValueError:
            raise bad(f"has {what}={value!r}: not LAUNCH_US|L2B:TBPS,...") from None
        if not bar or not knots:
            raise bad(f"has {what}={value!r}: not LAUNCH_US|L2B:TBPS,...")
        if not (math.isfinite(launch) and launch >= 0):
            raise bad(f"has {what} launch {launch_s!r}: not a number of µs >= 0")
        bs = [b for b, _ in knots]
        if bs != sorted(set(bs)) or not all(0 <= b <= 60 for b in bs):
            raise bad(f"has {what} knots {knots_s!r}: log2 bytes must rise, each in 0..60")
        ws = [w for _, w in knots]
        if not all(math.isfinite(w) and w > 0 for w in ws) or ws != sorted(ws):
            raise bad(f"has {what} knots {knots_s!r}: bandwidths must be positive TB/s that never fall")
        return PathFit(launch, tuple(knots))

    try:
        near = int(fields.get("near", str(NEAR)))
        n_weight = float(fields.get("n_weight", str(N_WEIGHT)))
        samples = int(fields.get("samples", "0"))
    except ValueError:
        raise bad("has near=, n_weight= or samples= that is not a number") from None
    if not (0 <= near <= 64 and math.isfinite(n_weight) and n_weight > 0 and samples >= 0):
        raise bad("has near= outside 0..64, n_weight= <= 0 or samples= < 0")
    kernel = None if fields["kernel"] == "none" else path("kernel", fields["kernel"])
    found = _parsed[(op, text)] = CostModel(op, kernel, path("fallback", fields["fallback"]), near, n_weight, samples)
    return found


def describe(model: CostModel) -> str:
    """One line: the trends' launch and bandwidth range, for ``explain``."""
    def path(p: PathFit | None) -> str:
        if p is None:
            return "none"
        return f"{p.launch_us:g} µs + bytes at {p.knots[0][1]:g}..{p.knots[-1][1]:g} TB/s"

    fitted = f"fitted on {model.samples} samples" if model.samples else "a default, not fitted on this op's samples"
    return f"kernel {path(model.kernel)}; fallback {path(model.fallback)}; {model.near} nearest measured shapes correct it; {fitted}"


def scaled(model: CostModel, factor: float) -> CostModel:
    """``model`` on a part with ``factor`` x the bandwidth (launch unchanged): a default for an unmeasured SKU."""
    def path(p: PathFit | None) -> PathFit | None:
        return None if p is None else PathFit(p.launch_us, tuple((b, float(_num(w * factor))) for b, w in p.knots))

    fb = path(model.fallback)
    assert fb is not None
    return CostModel(model.op, path(model.kernel), fb, model.near, model.n_weight, 0)


# --- cross-validation ----------------------------------------------------------------------------


@final
class Held(Record):
    """One held-out shape of one model: measured times, the predicted path and its regret."""

    model: str  #: the held-out model (catalog name)
    m: int
    n: int
    k: int
    kernel_us: float | None  #: measured
    fallback_us: float  #: measured
    predicted_kernel_us: float
    predicted_fallback_us: float

    @property
    def path(self) -> str:
        return "kernel" if self.predicted_kernel_us < self.predicted_fallback_us and self.kernel_us is not None else "fallback"

    @property
    def regret(self) -> float:
        """Time of the predicted path / the faster measured path."""
        k = self.kernel_us if self.kernel_us is not None else math.inf
        taken = k if self.path == "kernel" else self.fallback_us
        return taken / min(k, self.fallback_us)


def _evaluate(op: str, train: Sequence[Sample], held: Iterable[tuple[str, Sample]], near: int, n_weight: float) -> list[Held]:
    model = fit(op, train, near=near, n_weight=n_weight)
    table = {(s.m, s.n, s.k): (s.kernel_us, s.fallback_us) for s in train}
    out = []
    for name, s in held:
        p = predict(model, table, s.m, s.n, s.k)
        out.append(Held(name, s.m, s.n, s.k, s.kernel_us, s.fallback_us, p.kernel_us, p.fallback_us))
    return out


def cross_validate(
    op: str, samples: Sequence[Sample], shapes_of: Mapping[str, Iterable[Shape]], box: Iterable[Shape], *,
    near: int = NEAR, n_weight: float = N_WEIGHT,
) -> list[Held]:
    """Leave one model out: for each model of ``shapes_of`` (name -> its shapes), fit on every sample but
    that model's shapes (the ``box`` edges always stay in the fit: every sweep measures them) and
    predict its other shapes. A model whose shapes are all box edges or unmeasured contributes nothing.
    """
    by_shape = {(s.m, s.n, s.k): s for s in samples}
    boxed = set(box)
    out: list[Held] = []
    for name, shapes in shapes_of.items():
        held = sorted(s for s in set(shapes) if s in by_shape and s not in boxed)
        if not held:
            continue
        out += _evaluate(op, [s for sh, s in by_shape.items() if sh not in set(held)], [(name, by_shape[s]) for s in held], near, n_weight)
    return out


def holdout(
    op: str, train: Sequence[Sample], test: Sequence[Sample], models_of: Mapping[Shape, str], *,
    near: int = NEAR, n_weight: float = N_WEIGHT,
) -> list[Held]:
    """Fit on ``train`` (the catalog) and predict every shape of ``test`` not in it (a second models file):
    ``models_of`` names the model each test shape comes from."""
    known = {(s.m, s.n, s.k) for s in train}
    held = [(models_of.get((s.m, s.n, s.k), "?"), s) for s in test if (s.m, s.n, s.k) not in known]
    return _evaluate(op, train, held, near, n_weight) if held else []


def summary(rows: Sequence[Held], limit: float = 1.05) -> dict[str, object]:
    """Geomean and worst regret, the count over ``limit``, and the models held out."""
    regrets = [r.regret for r in rows]
    worst = max(rows, key=lambda r: r.regret) if rows else None
    return {
        "shapes": len(rows),
        "geomean": math.exp(sum(map(math.log, regrets)) / len(regrets)) if regrets else 1.0,
        "worst": worst.regret if worst else 1.0,
        "worst_at": f"{worst.model} {worst.m}x{worst.n}x{worst.k}" if worst else "",
        "over": sum(r > limit for r in regrets),
        "models": sorted({r.model for r in rows}),
    }
