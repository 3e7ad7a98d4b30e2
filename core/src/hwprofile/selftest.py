"""Kernels that check themselves: every kernel instance a profile can dispatch, run once against float64.

A kernel compiled for a GPU nobody here has run (sm_100, sm_120) is correct only by construction
until it runs. ``hwprofile selftest`` (and, opt-in, ``HWPROFILE_SELFTEST=1`` when an op first builds
a device's dispatch table) runs each instance the profile would dispatch, at one shape of the op's
grid or shipped shapes that routes to it, on random inputs, and compares with a float64 reference.

Each result is a *verdict*, stamped with what it depends on: the device SKU and compute capability,
the driver version, the plugin, the kernel source digest and the launch plan (name expression, grid,
block, shared memory). Verdicts live in ``<config dir>/selftest/<device>.json`` (written whole through
:func:`hwprofile._files.atomic_write`); a verdict whose stamp differs from what would run now is not
trusted but run again. A kernel with any failed instance (a wrong result, a launch the driver
refuses, a NaN it never wrote) is disabled on that device with one warning: the op takes its
fallback there (:meth:`hwprofile.ops._dispatch._Table.fail`); strict mode raises instead.

The runner is a seam: :func:`run` takes any ``runner(table, case) -> Outcome``; the default one needs
torch and the GPU. CPU tests pass a fake.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import _verdicts
from ._log import get_logger
from ._record import Record, final
from .errors import HwprofileError
from .optable import OPS, TENSOR_SCALE

if TYPE_CHECKING:
    from .kernels.spec import Launch
    from .ops import _dispatch
    from .profiles import Profile

log = get_logger("hwprofile.selftest")

FORMAT = _verdicts.FORMAT
TOLERANCE = _verdicts.TOLERANCE
Verdict = _verdicts.Verdict
read = _verdicts.read
write = _verdicts.write


@final
class Case(Record):
    """One kernel instance to check: the op, the shape that routes to it, the scale mode, its plan."""

    op: str
    shape: tuple[int, int, int]
    scale: int
    plan: Launch

    @property
    def instance(self) -> str:
        return self.plan.name_expression

    @property
    def key(self) -> _verdicts.Key:
        return (self.op, self.plan.name_expression, self.shape)


Outcome = _verdicts.Outcome


@dataclass
class Report:
    """Every verdict for one device, and which ops it disabled."""

    device: str
    path: Path
    verdicts: list[Verdict] = field(default_factory=list)
    disabled: dict[str, str] = field(default_factory=dict)  #: op -> why

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)


def cases(prof: Profile) -> list[Case]:
    """Every distinct kernel instance ``prof`` dispatches for its ops' grids and shipped shapes, with a shape that routes to it.

    Shapes: the op table's sweep grid and pre-built shapes (``OpDef.prebuilt``); each with every
    scale mode of the op and the profile's split-K. Only shapes the profile's routes send to the
    kernel count (:func:`hwprofile.ops.route`, ignoring kernels failed in this process since): the
    instances the profile can dispatch there.
    """
    from .ops import _dispatch

    split = bool(prof["gemv.split_k"])
    fresh = _dispatch._Table(prof)  # the profile's routes, whatever failed in this process since
    out: dict[tuple[str, str], Case] = {}
    for op, d in OPS.items():
        spec = prof.kernels.get(op)
        if spec is None:
            continue
        for m, n, k in dict.fromkeys((*d.grid, *d.prebuilt)):
            if _dispatch.route(fresh.routes[op], m, n, k) is not None:
                continue
            for sc in d.scale_modes:
                plan = spec.configure(m=m, n=n, k=k, split_k=split, **({"scale": sc} if d.scaled else {}))
                out.setdefault((op, plan.name_expression), Case(op, (m, n, k), sc, plan))
    return list(out.values())


def stamp(prof: Profile, case: Case) -> dict[str, Any]:
    """What a verdict depends on (:func:`hwprofile._verdicts.stamp`)."""
    return _verdicts.stamp(prof, case.op, case.plan, case.shape, case.scale)


def verdict_path(prof: Profile, environ: Any = None) -> Path:
    """``<config dir>/selftest/<slug of the device's name and sm>.json``: one file per device SKU."""
    return _verdicts.path_for(prof, environ)


