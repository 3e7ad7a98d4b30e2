"""Verification on first use: a kernel instance serves no routed call before it matched float64 on this device. Never routes.

Why: a kernel compiled for a GPU nobody here had (``sm_100a``, ``sm_120a``, any plugin ``hwprofile
new-plugin --family`` writes) is correct only by construction until it runs; a launch error falls
back, a wrong result would not.

* **When.** :func:`ensure` runs where a kernel instance is first made ready on a dispatch table
  (:func:`hwprofile.ops._kernel._load`: at :func:`hwprofile.ops.warmup` or at the first eager call a
  route sends to it), before its launcher is kept. An instance is one launch plan (name expression,
  grid, block, shared memory, PDL) at one shape.
* **What.** The instance runs at that shape on seeded inputs, three sets: normal values with rows of
  very different magnitude; a constant row and the weight dtype's extreme values (e4m3's 448 and
  subnormals, bf16 over 2^±8 per element, per-row scales over 2^±6); and all-zero activations, whose
  output must be exactly zero. Each output row is compared with a float64 reference (relative error
  of the row, :data:`hwprofile._verdicts.TOLERANCE` by output dtype); an element the kernel never
  wrote stays NaN and fails. The reference is computed in N-chunks, so no float64 weight is held.
* **Verdicts** are :mod:`hwprofile._verdicts`' records: stamped with device, driver, plugin, target,
  kernel source and plan; kept in memory, in the device's verdict file (which ``hwprofile selftest``
  shares), and in the fleet store when ``HWPROFILE_REMOTE`` names one, so a fleet verifies each
  instance once. A passing verdict costs nothing afterwards (a dict lookup where the launcher is made).
* **A failing instance** disables its op's kernel on the device with one warning naming the op, the
  instance, the shape and the error; the call that found it, and every later one, takes the fallback
  (strict mode raises). A launch the driver refuses is the launch path's fault, not a verdict.
* **Inside a CUDA-graph capture** an instance without a verdict raises :class:`NotVerifiedError`
  (naming the op, the shape and the warm-up to call) before anything reaches the stream.
* **Off** only by the user's choice: ``HWPROFILE_VERIFY=off`` or the setting ``verify`` (``explain`` names who).
* **Simulated devices** run nothing (there is no GPU); ``explain`` says the instance is not yet verified.
  :data:`on_simulated` is the CPU tests' seam that turns it on there.
"""

from __future__ import annotations

import datetime as _dt
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _state, _verdicts
from .._log import get_logger
from ..errors import HwprofileError, KernelError, NotVerifiedError
from ..optable import OPS, ROW_SCALE, TENSOR_SCALE

if TYPE_CHECKING:
    from ..kernels.spec import Launch
    from ..profiles import Profile
    from ._table import Table as _Table

log = get_logger(__name__)

#: test seam: verify on simulated devices too (CPU tensors under ``_dispatch._cpu_index``, a fake kernel)
on_simulated: bool = False

Shape = tuple[int, int, int]
#: ``run_once(out, x, w, scale)``: launch the instance on these operands (what :func:`check` calls per input set)
RunOnce = Callable[[Any, Any, Any, Any], None]


Outcome = _verdicts.Outcome


@dataclass
class _Book:
    """One device's verdicts in this process: what the file held when first asked, and what ran since."""

    path: Path | None
    verdicts: dict[_verdicts.Key, _verdicts.Verdict] = field(default_factory=dict)
    read: bool = False


_books: dict[int, _Book] = {}
_lock = threading.RLock()


@_state.on_reset
def _forget() -> None:
    with _lock:
        _books.clear()


@_state.in_forked_child
def _reinit_lock_in_child() -> None:
    global _lock
    _lock = threading.RLock()


def enabled(prof: Profile) -> bool:
    """Whether verification runs for ``prof``'s device: the setting ``verify`` and a GPU (or the test seam)."""
    return bool(prof["verify"]) and (on_simulated or not prof.device.simulated)


def _book(prof: Profile) -> _Book:
    idx = prof.device.index
    b = _books.get(idx)
    if b is None:
        try:
            path: Path | None = _verdicts.path_for(prof)
        except HwprofileError as exc:  # no config dir (a user with no home): verdicts live in memory only
            log.warning("hwprofile: kernel verdicts of cuda:%d are kept in memory only: %s", idx, exc)
            path = None
        b = _books[idx] = _Book(path)
    return b


