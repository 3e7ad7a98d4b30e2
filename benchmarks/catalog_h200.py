"""The whole served-model catalog on the current GPU in one run (written for the H200): regret per shape.

For every op of the op table it measures what ``hwprofile sweep OP`` measures by default (the
catalog's decode shapes plus the box edges; sweep's ``GpuTimer``: CUDA-graph replay, cold L2 by
rotating weight copies, two independent passes of 15 replays), writes the stamped tuned file
(plan digest over the grid and every measured shape, ``stamp.shapes``), then:

* prints per shape the kernel time, the fallback time, the path taken and the regret (time of the
  path taken / time of the faster path), for the shipped profile (before) and with the new tuned
  files applied (after), and the geometric mean per op and over everything;
* checks the tuned files end to end: a fresh profile that reads them (HWPROFILE_TUNED_FILE) must
  take the path the report computed at every measured shape (``decide()``), with complete stamps
  (kernel digest, plan digest, fallback versions known);
* checks that ``fp8_gemv`` is never slower than the bf16 ``gemv`` of the same (N, K) (it reads
  half the bytes): the time of the path each takes, beyond both shapes' noise;
* checks that ``fp8_gemv``'s fallback is within 2x of its kernel at every shape the kernel ran;
* checks the issue's targets: regret <= 1.03 at every shape, geomean <= 1.01.

Writes ``catalog.json``, ``catalog_regret.png`` (one panel per op), ``tuned/<op>.toml`` (with
``tuned/samples/``) to $OUT (default ./out). Exit status 1 when a check or target fails.

GPU time, estimated from the per-shape cost of ``GpuTimer`` (2 passes x (kernel + fallback) x 18
replays of >= 256 MB of weights, ~0.1-0.3 s a shape with allocation and capture; the FP8 fallback
at the LM-head shapes ~0.5 s): 373 shapes (router 88, linear 95, gemv 115, fp8 75 at this commit)
in about 2-3 minutes, plus the NVRTC compiles of instances not cached (~1 minute the first time).
The run prints its own wall time per op; ``--max-seconds`` (default 360) stops before an op that
would start past the budget and reports the ops not measured.

Usage (``benchmarks/run_h200.sh catalog`` runs it with the wheels installed):
    OUT=dir python3 benchmarks/catalog_h200.py [--ops gemv,fp8_gemv] [--reps 15] [--models a,b] [--max-seconds 360]
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
from hwprofile import _env, sweep
from hwprofile._text import table
from hwprofile.ops import decide
from hwprofile.optable import OPS

TARGET_WORST = 1.03
TARGET_GEOMEAN = 1.01
TARGET_FP8_FALLBACK = 2.0  #: fp8_gemv's fallback at most this x its kernel at every catalog shape (issue 32)


def progress(done: int, total: int, what: str) -> None:
    if done == total or done % 10 == 0:
        print(f"  {done}/{total} {what}", file=sys.stderr, flush=True)


def stamp_gaps(st: dict[str, Any]) -> list[str]:
    """What a stamp leaves unknown (a complete one: kernel, plan, and every fallback version)."""
    gaps = [f for f in ("kernel", "plan", "plugin", "plugin_version", "device", "date") if not st.get(f)]
    gaps += [f"fallback {k}" for k in ("function", "torch", "cublas") if st["fallback"].get(k) in (None, "", "unknown", "not installed")]
    return gaps


class DryTimer:
    """``--dry-run`` only: made-up times from a bandwidth model (no GPU), to check this script's plumbing
    on a simulated device before GPU time is spent. Its numbers mean nothing."""

    def measure(self, op: str, m: int, n: int, k: int) -> sweep.Point:
        wbytes = n * k * (1 if OPS[op].scaled else 2)
        kernel, fallback = 2.0 + wbytes / 3.3e6, 4.0 + wbytes / (3.0e6 if not OPS[op].scaled else 0.6e6)
        return sweep.Point(m, n, k, [kernel] * 5, [fallback] * 5)


def measure(prof: Any, ops: list[str], names: list[str] | None, args: argparse.Namespace, tuned: Path,
            t0: float) -> tuple[dict[str, dict[str, Any]], list[Path], list[str]]:
    """Sweep each op with a kernel, writing its tuned file under ``tuned``; returns the sweep documents, the files, the ops skipped."""
    docs: dict[str, dict[str, Any]] = {}
    files: list[Path] = []
    skipped: list[str] = []
    for op in ops:
        if op not in prof.kernels:
            skipped.append(f"{op} (no kernel)")
            continue
        if time.monotonic() - t0 > args.max_seconds:
            skipped.append(f"{op} (past --max-seconds {args.max_seconds:.0f})")
            continue
        grid = sweep.default_grid(op, names)
        t = time.monotonic()
        print(f"== {op}: {len(grid)} shapes", flush=True)
        timer = DryTimer() if args.dry_run else sweep.GpuTimer(prof, reps=args.reps)
        doc = sweep.run(prof, op, grid, timer, progress=progress, box=sweep.box_grid(op))
        print(f"   {time.monotonic() - t:.1f} s")
        f = tuned / f"{op}.toml"
        sweep.write(doc, f)
        docs[op], files = doc, [*files, f]
    return docs, files, skipped


def check_applied(tuned_prof: Any, docs: dict[str, dict[str, Any]], after: dict[str, list[sweep.Regret]]) -> list[str]:
    """End to end: a profile that reads the tuned files takes the reported path at every measured shape, with complete stamps."""
    failures: list[str] = []
    for op, rows in after.items():
        gaps = stamp_gaps(docs[op]["stamp"])
        if gaps:
            failures.append(f"{op}: stamp incomplete ({', '.join(gaps)})")
        res = tuned_prof.explain(f"{op}.measured")
        if res.winner.kind != "tuned":
            failures.append(f"{op}: the tuned file is not applied ({res.chain[-1].stale or res.winner.source})")
        for row in rows:
            d = decide(op, tuned_prof, m=row.m, n=row.n, k=row.k)
            if d.path != row.path:
                failures.append(f"{op} {row.m}x{row.n}x{row.k}: dispatch takes {d.path} ({d.reason}), the report says {row.path}")
    return failures


def report_regret(before: dict[str, list[sweep.Regret]], after: dict[str, list[sweep.Regret]]) -> tuple[dict[str, Any], list[str]]:
    """Print each op's regret table (tuned against shipped) and check the targets; returns the JSON rows and the failures."""
    failures: list[str] = []
    all_rows: dict[str, Any] = {}
    for op, rows in after.items():
        old = {(r.m, r.n, r.k): r for r in before[op]}
        print(f"\n{op}: {len(rows)} shapes")
        print(table(
            [[*sweep.report_rows([r])[0], f"{old[(r.m, r.n, r.k)].path} {old[(r.m, r.n, r.k)].regret:.3f}"] for r in rows],
            [*sweep.REPORT_HEADER, "shipped: path regret"],
        ))
        g_after, g_before = sweep.geomean(r.regret for r in rows), sweep.geomean(r.regret for r in before[op])
        worst = max(rows, key=lambda r: r.regret)
        print(f"{op}: geomean regret {g_after:.4f} (shipped {g_before:.4f}), worst {worst.regret:.3f} at {worst.m}x{worst.n}x{worst.k}")
        failures += [f"{op} {r.m}x{r.n}x{r.k}: regret {r.regret:.3f} > {TARGET_WORST}" for r in rows if r.regret > TARGET_WORST]
        if g_after > TARGET_GEOMEAN:
            failures.append(f"{op}: geomean regret {g_after:.4f} > {TARGET_GEOMEAN}")
        all_rows[op] = [{**vars(r), "regret": r.regret, "shipped_path": old[(r.m, r.n, r.k)].path,
                         "shipped_regret": old[(r.m, r.n, r.k)].regret} for r in rows]
    return all_rows, failures


