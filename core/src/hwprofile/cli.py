"""``hwprofile`` command line: show | plugins | devices | explain | env | doctor | compile | cache | sweep | tune | new-plugin.

Library code logs; this module prints. A user error prints one line and exits 2, no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import _env
from ._cli_common import _fmt, _profile, _sm
from ._cli_compile import cmd_cache, cmd_compile
from ._cli_sweep import cmd_sweep, cmd_tune
from ._redact import redacted_output
from ._text import table
from .errors import DeviceError, HwprofileError
from .optable import GATES, TABLE

#: Version of ``hwprofile show --json``'s layout (its ``format`` key); keys are only ever added under one number.
SHOW_FORMAT = 1
#: What a profile's fingerprint is, for the reader of ``show`` (and its test).
FINGERPRINT_NOTE = "hash of plugin, target, settings, env defaults and kernel sources: equal fingerprints dispatch alike"


def show_document(prof: Any) -> dict[str, Any]:
    """``hwprofile show --json``: the format and core version, then :meth:`Profile.as_dict`.

    ``stats`` are the dispatch counters of the process that prints them: ``{}`` from the ``hwprofile``
    program (no op ran there), real counts when an engine calls ``main(["show", "--json"])`` itself.
    """
    from . import _remote, _verdicts
    from ._version import __version__

    doc = {"format": SHOW_FORMAT, "hwprofile": __version__, **prof.as_dict()}
    doc["verification"] = _verdicts.summary(prof)  # per op with a kernel: on/off and who decided, verdicts passed and failed
    remote = _remote.status()
    if remote is not None:  # the fleet store (HWPROFILE_REMOTE): its URL, password hidden, and this process's counters
        doc["remote"] = remote
    return doc


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

    rows = [[k, _fmt(s.value, k), s.winner.source, note(s)] for k, s in prof.settings.items()]
    print(table(rows, ["setting", "value", "source", "note"]))
    if prof.env_defaults:
        print()
        rows = [
            [n, d.value, "user set: " + repr(os.environ[n]) if n in os.environ else "default", d.source]
            for n, d in prof.env_defaults.items()
        ]
        print(table(rows, ["env default", "value", "state", "from"]))
    if prof.kernels:
        from . import _verdicts

        print()
        checked = _verdicts.summary(prof)
        rows = [[op, s.plugin, s.source, str(len(s.instances)), _verdicts.summary_text(checked[op])] for op, s in prof.kernels.items()]
        print(table(rows, ["kernel", "plugin", "source", "instances", "verified on this device (float64)"]))
    if prof.stats.counts:  # only when an engine calls main(["show"]) in its own process
        print()
        rows = [[op, str(c["kernel"]), str(c["fallback"])] for op, c in sorted(prof.stats.counts.items())]
        print(table(rows, ["op", "kernel calls", "fallback calls"]))
        k = prof.stats.kernel_counts()
        hits = ", ".join(f"{n} from {layer}" for layer, n in k["hits"].items()) or "none"
        print(f"kernels: {k['compiles']} compiled, {k['loads']} loaded, cache hits: {hits}")
    from . import _remote

    remote = _remote.status()
    if remote is not None:
        print(f"\nremote store: {remote['url']} ({_env.REMOTE.name}), {remote['state']}\n  {_remote.describe(remote)}")
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
            "models": _models_hint(),
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
    print(f"\n{_models_hint()}")
    if extra_error:
        print(f"plugin catalog entries unavailable: {extra_error}", file=sys.stderr)
    return 0


def _models_hint() -> str:
    """Where the served-model catalog is and how a user adds a model (``hwprofile devices``)."""
    from . import models

    return (
        f"served-model shapes: 'hwprofile sweep OP' measures the decode shapes of the models in {models.SHIPPED} by default "
        "(--models NAME,... picks some); to add your own, write a file of the same format (one [\"name\"] table with "
        "source, hidden, heads, kv_heads, intermediate, experts, vocab, tp, fp8 from its config.json) and pass --models-file FILE"
    )


def version_text() -> str:
    """``hwprofile --version``: core, then every plugin, from package metadata (no plugin is imported)."""
    from ._entrypoints import ENTRY_POINT_GROUP, find_entry_points, natural_key
    from ._version import __version__

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
    if args.shape is not None and args.key not in TABLE:
        raise HwprofileError(f"--shape explains an op's decision: give an op ({', '.join(TABLE)}) as KEY, got {args.key!r}")
    prof = _profile(args)
    if args.key in TABLE:
        return _explain_decision(prof, args)
    if args.list or args.key is None:
        return _explain_list(prof, args)
    r = prof.explain(args.key)
    if args.json:
        return _explain_json(prof, r, args.key)
    s = r.setting
    print(f"{s.key} = {_fmt(r.value, s.key)}   (from {r.winner.source})")
    print(f"  {s.doc}")
    identical = "bit-identical" if s.bit_identical else "NOT bit-identical"
    print(f"  type {s.type}, allowed {s.allowed()}; override with {s.env_var}; {identical}")
    print("  layers, lowest first:")
    for layer in r.chain:
        mark = "->" if layer is r.winner else ("xx" if not layer.applied else "  ")
        why = f"  ({layer.reason})" if layer.reason else ""
        print(f"   {mark} {layer.kind:<10} {_fmt(layer.value, s.key):<8} {layer.source}{why}")
        if layer.stamp is not None:
            _print_stamp(prof, layer)
    if s.key.endswith(".measured") and r.value:
        _print_measured(s.key, r.value, r.winner.source)
    if s.key.endswith(".model") and r.value:
        _print_model(s.key, r.value, r.winner.source)
    from . import tuning
    from .optable import owner

    op = owner(s.key)
    unmeasured = tuning.unmeasured(prof).get(s.key)
    if unmeasured is not None and op is not None:
        print(f"  {unmeasured}")
        print(f"  measure it with: hwprofile sweep {op.name} (on this GPU)")
    verdict = _selftest_line(prof, s.key)
    if verdict is not None and op is not None:
        print(f"  self-test of the {op.name} kernel on this device: {verdict}")
    return 0


def _explain_list(prof: Any, args: argparse.Namespace) -> int:
    """``hwprofile explain`` / ``--list``: every setting, its value and what overrides it (``--json``: as JSON)."""
    if args.json:
        print(json.dumps({k: {"value": s.value, "source": s.winner.source, "doc": s.setting.doc, "env_var": s.setting.env_var}
                          for k, s in prof.settings.items()}, indent=2, default=str))
        return 0
    rows = [[k, _fmt(s.value, k), s.setting.env_var, s.setting.doc] for k, s in prof.settings.items()]
    print(table(rows, ["setting", "value", "override with", "what it does"]))
    if not args.list:
        print("\nhwprofile explain KEY shows where a value comes from")
    return 0


def _explain_json(prof: Any, r: Any, key: str) -> int:
    """``hwprofile explain KEY --json``: the resolution, each stamped layer's comparison, the unmeasured and self-test notes."""
    from . import tuning

    doc = r.as_dict()
    for layer, out in zip(r.chain, doc["chain"], strict=True):
        if isinstance(layer.stamp, tuning.Stamp):  # what differs now, by kind (stale / note / cannot tell)
            c = tuning.assess(prof, layer.stamp)
            out["comparison"] = {"stale": list(c.stale), "notes": list(c.notes), "unknown": list(c.unknown)}
    doc["unmeasured"] = tuning.unmeasured(prof).get(key)
    doc["selftest"] = _selftest_line(prof, key)
    print(json.dumps(doc, indent=2, default=str))
    return 0