def stored(prof: Profile) -> tuple[list[Verdict], list[Case]]:
    """The file's verdicts whose stamps match what would run now, and the cases that have none (never run, or stale)."""
    have = read(verdict_path(prof))
    good, todo = [], []
    for c in cases(prof):
        v = have.get(c.key)
        if v is not None and v.stamp == stamp(prof, c):
            good.append(v)
        else:
            todo.append(c)
    return good, todo


Runner = Callable[["_dispatch._Table", Case], Outcome]


def run(prof: Profile, *, runner: Runner | None = None, force: bool = False, apply: bool = True) -> Report:
    """Check every case of ``prof``: reuse verdicts whose stamps match (``force``: none), run the rest, write the file.

    ``apply``: disable on this device, with one warning each, the ops with a failed instance (strict
    mode: raise a :class:`~hwprofile.errors.KernelError` instead); without it, :attr:`Report.disabled`
    says which ops would be.
    """
    report, merged = _check(prof, runner, force)
    if apply:  # before the write: a verdict file that cannot be written must not keep a failed kernel in use
        from .ops import _dispatch

        report.disabled = disable(_dispatch.table(prof.device.index), report.verdicts)
    else:
        report.disabled = failures(report.verdicts)
    write(report.path, merged)
    return report


def _check(prof: Profile, runner: Runner | None, force: bool) -> tuple[Report, list[Verdict]]:
    """Run what has no matching verdict; the report, and every verdict the file will hold (other instances' kept)."""
    import datetime as _dt

    from .ops import _dispatch

    path = verdict_path(prof)
    good, todo = stored(prof) if not force else ([], cases(prof))
    table = _dispatch.table(prof.device.index)
    go = runner or gpu_runner
    date = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    fresh = []
    for c in todo:
        try:
            res = go(table, c)
        except HwprofileError as exc:  # a kernel error strict mode raised, a bad operand: that instance failed
            res = Outcome(False, None, str(exc))
        fresh.append(Verdict(c.op, c.instance, stamp(prof, c), res.ok, res.rel_error, res.error, c.shape, date, fresh=True))
    old = read(path)
    for v in (*good, *fresh):
        old[v.key] = v
    return Report(prof.device.name, path, [*good, *fresh]), list(old.values())


def failures(verdicts: Iterable[Verdict]) -> dict[str, str]:
    """op -> why, for each op with a failed verdict (its first): what disables the op's kernel on the device."""
    out: dict[str, str] = {}
    for v in verdicts:
        if not v.ok and v.op not in out:
            out[v.op] = f"self-test of {v.instance} at M, N, K = {v.shape} failed: {v.error or f'relative error {v.rel_error:.3g}'}"
    return out


def disable(table: _dispatch._Table, verdicts: Iterable[Verdict]) -> dict[str, str]:
    """Send every op with a failed verdict to its fallback on ``table``'s device, one warning each (strict: raise)."""
    from .ops import _disable_kernels

    out = failures(verdicts)
    _disable_kernels(table, out)
    return out