def check_fp8_vs_bf16(docs: dict[str, dict[str, Any]], after: dict[str, list[sweep.Regret]]) -> tuple[list[list[str]], list[str]]:
    """fp8_gemv never slower than bf16 gemv at the same (N, K): the time of the path each takes, beyond the noise."""
    failures: list[str] = []
    fp8_rows: list[list[str]] = []
    if "fp8_gemv" in after and "gemv" in after:
        noise = {op: {(m["n"], m["k"]): m["noise"] for m in docs[op]["measurements"]} for op in ("gemv", "fp8_gemv")}
        bf16 = {(r.n, r.k): r for r in after["gemv"] if r.m == 1}

        def taken(r: sweep.Regret) -> float:
            return r.kernel_us if r.path == "kernel" and r.kernel_us is not None else r.fallback_us

        for r in after["fp8_gemv"]:
            b = bf16.get((r.n, r.k))
            if b is None:
                continue
            ratio = taken(r) / taken(b)
            tol = 1 + max(noise["fp8_gemv"][(r.n, r.k)], noise["gemv"][(r.n, r.k)])
            fp8_rows.append([str(r.n), str(r.k), f"{taken(r):.2f}", f"{taken(b):.2f}", f"{ratio:.3f}", "ok" if ratio <= tol else "SLOWER"])
            if ratio > tol:
                why = f"{taken(r):.2f} us > bf16 gemv {taken(b):.2f} us (x{ratio:.3f}, noise {tol - 1:.3f})"
                failures.append(f"fp8_gemv 1x{r.n}x{r.k}: {why}")
        print(f"\nfp8_gemv vs bf16 gemv at the same shape ({len(fp8_rows)} shapes):")
        print(table(fp8_rows, ["N", "K", "fp8 us", "bf16 us", "fp8/bf16", ""]))
    return fp8_rows, failures