def lookup(prof: Profile, op: str, plan: Launch, shape: Shape, scale: int, *, remote: bool = True) -> _verdicts.Verdict | None:
    """The verdict of this instance whose stamp matches what would run now: memory, the file, the fleet store; None if none."""
    st = _verdicts.stamp(prof, op, plan, shape, scale)
    key = (op, plan.name_expression, shape)
    with _lock:
        b = _book(prof)
        v = b.verdicts.get(key)
        if (v is None or v.stamp != st) and b.path is not None:
            b.verdicts.update(_verdicts.read(b.path))  # another process may have verified it meanwhile
            b.read = True
            v = b.verdicts.get(key)
    if v is not None and v.stamp == st:
        return v
    if remote:
        got = _from_store(st)
        if got is not None:
            with _lock:
                _book(prof).verdicts[key] = got
            return got
    return None


def _from_store(st: dict[str, Any]) -> _verdicts.Verdict | None:
    from .. import _remote

    store = _remote.store()
    if store is None:
        return None
    key = _verdicts.remote_key(st, _remote.NAMESPACE)
    data = store.get("verdict", key, _verdicts.MAX_REMOTE_BYTES)
    if data is None:
        return None
    v = _verdicts.decode(data, st)
    _remote.note("verdict", "hits" if v is not None else "rejected")
    if v is None:
        log.warning("hwprofile: the fleet store's verdict %s is malformed or stamped for something else; it is not trusted", key)
    return v


def record(prof: Profile, v: _verdicts.Verdict) -> None:
    """Keep ``v`` in memory, the device's verdict file (best effort: a warning) and the fleet store (best effort)."""
    from .. import _remote

    with _lock:
        b = _book(prof)
        b.verdicts[v.key] = v
        if b.path is not None:
            try:
                on_disk = _verdicts.read(b.path)
                on_disk[v.key] = v
                _verdicts.write(b.path, on_disk.values())
            except HwprofileError as exc:
                log.warning("hwprofile: the verdict of %s %s was not stored (%s); it is checked again in the next process",
                            v.op, v.instance, exc)
    store = _remote.store()
    if store is not None:
        store.put("verdict", _verdicts.remote_key(v.stamp, _remote.NAMESPACE), _verdicts.encode(v))


def fleet_once(prof: Profile, st: dict[str, Any], run: Callable[[], _verdicts.Verdict]) -> _verdicts.Verdict:
    """``run()`` the check and :func:`record` its verdict; with a fleet store, under the instance's verify lock, so a fleet of
    cold hosts checks each instance once (the tune and compile locks' semantics: the store read again under the lock, a
    holder alive past :data:`hwprofile._remote.VERIFY_WAIT_S` or a store that fails and this host checks on its own)."""
    from .. import _remote

    store = _remote.store()
    lock = None
    if store is not None:
        lock = store.lock(_remote.verify_lock_key(_verdicts.remote_key(st, _remote.NAMESPACE)), purpose=_remote.VERIFY, quiet=True)
        if lock.acquire(_remote.VERIFY_WAIT_S) is not True:
            lock = None
        else:
            got = _from_store(st)  # checked by another host while this one waited
            if got is not None:
                lock.release()
                with _lock:
                    _book(prof).verdicts[got.key] = got
                return got
    try:
        v = run()
        record(prof, v)
        return v
    finally:
        if lock is not None:
            lock.release()


def ensure(t: _Table, op: str, plan: Launch, shape: Shape, scale: int, launch_on: RunOnce, *, capturing: bool) -> bool:
    """True if the instance may serve routed calls on ``t``'s device; False after disabling its op there (one warning).

    ``launch_on(out, x, w, scale)`` launches the instance on the current stream. Inside a capture an instance without
    a verdict is :class:`NotVerifiedError`. A launch error while checking is a :class:`KernelError` for the
    caller's launch-fault handling (no verdict is written: the driver refused, the kernel did not compute wrong).
    """
    prof = t.prof
    if not enabled(prof):
        return True
    m, n, k = shape
    v = lookup(prof, op, plan, shape, scale)
    if v is None:
        if capturing:
            raise NotVerifiedError(
                f"{op} (M={m}, N={n}, K={k}) was first called inside a CUDA-graph capture on cuda:{t.index}, and its kernel instance "
                f"{plan.name_expression} has no verdict on this device ({prof.device.name}): it is verified against float64 before "
                f"it serves a call, which cannot happen inside a capture; call hwprofile.ops.warmup(device={t.index}, "
                f"shapes={{{op!r}: [({m}, {n}, {k})]}}) (or call the op once at that shape) before capturing"
            )
        v = fleet_once(prof, _verdicts.stamp(prof, op, plan, shape, scale), lambda: _run(t, op, plan, shape, scale, launch_on))
    if v.ok:
        return True
    _disable(t, op, v)
    return False


