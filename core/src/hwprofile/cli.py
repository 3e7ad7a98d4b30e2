"""``hwprofile`` command line: show | plugins | devices | explain | env | doctor | compile | cache | sweep | tune | new-plugin.

Library code logs; this module prints. A user error prints one line and exits 2, no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import _env
from ._text import table
from .errors import DeviceError, HwprofileError, ToolchainError
from .optable import OPS


def _fmt(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (bool, str)) or v is None else str(v)


def _sm(d: Any) -> str:
    return f"{d.sm}, simulated" if d.simulated else d.sm


def _progress(enabled: bool, width: int) -> Any:
    """A progress callback drawing a bar on stderr, or ``None`` when stderr is not a terminal."""
    if not enabled or not sys.stderr.isatty():
        return None

    def progress(done: int, total: int, what: str) -> None:
        bar = "#" * (20 * done // total)
        print(f"\r[{bar:<20}] {done}/{total} {what}".ljust(width), end="\n" if done == total else "", file=sys.stderr, flush=True)

    return progress


def _profile(args: argparse.Namespace) -> Any:
    from .profiles import profile

    return profile(args.device)


#: Version of ``hwprofile show --json``'s layout (its ``format`` key); keys are only ever added under one number.
SHOW_FORMAT = 1
#: What a profile's fingerprint is, for the reader of ``show`` (and its test).
FINGERPRINT_NOTE = "hash of plugin, target, settings, env defaults and kernel sources: equal fingerprints dispatch alike"


def show_document(prof: Any) -> dict[str, Any]:
    """``hwprofile show --json``: the format and core version, then :meth:`Profile.as_dict`.

    ``stats`` are the dispatch counters of the process that prints them: ``{}`` from the ``hwprofile``
    program (no op ran there), real counts when an engine calls ``main(["show", "--json"])`` itself.
    """
    from . import __version__

    return {"format": SHOW_FORMAT, "hwprofile": __version__, **prof.as_dict()}


def cmd_show(args: argparse.Namespace) -> int:
    prof = _profile(args)
    if args.json:
        print(json.dumps(show_document(prof), indent=2, default=str))
        return 0
    from .device import with_details

    d, p = with_details(prof.device), prof.plugin
    cc = d.compute_capability
    print(f"device {d.index}: {d.name}  (compute capability {cc[0]}.{cc[1]}, {d.sm}{', simulated' if d.simulated else ''})")
    if d.memory_bytes:
        facts = [f"memory {d.memory_bytes / 2**30:.1f} GiB"]
        facts += [f"bus {d.memory_bus_width_bits} bit"] if d.memory_bus_width_bits else []
        facts += [f"max clocks {d.max_sm_clock_mhz}/{d.max_memory_clock_mhz} MHz"] if d.max_sm_clock_mhz else []
        facts += [f"driver {d.driver_version}"] if d.driver_version else []
        facts += [f"PCI {d.pci_bus_id}"] if d.pci_bus_id else []
        print("  " + ", ".join(facts))
    print(f"plugin: {p.label if p else 'none'}  target: {prof.target or '-'}")
    print(f"  why: {prof.selection.reason}")
    print(f"fingerprint: {prof.fingerprint}  ({FINGERPRINT_NOTE})\n")
    def note(s: Any) -> str:
        # short: `hwprofile explain KEY` has the detail
        notes = [] if s.setting.bit_identical else ["not bit-identical"]
        notes += ["STALE (see explain)"] if s.winner.stale else []
        notes += [f"stale {x.kind} value ignored" for x in s.chain if not x.applied]
        return "; ".join(notes)

    rows = [[k, _fmt(s.value), s.winner.source, note(s)] for k, s in prof.settings.items()]
    print(table(rows, ["setting", "value", "source", "note"]))
    if prof.env_defaults:
        print()
        rows = [
            [n, d.value, "user set: " + repr(os.environ[n]) if n in os.environ else "default", d.source]
            for n, d in prof.env_defaults.items()
        ]
        print(table(rows, ["env default", "value", "state", "from"]))
    if prof.kernels:
        print()
        rows = [[op, s.plugin, s.source, str(len(s.instances))] for op, s in prof.kernels.items()]
        print(table(rows, ["kernel", "plugin", "source", "instances"]))
    if prof.stats.counts:  # only when an engine calls main(["show"]) in its own process
        print()
        rows = [[op, str(c["kernel"]), str(c["fallback"])] for op, c in prof.stats.as_dict().items()]
        print(table(rows, ["op", "kernel calls", "fallback calls"]))
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from ._entrypoints import natural_key
    from .profiles import detect, registry

    reg = registry()
    det = detect()
    out = []
    for p in sorted(reg.plugins.values(), key=lambda p: natural_key(p.name)):
        sel = []
        for d in det.devices:
            try:
                if reg.select(d).plugin == p:
                    sel.append(d.index)
            except HwprofileError:
                pass
        secs = reg.import_seconds.get(p.name)
        out.append({**p.as_dict(), "selected_for_devices": sel, "import_ms": round(1e3 * secs, 2) if secs is not None else None})
    if args.json:
        print(json.dumps({"plugins": out, "disabled": reg.disabled, "devices": [d.as_dict() for d in det.devices]}, indent=2))
        return 0
    rows = []
    for o in out:
        claims = ", ".join(f"{c}->{t}" for c, t in o["targets"].items()) or "(downstream: every profile)"
        ms = f"{o['import_ms']:.1f}" if o["import_ms"] is not None else "-"
        rows.append([o["name"], f"{o['distribution']} {o['version']}", claims, ",".join(map(str, o["selected_for_devices"])) or "-", ms])
    if rows:
        print(table(rows, ["plugin", "distribution", "claims", "selected for device", "import ms"]))
    else:
        print("no hwprofile plugins installed")
    if reg.disabled:
        print(f"disabled by {_env.DISABLE_PLUGINS.name}: {', '.join(reg.disabled)}")
    for d in det.devices:
        try:
            s = reg.select(d)
            print(f"device {d.index} {d.name} ({_sm(d)}): {s.reason}")
        except HwprofileError as exc:
            print(f"device {d.index} {d.name} ({_sm(d)}): error: {exc}")
    if not det.devices:
        print(f"no device: {det.reason}")
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    """The devices this process sees, then every device that can be simulated (built in, from plugins)."""
    from . import catalog
    from .profiles import detect, registry

    det = detect()
    extra: dict[str, Any] = {}
    extra_error = None
    try:
        extra = registry().catalog_entries()
    except HwprofileError as exc:  # a broken plugin must not hide the built-in list
        extra_error = str(exc)
    sims = [(k, e, "hwprofile") for k, e in catalog.CATALOG.items()] + [(k, e, "plugin") for k, e in extra.items()]
    if args.json:
        out = {
            "visible": [d.as_dict() for d in det.devices],
            "visible_reason": det.reason,
            "simulatable": [
                {"name": k, "device": e.name, "compute_capability": list(e.compute_capability), "memory_bytes": e.memory_bytes,
                 "sm_count": e.sm_count, "from": src}
                for k, e, src in sims
            ],
            "generic": "any capability as sm_XY or X.Y (e.g. sm_110, 11.0)",
            "plugin_error": extra_error,
        }
        print(json.dumps(out, indent=2))
        return 0
    if det.devices:
        for d in det.devices:
            print(f"device {d.index}: {d.name} ({_sm(d)})")
    else:
        print(f"no visible device: {det.reason}")
    print()
    rows = [[k, e.name, f"{e.compute_capability[0]}.{e.compute_capability[1]}", f"{e.memory_bytes / 2**30:.0f} GiB", str(e.sm_count), src]
            for k, e, src in sims]
    print(table(rows, ["simulate with", "device", "capability", "memory", "SMs", "from"]))
    print("\nalso any capability as sm_XY or X.Y (e.g. --simulate sm_110); a comma list simulates several GPUs")
    if extra_error:
        print(f"plugin catalog entries unavailable: {extra_error}", file=sys.stderr)
    return 0


def version_text() -> str:
    """``hwprofile --version``: core, then every plugin, from package metadata (no plugin is imported)."""
    from . import __version__
    from ._entrypoints import find_entry_points, natural_key
    from .registry import ENTRY_POINT_GROUP

    lines = [f"hwprofile {__version__} (Python {sys.version.split()[0]})"]
    for ep in sorted(find_entry_points(ENTRY_POINT_GROUP), key=lambda e: natural_key(e.name)):
        lines.append(f"  plugin {ep.name}: {ep.distribution or '?'} {ep.version or '?'}")
    return "\n".join(lines)


class _VersionAction(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=dest, nargs=0, default=argparse.SUPPRESS, help="print hwprofile's and every plugin's version")

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None
    ) -> None:
        print(version_text())
        parser.exit()


def cmd_explain(args: argparse.Namespace) -> int:
    if args.list and args.key is not None:
        raise HwprofileError(f"explain takes a KEY or --list, not both (got {args.key!r} and --list)")
    prof = _profile(args)
    if args.list or args.key is None:
        if args.json:
            print(json.dumps({k: {"value": s.value, "source": s.winner.source, "doc": s.setting.doc, "env_var": s.setting.env_var}
                              for k, s in prof.settings.items()}, indent=2, default=str))
            return 0
        rows = [[k, _fmt(s.value), s.setting.env_var, s.setting.doc] for k, s in prof.settings.items()]
        print(table(rows, ["setting", "value", "override with", "what it does"]))
        if not args.list:
            print("\nhwprofile explain KEY shows where a value comes from")
        return 0
    r = prof.explain(args.key)
    if args.json:
        from . import tuning

        doc = r.as_dict()
        for layer, out in zip(r.chain, doc["chain"], strict=True):
            if isinstance(layer.stamp, tuning.Stamp):  # what differs now, by kind (stale / note / cannot tell)
                c = tuning.assess(prof, layer.stamp)
                out["comparison"] = {"stale": list(c.stale), "notes": list(c.notes), "unknown": list(c.unknown)}
        print(json.dumps(doc, indent=2, default=str))
        return 0
    s = r.setting
    print(f"{s.key} = {_fmt(r.value)}   (from {r.winner.source})")
    print(f"  {s.doc}")
    identical = "bit-identical" if s.bit_identical else "NOT bit-identical"
    print(f"  type {s.type}, allowed {s.allowed()}; override with {s.env_var}; {identical}")
    print("  layers, lowest first:")
    for layer in r.chain:
        mark = "->" if layer is r.winner else ("xx" if not layer.applied else "  ")
        why = f"  ({layer.reason})" if layer.reason else ""
        print(f"   {mark} {layer.kind:<10} {_fmt(layer.value):<8} {layer.source}{why}")
        if layer.stamp is not None:
            from . import tuning

            st = layer.stamp
            fb = ", ".join(f"{k} {v}" for k, v in st.fallback.items())
            print(
                f"        measured {st.date or '?'} on {st.device} with {st.plugin} {st.plugin_version}, "
                f"kernel {st.kernel[:12]}{f', plan {st.plan[:12]}' if st.plan else ''}, against {fb}"
            )
            c = tuning.assess(prof, st) if isinstance(st, tuning.Stamp) else tuning.Comparison()
            for what in c.stale:
                print(f"        STALE{' (ignored)' if not layer.applied else ''}: {what}")
            for what in c.notes:
                print(f"        note: {what}")
            for what in c.unknown:
                print(f"        {what}")
            if c.stale:
                print(f"        re-measure with: hwprofile sweep {st.op}")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    prof = _profile(args)
    pending = prof.pending_env()
    if args.json:
        print(json.dumps({n: d.as_dict() for n, d in pending.items()}, indent=2))
    elif args.export:
        import shlex

        for n, d in pending.items():
            print(f"export {n}={shlex.quote(d.value)}")
    else:
        for n, d in pending.items():
            print(f"{n}={d.value}    # {d.reason} [{d.source}]{'' if d.bit_identical else ' (not bit-identical)'}")
        skipped = sorted(set(prof.env_defaults) - set(pending))
        if skipped:
            print(f"# already set by you, left alone: {', '.join(skipped)}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import collect, render

    report = collect()
    print(json.dumps(report.as_dict(), indent=2) if args.json else render(report))
    return 1 if report.failed else 0


def _check_compile_environment(reg: Any) -> None:
    """What ``profile()`` checks of the environment, for ``compile`` (which builds no profile).

    Invalid control values (``HWPROFILE_CACHE``, ``HWPROFILE_STRICT``, ...) are one error here, not one per
    kernel instance; unknown ``HWPROFILE_*`` names warn once, against every installed plugin's settings.
    """
    from .settings import CORE_SETTINGS, SettingsResolver, check_environment

    resolver = SettingsResolver()
    resolver.declare(CORE_SETTINGS, by="hwprofile core")
    for p in reg.plugins.values():
        decl = reg._call_plugin("hwprofile_declare_settings", p)
        if decl is not None:
            resolver.declare(decl, by=p.label, namespace=p.name)
    check_environment(os.environ, (s.env_var for s in resolver.declared.values()))  # every control variable (_env.VARS)
    resolver.add_user_env(os.environ)  # a bad value of any setting's variable (HWPROFILE_ROUTER_GEMM_MAX_TOKENS=x) is an error


#: ``hwprofile compile``'s table, explained under it (the columns a reader cannot guess).
COMPILE_LEGEND = (
    "instances: compiled = NVRTC ran now; cached = read from the kernel cache; N shared with OP = the same\n"
    "  instances as OP's (one cache entry, compiled once). per inst. = time / (compiled + cached); cubins = size\n"
    "  of the kernel's cubins; max regs = registers per thread; spill B = bytes spilled to local memory (0 expected)"
)


def _share_instances(work: list[tuple[Any, str]], kernels: Any) -> tuple[list[tuple[Any, str]], list[dict[str, int]]]:
    """Give each cache entry to one (spec, target): ops may share instances (same source, options and
    name expression: one key). The first spec compiles it; the others list it as shared (instance ->
    index of the owner in ``work``), so a first compile never calls a freshly built entry "cached"."""
    owners: dict[str, int] = {}
    deduped: list[tuple[Any, str]] = []
    shared: list[dict[str, int]] = []
    for i, (spec, target) in enumerate(work):
        own: list[str] = []
        theirs: dict[str, int] = {}
        for expr in spec.instances:
            try:
                key = kernels.cache_key(spec, target, (expr,))
            except Exception:  # noqa: BLE001 - compiling it reports the fault, in its row
                own.append(expr)
                continue
            if key in owners:
                theirs[expr] = owners[key]
            else:
                owners[key] = i
                own.append(expr)
        deduped.append((spec.replace(instances=tuple(own)), target))
        shared.append(theirs)
    return deduped, shared


def _add_shared(r: Any, spec: Any, theirs: dict[str, int], reports: list[Any], kernels: Any) -> None:
    """Count ``theirs`` (instance -> index of the report that compiled it) into ``r``: the memoised
    entry gives its cubin and registers; an owner's failure is this instance's too."""
    for expr, i in theirs.items():
        owner, op = reports[i], reports[i].spec.op
        failed = [e for e in owner.errors if e.startswith(f"{expr}: ")]
        if failed:
            r.errors.append(f"{expr}: shared with {op}, which failed to build it (above)")
            continue
        try:
            c = kernels.compile_spec(spec, r.target, (expr,))  # built this run: the in-process memo answers
        except Exception as exc:  # noqa: BLE001 - reported in the row
            r.errors.append(f"{expr}: {exc}")
            continue
        r.cubin_bytes += len(c.cubin)
        if c.registers is not None:
            r.registers = max(r.registers or 0, c.registers)
        r.spill_bytes = max(r.spill_bytes, c.spill_bytes or 0)


def _owners(theirs: dict[str, int], work: list[tuple[Any, str]]) -> list[str]:
    return list(dict.fromkeys(work[i][0].op for i in sorted(set(theirs.values()))))


def cmd_compile(args: argparse.Namespace) -> int:
    from . import kernels
    from ._entrypoints import natural_key
    from .device import DeviceInfo
    from .profiles import registry

    reg = registry()
    wanted = None if args.arch in (None, "all") else {a.strip() for a in args.arch.split(",") if a.strip()}
    if wanted is not None and not wanted:
        raise HwprofileError(f"--arch {args.arch!r} names no target; give targets like sm_90a,sm_100a, or 'all'")
    work = []
    for p in sorted(reg.arch_plugins, key=lambda p: natural_key(p.name)):
        assert p.arch is not None
        for cc, target in p.arch.targets.items():
            if wanted is not None and target not in wanted:
                continue
            dev = DeviceInfo(0, f"compile-only {target}", cc, simulated=True)
            specs = reg._call_plugin("hwprofile_kernels", p, device=dev, target=target) or []
            for spec in specs:
                work.append((spec.replace(plugin=p.name, distribution_version=f"{p.distribution} {p.version}"), target))
    if wanted:
        known = {t for p in reg.arch_plugins if p.arch for t in p.arch.targets.values()}
        missing = wanted - known
        if missing:
            raise HwprofileError(
                f"no installed plugin targets {', '.join(sorted(missing, key=natural_key))}; "
                f"installed targets: {', '.join(sorted(known, key=natural_key))}"
            )
    if not work:
        print("nothing to compile: no architecture plugin is installed")
        return 0
    _check_compile_environment(reg)  # the control variables and typos profile() would check, once
    try:  # once, before any kernel: a missing NVRTC is one line, not one error per kernel instance
        kernels.check_toolchain()
    except ToolchainError as exc:
        raise HwprofileError(f"cannot compile: {exc}") from None
    t0 = time.perf_counter()
    deduped, shared = _share_instances(work, kernels)
    reports = kernels.compile_all(deduped, args.jobs, _progress(not args.json, 60))
    for r, (spec, _target), theirs in zip(reports, work, shared, strict=True):
        _add_shared(r, spec, theirs, reports, kernels)
    failed = [r for r in reports if r.errors]
    if args.json:
        out = [
            {"op": spec.op, "plugin": spec.plugin, "target": r.target, "instances": len(spec.instances), "compiled": r.compiled,
             "cached": r.cached, "shared": len(theirs), "shared_with": _owners(theirs, work), "seconds": round(r.seconds, 3),
             "cubin_bytes": r.cubin_bytes, "registers": r.registers, "spill_bytes": r.spill_bytes, "errors": r.errors}
            for r, (spec, _target), theirs in zip(reports, work, shared, strict=True)
        ]
        print(json.dumps(out, indent=2))
    else:
        rows = []
        for r, (spec, _target), theirs in zip(reports, work, shared, strict=True):
            if r.errors:
                state = "FAILED"
            else:
                parts = [f"compiled {r.compiled}"] if r.compiled else []
                parts += [f"cached {r.cached}"] if r.cached else []
                parts += [f"{len(theirs)} shared with {', '.join(_owners(theirs, work))}"] if theirs else []
                state = ", ".join(parts) or "none"
            n = r.compiled + r.cached
            rows.append([
                spec.op, spec.plugin, r.target, state, f"{r.seconds:.2f}s", f"{r.seconds / n:.2f}s" if n else "-",
                f"{r.cubin_bytes // 1024} KiB", str(r.registers or "?"), str(r.spill_bytes),
            ])
        print(table(rows, ["kernel", "plugin", "target", "instances", "time", "per inst.", "cubins", "max regs", "spill B"]))
        print(COMPILE_LEGEND)
        print(f"{len(reports) - len(failed)}/{len(reports)} kernels ready in {time.perf_counter() - t0:.1f}s wall (jobs={args.jobs})")
        for r in failed:
            print(f"\n{r.spec.op} for {r.target}:\n" + "\n".join(r.errors), file=sys.stderr)
    return 1 if failed else 0


def cmd_cache(args: argparse.Namespace) -> int:
    import stat

    from .kernels import cache as kcache

    if args.action == "clear":
        report = kcache.clear()
        print(f"removed {report.removed} entries from {report.path}")
        for note in report.skipped:
            print(f"  left alone: {note}")
        return 0
    enabled = kcache.cache_enabled()
    opened = kcache.open_dir(create=False)
    n = size = 0
    d = kcache.cache_dir()
    if opened is not None:
        dfd, d = opened
        try:
            for name in os.listdir(dfd):
                if name.endswith(".cubin"):
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        n, size = n + 1, size + st.st_size
        finally:
            os.close(dfd)
    print(f"cache: {d} ({'enabled' if enabled else f'disabled by {_env.CACHE.name}=off'})")
    print(f"entries: {n}, {size / 1024:.0f} KiB")
    return 0


def _ints(text: str | None) -> list[int] | None:
    """``"1..16"`` or ``"1,2,4"`` -> list of ints."""
    if not text:
        return None
    if ".." in text:
        a, b = text.split("..", 1)
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in text.split(",") if x.strip()]


def cmd_sweep(args: argparse.Namespace) -> int:

    from . import sweep
    from .tuning import tuned_dir

    try:
        prof = _profile(args)
    except DeviceError as exc:
        why = str(exc).split(". Simulate one", 1)[0]  # simulation cannot time kernels: leave that advice out
        raise HwprofileError(f"sweep times real kernels and needs a real NVIDIA GPU ({why}); run it on the GPU host") from None
    if prof.device.simulated:
        raise HwprofileError(
            f"sweep times real kernels: {prof.device.name} is simulated (unset {_env.DEVICE.name} / --simulate and run on the GPU)"
        )
    try:
        import torch
    except ImportError:
        raise HwprofileError("sweep needs torch with CUDA") from None
    if not torch.cuda.is_available():
        raise HwprofileError("sweep needs a GPU that torch can use; torch.cuda.is_available() is False")
    if prof.plugin is None or args.op not in prof.kernels:
        raise HwprofileError(f"no installed plugin provides a {args.op} kernel for {prof.device.sm}: nothing to tune")
    grid = sweep.default_grid(args.op)
    if args.shapes:
        grid = [(1, int(n), int(k)) for n, k in (s.lower().split("x") for s in args.shapes.split(","))]
    ms, ns, ks = _ints(args.m), _ints(args.n), _ints(args.k)
    if ms or ns or ks:
        grid = [
            (m, n, k)
            for m in (ms or sorted({g[0] for g in grid}))
            for n in (ns or sorted({g[1] for g in grid}))
            for k in (ks or sorted({g[2] for g in grid}))
        ]

    doc = sweep.run(prof, args.op, grid, sweep.GpuTimer(prof, reps=args.reps), ties=args.ties, progress=_progress(True, 70))
    rows = [
        [
            str(r["m"]), str(r["n"]), str(r["k"]),
            f"{r['kernel_us']:.2f}", f"{r['fallback_us']:.2f}", f"{100 * r['noise']:.1f}%", r["verdict"],
        ]
        for r in doc["measurements"]
    ]
    print(table(rows, ["M", "N", "K", "kernel us", "fallback us", "noise", "faster"]))
    print("\nthresholds: " + ", ".join(f"{k} = {v}" for k, v in doc["thresholds"].items()))
    for note in doc["sweep"]["notes"]:
        print(f"note: {note}")
    out = args.output or tuned_dir(prof.device, os.environ) / f"{args.op}.toml"
    samples = sweep.write(doc, out)
    if samples is not None:
        print(f"wrote {samples} (raw measurements)")
    fallback = doc["stamp"]["fallback"]
    print(f"wrote {out} (stamped against {fallback['function']}, torch {fallback['torch']}, cuBLAS {fallback['cublas']})")
    if args.plot:
        sweep.plot(doc, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _op_lines() -> Any:
    """A progress callback printing one line per op when stderr is not a terminal (a bar otherwise: :func:`_progress`)."""
    state = {"op": "", "done": 0}

    def progress(done: int, total: int, what: str) -> None:
        op = what.split(" ", 1)[0]
        if state["op"] and op != state["op"]:
            print(f"measured {state['op']}", file=sys.stderr, flush=True)
        state["op"] = op
        if done == total:
            print(f"measured {op} ({total} points on this rank)", file=sys.stderr, flush=True)

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


def cmd_new_plugin(args: argparse.Namespace) -> int:
    from . import scaffold

    directory = args.dir or Path(f"hwprofile-{args.name}")
    written = scaffold.write(directory, args.name, args.capability, args.target)
    for p in written:
        print(f"wrote {p}")
    target = args.target or "sm_" + args.capability.replace(".", "")
    print(scaffold.hint(directory, target))
    return 0


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


def _device_name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a device name ('hwprofile devices' lists them), got an empty string")
    return text


def build_parser() -> argparse.ArgumentParser:
    # Each subcommand takes only the flags it honours.
    device = argparse.ArgumentParser(add_help=False)
    device.add_argument("--device", type=int, default=None, help="CUDA device index (default: current)")
    simulate = argparse.ArgumentParser(add_help=False)
    simulate.add_argument(
        "--simulate", metavar="NAME", type=_device_name,
        help=f"simulate a GPU (sets {_env.DEVICE.name}): a name from 'hwprofile devices', sm_XY / X.Y, or a comma list",
    )
    js = argparse.ArgumentParser(add_help=False)
    js.add_argument("--json", action="store_true", help="machine-readable output")
    p = argparse.ArgumentParser(prog="hwprofile", description="Per-architecture GPU profiles for inference engines.")
    p.add_argument("--version", action=_VersionAction)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "show", parents=[device, simulate, js], help="device, selected plugin, settings, env defaults, kernels"
    ).set_defaults(fn=cmd_show)
    sub.add_parser("plugins", parents=[simulate, js], help="installed plugins and what they claim").set_defaults(fn=cmd_plugins)
    sub.add_parser(
        "devices", parents=[simulate, js], help="visible devices and every device that can be simulated"
    ).set_defaults(fn=cmd_devices)
    s = sub.add_parser("explain", parents=[device, simulate, js], help="the whole provenance chain of one setting (--list: every key)")
    s.add_argument("key", nargs="?", help="setting key, e.g. router_gemm.max_tokens")
    s.add_argument("--list", action="store_true", help="list every setting key with its value and override variable")
    s.set_defaults(fn=cmd_explain)
    s = sub.add_parser("env", parents=[device, simulate], help="env defaults that would be applied (never ones you set)")
    fmt = s.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="machine-readable output")
    fmt.add_argument("--export", action="store_true", help="print 'export NAME=value' lines for eval")
    s.set_defaults(fn=cmd_env)
    sub.add_parser(
        "doctor", parents=[js],
        help="bug-report data: versions, environment, env defaults, paths, devices with plugin and fingerprint, checks",
    ).set_defaults(fn=cmd_doctor)
    s = sub.add_parser(
        "compile", parents=[js], help="compile every plugin kernel for its targets (no GPU needed)",
        description="Compile every kernel instance of the installed architecture plugins into the kernel cache, for every "
        "target they serve unless --arch names some. Needs NVRTC and the CUDA headers, no GPU.",
    )
    s.add_argument(
        "--arch", default="all",
        help="comma list of targets (e.g. sm_90a,sm_100a,sm_103a,sm_120a,sm_121a; 'hwprofile plugins' lists them) "
        "or 'all' (default: all, every target of every installed architecture plugin)",
    )
    s.add_argument("--jobs", type=_positive_int, default=os.cpu_count() or 1, help="parallel NVRTC compiles (default: CPU count)")
    s.set_defaults(fn=cmd_compile)
    s = sub.add_parser("sweep", parents=[device], help="time a kernel against its fallback and write tuned thresholds (needs the GPU)")
    s.add_argument("op", choices=list(OPS))
    s.add_argument("--m", help="tokens: 1..16 or 1,2,4 (router_gemm, linear_bf16_fp32)")
    s.add_argument("--n", help="output features: 256,384 or a range")
    s.add_argument("--k", help="input features")
    s.add_argument("--shapes", help="GEMV shapes as NxK,NxK (M = 1)")
    s.add_argument("--reps", type=int, default=15, help="timed graph replays per point (median)")
    s.add_argument("--ties", choices=["fallback", "kernel"], default="fallback", help="who gets a tie within the noise")
    s.add_argument("--output", type=Path, help="tuned file to write (default: this device's tuned directory)")
    s.add_argument("--plot", type=Path, help="PNG of latency against M or N with the threshold marked")
    s.set_defaults(fn=cmd_sweep)
    s = sub.add_parser(
        "tune", parents=[device, simulate, js],
        help="re-measure only the thresholds whose stamps went stale (or were never measured here) and write them (needs the GPU)",
        description="For each device (or --device N; under torchrun, each rank's own, the ranks splitting the points), find the "
        "ops whose measured values are stale (another fallback function, kernel, launch plan or device generation) or were "
        "never measured on this SKU, re-measure only those as 'hwprofile sweep' does, and write stamped tuned files into the "
        "device's tuned directory. --dry-run works everywhere, simulated devices included.",
    )
    s.add_argument("--dry-run", action="store_true", help="list what would be measured and an estimate of the GPU time; measure nothing")
    s.add_argument("--all", action="store_true", help="re-measure every op that has a kernel, stale or not")
    s.add_argument("--ops", help="only these ops (comma list)")
    s.add_argument("--reps", type=_positive_int, default=15, help="timed graph replays per point (median)")
    s.add_argument("--ties", choices=["fallback", "kernel"], default="fallback", help="who gets a tie within the noise")
    s.set_defaults(fn=cmd_tune)
    s = sub.add_parser("new-plugin", help="scaffold an architecture plugin package")
    s.add_argument("name", help="plugin name, e.g. sm89 (distribution hwprofile-<name>)")
    s.add_argument("--capability", required=True, help="exact compute capability served, e.g. 8.9")
    s.add_argument("--target", help="NVRTC target (default sm_<major><minor>)")
    s.add_argument("--dir", type=Path, help="where to write it (default ./hwprofile-<name>)")
    s.set_defaults(fn=cmd_new_plugin)
    s = sub.add_parser("cache", help="show or clear the kernel cache")
    s.add_argument("action", choices=["info", "clear"], nargs="?", default="info")
    s.set_defaults(fn=cmd_cache)
    return p


def main(argv: Sequence[str] | None = None, *, program: bool = False) -> int:
    """Run one command. Bad input or a broken environment ends in one line on stderr and a non-zero exit:
    2 for a hwprofile error (bad name, plugin, setting, kernel), 1 for the system refusing (full disk,
    unwritable path), 3 for anything unexpected (a bug: ``HWPROFILE_TRACEBACK=1`` shows where).

    An engine may call it in its own process: ``show`` then reports the process's own profile, its
    dispatch counters (``stats``) included. ``--simulate`` holds for this call only: the caller's
    ``HWPROFILE_DEVICE`` is restored after it and its profiles are resolved afresh on the next
    ``profile()`` (counters start over), unless ``--simulate`` names what ``HWPROFILE_DEVICE`` already
    says, which changes nothing. Only the ``hwprofile`` program itself (``program=True``,
    :func:`console`) points a failed stdout at /dev/null.
    """
    simulate = None
    simulate_var = _env.DEVICE.name
    before = os.environ.get(simulate_var)  # the caller's raw value, restored below
    try:
        args = build_parser().parse_args(argv)  # --version prints here: a closed pipe is handled below too
        simulate = getattr(args, "simulate", None)
        if simulate == before:
            simulate = None  # the process's own device already: keep its profiles and their counters
        if simulate:
            os.environ[simulate_var] = simulate
            from .profiles import reset

            reset()
        code = int(args.fn(args))
        sys.stdout.flush()  # a full disk or a closed pipe shows up here, not at exit
        return code
    except BrokenPipeError:  # `hwprofile show | head`: the reader left; that is not an error
        if program:
            _silence_stdout()
        return 0
    except HwprofileError as exc:
        return _fail(f"error: {exc}", 2)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        if exc.filename is None and program:
            _silence_stdout()  # most likely stdout itself failed (a full disk): do not fail again at exit
        return _fail(f"error: {exc.strerror or exc}{where}; check the path, its permissions and free space", 1)
    except KeyboardInterrupt:
        if not program:
            raise  # an engine calling main() in its own process keeps its Ctrl-C
        return _fail("interrupted", 130)
    except Exception as exc:
        if _env.TRACEBACK.read():
            raise
        return _fail(f"internal error: {type(exc).__name__}: {exc}. This is a bug; rerun with {_env.TRACEBACK.name}=1 to see where", 3)
    finally:
        if simulate:
            if before is None:
                os.environ.pop(simulate_var, None)
            else:
                os.environ[simulate_var] = before
            from .profiles import reset

            reset()  # the caller's next profile() sees its own environment again


def console() -> None:
    """The ``hwprofile`` program (console script): :func:`main`, then exit with its status.

    argparse's own exits (``--help``, ``--version``, a usage error) leave their text in stdout's
    buffer; it is flushed here, so a closed pipe (``hwprofile --version | head -1``) ends quietly
    instead of in the interpreter's "Exception ignored ... BrokenPipeError" and status 120.
    """
    try:
        code: int | str | None = main(program=True)
    except SystemExit as exc:
        code = exc.code
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        _silence_stdout()
    sys.exit(code)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again (the program only)."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(fd, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(fd)


def _fail(msg: str, code: int) -> int:
    try:
        print(f"hwprofile: {msg}", file=sys.stderr)
    except OSError:
        pass
    return code


if __name__ == "__main__":  # pragma: no cover
    console()