def check_fp8_fallback(after: dict[str, list[sweep.Regret]]) -> tuple[list[list[str]], list[str]]:
    """The FP8 fallback within 2x of the kernel at every catalog shape the kernel ran (issue 32: never an order of magnitude)."""
    failures: list[str] = []
    fp8_fb_rows: list[list[str]] = []
    for r in after.get("fp8_gemv", []):
        if r.kernel_us is None:
            continue
        ratio = r.fallback_us / r.kernel_us
        fp8_fb_rows.append([str(r.m), str(r.n), str(r.k), f"{r.kernel_us:.2f}", f"{r.fallback_us:.2f}", f"{ratio:.2f}",
                            "ok" if ratio <= TARGET_FP8_FALLBACK else "OVER"])
        if ratio > TARGET_FP8_FALLBACK:
            failures.append(f"fp8_gemv {r.m}x{r.n}x{r.k}: fallback {r.fallback_us:.2f} us = {ratio:.2f}x the kernel's "
                            f"{r.kernel_us:.2f} us > {TARGET_FP8_FALLBACK}x")
    if fp8_fb_rows:
        print(f"\nfp8_gemv fallback / kernel ({len(fp8_fb_rows)} shapes, target <= {TARGET_FP8_FALLBACK}x):")
        print(table(fp8_fb_rows, ["M", "N", "K", "kernel us", "fallback us", "fallback/kernel", ""]))
    return fp8_fb_rows, failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--ops", default=",".join(OPS), help="comma list of ops (default: every op of the op table)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--models", default=None, help="comma list of catalog models (default: all)")
    ap.add_argument("--max-seconds", type=float, default=360.0, help="do not start an op past this many seconds")
    ap.add_argument("--dry-run", action="store_true", help="made-up times on any device (a simulated one too): checks the plumbing only")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT", "out"))
    tuned = out / "tuned"
    tuned.mkdir(parents=True, exist_ok=True)
    ops = [o for o in args.ops.split(",") if o]
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        ap.error(f"unknown op(s) {', '.join(unknown)}; ops: {', '.join(OPS)}")
    names = None if args.models is None else args.models.split(",")

    hwprofile.reset()
    prof = hwprofile.profile(0)
    if (prof.device.simulated and not args.dry_run) or prof.plugin is None:
        print(f"needs a real GPU with its architecture plugin, got {prof.device.name} ({prof.device.sm}), plugin {prof.plugin}")
        return 2
    print(f"{prof.device.name} ({prof.device.sm}), plugin {prof.plugin.name} {prof.plugin.version}; reps {args.reps}")
    t0 = time.monotonic()
    docs, files, skipped = measure(prof, ops, names, args, tuned, t0)
    gpu_s = time.monotonic() - t0
    print(f"\nmeasured {sum(len(d['measurements']) for d in docs.values())} shapes in {gpu_s:.1f} s")

    failures: list[str] = [f"not measured: {s}" for s in skipped]
    before = {op: sweep.report(prof, {**doc, "thresholds": {}}) for op, doc in docs.items()}  # the shipped profile's paths
    after = {op: sweep.report(prof, doc) for op, doc in docs.items()}

    # end to end: a profile that reads the files takes the reported path at every measured shape
    os.environ[_env.TUNED_FILE.name] = os.pathsep.join(map(str, files))
    hwprofile.reset()
    tuned_prof = hwprofile.profile(0)
    failures += check_applied(tuned_prof, docs, after)

    all_rows, regret_failures = report_regret(before, after)
    failures += regret_failures
    every = [r.regret for rows in after.values() for r in rows]
    print(f"\nall ops: {len(every)} shapes, geomean regret {sweep.geomean(every):.4f} "
          f"(shipped {sweep.geomean(r.regret for rows in before.values() for r in rows):.4f})")

    fp8_rows, fp8_failures = check_fp8_vs_bf16(docs, after)
    failures += fp8_failures

    fp8_fb_rows, fallback_failures = check_fp8_fallback(after)
    failures += fallback_failures

    (out / "catalog.json").write_text(json.dumps({
        "device": prof.device.name, "gpu_seconds": gpu_s, "reps": args.reps, "stamps": {op: d["stamp"] for op, d in docs.items()},
        "rows": all_rows, "fp8_vs_bf16": fp8_rows, "fp8_fallback_vs_kernel": fp8_fb_rows, "failures": failures,
    }, indent=1))
    try:
        st = next(iter(docs.values()))["stamp"] if docs else {"device": prof.device.name, "date": ""}
        sweep.plot_regret(after, out / "catalog_regret.png", title=f"{st['device']}, {st['date']}: regret per catalog shape")
        print(f"wrote {out / 'catalog_regret.png'}")
    except ImportError:
        print("no plot: matplotlib is not installed")
    print(f"wrote {out / 'catalog.json'} and {len(files)} tuned file(s) under {tuned}")
    for failure in failures:
        print(f"FAIL {failure}")
    print(f"{'PASS' if not failures else 'FAIL'}: {len(failures)} failure(s); GPU phase {gpu_s:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
