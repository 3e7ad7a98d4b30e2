"""``hwprofile sweep``: time a kernel against its fallback, fit the cost model and per-shape decisions, write them stamped.

By default it measures the served-model catalog's decode shapes plus the op table's grid (the box
edges): the cost model (``<op>.model``, :mod:`hwprofile.costmodel`) is fitted on every measured
shape, and every measured shape gets its own decision (``<op>.measured``, which dispatch takes
before the model). The crossover logic is pure (:func:`verdict`, :func:`decision_table`)
and so is the regret report (:func:`report`); they are tested on the CPU with made-up timings (any
:class:`Timer`); :class:`GpuTimer` does the measuring on a real GPU (cold L2 by rotating weight
copies, CUDA-graph replay, median of many replays, warm-up excluded).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from ._log import get_logger

log = get_logger(__name__)

NOISE_FLOOR = 0.02  # relative: differences under 2 % are ties even when replays agree better


@dataclass
class Point:
    """One shape's timings (microseconds per call, one sample per replay)."""

    m: int
    n: int
    k: int
    kernel_us: list[float] = field(default_factory=list)
    fallback_us: list[float] = field(default_factory=list)
    # medians of independent passes (fresh weights each): their spread is the run-to-run noise
    kernel_passes: list[float] = field(default_factory=list)
    fallback_passes: list[float] = field(default_factory=list)
    #: the kernel variant ``kernel_us`` holds (a key of ``tuning.VARIANTS``): the faster of those timed, or None
    #: where one was timed (its plans do not differ, or the timer times one)
    variant: str | None = None
    #: every variant timed: its median over all passes (regret counts against the fastest, ``kernel_us``)
    variant_us: dict[str, float] = field(default_factory=dict)

    def take_variants(self, runs: Mapping[str | None, Sequence[Sequence[float]]]) -> None:
        """Set the kernel's samples from each variant's passes (variant -> one list of replay times per pass): the
        variant with the smallest median over all its samples is the kernel's time here."""
        timed = {v: [t for p in ps for t in p] for v, ps in runs.items() if any(ps)}
        if not timed:
            return
        best = min(timed, key=lambda v: (statistics.median(timed[v]), v or ""))
        self.kernel_us = list(timed[best])
        self.kernel_passes = [statistics.median(p) for p in runs[best] if p]
        self.variant = best
        self.variant_us = {v: round(statistics.median(ts), 3) for v, ts in timed.items() if v is not None}

    @property
    def kernel(self) -> float:
        return statistics.median(self.kernel_us) if self.kernel_us else float("inf")

    @property
    def fallback(self) -> float:
        return statistics.median(self.fallback_us)

    @property
    def noise(self) -> float:
        """Relative noise: the largest of the replays' interquartile spread, the spread between
        independent passes (run-to-run), and NOISE_FLOOR."""
        def spread(xs: Sequence[float]) -> float:
            if len(xs) < 4:
                return 0.0
            q = statistics.quantiles(xs, n=4)
            return (q[2] - q[0]) / statistics.median(xs)

        def passes(xs: Sequence[float]) -> float:
            return (max(xs) - min(xs)) / statistics.median(xs) if len(xs) >= 2 else 0.0

        return max(NOISE_FLOOR, spread(self.kernel_us), spread(self.fallback_us), passes(self.kernel_passes), passes(self.fallback_passes))

    def as_dict(self, ties: str) -> dict[str, Any]:
        variants = {"variant": self.variant, "variant_us": dict(self.variant_us)} if self.variant else {}  # TOML has no None
        return {
            "m": self.m,
            "n": self.n,
            "k": self.k,
            "kernel_us": round(self.kernel, 3) if self.kernel_us else -1.0,
            "fallback_us": round(self.fallback, 3),
            "noise": round(self.noise, 4),
            "verdict": verdict(self),
            "kernel_samples": [round(x, 3) for x in self.kernel_us],
            "fallback_samples": [round(x, 3) for x in self.fallback_us],
            "kernel_pass_medians": [round(x, 3) for x in self.kernel_passes],
            "fallback_pass_medians": [round(x, 3) for x in self.fallback_passes],
            **variants,
        }


