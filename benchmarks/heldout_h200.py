"""Held-out regret of the cost model on the current GPU (written for the H200): shapes no fit has seen.

Measures every op of the op table (sweep's ``GpuTimer``: CUDA-graph replay, cold L2, two passes of
15 replays) at the served-model catalog's shapes plus the box edges (what ``hwprofile sweep`` measures)
and at the shapes of ``benchmarks/heldout_models.toml`` (>= 10 served models not in the catalog), each
shape once, then reports per op:

* leave-one-model-out over the catalog (``costmodel.cross_validate``: fit on every other model's
  shapes and the box edges, predict the held-out model's);
* fit on the catalog, evaluated on the held-out file (``costmodel.holdout``: those models never in the fit);

regret = time of the predicted path / the faster measured path: geomean, worst, shapes over 1.05, and
the held-out models named. Targets (issue 32): geomean <= 1.03 per op, worst <= 1.15. Writes
``heldout.json``, ``heldout_regret.png`` (one panel per op: held-out file shapes) and the tuned files
fitted on the catalog (``tuned/<op>.toml`` + ``tuned/samples/``; ``benchmarks/ship_sm90.py OUT/tuned``
ships them) to $OUT. Exit 1 when a target fails.

GPU time: the catalog run measured 373 shapes in 36 s; with ~170 held-out shapes about 60-90 s, plus NVRTC
compiles of uncached instances. ``--dry-run`` uses made-up times on any device (plumbing only).

Usage (``benchmarks/run_h200.sh heldout``): OUT=dir python3 benchmarks/heldout_h200.py [--ops a,b] [--reps 15]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import hwprofile
from hwprofile import costmodel, models, sweep
from hwprofile._text import table
from hwprofile.optable import OPS

HELDOUT = Path(__file__).with_name("heldout_models.toml")
TARGET_GEOMEAN = 1.03
TARGET_WORST = 1.15


def row_of(r: costmodel.Held) -> dict[str, object]:
    """A held-out row for the JSON report: its fields and its regret."""
    return {f: getattr(r, f) for f in r.__slots__} | {"regret": r.regret}


class Cached:
    """Each shape measured once, whichever of the runs below asks for it."""

    def __init__(self, timer: Any) -> None:
        self.timer, self.points = timer, {}  # type: dict[tuple[str, int, int, int], sweep.Point]

    def measure(self, op: str, m: int, n: int, k: int) -> sweep.Point:
        key = (op, m, n, k)
        if key not in self.points:
            self.points[key] = self.timer.measure(op, m, n, k)
        return self.points[key]


class DryTimer:
    """``--dry-run``: made-up times with a kernel that loses at some N (no GPU); its numbers mean nothing."""

    def measure(self, op: str, m: int, n: int, k: int) -> sweep.Point:
        b = costmodel.call_bytes(op, m, n, k)
        kernel = 2.0 + b / 3.3e6 * (1.2 if (n // 512) % 3 == 0 else 1.0)
        fallback = 4.0 + b / 3.6e6
        return sweep.Point(m, n, k, [kernel] * 5, [fallback] * 5)


def rows(held: list[costmodel.Held]) -> list[list[str]]:
    return [[r.model, f"{r.m}x{r.n}x{r.k}", "-" if r.kernel_us is None else f"{r.kernel_us:.2f}", f"{r.fallback_us:.2f}",
             f"{r.predicted_kernel_us:.2f}", f"{r.predicted_fallback_us:.2f}", r.path, f"{r.regret:.3f}"] for r in held]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT", "out"))
    (out / "tuned").mkdir(parents=True, exist_ok=True)
    hwprofile.reset()
    prof = hwprofile.profile(0)
    if (prof.device.simulated and not args.dry_run) or prof.plugin is None:
        print(f"needs a real GPU with its architecture plugin, got {prof.device.name}, plugin {prof.plugin}")
        return 2
    shipped = models.load()
    held_models = {k: v for k, v in models.load([HELDOUT]).items() if k not in shipped}
    timer = Cached(DryTimer() if args.dry_run else sweep.GpuTimer(prof, reps=args.reps))
    t0 = time.monotonic()
    report: dict[str, Any] = {"device": prof.device.name, "heldout_models": sorted(held_models), "ops": {}}
    failures: list[str] = []
    heldout_rows: dict[str, list[costmodel.Held]] = {}
    for op in [o for o in args.ops.split(",") if o]:
        if op not in prof.kernels:
            continue
        grid = sweep.default_grid(op)
        doc = sweep.run(prof, op, grid, timer, box=sweep.box_grid(op))  # the catalog fit: what a sweep ships
        sweep.write(doc, out / "tuned" / f"{op}.toml")
        per_model: dict[str, set[tuple[int, int, int]]] = {}
        for s, names in models.origins(op, shipped).items():
            for nm in names:
                per_model.setdefault(nm.split()[0], set()).add(s)
        origins = models.origins(op, held_models)
        for s in origins:
            timer.measure(op, *s)
        pts = lambda shapes: [timer.points[(op, *s)] for s in shapes]  # noqa: E731
        train = sweep.samples(pts(grid))
        test = sweep.samples(pts(origins))
        lomo = costmodel.cross_validate(op, train, per_model, sweep.box_grid(op))
        ho = costmodel.holdout(op, train, test, {s: names[0].split()[0] for s, names in origins.items()})
        heldout_rows[op] = ho
        report["ops"][op] = {"lomo": costmodel.summary(lomo), "heldout": costmodel.summary(ho),
                             "lomo_rows": [row_of(r) for r in lomo], "heldout_rows": [row_of(r) for r in ho]}
        for what, res in (("leave-one-model-out (catalog)", lomo), ("fit on the catalog, held-out file", ho)):
            sm = costmodel.summary(res)
            print(f"\n{op}, {what}: {sm['shapes']} shapes, geomean {sm['geomean']:.4f}, worst {sm['worst']:.3f} "
                  f"({sm['worst_at']}), {sm['over']} over 1.05; models: {', '.join(sm['models'])}")  # type: ignore[arg-type]
            bad = [r for r in res if r.regret > 1.0]
            if bad:
                print(table(rows(bad), ["model", "shape", "kernel", "fallback", "pred kernel", "pred fallback", "path", "regret"]))
            if res and (sm["geomean"] > TARGET_GEOMEAN or sm["worst"] > TARGET_WORST):  # type: ignore[operator]
                failures.append(f"{op} {what}: geomean {sm['geomean']:.4f}, worst {sm['worst']:.3f}")
    gpu_s = time.monotonic() - t0
    report["gpu_seconds"], report["failures"] = gpu_s, failures
    (out / "heldout.json").write_text(json.dumps(report, indent=1))
    try:
        sweep.plot_regret({op: r for op, r in heldout_rows.items() if r}, out / "heldout_regret.png",
                          title=f"{prof.device.name}: regret at held-out models' shapes (model fitted on the catalog)")
    except (ImportError, ValueError) as exc:
        print(f"no plot: {exc}")
    for f in failures:
        print(f"FAIL {f}")
    print(f"{'PASS' if not failures else 'FAIL'}: {len(timer.points)} shapes measured in {gpu_s:.1f} s; wrote {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
