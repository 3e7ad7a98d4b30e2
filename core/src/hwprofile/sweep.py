"""``hwprofile sweep``: time a kernel against its fallback, pick thresholds, write them stamped.

The crossover logic is pure (:func:`verdict`, :func:`max_tokens`, :func:`predicate_box`) and is
tested on the CPU with made-up timings; :class:`GpuTimer` does the measuring on a real GPU (cold L2
by rotating weight copies, CUDA-graph replay, median of many replays, warm-up excluded).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

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


def _wins(p: Point, ties: str) -> bool:
    v = verdict(p)
    return v == "kernel" or (v == "tie" and ties == "kernel")


def max_tokens(points: Iterable[Point], ties: str = "fallback") -> tuple[int, list[str]]:
    """Largest M such that the kernel wins at every M' <= M for every measured N (0 if it never does).

    Kernel wins above a loss are not taken (dispatch is "M <= threshold"); they come back as notes.
    """
    by_m: dict[int, list[Point]] = {}
    for p in points:
        by_m.setdefault(p.m, []).append(p)
    best, notes, broken = 0, [], False
    for m in sorted(by_m):
        ok = all(_wins(p, ties) for p in by_m[m])
        if ok and not broken:
            best = m
        elif not ok and not broken:
            broken = True
        elif ok and broken:
            notes.append(f"kernel also wins at M={m}, above a loss: not dispatched (non-monotone)")
    return best, notes


def predicate_box(points: Iterable[Point], ties: str = "fallback") -> tuple[int, int, list[str]]:
    """(max_n, max_k): the largest all-winning box N <= max_n, K <= max_k over the measured grid."""
    pts = list(points)
    ns = sorted({p.n for p in pts})
    ks = sorted({p.k for p in pts})
    win = {(p.n, p.k): _wins(p, ties) for p in pts}
    best = (0, 0, 0)
    for n_max in ns:
        for k_max in ks:
            cells = [(n, k) for n in ns if n <= n_max for k in ks if k <= k_max if (n, k) in win]
            if cells and all(win[c] for c in cells) and len(cells) > best[0]:
                best = (len(cells), n_max, k_max)
    notes = [
        f"kernel also wins at N={n}, K={k}, outside the box: not dispatched"
        for (n, k), w in sorted(win.items())
        if w and not (n <= best[1] and k <= best[2])
    ]
    return best[1], best[2], notes


def thresholds_for(op: str, points: Sequence[Point], ties: str) -> tuple[dict[str, int], list[str]]:
    """The settings a sweep of ``op`` decides: its threshold and the bounds of the region it measured.

    Outside the measured N and K the op keeps its fallback (nobody measured there).
    """
    from .optable import get

    d = get(op)
    ns, ks = [p.n for p in points], [p.k for p in points]
    if d.threshold == "max_tokens":
        m, notes = max_tokens(points, ties)
        return {
            f"{op}.max_tokens": m,
            f"{op}.min_n": min(ns),
            f"{op}.max_n": max(ns),
            f"{op}.min_k": min(ks),
            f"{op}.max_k": max(ks),
        }, notes
    n, k, notes = predicate_box(points, ties)
    out = {f"{op}.min_n": min(ns), f"{op}.max_n": n, f"{op}.min_k": min(ks), f"{op}.max_k": k}
    if d.roof is not None:
        out.update({b: 0 for b in d.roof if isinstance(b, str)})
    return out, notes


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


class Timer(Protocol):
    def measure(self, op: str, m: int, n: int, k: int) -> Point: ...


class GpuTimer:
    """Kernel and fallback side by side on the profile's GPU, cold L2, CUDA-graph replay."""

    def __init__(self, prof: Any, reps: int = 15, rotate_bytes: int = 256 << 20) -> None:
        import torch

        from . import ops

        self.prof, self.reps, self.rotate = prof, reps, rotate_bytes
        self.torch, self.ops = torch, ops
        self.dev = torch.device("cuda", prof.device.index)

    def _graph(self, fn: Callable[[int], Any], calls: int) -> list[float]:
        return replay_times(fn, calls, self.reps, self.dev)

    def measure(self, op: str, m: int, n: int, k: int, passes: int = 2) -> Point:
        """``passes`` independent passes, each with fresh weights, so run-to-run noise is measured too."""
        point = Point(m, n, k)
        for _ in range(passes):
            ks, fs = self._one_pass(op, m, n, k)
            if ks:
                point.kernel_us += ks
                point.kernel_passes.append(statistics.median(ks))
            point.fallback_us += fs
            point.fallback_passes.append(statistics.median(fs))
        return point

    def _one_pass(self, op: str, m: int, n: int, k: int) -> tuple[list[float], list[float]]:
        from .optable import get

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
        kernel: list[float] = []
        kernel_ok = op in self.prof.kernels and m <= (d.max_m if isinstance(d.max_m, int) else 16)
        if kernel_ok and ops.run_kernel(op, out, x, ws[0], scales[0] if scales else None):
            kernel = self._graph(
                lambda i: ops.run_kernel(op, out, x, ws[i], scales[i] if scales else None), copies
            )
        fallback_fn = ops.fallback(op)  # the function the op dispatches to off its kernel
        if scales is not None:
            fallback = self._graph(lambda i: fallback_fn(x, ws[i], scales[i]), copies)
        else:
            fallback = self._graph(lambda i: fallback_fn(x, ws[i]), copies)
        return kernel, fallback