def _print_stamp(prof: Any, layer: Any) -> None:
    """A stamped layer's measurement and what differs from the running system now (stale, notes, cannot tell)."""
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


def _selftest_line(prof: Any, key: str) -> str | None:
    """The stored self-test verdict of the kernel of the op owning ``key`` on a real device (None: no such op or kernel, or simulated)."""
    from .optable import owner

    op = owner(key)
    from . import selftest

    if op is None or op.name not in prof.kernels or not selftest.on_gpu(prof):
        return None

    return next((row["state"] for row in selftest.summary(prof) if row["op"] == op.name), None)


def cmd_selftest(args: argparse.Namespace) -> int:
    """Run every kernel instance the device can dispatch against float64; 0 if every verdict passed, 1 otherwise."""
    from . import selftest

    prof = _profile(args)
    if not selftest.on_gpu(prof):
        raise DeviceError(
            f"selftest runs kernels on the GPU in hand; device {prof.device.index} is simulated ({_env.DEVICE.name} is set): "
            f"unset {_env.DEVICE.name} on a machine with the GPU"
        )
    if not prof.kernels:
        print(f"{prof.device.name}: {prof.plugin.name if prof.plugin else 'no architecture plugin'} provides no kernel: nothing to check")
        return 0
    report = selftest.run(prof, force=args.force, apply=False)
    if args.json:
        print(json.dumps({"device": report.device, "path": str(report.path), "ok": report.ok,
                          "verdicts": [{**v.as_dict(), "fresh": v.fresh} for v in report.verdicts]}, indent=2))
        return 0 if report.ok else 1
    rows = [[v.op, v.instance, "x".join(map(str, v.shape)), "pass" if v.ok else "FAIL",
             "-" if v.rel_error is None else f"{v.rel_error:.2g}", "run now" if v.fresh else f"stored {v.date}", v.error]
            for v in report.verdicts]
    print(table(rows, ["op", "instance", "MxNxK", "verdict", "rel. error", "when", "error"]))
    failed = sorted({v.op for v in report.verdicts if not v.ok})
    print(f"\n{len(report.verdicts)} instances on {report.device}; verdicts in {report.path}")
    if failed:
        print(f"FAILED: {', '.join(failed)}: with {_env.SELFTEST.name}=1 these kernels are disabled on this device (the op falls back)")
        return 1
    print("every instance passed")
    return 0