def gpu_runner(table: _dispatch._Table, case: Case) -> Outcome:
    """Run ``case`` on the table's GPU through the real launch path, against a float64 reference on random inputs."""
    import torch

    from .ops import _dispatch, _kernel

    d = OPS[case.op]
    m, n, k = case.shape
    dev = torch.device("cuda", table.index)
    gen = torch.Generator(device=dev).manual_seed(1234 + m * 7 + n * 13 + k)
    x = torch.randn(m, k, device=dev, generator=gen).to(getattr(torch, d.x_dtype))
    w32 = torch.randn(n, k, device=dev, generator=gen)
    w = w32.to(getattr(torch, d.w_dtype))
    scale = None
    if d.scaled:
        scale = (torch.rand(1 if case.scale == TENSOR_SCALE else n, device=dev, generator=gen) + 0.5).float()
    out = torch.full((m, n), float("nan"), device=dev, dtype=getattr(torch, d.out_dtype))  # an unwritten element fails
    _kernel.check_operands(case.op, table.index, _dispatch._cpu_index, out, x, w, scale)
    # a fault to build, load or launch warns once there (naming kernel, device, error) and fails the op on the table
    ok = _kernel.launch(table, case.op, out, x, w, scale, m, n, k, case.scale)  # the profile's split-K, as dispatch
    if ok:
        torch.cuda.synchronize(dev)
    if not ok:
        return Outcome(False, None, table.errors.get(case.op, "the kernel could not be built, loaded or launched"))
    wd = w.double() * (scale.double().reshape(-1, 1) if scale is not None else 1)
    ref = x.double() @ wd.t()
    got = out.double()
    if not bool(torch.isfinite(got).all()):
        return Outcome(False, None, "the output has NaN or Inf (an element the kernel never wrote)")
    rel = float((got - ref).norm() / ref.norm().clamp_min(1e-30))
    tol = TOLERANCE[d.out_dtype]
    return Outcome(rel <= tol, rel, "" if rel <= tol else f"relative error {rel:.3g} above {tol:g} against float64")


def on_gpu(prof: Profile) -> bool:
    """Whether ``prof``'s device is a real GPU (a simulated one has nothing to run on; the CPU tests' seam)."""
    return not prof.device.simulated


def at_first_use(prof: Profile) -> dict[str, str]:
    """``HWPROFILE_SELFTEST=1``: check a real device's kernels when its dispatch table is built; the ops to disable there.

    Core's :func:`~hwprofile.hookspecs.hwprofile_check_kernels` (``hwprofile.ops`` applies the answer). A verdict
    file that cannot be written costs a warning (the kernels are checked again next time), never the answer.
    """
    if not on_gpu(prof) or not prof.kernels:
        return {}
    from .ops import _dispatch

    strict = _dispatch.table(prof.device.index).strict  # the table being built: this runs inside its construction
    try:
        report, merged = _check(prof, None, False)
    except HwprofileError:
        if strict:
            raise
        log.warning("hwprofile: the self-test of cuda:%d could not run", prof.device.index, exc_info=True)
        return {}
    reasons = failures(report.verdicts)
    try:
        write(report.path, merged)
    except HwprofileError as exc:
        log.warning("hwprofile: the self-test verdicts of cuda:%d were not stored (%s); they run again in the next process",
                    prof.device.index, exc)
    log.info("self-test of cuda:%d: %d verdicts (%d run now), %d ops disabled; %s", prof.device.index, len(report.verdicts),
             sum(v.fresh for v in report.verdicts), len(reasons), report.path)
    return reasons


def summary(prof: Profile) -> list[dict[str, Any]]:
    """The stored verdicts of ``prof``'s device per op, for ``explain`` and ``doctor`` (runs nothing)."""
    good, todo = stored(prof)
    out = []
    for op in OPS:
        if op not in prof.kernels:
            continue
        mine = [v for v in good if v.op == op]
        pending = [c for c in todo if c.op == op]
        failed = [v for v in mine if not v.ok]
        if failed:
            state = f"FAILED: {failed[0].instance}: {failed[0].error or f'relative error {failed[0].rel_error:.3g}'}"
        elif pending:
            state = f"not checked: {len(pending)} of {len(pending) + len(mine)} instances have no verdict for this stamp"
        elif mine:
            worst = max((v.rel_error or 0.0) for v in mine)
            state = f"passed: {len(mine)} instances, largest relative error {worst:.2g} ({mine[0].date})"
        else:
            state = "nothing to check: no shape of the op's grid routes to the kernel"
        out.append({"op": op, "state": state, "passed": len(mine) - len(failed), "failed": len(failed), "unchecked": len(pending)})
    return out