def default_grid(op: str) -> list[tuple[int, int, int]]:
    """The op table's sweep grid for ``op``."""
    from .optable import get

    return list(get(op).grid)


def model_grid(op: str, models: Sequence[str] | None = None, model_files: Sequence[Path | str] = ()) -> list[tuple[int, int, int]]:
    """The served-model catalog's shapes for ``op`` (every model, or the named ones, plus those of
    ``model_files``), sorted: what a sweep must measure so that dispatch is right where models run.

    Not yet the default grid: :func:`thresholds_for` turns a grid into one threshold and one N x K
    box, and a box spanning the catalog's shapes would include combinations nobody measured. The
    catalog becomes the default once a tuned result can hold one decision per measured shape.
    """
    from . import models as catalog

    known = catalog.load(model_files)
    return catalog.shapes(op, known if models is None else catalog.select(known, models))


def run(
    prof: Any,
    op: str,
    grid: Sequence[tuple[int, int, int]],
    timer: Timer,
    ties: str = "fallback",
    progress: Callable[[int, int, str], None] | None = None,
    date: str | None = None,
) -> dict[str, Any]:
    """Measure every grid point, choose thresholds, and return the stamped tuned-file document."""
    from . import tuning as stamps

    points = []
    for i, (m, n, k) in enumerate(grid):
        points.append(timer.measure(op, m, n, k))
        if progress:
            progress(i + 1, len(grid), f"{op} M={m} N={n} K={k}")
    chosen, notes = thresholds_for(op, points, ties)
    spec = prof.kernels.get(op)
    p = prof.plugin
    stamp = stamps.current(
        op,
        prof.device,
        p.name if p else "",
        (p.version or "") if p else "",
        spec.source_digest() if spec else "",
        date or time.strftime("%Y-%m-%d"),
        plan=stamps.plan_digest(op, spec) if spec else "",
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
        "measurements": [pt.as_dict(ties) for pt in points],
    }


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
    """Latency against M (router, linear) or N (GEMV, per K) for kernel and fallback, threshold marked.

    The figure is built without pyplot: no backend switch and no figure left registered in the
    caller's process (a notebook keeps its own backend). The format is the suffix's (``.png`` when
    there is none); the file is written whole through :func:`hwprofile._files.atomic_write`.
    """
    from matplotlib.figure import Figure

    op = doc["stamp"]["op"]
    ms = doc["measurements"]
    fig = Figure(figsize=(8, 4.5))
    ax = fig.subplots()
    if doc["thresholds"].get(f"{op}.max_tokens") is not None:
        for n in sorted({r["n"] for r in ms}):
            rs = [r for r in ms if r["n"] == n]
            ax.plot([r["m"] for r in rs], [r["kernel_us"] for r in rs], "o-", label=f"kernel N={n}")
            ax.plot([r["m"] for r in rs], [r["fallback_us"] for r in rs], "s--", label=f"fallback N={n}")
        t = doc["thresholds"][f"{op}.max_tokens"]
        ax.axvline(t + 0.5, color="gray", ls=":", label=f"{op}.max_tokens = {t}")
        ax.set_xlabel("M (tokens)")
    else:
        for kk in sorted({r["k"] for r in ms}):
            rs = sorted((r for r in ms if r["k"] == kk), key=lambda r: r["n"])
            ax.plot([r["n"] for r in rs], [r["fallback_us"] / r["kernel_us"] for r in rs], "o-", label=f"K={kk}")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axvline(
            doc["thresholds"][f"{op}.max_n"],
            color="gray",
            ls=":",
            label=f"max_n={doc['thresholds'][f'{op}.max_n']}, max_k={doc['thresholds'][f'{op}.max_k']}",
        )
        ax.set(xscale="log", xlabel="N", ylabel="fallback time / kernel time (>1: kernel faster)")
    st = doc["stamp"]
    ax.set_title(f"{op} on {st['device']} vs {st['fallback']['function']} (torch {st['fallback']['torch']})", fontsize=9)
    if doc["thresholds"].get(f"{op}.max_tokens") is not None:
        ax.set_ylabel("GPU time per call, us")
    ax.legend(fontsize=8)
    fig.tight_layout()
    import io

    from ._files import atomic_write, ensure_directory

    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lstrip(".").lower() or "png", dpi=90)
    ensure_directory(path.parent, what="plot")
    atomic_write(path, buf.getvalue(), what="plot")  # never through a link planted at the path, never half written