def verdict(p: Point) -> str:
    """``kernel`` / ``fallback`` when one is faster by more than the noise, else ``tie``."""
    if not p.kernel_us:
        return "fallback"  # no kernel for this shape
    k, f = p.kernel, p.fallback
    margin = p.noise * max(k, f)
    if f - k > margin:
        return "kernel"
    if k - f > margin:
        return "fallback"
    return "tie"


def samples(points: Sequence[Point]) -> list[Any]:
    """The cost model's samples (:class:`hwprofile.costmodel.Sample`) of measured points: both medians."""
    from .costmodel import Sample

    return [Sample(p.m, p.n, p.k, p.kernel if p.kernel_us else None, p.fallback) for p in points]


def thresholds_for(op: str, points: Sequence[Point], ties: str) -> tuple[dict[str, int | str], list[str]]:
    """The settings a sweep of ``op`` decides besides its per-shape table: the cost model, fitted on ``points``.

    The kernel's limits are the op table's (what the kernel takes), not a sweep's: no box is written.
    ``ties`` is the per-shape tie rule (:func:`decision_table`); the model predicts strict wins only.
    A sweep of one shape is legitimate (its decision is still written) but a fit needs two: then no
    model is written, a note says so, and the model of the layers below stays in force.
    """
    from . import costmodel

    key = costmodel.model_key(op)
    if len(points) < costmodel.MIN_SAMPLES:
        return {}, [
            f"{op}: {len(points)} measured shape(s), the cost model needs at least {costmodel.MIN_SAMPLES}: no {key} written "
            f"(the profile's stays in force); sweep more shapes to fit one"
        ]
    model = costmodel.fit(op, samples(points))
    notes = [] if model.kernel is not None else [f"{op}: the kernel ran at no measured shape: the model never predicts it faster"]
    return {key: costmodel.format_model(model)}, notes


def replay_times(fn: Callable[[int], Any], calls: int, reps: int, dev: Any) -> list[float]:
    """Microseconds per call of ``fn(0..calls-1)``, one sample per CUDA-graph replay.

    The calls are run once (warm-up: compile, load, allocator), captured into one graph on a side
    stream, replayed once more, then ``reps`` replays are timed with CUDA events: launch gaps and
    host overhead stay out, and every call reads the weights of a different copy (cold L2).
    """
    import torch

    for i in range(calls):
        fn(i)
    torch.cuda.synchronize(dev)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        for i in range(calls):
            fn(i)
    torch.cuda.current_stream(dev).wait_stream(s)
    g.replay()
    torch.cuda.synchronize(dev)
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1000 / calls)
    return out


#: the rotation covers this many times the device's L2 (``GpuTimer``, benchmarks/fp8m_h200.py)
L2_ROTATIONS: Final = 4


def rotate_factor(l2_bytes: int) -> int:
    """Bytes of weight copies a cold-L2 replay rotates through on a device with ``l2_bytes`` of L2."""
    return L2_ROTATIONS * max(l2_bytes, 0)


def l2_bytes(torch: Any, dev: Any) -> int:
    """The L2 size of CUDA device ``dev`` (0 where torch cannot tell: no CUDA, an older torch)."""
    try:
        return int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 0)
    except (RuntimeError, AssertionError, AttributeError):
        return 0


class Timer(Protocol):
    def measure(self, op: str, m: int, n: int, k: int) -> Point: ...


