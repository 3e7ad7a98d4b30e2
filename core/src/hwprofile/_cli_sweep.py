"""``hwprofile sweep`` and ``hwprofile tune``: measuring an op against its fallback, re-tuning a device (from cli.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from . import _env
from ._cli_common import _profile, _progress
from ._text import table
from .errors import DeviceError, HwprofileError


def _ints(text: str | None, flag: str) -> list[int] | None:
    """``"1..16"`` or ``"1,2,4"`` -> list of positive ints; anything else is an error naming ``flag``."""
    if not text:
        return None
    try:
        if ".." in text:
            a, b = text.split("..", 1)
            out = list(range(int(a), int(b) + 1))
        else:
            out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise HwprofileError(f"{flag} {text!r} is invalid: write a range (1..16) or a comma list (1,2,4) of positive integers") from None
    if not out or min(out) < 1:
        raise HwprofileError(f"{flag} {text!r} is invalid: it must name at least one size, each a positive integer")
    return out


def _check_tuned_output(out: Path) -> None:
    """The tuned file and its raw samples (``samples/<name>`` beside it): what :func:`hwprofile.sweep.write` will refuse."""
    from ._files import check_writable
    from .tuning import SAMPLES_DIR

    check_writable(out, what="tuned file")
    check_writable(out.parent / SAMPLES_DIR / out.name, what="sweep samples")


def _check_plot(plot: Path, output: Path | None) -> None:
    """``--plot``: matplotlib importable, a format it writes, a path hwprofile may write (before any measuring)."""
    from ._files import check_writable

    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise HwprofileError(
            f"--plot {plot} needs matplotlib, which cannot be imported here ({exc}); pip install matplotlib, or leave --plot out"
        ) from None
    if output is not None and os.path.abspath(plot) == os.path.abspath(output):
        raise HwprofileError(f"--plot {plot} is also the --output tuned file: the plot would replace it; choose another path")
    fmt = plot.suffix.lstrip(".").lower() or "png"
    formats = Figure().canvas.get_supported_filetypes()
    if fmt not in formats:
        raise HwprofileError(f"--plot {plot}: matplotlib cannot write .{fmt} files; use one of .{', .'.join(sorted(formats))}")
    check_writable(plot, what="plot")


def _check_torch_cuda() -> None:
    """A sweep times real kernels: torch must be installed with CUDA, and see a GPU."""
    try:
        import torch
    except ImportError:
        raise HwprofileError("sweep needs torch with CUDA, which is not installed here: install a CUDA build of torch") from None
    if not torch.cuda.is_available():
        raise HwprofileError("sweep needs a GPU that torch can use; torch.cuda.is_available() is False: check that torch is a CUDA build, "
                             "the NVIDIA driver, and CUDA_VISIBLE_DEVICES")


def cmd_sweep(args: argparse.Namespace) -> int:
    """Everything the user gave (grid, output paths, plot) is checked before the device is touched: a
    refused path or a missing matplotlib must not end minutes of GPU work."""
    from . import sweep, tuning
    from .tuning import SAMPLES_DIR, tuned_dir

    grid, box = _sweep_grid(args)  # before the device: a bad model file or name is an error on any machine
    if args.output is not None:
        _check_tuned_output(args.output)
    if args.plot is not None:
        _check_plot(args.plot, args.output)
    if args.regret_plot is not None:
        if not args.report:
            raise HwprofileError(f"--regret-plot {args.regret_plot} is written by --report: add --report, or leave --regret-plot out")
        _check_plot(args.regret_plot, args.output)
    try:
        prof = _profile(args)
    except DeviceError as exc:
        why = str(exc).split(". Simulate one", 1)[0]  # simulation cannot time kernels: leave that advice out
        raise HwprofileError(f"sweep times real kernels and needs a real NVIDIA GPU ({why}); run it on the GPU host") from None
    if prof.device.simulated:
        raise HwprofileError(
            f"sweep times real kernels: {prof.device.name} is simulated (unset {_env.DEVICE.name} / --simulate and run on the GPU)"
        )
    out = args.output
    if out is None:
        out = tuned_dir(prof.device, os.environ) / f"{args.op}.toml"  # no home: an error naming HWPROFILE_CONFIG_DIR
        _check_tuned_output(out)
    if args.report and args.regret_plot is None:  # the default regret plot beside the samples, checked before measuring
        _check_plot(out.parent / SAMPLES_DIR / f"{out.stem}-regret.png", out)
    _check_torch_cuda()
    if prof.plugin is None or args.op not in prof.kernels:
        raise HwprofileError(f"no installed plugin provides a {args.op} kernel for {prof.device.sm}: nothing to tune")
    doc = sweep.run(prof, args.op, grid, sweep.GpuTimer(prof, reps=args.reps), ties=args.ties, progress=_progress(True, 70), box=box)
    rows = [
        [
            str(r["m"]), str(r["n"]), str(r["k"]),
            f"{r['kernel_us']:.2f}", f"{r['fallback_us']:.2f}", f"{100 * r['noise']:.1f}%", r["verdict"],
        ]
        for r in doc["measurements"]
    ]
    print(table(rows, ["M", "N", "K", "kernel us", "fallback us", "noise", "faster"]))
    measured_key = tuning.measured_key(args.op)
    print("\n" + "\n".join(f"{k} = {v}" for k, v in doc["thresholds"].items() if k != measured_key))
    print(f"{measured_key}: one decision for each of the {len(doc['measurements'])} measured shapes (the cost model predicts elsewhere)")
    for note in doc["sweep"]["notes"]:
        print(f"note: {note}")
    samples = sweep.write(doc, out)
    if samples is not None:
        print(f"wrote {samples} (raw measurements)")
    fallback = doc["stamp"]["fallback"]
    print(f"wrote {out} (stamped against {fallback['function']}, torch {fallback['torch']}, cuBLAS {fallback['cublas']})")
    if args.plot:
        sweep.plot(doc, args.plot)
        print(f"wrote {args.plot}")
    if args.report:
        _sweep_report(prof, doc, args.regret_plot or out.parent / SAMPLES_DIR / f"{out.stem}-regret.png", args.models_file)
    return 0


def _sweep_grid(args: argparse.Namespace) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """(every shape to measure, the box edges the threshold rule is chosen from) for ``hwprofile sweep``.

    By default the served-model catalog's shapes plus the op table's grid (the box edges);
    ``--models``/``--models-file`` narrow or extend the catalog; ``--shapes``/``--m``/``--n``/``--k``
    replace the box edges, and then the catalog is measured only if ``--models``/``--models-file`` ask for it.
    """
    from . import sweep

    box = sweep.box_grid(args.op)
    explicit = False
    if args.shapes:
        explicit = True
        try:
            pairs = [tuple(int(x) for x in s.strip().lower().split("x")) for s in args.shapes.split(",")]
        except ValueError:
            pairs = []
        if not pairs or any(len(p) != 2 or min(p) < 1 for p in pairs):
            raise HwprofileError(f"--shapes {args.shapes!r} is invalid: write NxK pairs of positive integers, e.g. 4096x7168,2048x16384")
        box = [(1, n, k) for n, k in pairs]
    ms, ns, ks = _ints(args.m, "--m"), _ints(args.n, "--n"), _ints(args.k, "--k")
    if ms or ns or ks:
        explicit = True
        box = [
            (m, n, k)
            for m in (ms or sorted({g[0] for g in box}))
            for n in (ns or sorted({g[1] for g in box}))
            for k in (ks or sorted({g[2] for g in box}))
        ]
    names = None if args.models is None else [x for x in args.models.split(",") if x.strip()]
    if names is not None and not names and not args.models_file:
        raise HwprofileError("--models names no model; give NAME,NAME ('hwprofile devices' says where the catalog lists them)")
    asked = names is not None or bool(args.models_file)
    if explicit and names is None:
        names = []  # explicit shapes: the shipped catalog only if --models asks for it (a --models-file's models still count)
    catalog = sweep.model_grid(args.op, names, args.models_file) if names != [] or args.models_file else []
    if asked:
        if not catalog:
            raise HwprofileError(f"the chosen models give {args.op} no shape (a dense model has no router; FP8 needs fp8 = true)")
    return sorted({*catalog, *box}), box


def _sweep_report(prof: Any, doc: dict[str, Any], plot_path: Path, model_files: Any = ()) -> None:
    """``hwprofile sweep --report``: per measured shape both times, the path the result takes and its regret, the
    held-out (leave-one-model-out) regret of the cost model; a plot of both."""
    from . import sweep

    rows = sweep.report(prof, doc)
    print()
    print(table(sweep.report_rows(rows), sweep.REPORT_HEADER))
    worst = max(rows, key=lambda r: r.regret)
    print(
        f"\nregret (time of the path taken / time of the faster path): geomean {sweep.geomean(r.regret for r in rows):.4f}, "
        f"worst {worst.regret:.3f} at M={worst.m} N={worst.n} K={worst.k}"
    )
    held = sweep.cross_validate(doc, model_files)
    if held:
        from .costmodel import summary

        sm = summary(held)
        print(
            f"held out (leave one model out: the cost model fitted without each model's shapes, box edges always in): "
            f"{sm['shapes']} shapes, geomean {sm['geomean']:.4f}, worst {sm['worst']:.3f} ({sm['worst_at']}), "
            f"{sm['over']} over 1.05; models held out: {', '.join(map(str, sm['models']))}"  # type: ignore[call-overload]
        )
    try:
        reports: dict[str, Any] = {doc["stamp"]["op"]: rows}
        if held:
            reports[f"{doc['stamp']['op']} held out"] = held
        sweep.plot_regret(reports, plot_path, title=f"{doc['stamp']['device']}, {doc['stamp']['date']}")
    except ImportError:
        print("no regret plot: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return
    print(f"wrote {plot_path} (regret per shape)")


def _op_lines() -> Any:
    """A progress callback printing one line per op, with that op's points, when stderr is not a terminal (a bar
    otherwise: :func:`_progress`); a rank's share comes op by op (:func:`hwprofile.retune.split`)."""
    points: dict[str, int] = {}  # op -> points measured, in the order measured

    def progress(done: int, total: int, what: str) -> None:
        op = what.split(" ", 1)[0]
        last = next(reversed(points), "")
        if last and op != last:
            print(f"measured {last} ({points[last]} points on this rank)", file=sys.stderr, flush=True)
        points[op] = points.get(op, 0) + 1
        if done == total:
            print(f"measured {op} ({points[op]} points on this rank)", file=sys.stderr, flush=True)

    return progress