def _print_model(key: str, text: str, source: str) -> None:
    """An ``<op>.model`` value in words and in full (``explain``; ``show`` prints only whether it was fitted)."""
    from . import costmodel
    from .errors import SettingError

    try:
        print(f"  cost model: {costmodel.describe(costmodel.parse(key.rsplit('.', 1)[0], text, where=source))}")
    except SettingError as exc:
        print(f"  cost model: {exc}")
    print(f"  {text}")


def _print_measured(key: str, text: str, source: str) -> None:
    """The per-shape decisions of an ``<op>.measured`` value, one row per shape (``explain``)."""
    from . import tuning

    op = key.rsplit(".", 1)[0]
    rows = [
        [str(m), str(n), str(k), "kernel" if d.kernel else "fallback",
         "-" if d.kernel_us is None else f"{d.kernel_us:g}", f"{d.fallback_us:g}"]
        for (m, n, k), d in sorted(tuning.parse_measured(op, text, where=source).items())
    ]
    print(f"  measured decisions ({len(rows)} shapes; dispatch takes them before the cost model):")
    print(table(rows, ["M", "N", "K", "path", "kernel us", "fallback us"]))


def _explain_decision(prof: Any, args: argparse.Namespace) -> int:
    """``hwprofile explain OP --shape MxNxK``: the path the op takes at that shape and what decided it."""
    from .ops import decide

    if args.shape is None:
        raise HwprofileError(f"explain {args.key} needs --shape MxNxK (e.g. --shape 1x4096x7168); a setting key is explained without it")
    try:
        m, n, k = (int(x) for x in args.shape.lower().split("x"))
    except ValueError:
        raise HwprofileError(f"--shape {args.shape!r}: write it as MxNxK with integers (e.g. 1x4096x7168)") from None
    if min(m, n, k) < 0:
        raise HwprofileError(f"--shape {args.shape!r}: M, N and K must be >= 0")
    from .ops import _verify

    d = decide(args.key, prof, m=m, n=n, k=k)
    checked: list[str] = []
    if d.path == "kernel" or d.gate == "failed":
        from .ops import _gate

        checked = _gate.verification_states(prof, m, n, k) if d.op in GATES else _verify.states(prof, d.op, m, n, k)
    if args.json:
        doc = {"op": d.op, "m": m, "n": n, "k": k, "path": d.path, "basis": d.basis, "gate": d.gate, "reason": d.reason,
               "kernel_us": d.kernel_us, "fallback_us": d.fallback_us, "verification": checked}
        print(json.dumps(doc, indent=2))
        return 0
    what = _BASIS_WORDS.get(d.basis, d.basis)
    print(f"{d.op} at M={m} N={n} K={k}: {d.path}   ({what})")
    if d.kernel_us is not None or d.fallback_us is not None:
        how = "measured" if d.basis == "measured" else "predicted"
        kern = "-" if d.kernel_us is None else f"{d.kernel_us:.3g} µs"
        fb = "-" if d.fallback_us is None else f"{d.fallback_us:.3g} µs"
        print(f"  {how}: kernel {kern}, fallback {fb}")
    print(f"  {d.reason}")
    for line in checked:
        print(f"  verification: {line}")
    return 0