class GpuTimer:
    """Kernel and fallback side by side on the profile's GPU, cold L2, CUDA-graph replay."""

    def __init__(self, prof: Any, reps: int = 15, rotate_bytes: int = 256 << 20) -> None:
        import torch

        from . import ops

        self.prof, self.reps = prof, reps
        self.torch, self.ops = torch, ops
        self.dev = torch.device("cuda", prof.device.index)
        # the weight copies one replay walks through: at least 4x the device's L2, so no call finds its weight in L2
        # (an H200's 60 MB L2 takes 240 MB; the 256 MB default covered it only by chance)
        self.rotate = max(rotate_bytes, rotate_factor(l2_bytes(torch, self.dev)))

    def _graph(self, fn: Callable[[int], Any], calls: int) -> list[float]:
        return replay_times(fn, calls, self.reps, self.dev)

    def measure(self, op: str, m: int, n: int, k: int, passes: int = 3) -> Point:
        """``passes`` independent passes, each with fresh weights (new allocations, new addresses), so run-to-run
        noise is measured too and a near tie rests on repeated measurements (:func:`decision_table`)."""
        point = Point(m, n, k)
        runs: dict[str | None, list[list[float]]] = {}
        for _ in range(passes):
            kv, fs = self._one_pass(op, m, n, k)
            for v, ks in kv.items():
                runs.setdefault(v, []).append(ks)
            point.fallback_us += fs
            point.fallback_passes.append(statistics.median(fs))
        point.take_variants(runs)
        return point

    def variants(self, op: str, m: int, n: int, k: int, scale: int | None) -> dict[str | None, bool | None]:
        """The kernel variants worth timing at a shape (name -> ``split_k``): split-K on and off where the plugin plans
        them differently, else one (None: the profile's ``gemv.split_k``)."""
        from .tuning import VARIANTS

        spec = self.prof.kernels.get(op)
        if spec is None:
            return {None: None}
        try:
            extra = {} if scale is None else {"scale": scale}
            plans = {v: spec.configure(m=m, n=n, k=k, split_k=sk, **extra) for v, sk in VARIANTS.items()}
        except (ValueError, TypeError):
            return {None: None}
        if len({(p.name_expression, p.grid, p.block, p.shared_bytes) for p in plans.values()}) < 2:
            return {None: None}
        return {v: sk for v, sk in VARIANTS.items()}

    def _one_pass(self, op: str, m: int, n: int, k: int) -> tuple[dict[str | None, list[float]], list[float]]:
        from .optable import GATES, ROW_SCALE, get

        if op in GATES:
            ks, fs = self._gate_pass(op, m, n, k)
            return {None: ks}, fs
        torch, ops = self.torch, self.ops
        d = get(op)
        fp8 = d.scaled
        wbytes = n * k * (1 if fp8 else 2)
        copies = max(2, min(64, -(-self.rotate // wbytes)))
        wdt = getattr(torch, d.w_dtype)
        ws = [(torch.randn(n, k, device=self.dev) * (3 if fp8 else 1)).to(wdt) for _ in range(copies)]
        scales = [torch.rand(n, device=self.dev) + 0.5 for _ in ws] if fp8 else None
        x = torch.randn(m, k, device=self.dev).bfloat16()
        out = torch.empty(m, n, device=self.dev, dtype=getattr(torch, d.out_dtype))
        kernel: dict[str | None, list[float]] = {}
        kernel_ok = op in self.prof.kernels and m <= (d.max_m if isinstance(d.max_m, int) else 16)
        if kernel_ok:
            try:
                kernel_ok = ops.run_kernel(op, out, x, ws[0], scales[0] if scales else None)
            except ValueError as exc:  # the plugin's plan refuses the shape: no kernel time here, the sweep goes on
                log.info("%s M=%d N=%d K=%d: the kernel refuses the shape (%s); timing the fallback only", op, m, n, k, exc)
                kernel_ok = False
        if kernel_ok:
            for v, sk in self.variants(op, m, n, k, ROW_SCALE if scales else None).items():

                def call(i: int, sk: bool | None = sk) -> Any:
                    return ops.run_kernel(op, out, x, ws[i], scales[i] if scales else None, split_k=sk)

                kernel[v] = self._graph(call, copies)
        fallback_fn = ops.fallback(op)  # the function the op dispatches to off its kernel
        if scales is not None:
            fallback = self._graph(lambda i: fallback_fn(x, ws[i], scales[i]), copies)
        else:
            fallback = self._graph(lambda i: fallback_fn(x, ws[i]), copies)
        return kernel, fallback


    def _gate_pass(self, op: str, m: int, n: int, k: int) -> tuple[list[float], list[float]]:
        """A gate op: its fused kernel (``ops._gate.run_kernel``) against its torch path (``ops._gate.fallback``), with the
        selection of the served router at (N, K) (``GateDef.router_for``), cold L2 as the GEMM ops."""
        from .ops import _gate
        from .optable import GATES

        torch = self.torch
        r = GATES[op].router_for(n, k)
        copies = max(2, min(64, -(-self.rotate // (n * k * 2))))
        ws = [(torch.randn(n, k, device=self.dev) * k**-0.5).bfloat16() for _ in range(copies)]
        bias = torch.randn(n, device=self.dev) * 0.05 if r.scoring == "sigmoid" else None
        x = torch.randn(m, k, device=self.dev).bfloat16()
        sel: dict[str, Any] = {"top_k": r.top_k, "n_group": r.n_group, "topk_group": r.topk_group, "renormalize": r.renormalize,
                               "scaling": r.scaling, "scoring": r.scoring}
        kernel: list[float] = []
        kernel_ok = op in self.prof.kernels
        if kernel_ok:
            try:
                _gate.run_kernel(x, ws[0], bias, **sel)
            except ValueError as exc:  # the plugin's plan refuses the shape: no kernel time here, the sweep goes on
                log.info("%s M=%d N=%d K=%d: the kernel refuses the shape (%s); timing the fallback only", op, m, n, k, exc)
                kernel_ok = False
        if kernel_ok:
            kernel = self._graph(lambda i: _gate.run_kernel(x, ws[i], bias, **sel), copies)
        fallback = self._graph(
            lambda i: _gate.fallback(x, ws[i], bias, r.n_group, r.topk_group, r.top_k, r.renormalize, r.scaling, r.scoring), copies
        )
        return kernel, fallback


def box_grid(op: str) -> list[tuple[int, int, int]]:
    """The op table's sweep grid for ``op`` (either kind): the box edges, so the cost model's fit spans the kernel's range."""
    from .optable import TABLE

    return list(TABLE[op].grid)


def model_grid(op: str, models: Sequence[str] | None = None, model_files: Sequence[Path | str] = ()) -> list[tuple[int, int, int]]:
    """The served-model catalog's shapes for ``op`` (every model, or the named ones, plus those of
    ``model_files``), sorted: what a sweep must measure so that dispatch is right where models run.

    A file's models join the selection whether or not ``models`` names them (naming a file is
    asking for its models).
    """
    from . import models as catalog

    known = catalog.load(model_files)
    if models is None:
        return catalog.shapes(op, known)
    shipped = catalog.load() if model_files else known
    chosen = {**catalog.select(known, models), **{k: v for k, v in known.items() if k not in shipped}}
    return catalog.shapes(op, chosen)


def default_grid(op: str, models: Sequence[str] | None = None, model_files: Sequence[Path | str] = ()) -> list[tuple[int, int, int]]:
    """What ``hwprofile sweep OP`` measures by default: the catalog's shapes (:func:`model_grid`) and
    the box edges (:func:`box_grid`), sorted, each once.

    Every measured shape becomes a per-shape decision (``<op>.measured``) and a sample of the cost
    model (``<op>.model``); the box edges give the fit shapes across the kernel's range, not only
    where the catalog's models run.
    """
    return sorted({*model_grid(op, models, model_files), *box_grid(op)})


def decision_table(points: Sequence[Point], ties: str) -> dict[tuple[int, int, int], Any]:
    """One decision per measured shape, with both times: the path faster by more than the noise
    (:func:`verdict`), and a near tie (within the noise of the replays and of the independent passes)
    by ``ties``: ``"kernel"`` (the default of ``hwprofile sweep`` and ``tune``) takes the kernel, the
    path with fewer moving parts (no cuBLAS handle or workspace, nothing that differs between two
    processes), so a decision never rests on which side of one noisy number a median fell (the H200's
    bf16 GEMV at 128256x4096: kernel 243 µs against cuBLAS 241.7 in the shipped table and 252-281 in two
    graph replays); ``"fallback"`` takes the faster median (giving every within-noise tie to the
    fallback cost up to 7 % on the H200 catalog run: gemv 1x37984x5120, kernel 94.5 µs, fallback 101.4
    µs, passes 8 % apart).
    """
    from .tuning import Measured

    def wins(p: Point) -> bool:
        if not p.kernel_us:
            return False
        v = verdict(p)
        return v == "kernel" or (v == "tie" and (ties == "kernel" or p.kernel < p.fallback))

    return {
        (p.m, p.n, p.k): Measured(
            wins(p), round(p.kernel, 3) if p.kernel_us else None, round(p.fallback, 3), p.variant if p.kernel_us else None
        )
        for p in points
    }


def run(
    prof: Any,
    op: str,
    grid: Sequence[tuple[int, int, int]],
    timer: Timer,
    ties: str = "kernel",
    progress: Callable[[int, int, str], None] | None = None,
    date: str | None = None,
    box: Sequence[tuple[int, int, int]] | None = None,
) -> dict[str, Any]:
    """Measure every grid point, fit the cost model, and return the stamped tuned-file document.

    The cost model (``<op>.model``) is fitted on every measured point (``box`` points not in ``grid``
    are measured too; the plot draws them); every measured shape also gets its own decision,
    ``<op>.measured``, which dispatch takes before the model. The stamp's plan digest covers the
    op's grid and every measured shape (``stamp.shapes`` lists those outside the grid).
    """
    from . import tuning as stamps

    shapes = list(dict.fromkeys((*grid, *(box or ()))))
    points = []
    for i, (m, n, k) in enumerate(shapes):
        points.append(timer.measure(op, m, n, k))
        if progress:
            progress(i + 1, len(shapes), f"{op} M={m} N={n} K={k}")
    in_box = set(box) if box is not None else set(shapes)
    chosen, notes = thresholds_for(op, points, ties)  # every measured shape, box edges included
    table = decision_table(points, ties)
    spec = prof.kernels.get(op)
    notes += _routable(prof, op, table, spec)
    chosen[stamps.measured_key(op)] = stamps.format_measured(table)
    p = prof.plugin
    grid_set = set(_optable_grid(op))
    extra = sorted(s for s in table if s not in grid_set)
    stamp = stamps.current(
        op,
        prof.device,
        p.name if p else "",
        (p.version or "") if p else "",
        spec.source_digest() if spec else "",
        date or time.strftime("%Y-%m-%d"),
        plan=stamps.plan_digest(op, spec, extra) if spec else "",
        shapes=extra if spec else (),
    )
    return {
        "stamp": stamp.as_dict(),
        "thresholds": chosen,
        "sweep": {
            "ties": ties,
            "noise_floor": NOISE_FLOOR,
            "notes": notes,
            "method": "CUDA-graph replay, cold L2 (rotating weight copies), median of replays",
        },
        # "box": the point is a box edge of the op's grid (plot draws those)
        "measurements": [{**pt.as_dict(ties), "box": (pt.m, pt.n, pt.k) in in_box} for pt in points],
    }


def _routable(prof: Any, op: str, table: dict[tuple[int, int, int], Any], spec: Any) -> list[str]:
    """Turn kernel wins that dispatch could not route (beyond the kernel's limits, its multiples or
    its plan: ``run_kernel`` runs outside them) into fallback decisions, in place; the notes say which."""
    from .ops import _dispatch
    from .tuning import beyond_limits, measured_key, shape_text

    wins = {s: d for s, d in table.items() if d.kernel}
    bad = {s: why for s in wins if (why := beyond_limits(op, s))}
    if spec is not None:
        r = _route_for(prof, op, {measured_key(op): ""})
        bad.update({s: why for s, why in _dispatch.untakeable(r, {s: d for s, d in wins.items() if s not in bad}, spec).items()})
    for s in bad:
        table[s] = table[s].replace(kernel=False)
    return [
        f"kernel faster at {shape_text(s)} but dispatch cannot route it there ({why}): fallback recorded" for s, why in sorted(bad.items())
    ]


def _optable_grid(op: str) -> tuple[tuple[int, int, int], ...]:
    from .optable import TABLE

    return TABLE[op].grid


def _route_for(prof: Any, op: str, overrides: Mapping[str, Any]) -> Any:
    """Dispatch's ``_Route`` of ``op`` on ``prof`` with ``overrides`` above its values: a GEMM op's, or a gate's with its
    served router's selection (``ops._gate.served_route``)."""
    from .ops import _dispatch, _gate
    from .optable import GATES

    if op in GATES:
        return _gate.served_route(prof, overrides)
    return _dispatch._Route(_dispatch.ENTRIES[op].op, prof, overrides=overrides)


# --- regret: what the tuned result costs at each measured shape ------------------------------------


@dataclass
class Regret:
    """One measured shape in a sweep's report: both times, the path the tuned result takes, and why."""

    m: int
    n: int
    k: int
    kernel_us: float | None  #: None: the kernel could not run the shape
    fallback_us: float
    path: str  #: "kernel" | "fallback": what dispatch does with the sweep's result applied
    basis: str  #: "measured" | "model" | "limit" | "fixed" (:attr:`hwprofile.ops.Decision.basis`)

    @property
    def regret(self) -> float:
        """Time of the path taken / time of the faster path (1.0: the faster path is taken)."""
        k = self.kernel_us if self.kernel_us is not None else math.inf
        taken = k if self.path == "kernel" else self.fallback_us
        return taken / min(k, self.fallback_us)


def report(prof: Any, doc: Mapping[str, Any]) -> list[Regret]:
    """Per measured shape of ``doc`` (a :func:`run` result), the path dispatch takes with the result's
    values standing above ``prof``'s, by dispatch's own routing function (no copy of its rules)."""
    from .ops import _dispatch

    op = doc["stamp"]["op"]
    r = _route_for(prof, op, doc["thresholds"])
    out = []
    for row in doc["measurements"]:
        m, n, k = int(row["m"]), int(row["n"]), int(row["k"])
        gate = _dispatch.route(r, m, n, k)
        basis = _dispatch.basis(r, gate, m, n, k)
        kernel = float(row["kernel_us"])
        path = "kernel" if gate is None else "fallback"
        out.append(Regret(m, n, k, kernel if kernel > 0 else None, float(row["fallback_us"]), path, basis))
    return out


def cross_validate(doc: Mapping[str, Any], model_files: Sequence[Path | str] = ()) -> list[Any]:
    """Leave-one-model-out over a :func:`run` result: for each catalog model (the shipped catalog and
    ``model_files``), the cost model fitted on the other models' measured shapes and the box edges predicts
    that model's (:func:`hwprofile.costmodel.cross_validate`); rows are :class:`hwprofile.costmodel.Held`."""
    from . import costmodel
    from . import models as catalog
    from .optable import TABLE

    op = doc["stamp"]["op"]
    found = [Point(int(r["m"]), int(r["n"]), int(r["k"]), [float(r["kernel_us"])] if float(r["kernel_us"]) > 0 else [],
                   [float(r["fallback_us"])]) for r in doc["measurements"]]
    per_model: dict[str, set[tuple[int, int, int]]] = {}
    for shape, names in catalog.origins(op, catalog.load(model_files)).items():
        for name in names:
            per_model.setdefault(name.split()[0], set()).add(shape)
    return costmodel.cross_validate(op, samples(found), per_model, TABLE[op].grid)


def geomean(xs: Iterable[float]) -> float:
    """Geometric mean (1.0 for no values)."""
    vals = list(xs)
    return math.exp(sum(math.log(x) for x in vals) / len(vals)) if vals else 1.0


def report_rows(rows: Sequence[Regret]) -> list[list[str]]:
    """Table rows for :func:`report`'s result: M, N, K, kernel, fallback, path (basis), regret."""
    return [
        [str(r.m), str(r.n), str(r.k), "-" if r.kernel_us is None else f"{r.kernel_us:.2f}", f"{r.fallback_us:.2f}",
         f"{r.path} ({r.basis})", f"{r.regret:.3f}"]
        for r in rows
    ]


REPORT_HEADER = ["M", "N", "K", "kernel us", "fallback us", "path taken", "regret"]


def plot_regret(reports: Mapping[str, Sequence[Any]], path: Path, title: str = "") -> None:
    """Regret per shape, one panel per op (bars; 1.0 is the faster path taken), written atomically.

    Rows are :class:`Regret` (a sweep's report) or :class:`hwprofile.costmodel.Held` (held-out shapes): anything
    with ``m``, ``n``, ``k``, ``path`` and ``regret``.

    Built without pyplot (no backend switch, nothing left registered in the caller's process).
    """
    import io

    from matplotlib.figure import Figure

    from ._files import atomic_write, ensure_directory

    ops = [op for op, rows in reports.items() if rows]
    if not ops:
        raise ValueError("plot_regret: no measured shape to plot")
    fig = Figure(figsize=(max(8.0, 0.12 * max(len(reports[o]) for o in ops)), 2.8 * len(ops)))
    axes = fig.subplots(len(ops), 1, squeeze=False)[:, 0]
    for ax, op in zip(axes, ops, strict=True):
        rows = reports[op]
        xs = range(len(rows))
        colors = ["tab:blue" if r.path == "kernel" else "tab:orange" for r in rows]
        ax.bar(xs, [r.regret for r in rows], color=colors)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhline(1.03, color="gray", ls=":", lw=0.8)
        ax.set_xticks(list(xs), [f"{r.m}x{r.n}x{r.k}" for r in rows], rotation=90, fontsize=5)
        worst = max(r.regret for r in rows)
        ax.set_title(f"{op}: {len(rows)} shapes, geomean regret {geomean(r.regret for r in rows):.3f}, worst {worst:.3f} "
                     "(blue: kernel, orange: fallback)", fontsize=8)
        ax.set_ylabel("regret", fontsize=8)
        ax.set_ylim(0.95, max(1.1, worst * 1.02))
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lstrip(".").lower() or "png", dpi=90)
    ensure_directory(path.parent, what="regret plot")
    atomic_write(path, buf.getvalue(), what="regret plot")


def write(doc: dict[str, Any], path: Path) -> Path | None:
    """Write the tuned file (stamp, thresholds, sweep notes) to ``path`` and the raw measurements
    beside it, in ``samples/<name>`` (returned): every first ``profile()`` reads the tuned file, and
    only the thresholds are needed there (:mod:`hwprofile.tuning`)."""
    import tomli_w

    from ._files import atomic_write, ensure_directory
    from .tuning import SAMPLES_DIR

    ensure_directory(path.parent, what="tuned file")
    measurements = doc.get("measurements")
    head = {k: v for k, v in doc.items() if k != "measurements"}
    samples = None
    if measurements:
        samples = path.parent / SAMPLES_DIR / path.name
        ensure_directory(samples.parent, what="sweep samples")
        atomic_write(samples, tomli_w.dumps({"stamp": doc["stamp"], "measurements": measurements}), what="sweep samples")
        head["sweep"] = {**head.get("sweep", {}), "samples": f"{SAMPLES_DIR}/{path.name}"}
    atomic_write(path, tomli_w.dumps(head), what="tuned file")  # readers see the old file or the new one, whole
    return samples


def plot(doc: dict[str, Any], path: Path) -> None:
    """Latency against M (router, linear) or N (GEMV, per K) for kernel and fallback, at the box edges.

    The figure is built without pyplot: no backend switch and no figure left registered in the
    caller's process (a notebook keeps its own backend). The format is the suffix's (``.png`` when
    there is none); the file is written whole through :func:`hwprofile._files.atomic_write`.
    """
    from matplotlib.figure import Figure

    op = doc["stamp"]["op"]
    ms = [r for r in doc["measurements"] if r.get("box", True)] or doc["measurements"]  # the box edges: one line per N or K
    fig = Figure(figsize=(8, 4.5))
    ax = fig.subplots()
    from .optable import TABLE

    by_m = TABLE[op].threshold == "max_tokens"
    if by_m:
        for n in sorted({r["n"] for r in ms}):
            rs = [r for r in ms if r["n"] == n]
            ax.plot([r["m"] for r in rs], [r["kernel_us"] for r in rs], "o-", label=f"kernel N={n}")
            ax.plot([r["m"] for r in rs], [r["fallback_us"] for r in rs], "s--", label=f"fallback N={n}")
        ax.set_xlabel("M (tokens)")
    else:
        for kk in sorted({r["k"] for r in ms}):
            rs = sorted((r for r in ms if r["k"] == kk), key=lambda r: r["n"])
            ax.plot([r["n"] for r in rs], [r["fallback_us"] / r["kernel_us"] for r in rs], "o-", label=f"K={kk}")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set(xscale="log", xlabel="N", ylabel="fallback time / kernel time (>1: kernel faster)")
    st = doc["stamp"]
    ax.set_title(f"{op} on {st['device']} vs {st['fallback']['function']} (torch {st['fallback']['torch']})", fontsize=9)
    if by_m:
        ax.set_ylabel("GPU time per call, us")
    ax.legend(fontsize=8)
    fig.tight_layout()
    import io

    from ._files import atomic_write, ensure_directory

    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lstrip(".").lower() or "png", dpi=90)
    ensure_directory(path.parent, what="plot")
    atomic_write(path, buf.getvalue(), what="plot")  # never through a link planted at the path, never half written