def _torchrun_job() -> tuple[Any, int] | None:
    """Under torchrun (``WORLD_SIZE`` > 1): the initialised torch.distributed module and this rank's device; else None."""
    if int(os.environ.get("WORLD_SIZE", "1") or "1") <= 1 or "MASTER_ADDR" not in os.environ:
        return None
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise HwprofileError("tune under torchrun needs torch with torch.distributed") from None
    local = int(os.environ.get("LOCAL_RANK", "0") or "0")
    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(local)
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist, local


def cmd_tune(args: argparse.Namespace) -> int:
    from . import retune
    from .profiles import detect, profile

    job = None if args.dry_run else _torchrun_job()
    try:
        if job is not None:
            indices = [args.device if args.device is not None else job[1]]
        elif args.device is not None:
            indices = [args.device]
        else:
            det = detect()
            if not det.devices:
                raise HwprofileError(f"tune needs a device: {det.reason}")
            indices = [d.index for d in det.devices]
        ops = args.ops.split(",") if args.ops else None
        plans = []
        for index in indices:
            prof = profile(index)
            p = retune.plan(prof, everything=args.all, ops=ops)
            plans.append(p)
            if args.dry_run:
                continue
            if p.grids:
                why = retune.cannot_measure(prof)
                if why:
                    raise HwprofileError(
                        f"tune measures real kernels: {why}. Run it on the GPU host; 'hwprofile tune --dry-run' lists what it would measure"
                    )
            progress = _progress(True, 70) or _op_lines()
            result = retune.tune(index, everything=args.all, ops=ops, reps=args.reps, ties=args.ties, progress=progress)
            print(result.describe())
            for path in result.written:
                print(f"wrote {path}")
            for f in p.findings:
                for note in f.leftovers:
                    print(f"note: {note}")
        if args.dry_run:
            if args.json:
                print(json.dumps({"devices": [p.as_dict(args.reps) for p in plans]}, indent=2))
                return 0
            for p in plans:
                rows = [[f.op, f.status, str(len(p.grids.get(f.op, ()))), "; ".join(f.reasons + f.leftovers) or "-"] for f in p.findings]
                print(f"device {p.index}: {p.device}")
                print(table(rows, ["op", "status", "points", "why"]))
                n = len(p.points())
                print(f"would measure {n} point(s), about {p.estimate_s(args.reps):.0f} s of GPU time\n" if n else "nothing to measure\n")
        return 0
    finally:
        if job is not None:
            job[0].destroy_process_group()