def _run(t: _Table, op: str, plan: Launch, shape: Shape, scale: int, launch_on: RunOnce) -> _verdicts.Verdict:
    import time

    import torch

    # a simulated device runs verification only under the CPU tests' seam (on_simulated), on CPU tensors
    dev = torch.device("cpu") if t.prof.device.simulated else torch.device("cuda", t.index)

    def run_once(out: Any, x: Any, w: Any, s: Any) -> None:
        try:
            launch_on(out, x, w, s)
        except Exception as exc:
            if isinstance(exc, KernelError):
                raise
            raise KernelError(f"launching the {op} kernel to verify it: {type(exc).__name__}: {exc}") from exc
        if dev.type == "cuda":
            torch.cuda.current_stream(dev).synchronize()

    t0 = time.perf_counter()
    res = check(op, shape, scale, dev, run_once)
    ms = (time.perf_counter() - t0) * 1e3
    log.info("hwprofile: verified %s %s at M=%d, N=%d, K=%d on cuda:%d in %.1f ms: %s", op, plan.name_expression, *shape, t.index, ms,
             "passed" if res.ok else res.error)
    return verdict(t, op, plan, shape, scale, res)


def verdict(t: _Table, op: str, plan: Launch, shape: Shape, scale: int, res: Outcome) -> _verdicts.Verdict:
    """The stamped verdict of a check this process ran (``scale``: the op's scale mode, or the gate's selection code)."""
    date = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    st = _verdicts.stamp(t.prof, op, plan, shape, scale)
    return _verdicts.Verdict(op, plan.name_expression, st, res.ok, res.rel_error, res.error, shape, date, fresh=True,
                             where="this process")


def _disable(t: _Table, op: str, v: _verdicts.Verdict) -> None:
    why = (f"its instance {v.instance} at M, N, K = {v.shape} failed verification against float64 ({v.where}, {v.date}): "
           f"{v.error or f'relative error {v.rel_error:.3g}'}")
    if t.strict:
        raise KernelError(f"{op} on cuda:{t.index} ({t.prof.device.name}): {why}")
    if op in t.errors:
        return
    t.fail(op, why)
    warnings.warn(f"hwprofile: {op} kernel disabled on cuda:{t.index} ({t.prof.device.name}): {why}; using the torch fallback "
                  f"(the verdict stays until the driver, plugin or kernel changes: 'hwprofile doctor' shows it; report it to the "
                  f"plugin's authors with 'hwprofile doctor --json')",
                  RuntimeWarning, stacklevel=7)  # _disable <- ensure <- _load <- launch <- _dispatch <- call <- the op


# --- the check -------------------------------------------------------------------------------------