#: ``Decision.basis`` in the words ``explain OP --shape`` prints
_BASIS_WORDS = {
    "measured": "measured at this shape",
    "model": "cost model",
    "limit": "kernel limit",
    "fixed": "no choice",
}


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


def cmd_new_plugin(args: argparse.Namespace) -> int:
    from . import scaffold

    directory = args.dir or Path(f"hwprofile-{args.name}")
    written = scaffold.write(directory, args.name, args.capability, args.target, family=args.family)
    for p in written:
        print(f"wrote {p}")
    target = args.target or "sm_" + args.capability.replace(".", "")
    print(scaffold.hint(directory, target, family=args.family))
    return 0


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


def _user_path(text: str) -> Path:
    """A path argument with a leading ``~`` / ``~user`` expanded, as for the path variables: ``--output=~/t.toml``
    reaches hwprofile unexpanded (no shell expands after ``=``) and must not create a literal ``./~``."""
    from . import _paths

    try:
        return Path(_paths.expand(text, what=""))
    except HwprofileError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    s.add_argument("key", nargs="?", help="setting key, e.g. router_gemm.max_tokens; or an op with --shape")
    s.add_argument(
        "--shape", metavar="MxNxK",
        help="with an op as KEY: the path it takes at this shape, and whether a measurement, the cost model or a kernel limit did"
    )
    s.add_argument("--list", action="store_true", help="list every setting key with its value and override variable")
    s.set_defaults(fn=cmd_explain)
    s = sub.add_parser(
        "selftest", parents=[device, js],
        help="run every kernel the device can dispatch against float64 and record the verdicts (needs the GPU)",
    )
    s.add_argument("--force", action="store_true", help="run every instance again, even those with a verdict whose stamp matches")
    s.set_defaults(fn=cmd_selftest)
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
    s.add_argument(
        "--warm", metavar="SHAPES",
        help="only the instances the ops dispatch these shapes to: OP:MxNxK[,MxNxK...], several ops separated by ';' "
        "(e.g. 'gemv:1x4096x4096;router_gemm:8x256x7168')",
    )
    s.add_argument("--models", metavar="NAMES", help="only the instances the decode shapes of these served models need (comma list)")
    s.add_argument("--output", type=Path, metavar="DIR", help="also copy every entry into the cache layer DIR (created private)")
    s.add_argument(
        "--package", type=Path, metavar="DIR",
        help="write a project at DIR shipping the layer as package data (build it with 'pip wheel --no-deps DIR')",
    )
    s.add_argument("--package-name", default="hwprofile-cubins", help="distribution name of --package (default: hwprofile-cubins)")
    s.set_defaults(fn=cmd_compile)
    s = sub.add_parser("sweep", parents=[device], help="time a kernel against its fallback and write tuned thresholds (needs the GPU)")
    s.add_argument("op", choices=list(TABLE))
    s.add_argument("--m", help="tokens: 1..16 or 1,2,4 (router_gemm, linear_bf16_fp32)")
    s.add_argument("--n", help="output features: 256,384 or a range")
    s.add_argument("--k", help="input features")
    s.add_argument("--shapes", help="GEMV shapes as NxK,NxK (M = 1); with --m/--n/--k they replace the box edges, and the catalog "
                   "is measured only if --models/--models-file ask for it")
    s.add_argument("--models", metavar="NAME,...", help="measure only these served models' shapes (default: the whole catalog; "
                   "'hwprofile devices' says where it is)")
    s.add_argument("--models-file", metavar="FILE", type=_user_path, action="append", default=[],
                   help="your own models, in the catalog's format (models.toml shipped with hwprofile); repeatable")
    s.add_argument("--report", action="store_true", help="print per shape both times, the path taken and its regret; write a regret plot")
    s.add_argument(
        "--regret-plot", type=_user_path, help="where --report writes its plot (default: samples/<op>-regret.png beside the tuned file)"
    )
    s.add_argument("--reps", type=_positive_int, default=15, help="timed graph replays per point (median)")
    s.add_argument("--ties", choices=["fallback", "kernel"], default="kernel", help="who gets a near tie (kernel: fewer parts)")
    s.add_argument("--output", type=_user_path, help="tuned file to write (default: this device's tuned directory)")
    s.add_argument("--plot", type=_user_path, help="PNG of latency against M or N with the threshold marked")
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
    s.add_argument("--ties", choices=["fallback", "kernel"], default="kernel", help="who gets a near tie (kernel: fewer parts)")
    s.set_defaults(fn=cmd_tune)
    s = sub.add_parser("new-plugin", help="scaffold an architecture plugin package")
    s.add_argument("name", help="plugin name, e.g. sm89 (distribution hwprofile-<name>)")
    s.add_argument("--capability", required=True, help="exact compute capability served, e.g. 8.9")
    s.add_argument("--target", help="NVRTC target (default sm_<major><minor>)")
    s.add_argument("--dir", type=_user_path, help="where to write it (default ./hwprofile-<name>)")
    s.add_argument("--family", action="store_true",
                   help="a plugin on hwprofile's shared kernel family: every op and the MoE gate (compute capability 9.0+)")
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

    Output never fails on what it prints: a path that is not valid in stdout's encoding (a
    non-UTF-8 file name, any non-ASCII one on an ASCII terminal) is written as its original bytes or
    a backslash escape (:func:`_render_errors`). A closed stdout (``hwprofile show >&-``) runs the
    command, then ends in one line and status 1 if it had anything to print.
    """
    closed = _ClosedStdout() if sys.stdout is None else None
    if closed is not None:
        sys.stdout = closed  # print() writes here, argparse's --version and --help too
    restore = _render_unencodable(sys.stdout)
    try:
        with redacted_output():  # every line printed passes the one redaction (the store's password)
            code = _main(argv, program=program)
    except SystemExit as exc:  # argparse's own exits (--version, --help, a usage error)
        if closed is not None and closed.written and exc.code in (0, None):
            raise SystemExit(_closed_stdout_failure()) from None
        raise
    finally:
        restore()
        if closed is not None:
            sys.stdout = None
    if closed is not None and closed.written:
        failed = _closed_stdout_failure()
        return code or failed  # a command that failed (doctor's failed check) keeps its own status
    return code


class _ClosedStdout:
    """What ``sys.stdout`` is while fd 1 is closed (Python sets it to ``None``): remembers whether anything was printed."""

    written = False

    def write(self, text: str) -> int:
        self.written = self.written or bool(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def _closed_stdout_failure() -> int:
    return _fail("error: standard output is closed, so the output was not written; run with stdout open or redirect it (> /dev/null)", 1)


_RENDER = "hwprofile.render"


def _render_errors(exc: UnicodeError) -> tuple[str | bytes, int]:
    """The codec error handler of the CLI's output: an undecodable byte of a file name (a lone
    surrogate, as ``os.fsdecode`` makes it) is written back as that byte, like ``surrogateescape``;
    any other character the encoding lacks becomes a backslash escape, like ``backslashreplace``."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    bad = exc.object[exc.start : exc.end]
    if all(0xDC80 <= ord(c) <= 0xDCFF for c in bad):
        return bytes(ord(c) - 0xDC00 for c in bad), exc.end
    return "".join(c.encode("ascii", "backslashreplace").decode("ascii") for c in bad), exc.end


