"""``hwprofile compile`` and ``hwprofile cache``: pre-building kernels, the layer package, the cache listing (from cli.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from . import _env
from ._cli_common import _progress
from ._text import table
from .errors import HwprofileError, ToolchainError


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


def _warm_work(reg: Any, work: list[tuple[Any, str]], args: argparse.Namespace) -> list[tuple[Any, str]]:
    """``--warm`` / ``--models``: each (spec, target) cut to the instances its target's profile dispatches those shapes to.

    Routing is the ops' own (``hwprofile.ops._warmup.plan``: ``decide`` on the profile of a device of
    that capability, simulated), so the cache holds exactly what ``hwprofile.ops.warmup`` would load.
    """
    from .device import DeviceInfo
    from .models import load as load_models
    from .models import select
    from .ops import _warmup
    from .profiles import build_profile

    shapes: dict[str, list[tuple[int, int, int]]] = {}
    try:
        if args.warm:
            shapes = _warmup.parse_shapes(args.warm)
        names = [n for n in (args.models or "").split(",") if n.strip()]
        if names:
            select(load_models(), names)  # an unknown model is one error listing the known ones
        wanted = _warmup.shapes_of(shapes, names)
    except ValueError as exc:
        raise HwprofileError(str(exc)) from None
    out: list[tuple[Any, str]] = []
    profiles: dict[str, Any] = {}
    for spec, target in work:
        prof = profiles.get(target)
        if prof is None:
            cc = next(cc for p in reg.arch_plugins if p.arch for cc, t in p.arch.targets.items() if t == target)
            prof = profiles[target] = build_profile(DeviceInfo(0, f"compile-only {target}", cc, simulated=True), reg, os.environ)
        exprs = [
            p.launch.name_expression
            for p in _warmup.plan(prof, {spec.op: wanted.get(spec.op, [])}, bool(prof["gemv.split_k"]))
            if p.launch is not None and prof.kernels.get(spec.op) is not None and prof.kernels[spec.op].source == spec.source
        ]
        out.append((spec.replace(instances=tuple(dict.fromkeys(exprs))), target))
    return out


def cmd_compile(args: argparse.Namespace) -> int:
    from . import kernels
    from .kernels.cache import LAYER_SUBDIR, open_layer_for_writing
    from .profiles import registry

    layers = [args.output] if args.output is not None else []
    if args.package is not None:
        _check_layer_package(args.package, args.package_name)  # before anything is created: never over a user's project
        layers.append(args.package / "src" / _layer_package_name(args.package_name) / LAYER_SUBDIR)
    for layer in layers:  # before any compile: a bad --output is one line, not minutes of NVRTC later
        os.close(open_layer_for_writing(layer))
    reg = registry()
    work = _compile_work(reg, args.arch)
    if not work:
        print("nothing to compile: no architecture plugin is installed")
        return 0
    _check_compile_environment(reg)  # the control variables and typos profile() would check, once
    try:  # once, before any kernel: a missing NVRTC is one line, not one error per kernel instance
        kernels.check_toolchain()
    except ToolchainError as exc:
        raise HwprofileError(f"cannot compile: {exc}") from None
    from .kernels import cache as kcache

    kcache.check_layers()  # once, before any kernel: a cache directory that is a file or a link is one error, not one per instance
    if args.warm or args.models:
        work = _warm_work(reg, work, args)
    t0 = time.perf_counter()
    deduped, shared = _share_instances(work, kernels)
    reports = kernels.compile_all(deduped, args.jobs, _progress(not args.json, 60))
    for r, (spec, _target), theirs in zip(reports, work, shared, strict=True):
        _add_shared(r, spec, theirs, reports, kernels)
    failed = [r for r in reports if r.errors]
    layer_note = "" if failed else _fill_layers(reports, layers, args)
    if args.json:
        out = [
            {"op": spec.op, "plugin": spec.plugin, "target": r.target, "instances": len(spec.instances), "compiled": r.compiled,
             "cached": r.cached, "shared": len(theirs), "shared_with": _owners(theirs, work), "seconds": round(r.seconds, 3),
             "cubin_bytes": r.cubin_bytes, "registers": r.registers, "spill_bytes": r.spill_bytes, "errors": r.errors}
            for r, (spec, _target), theirs in zip(reports, work, shared, strict=True)
        ]
        print(json.dumps(out, indent=2))
    else:
        rows = [_compile_row(r, spec, theirs, work) for r, (spec, _target), theirs in zip(reports, work, shared, strict=True)]
        print(table(rows, ["kernel", "plugin", "target", "instances", "time", "per inst.", "cubins", "max regs", "spill B"]))
        print(COMPILE_LEGEND)
        print(f"{len(reports) - len(failed)}/{len(reports)} kernels ready in {time.perf_counter() - t0:.1f}s wall (jobs={args.jobs})")
        if layer_note:
            print(layer_note)
        for r in failed:
            print(f"\n{r.spec.op} for {r.target}:\n" + "\n".join(r.errors), file=sys.stderr)
    return 1 if failed else 0


def _compile_work(reg: Any, arch: str | None) -> list[tuple[Any, str]]:
    """(kernel spec, target) of every architecture plugin's kernels for the targets ``--arch`` names (None, "all": every
    target); a target no installed plugin has is an error naming the installed ones."""
    from ._entrypoints import natural_key
    from .device import DeviceInfo

    wanted = None if arch in (None, "all") else {a.strip() for a in arch.split(",") if a.strip()}
    if wanted is not None and not wanted:
        raise HwprofileError(f"--arch {arch!r} names no target; give targets like sm_90a,sm_100a, or 'all'")
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
    return work


def _fill_layers(reports: list[Any], layers: list[Path], args: argparse.Namespace) -> str:
    """Write the compiled kernels into each ``--output`` layer and the ``--package`` project; what was done, in words."""
    from . import kernels

    notes = []
    for layer in layers:
        written, present = kernels.fill_layer([(r.spec, r.target) for r in reports], layer)
        notes.append(f"cache layer {layer}: {written} entries written, {present} already there")
    if args.package is not None:
        _write_layer_package(args.package, args.package_name, [r.target for r in reports])
        notes.append(f"layer package {args.package}: build its wheel with 'pip wheel --no-deps {args.package}'")
    return "\n".join(notes)


def _compile_row(r: Any, spec: Any, theirs: dict[str, int], work: list[tuple[Any, str]]) -> list[str]:
    """One kernel's row of ``hwprofile compile``'s table."""
    if r.errors:
        state = "FAILED"
    else:
        parts = [f"compiled {r.compiled}"] if r.compiled else []
        parts += [f"cached {r.cached}"] if r.cached else []
        parts += [f"{len(theirs)} shared with {', '.join(_owners(theirs, work))}"] if theirs else []
        state = ", ".join(parts) or "none"
    n = r.compiled + r.cached
    return [
        spec.op, spec.plugin, r.target, state, f"{r.seconds:.2f}s", f"{r.seconds / n:.2f}s" if n else "-",
        f"{r.cubin_bytes // 1024} KiB", str(r.registers or "?"), str(r.spill_bytes),
    ]


def _layer_package_name(dist: str) -> str:
    """The import name of a layer distribution: ``hwprofile-sm90-cubins`` -> ``hwprofile_sm90_cubins``."""
    import re

    name = re.sub(r"[^A-Za-z0-9]+", "_", dist).strip("_").lower()
    if not name or name[0].isdigit():
        raise HwprofileError(f"--package-name {dist!r} is not a distribution name; write e.g. hwprofile-sm90-cubins")
    return name


def _check_layer_package(root: Path, dist: str) -> None:
    """``--package DIR``: a valid distribution name, and DIR absent, empty, or a layer package hwprofile wrote before."""
    import re

    from .kernels.cache import LAYER_GROUP

    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", dist):
        raise HwprofileError(f"--package-name {dist!r} is not a distribution name (PEP 508); write e.g. hwprofile-sm90-cubins")
    _layer_package_name(dist)
    if root.is_dir() and any(root.iterdir()):
        project = root / "pyproject.toml"
        ours = project.is_file() and not project.is_symlink() and LAYER_GROUP in project.read_text(errors="replace")
        if not ours:
            raise HwprofileError(
                f"--package {root} is a non-empty directory that is not a layer package hwprofile wrote; its files would be "
                "replaced: choose an empty or new directory"
            )
    elif root.exists() and not root.is_dir():
        raise HwprofileError(f"--package {root} exists and is not a directory; choose a new directory")


def _write_layer_package(root: Path, dist: str, targets: list[str]) -> None:
    """The project of a wheel that ships the layer under ``src/<package>/cubins``, found through the ``hwprofile.cubins`` group."""
    from ._files import atomic_write, ensure_directory
    from ._version import __version__
    from .kernels.cache import LAYER_GROUP, LAYER_SUBDIR

    pkg = _layer_package_name(dist)
    arch = ", ".join(sorted(set(targets)))
    ensure_directory(root / "src" / pkg, what="layer package")
    doc = f'"""Prebuilt hwprofile kernels ({arch}): a read-only kernel cache layer, found through the {LAYER_GROUP} entry point group."""\n'
    atomic_write(root / "src" / pkg / "__init__.py", doc, what="layer package")
    atomic_write(root / "pyproject.toml", f"""[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "{__version__}"
description = "Prebuilt hwprofile kernels for {arch}: a read-only kernel cache layer"
requires-python = ">=3.11"
# entries are keyed by hwprofile's version, the plugins', NVRTC's build and every header: pin what built them
dependencies = ["hwprofile=={__version__}"]

[project.entry-points."{LAYER_GROUP}"]
{pkg} = "{pkg}"

[tool.setuptools.packages.find]
where = ["src"]

[tool.setuptools.package-data]
{pkg} = ["{LAYER_SUBDIR}/*.cubin"]
""", what="layer package")


def cmd_cache(args: argparse.Namespace) -> int:
    import stat

    from .kernels import cache as kcache

    if args.action == "clear":
        report = kcache.clear()
        print(f"removed {report.removed} entries from {report.path}")
        for note in report.skipped:
            print(f"  left alone: {note}")
        if report.foreign:
            print(f"  left alone: {report.foreign} files hwprofile did not write (only its own entries are ever removed)")
        return 0
    enabled = kcache.cache_enabled()
    print(f"cache: {'enabled' if enabled else f'disabled by {_env.CACHE.name}=off'}")
    total = total_size = 0
    with kcache.open_layers(create=False) as layers:
        if not layers.read:
            print(f"layer {kcache.configured_dirs()[-1]} (write): absent, created on the first compile")
        for layer in layers.read:
            n = size = 0
            for name in os.listdir(layer.fd):
                if kcache.is_entry_name(name):
                    st = os.stat(name, dir_fd=layer.fd, follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        n, size = n + 1, size + st.st_size
            role = "write" if layer.writable else f"read-only, {layer.origin}"
            print(f"layer {layer.path} ({role}): {n} entries, {size / 1024:.0f} KiB")
            total, total_size = total + n, total_size + size
    print(f"entries: {total}, {total_size / 1024:.0f} KiB")
    return 0