def inputs(op: str, shape: Shape, scale: int, device: Any, seed: int = 0) -> list[tuple[str, Any, Any, Any]]:
    """The input sets an instance is checked on: ``[(name, x, w, scale), ...]`` in the op's dtypes on ``device``."""
    import torch

    d = OPS[op]
    m, n, k = shape
    # generated on the device (a CPU generator and a copy cost tens of ms at lm-head sizes)
    gen = torch.Generator(device=device).manual_seed(1234 + seed + 7 * m + 13 * n + k)
    dev = {"device": device, "generator": gen}

    def powers(rows: int, cols: int, lo: int, hi: int) -> Any:
        return torch.pow(2.0, torch.randint(lo, hi + 1, (rows, cols), **dev).float())

    xdt, wdt = getattr(torch, d.x_dtype), getattr(torch, d.w_dtype)
    fp8 = d.w_dtype.startswith("float8")
    sets: list[tuple[str, Any, Any, Any]] = []
    # 1. normal values, rows of very different magnitude
    x = torch.randn(m, k, **dev) * powers(m, 1, -6, 6)
    w = torch.randn(n, k, **dev) * (32.0 if fp8 else 1.0)
    sets.append(("random", x, w, _scale(scale, n, dev, -1, 1)))
    # 2. extremes: per-element magnitudes over 2^±8, a constant last row, the weight dtype's largest and smallest values
    x = torch.randn(m, k, **dev) * powers(m, k, -8, 8)
    if m > 1:
        x[-1] = 1.0
    if fp8:
        pick = torch.tensor([448.0, -448.0, 2.0 ** -9, -(2.0 ** -9), 240.0, 0.0, 1.0, -1.0], device=device)
        w = pick[torch.randint(0, len(pick), (n, k), **dev)] * (torch.rand(n, k, **dev) < 0.5)
        w = w + torch.randn(n, k, **dev).clamp(-8, 8) * (w == 0)
    else:
        w = torch.randn(n, k, **dev) * powers(n, k, -8, 8)
    sets.append(("extremes", x, w, _scale(scale, n, dev, -6, 6)))
    # 3. zero activations: the output is exactly zero (an accumulator never cleared, a stale partial sum shows)
    sets.append(("zeros", torch.zeros(m, k, device=device), torch.randn(n, k, **dev), _scale(scale, n, dev, 0, 0)))
    return [(name, x.to(xdt), w.to(wdt), s) for name, x, w, s in sets]


def _scale(scale: int, n: int, dev: dict[str, Any], lo: int, hi: int) -> Any:
    import torch

    if scale == TENSOR_SCALE:
        return torch.pow(2.0, torch.randint(lo, hi + 1, (1,), **dev).float()) * 0.75
    if scale == ROW_SCALE:
        return torch.pow(2.0, torch.randint(lo, hi + 1, (n,), **dev).float()) * (0.5 + torch.rand(n, **dev))
    return None


#: rows of the weight compared at a time: the float64 reference never holds more than this many rows of it
REF_CHUNK = 4096


def compare(op: str, out: Any, x: Any, w: Any, scale: Any) -> Outcome:
    """``out`` against the float64 reference of ``x . (w * scale)^T``, row by row (module doc)."""
    import torch

    d = OPS[op]
    if not bool(torch.isfinite(out).all()):
        return Outcome(False, None, "the output has NaN or Inf (an element the kernel never wrote, or an overflow it made)")
    x64 = x.double()
    m, n = out.shape
    err2 = torch.zeros(m, dtype=torch.float64, device=out.device)
    ref2 = torch.zeros(m, dtype=torch.float64, device=out.device)
    for lo in range(0, n, REF_CHUNK):
        hi = min(n, lo + REF_CHUNK)
        wd = w[lo:hi].double()
        if scale is not None:
            s = scale.double().reshape(-1)
            wd = wd * (s[lo:hi].reshape(-1, 1) if s.numel() > 1 else s.reshape(1, 1))
        ref = x64 @ wd.t()
        err2 += (out[:, lo:hi].double() - ref).pow(2).sum(1)
        ref2 += ref.pow(2).sum(1)
    zero_rows = ref2 == 0
    if bool((err2[zero_rows] != 0).any()):
        row = int(torch.nonzero(zero_rows & (err2 != 0))[0, 0])
        return Outcome(False, None, f"row {row} must be exactly zero (zero activations), it is not")
    rel = (err2 / ref2.clamp_min(1e-300)).sqrt()
    rel = torch.where(zero_rows, torch.zeros_like(rel), rel)
    worst = float(rel.max()) if m else 0.0
    tol = _verdicts.TOLERANCE[d.out_dtype]
    if worst > tol:
        row = int(rel.argmax())
        return Outcome(False, worst, f"relative error {worst:.3g} in row {row} above {tol:g} against float64")
    return Outcome(True, worst)