def _render_unencodable(stream: Any) -> Any:
    """Switch ``stream`` (stdout) from strict errors to :func:`_render_errors`; returns what undoes it."""
    import codecs

    errors = getattr(stream, "errors", None)
    if errors != "strict" or not hasattr(stream, "reconfigure"):
        return lambda: None
    try:
        codecs.lookup_error(_RENDER)
    except LookupError:
        codecs.register_error(_RENDER, _render_errors)
    try:
        stream.reconfigure(errors=_RENDER)
    except (OSError, ValueError):  # a closed or broken stream: the command's own output path reports it
        return lambda: None

    def restore() -> None:
        try:
            stream.reconfigure(errors=errors)
        except (OSError, ValueError):
            pass

    return restore


def _main(argv: Sequence[str] | None, *, program: bool) -> int:
    """:func:`main` without its stdout guards."""
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
        from ._deps import missing

        dep = missing(exc)  # an installation problem, not a bug: which package, and the command that installs it
        if dep is not None:
            return _fail(f"error: {dep}", 2)
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
        if sys.stdout is not None:  # None: fd 1 was closed from the start (main said so)
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
    if sys.stderr is None:  # fd 2 closed as well: the status is all that can be said
        return code
    try:
        print(f"hwprofile: {msg}", file=sys.stderr)
    except (OSError, ValueError):
        pass
    return code


if __name__ == "__main__":  # pragma: no cover
    console()