def check(op: str, shape: Shape, scale: int, device: Any, run_once: RunOnce) -> Outcome:
    """Run the instance (``run_once``) on every input set of :func:`inputs` and compare each; the first failure, or the worst pass."""
    import torch

    d = OPS[op]
    worst = 0.0
    m, n, _ = shape
    for name, x, w, s in inputs(op, shape, scale, device):
        out = torch.full((m, n), float("nan"), dtype=getattr(torch, d.out_dtype), device=device)
        run_once(out, x, w, s)
        res = compare(op, out, x, w, s)
        if not res.ok:
            return Outcome(False, res.rel_error, f"{name} inputs: {res.error}")
        worst = max(worst, res.rel_error or 0.0)
    return Outcome(True, worst)


# --- what it says ----------------------------------------------------------------------------------


def state(prof: Profile, op: str, plan: Launch, shape: Shape, scale: int) -> str:
    """The instance's verification state in words (``explain OP --shape``): verified, failed, not yet, or off and by whom."""
    if not prof["verify"]:
        who = prof.explain("verify").winner.source
        return f"verification off ({who}): this instance serves calls unchecked on this GPU"
    v = lookup(prof, op, plan, shape, scale, remote=False)
    if v is not None:
        return f"{plan.name_expression}: {v.describe()}"
    where = "on its first use on the GPU" if prof.device.simulated else "before its first call here (warm-up or first eager call)"
    return f"{plan.name_expression}: not yet verified on this device; it is checked against float64 {where}"


def states(prof: Profile, op: str, m: int, n: int, k: int) -> list[str]:
    """Each instance ``op`` would launch at (m, n, k) on ``prof``'s device (every scale mode), in :func:`state`'s words."""
    d = OPS.get(op)
    spec = prof.kernels.get(op)
    if d is None or spec is None:
        return []
    split = bool(prof["gemv.split_k"])
    out = []
    for mode in d.scale_modes if d.scaled else (0,):
        try:
            plan = spec.configure(m=m, n=n, k=k, split_k=split, **({"scale": mode} if d.scaled else {}))
        except ValueError:
            continue  # a shape the planner refuses has no instance (the route says so)
        out.append(state(prof, op, plan, (m, n, k), mode))
    return out


# --- what waited for the first launch: the launch plans of measured values -------------------------

_plans_warned: set[str] = set()


@_state.on_reset
def _forget_plan_warnings() -> None:
    _plans_warned.clear()


def check_deferred_plans(t: _Table) -> None:
    """A real GPU's first dispatch table: compare the launch plans of the profile's stamped values, which ``profile()`` could not.

    A plan depends on the GPU's SM count, which only the CUDA driver gives; ``profile()`` never starts the
    driver (:data:`hwprofile.tuning.PLAN_AT_LAUNCH`), and the first table is where the ops need it anyway.
    A value measured with another plan is reported once per process, like a stale shipped threshold:
    it still applies (strict mode: a :class:`~hwprofile.errors.SettingError`), and ``hwprofile tune``
    re-measures it.
    """
    from .. import tuning
    from ..errors import SettingError

    prof = t.prof
    if prof.device.simulated or not any(tuning.plan_waits_for_driver(s) for s in prof.kernels.values()):
        return
    for spec in prof.kernels.values():
        if tuning.plan_waits_for_driver(spec):
            getattr(spec.configure, "tuning")  # noqa: B009 - a Planner's property: reads the SM count and shared memory once
    staleness = tuning.Staleness(prof.device, prof.selection, prof.kernels)
    keys: list[str] = []
    whys: list[str] = []
    for key, r in prof.settings.items():
        st = r.winner.stamp
        if isinstance(st, tuning.Stamp) and st.plan:
            changed = [w for w in staleness.compare(st).stale if w.startswith("launch plan changed")]
            if changed:
                keys.append(f"{key} ({r.winner.source})")
                whys += changed
    if not keys:
        return
    msg = (f"hwprofile: {len(keys)} measured value(s) of cuda:{t.index} ({prof.device.name}) were measured with another launch plan "
           f"than this GPU's ({whys[0]}{f' and {len(whys) - 1} more' if len(whys) > 1 else ''}; checked at the first launch, since "
           f"the plan needs the driver): {', '.join(keys[:6])}{' ...' if len(keys) > 6 else ''}; they still apply. "
           f"Re-measure them: hwprofile tune --device {t.index}")
    if t.strict:
        raise SettingError(f"{msg} [strict is on: stale values are errors]")
    if msg not in _plans_warned:
        _plans_warned.add(msg)
        log.warning(msg)
