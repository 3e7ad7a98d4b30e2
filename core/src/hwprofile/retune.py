"""Self-healing thresholds: re-measure only what went stale, on every rank alike, and write it whole.

:func:`plan` reads a resolved profile and says, op by op, whether its measured values still hold
for this device (:class:`Finding`): "changed" when a stamp the values depend on is stale (another
fallback function, kernel source, launch plan, device generation, plugin; on a real GPU another
major.minor of torch or cuBLAS: what :func:`hwprofile.tuning.compare` calls stale, never "cannot
tell"), "unmeasured" when nothing was measured on this SKU (only declared defaults, or a stamp
naming another card), "fresh" otherwise. :func:`tune` re-measures the ops that need it, each over
the grid ``hwprofile sweep`` measures by default (:func:`hwprofile.sweep.default_grid`), with the
same timer, method and noise floor (:func:`hwprofile.sweep.run` picks the thresholds), writes the
stamped tuned file where the profile reads it (:func:`hwprofile.tuning.tuned_dir`, through
:func:`hwprofile.sweep.write`: temp file, fsync, rename), and resolves the profile again.

Ranks alike: inside a torch.distributed job every rank calls :func:`tune`; the ranks split the
points to measure (greedy by estimated cost, the same split on every rank), exchange their
measurements over the job's group (bounded waits) and every rank builds the same document from the
same points, so every rank writes and applies the same table and ``check_agreement()`` holds
after. A rank that fails makes every rank raise the same :class:`TuneError`. Processes of one host
sharing a config directory tune once: one file lock per (host, tuned directory), taken with a
bounded wait; a process that waits re-reads the directory before it plans, and one that gives up
keeps the values already there.

``HWPROFILE_TUNE=stale`` runs :func:`at_first_profile` from the first ``profile()`` of a device
(through the hook ``hwprofile_first_profile``, answered by :mod:`hwprofile._core_plugin`: this module
measures through ``hwprofile.ops``, which sits above profiles, so profiles never imports it); never on a simulated device, never inside
CUDA-graph capture.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import _env
from ._log import get_logger
from ._record import Record, final
from .errors import HwprofileError
from .optable import TABLE

if TYPE_CHECKING:
    from .device import DeviceInfo
    from .profiles import Profile
    from .sweep import Point, Timer

log = get_logger(__name__)

#: How long a process waits for another one tuning the same tuned directory on this host.
LOCK_TIMEOUT_S = 600.0
#: Seconds of host work per measured graph (weights, capture, events) that the bandwidth model leaves out.
_GRAPH_OVERHEAD_S = 0.03
_HOST_CALL_S = 30e-6  # Python per kernel or fallback call outside the graph (warm-up and capture)
_LAUNCH_FLOOR_US = 2.5  # the shortest call a graph replay times (launch-bound shapes)
_DEFAULT_BANDWIDTH = 2.0e12  # bytes/s when the device reports no memory bus (a guess: estimates only)
_KEPT = "no tuned file was changed"


class TuneError(HwprofileError):
    """Tuning could not finish: the text says what failed, on which rank or device, and that no file changed."""


# --- what is stale ------------------------------------------------------------------------------


@final
class Finding(Record):
    """One op on one device: whether its measured values hold, and why not."""

    op: str
    #: ``changed`` (a stamp is stale), ``unmeasured`` (nothing measured on this SKU), ``forced`` (``--all``),
    #: ``fresh``, or ``no kernel`` (the plugin has no kernel for the op here: nothing to measure).
    status: str
    reasons: tuple[str, ...] = ()
    #: Stale tuned files that stay ignored after tuning (a newer tuned value wins over them): remove them.
    leftovers: tuple[str, ...] = ()

    @property
    def measure(self) -> bool:
        return self.status in ("changed", "unmeasured", "forced")


@final
class Plan(Record):
    """What :func:`tune` would measure on one device: a finding per op, the grid of each op to measure."""

    index: int
    device: str  #: the device identity stamps record (``tuning.device_identity``)
    findings: tuple[Finding, ...]
    grids: Mapping[str, tuple[tuple[int, int, int], ...]]
    bandwidth: float  #: bytes/s the estimate assumes

    def points(self) -> list[tuple[str, int, int, int]]:
        return [(op, m, n, k) for op, grid in self.grids.items() for (m, n, k) in grid]

    def estimate_s(self, reps: int = 15) -> float:
        """Seconds of GPU time the measurements take on one GPU (a model, good to about 2x)."""
        return sum(cost(p, self.bandwidth, reps) for p in self.points())

    def as_dict(self, reps: int = 15) -> dict[str, Any]:
        return {
            "device": self.index,
            "identity": self.device,
            "ops": [
                {"op": f.op, "status": f.status, "reasons": list(f.reasons), "leftovers": list(f.leftovers),
                 "points": len(self.grids.get(f.op, ()))}
                for f in self.findings
            ],
            "points": len(self.points()),
            "estimate_s": round(self.estimate_s(reps), 1),
        }


def decided_keys(op: str) -> tuple[str, ...]:
    """The settings a sweep of ``op`` writes (what its measurement decides), asked of sweep itself: the model
    and the per-shape table :func:`hwprofile.sweep.run` adds to it."""
    from .sweep import Point, thresholds_for
    from .tuning import measured_key

    grid = TABLE[op].grid
    chosen, _ = thresholds_for(op, [Point(m, n, k, [1.0], [2.0]) for m, n, k in grid], "fallback")
    return (*chosen, measured_key(op))


def _measured_winner(chain: Sequence[Any]) -> Any:
    """The layer whose value applies, the user's environment left out (an override says nothing about a measurement)."""
    return next(layer for layer in reversed(chain) if layer.applied and layer.kind != "env")


def findings(prof: Profile, *, everything: bool = False) -> list[Finding]:
    """A :class:`Finding` per op of the op table for ``prof``'s device (module docstring)."""
    from . import tuning

    staleness = tuning.Staleness(prof.device, prof.selection, prof.kernels)
    here = tuning.device_identity(prof.device)
    out = []
    for op in TABLE:
        if op not in prof.kernels:
            who = prof.plugin.label if prof.plugin else "no architecture plugin"
            out.append(Finding(op, "no kernel", (f"{who} provides no {op} kernel for {prof.device.sm}",)))
            continue
        stamped, unstamped, ignored, tuned_wins = _winners(prof, op)
        changed = []
        elsewhere = []
        for source, stamp in stamped.items():
            c = staleness.compare(stamp)
            if c.stale:
                changed.append(f"{source} (applies): {'; '.join(c.stale)}")
            elif stamp.device != here:
                elsewhere.append(f"the values from {source} were measured on {stamp.device}, not on {here}")
        leftovers: tuple[str, ...] = ()
        if ignored and not tuned_wins:
            changed += [f"{source} (ignored): {what}" for source, what in ignored.items()]
        elif ignored:
            leftovers = tuple(f"{source} is stale ({what}) and stays ignored: remove it" for source, what in ignored.items())
        if changed:
            out.append(Finding(op, "changed", tuple(changed), leftovers))
        elif not stamped:
            why = ", ".join(sorted(unstamped)) or "declared defaults"
            out.append(Finding(op, "unmeasured", (f"nothing measured on {here}: its values come from {why}, unstamped",)))
        elif elsewhere:
            out.append(Finding(op, "unmeasured", tuple(elsewhere), leftovers))
        else:
            out.append(Finding(op, "forced" if everything else "fresh", ("measured here; re-measured by --all",) if everything else (),
                               leftovers))
    return out


def _winners(prof: Profile, op: str) -> tuple[dict[str, Any], set[str], dict[str, str], bool]:
    """What decides ``op``'s measured settings on ``prof``: the stamps of the winning layers by source, the sources
    that won unstamped, the stale tuned files left unapplied (source -> what changed), and whether a tuned file won."""
    from . import tuning

    stamped: dict[str, Any] = {}  # source -> stamp of the winning layers
    unstamped: set[str] = set()
    ignored: dict[str, str] = {}  # stale tuned files left unapplied: source -> what changed
    tuned_wins = False
    for key in decided_keys(op):
        rs = prof.settings.get(key)
        if rs is None:
            continue
        win = _measured_winner(rs.chain)
        if isinstance(win.stamp, tuning.Stamp):
            stamped.setdefault(win.source, win.stamp)
            tuned_wins = tuned_wins or win.kind == "tuned"
        else:
            unstamped.add(win.source)
        for layer in rs.chain:
            if not layer.applied and layer.kind == "tuned" and layer.stale:
                ignored.setdefault(layer.source, layer.stale)
    return stamped, unstamped, ignored, tuned_wins


def plan(prof: Profile, *, everything: bool = False, ops: Sequence[str] | None = None) -> Plan:
    """What :func:`tune` would measure for ``prof`` (``everything``: every op that has a kernel; ``ops``: only these)."""
    from .sweep import default_grid

    fs = findings(prof, everything=everything)
    if ops is not None:
        unknown = [o for o in ops if o not in TABLE]
        if unknown:
            raise TuneError(f"unknown op {unknown[0]!r}; known ops: {', '.join(TABLE)}")
        fs = [f for f in fs if f.op in ops]
    grids = {f.op: tuple(default_grid(f.op)) for f in fs if f.measure}
    from . import tuning

    return Plan(prof.device.index, tuning.device_identity(prof.device), tuple(fs), grids, bandwidth(prof.device))


def bandwidth(info: DeviceInfo) -> float:
    """Peak memory bandwidth (bytes/s) from the device's bus width and memory clock (double data rate)."""
    from .device import with_details

    try:
        d = with_details(info)
    except Exception:  # noqa: BLE001 - an estimate must never stop planning
        d = info
    if d.memory_bus_width_bits and d.max_memory_clock_mhz:
        return d.memory_bus_width_bits / 8 * d.max_memory_clock_mhz * 1e6 * 2
    return _DEFAULT_BANDWIDTH


def point_seconds(op: str, m: int, n: int, k: int, bw: float, reps: int = 15, passes: int = 2, rotate: int = 256 << 20) -> float:
    """GPU seconds :class:`hwprofile.sweep.GpuTimer` spends on one point: ``passes`` x (kernel, fallback) graphs,
    each run once, captured, replayed ``1 + reps`` times over its rotating weight copies."""
    d = TABLE[op]
    wbytes = n * k * (1 if d.scaled else 2)
    copies = max(2, min(64, -(-rotate // wbytes)))
    call_s = max(_LAUNCH_FLOOR_US * 1e-6, (wbytes + 2 * m * k + 4 * m * n) / (0.8 * bw))
    # warm-up and capture on the host, the replays on the GPU, and making the weight copies
    graph_s = copies * (2 * _HOST_CALL_S + call_s * (reps + 2)) + copies * wbytes * 3 / bw + _GRAPH_OVERHEAD_S
    return passes * 2 * graph_s


# --- measuring, splitting, exchanging ------------------------------------------------------------


def _point_dict(p: Point, op: str) -> dict[str, Any]:
    return {"op": op, "m": p.m, "n": p.n, "k": p.k, "kernel_us": p.kernel_us, "fallback_us": p.fallback_us,
            "kernel_passes": p.kernel_passes, "fallback_passes": p.fallback_passes}


def _point(d: Mapping[str, Any]) -> Point:
    from .sweep import Point

    return Point(int(d["m"]), int(d["n"]), int(d["k"]), [float(x) for x in d["kernel_us"]], [float(x) for x in d["fallback_us"]],
                 [float(x) for x in d["kernel_passes"]], [float(x) for x in d["fallback_passes"]])


def cost(p: tuple[str, int, int, int], bw: float, reps: int = 15) -> float:
    """:func:`point_seconds` of one ``(op, m, n, k)``."""
    return point_seconds(p[0], p[1], p[2], p[3], bw, reps)


def split(points: Sequence[tuple[str, int, int, int]], size: int, bw: float, reps: int = 15) -> list[list[tuple[str, int, int, int]]]:
    """``points`` shared among ``size`` ranks, longest first to the least loaded (the same answer on every rank)."""
    shares: list[list[tuple[str, int, int, int]]] = [[] for _ in range(size)]
    loads = [0.0] * size
    for p in sorted(points, key=lambda p: (-cost(p, bw, reps), p)):
        r = min(range(size), key=lambda i: (loads[i], i))
        shares[r].append(p)
        loads[r] += cost(p, bw, reps)
    order = {op: i for i, op in enumerate(TABLE)}
    return [sorted(s, key=lambda p: (order[p[0]], p[1:])) for s in shares]  # op by op: one progress line per op


class _Replay:
    """A :class:`hwprofile.sweep.Timer` that hands back points measured already (on any rank)."""

    def __init__(self, points: Mapping[tuple[str, int, int, int], Point]) -> None:
        self.points = points

    def measure(self, op: str, m: int, n: int, k: int) -> Point:
        return self.points[(op, m, n, k)]


class _Group:
    """The job's torch.distributed group as :func:`tune` uses it: rank, size, a bounded exchange of JSON."""

    def __init__(self, group: Any) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.group = torch, dist, group
        pg = group if group is not None else dist.group.WORLD
        self.rank, self.size = dist.get_rank(pg), dist.get_world_size(pg)
        backend = str(dist.get_backend(pg)).lower()
        cuda = "nccl" in backend and "gloo" not in backend
        self.dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    def exchange(self, obj: Any, timeout_s: float, what: str) -> list[Any]:
        """Every rank's ``obj`` (JSON), in rank order, within ``timeout_s`` per collective, or a :class:`TuneError`
        that reads the same on every rank that raises it."""
        torch, dist = self.torch, self.dist
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
        blob = json.dumps(obj, sort_keys=True).encode()
        try:
            sizes = torch.zeros(self.size, dtype=torch.int64, device=self.dev)
            gather(sizes, torch.tensor([len(blob)], dtype=torch.int64, device=self.dev), group=self.group, async_op=True).wait(
                timedelta(seconds=timeout_s)
            )
            lengths = [int(x) for x in sizes.cpu().tolist()]
            width = max(lengths)
            buf = torch.zeros(width, dtype=torch.uint8)
            buf[: len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
            out = torch.empty(self.size * width, dtype=torch.uint8, device=self.dev)
            gather(out, buf.to(self.dev), group=self.group, async_op=True).wait(timedelta(seconds=timeout_s))
            raw = bytes(out.cpu().tolist())
        except Exception as exc:  # a rank that died, hung or never called tune()
            log.info("hwprofile tune: the exchange of %s failed on rank %d: %s", what, self.rank, exc)
            raise TuneError(
                f"hwprofile tune: the {self.size} ranks could not exchange {what} within {timeout_s:g} s (a rank failed, hung, or "
                "did not call hwprofile.tune()); no tuned file was changed. Every rank must call hwprofile.tune() (or run "
                "'hwprofile tune' under torchrun); raise timeout= if ranks legitimately take longer"
            ) from exc
        return [json.loads(raw[i * width : i * width + n]) for i, n in enumerate(lengths)]

    def check(self, got: Sequence[Mapping[str, Any]], what: str, kept: str = _KEPT) -> None:
        """Raise, on every rank alike, the errors any rank reported with its part of ``got``."""
        errors = [(r, g["error"]) for r, g in enumerate(got) if g.get("error")]
        if errors:
            lines = "; ".join(f"rank {r}: {e}" for r, e in errors)
            raise TuneError(f"hwprofile tune: {what} failed on {len(errors)} of {self.size} ranks ({lines}); {kept}")


class _Solo:
    """No job: one rank, nothing to exchange."""

    rank, size = 0, 1

    def exchange(self, obj: Any, timeout_s: float, what: str) -> list[Any]:
        return [json.loads(json.dumps(obj))]

    def check(self, got: Sequence[Mapping[str, Any]], what: str, kept: str = _KEPT) -> None:
        if got[0].get("error"):
            raise TuneError(f"hwprofile tune: {what} failed: {got[0]['error']}; {kept}")


def _job(group: Any) -> _Group | _Solo:
    """The torch.distributed group to tune across: ``group`` (``False``: none), else the world when initialised."""
    if group is False or "torch" not in sys.modules:
        return _Solo()
    try:
        import torch.distributed as dist
    except ImportError:
        return _Solo()
    if not dist.is_available() or not dist.is_initialized():
        if group not in (None, False):
            raise TuneError("hwprofile.tune(group=...): torch.distributed is not initialised; call init_process_group() first")
        return _Solo()
    g = _Group(None if group is None else group)
    return g if g.size > 1 else _Solo()


# --- the host lock -------------------------------------------------------------------------------


class _HostLock:
    """One tuning per (host, tuned directory) at a time; a waiter says so, and gives up after ``timeout_s``."""

    def __init__(self, directory: Path, timeout_s: float) -> None:
        import filelock

        from ._files import ensure_directory

        ensure_directory(directory, what="tuned directory")
        self.path = directory / f".tune-{socket.gethostname()}.lock"
        self.lock = filelock.FileLock(str(self.path), mode=0o600)
        self.timeout_s, self.waited = timeout_s, False

    def acquire(self) -> bool:
        """True when held; False after ``timeout_s`` (another process is still tuning)."""
        import filelock

        try:
            self.lock.acquire(timeout=0)
            return True
        except filelock.Timeout:
            pass
        except OSError as exc:
            raise TuneError(
                f"cannot create the lock file {self.path} ({exc.strerror or exc}): the tuned directory is not writable, so no "
                f"tuned file can be written there; nothing was measured. Fix the directory or set {_env.CONFIG_DIR.name}"
            ) from None
        self.waited = True
        log.warning(
            "hwprofile tune: another process on this host is tuning %s (lock %s); waiting up to %g s for its table",
            self.path.parent, self.path, self.timeout_s,
        )
        try:
            self.lock.acquire(timeout=self.timeout_s)
            return True
        except filelock.Timeout:
            return False

    def release(self) -> None:
        if self.lock.is_locked:
            self.lock.release()


# --- the fleet lock -------------------------------------------------------------------------------


def _fleet_lock(prof: Profile, everything: bool, ops: Sequence[str] | None, timeout_s: float) -> tuple[Profile, Any, str]:
    """One tuner per SKU and plugin across the hosts sharing a fleet store (``HWPROFILE_REMOTE``).

    Returns ``(profile, lock, why)``: the lock held (to release after publishing) or None, and why
    this process must not tune (another host still holds the lock after ``timeout_s``), else "".
    Taken only when something is stale. Once it holds the lock, the process resolves its profile
    again, reading any table a holder published meanwhile, so it measures only what is still stale
    (everything, when the holder died: its lock expired, ``_remote.LOCK_TTL_S``). A store that fails
    is one warning and this process tunes alone.
    """
    from . import _remote, profiles, tuning

    store = _remote.store()
    if store is None or prof.plugin is None or not plan(prof, everything=everything, ops=ops).grids:
        return prof, None, ""
    identity = tuning.device_identity(prof.device)
    lock = store.lock(_remote.tune_lock_key(identity, prof.plugin.name))
    got = lock.acquire(timeout_s)
    if got is None:
        return prof, None, ""
    if not got:
        return prof, None, (
            f"another host ({lock.holder or '?'}) was still tuning {identity} through the remote store {store.shown} after "
            f"{timeout_s:g} s; the values already there apply"
        )
    # checked again under the lock: a holder may have published (and released) since this profile was resolved, whether
    # this process waited for it or not; only what is still stale is measured
    try:
        prof = profiles._rebuild(prof.device.index)
    except BaseException:
        lock.release()  # never left renewing behind a failed resolution
        raise
    return prof, lock, ""


# --- tuning ---------------------------------------------------------------------------------------


@dataclass
class TuneResult:
    """What :func:`tune` did on one device."""

    index: int
    plan: Plan
    #: Ops measured, with the settings that changed: op -> {key: (before, after)}.
    changes: dict[str, dict[str, tuple[Any, Any]]] = field(default_factory=dict)
    #: Tuned files written.
    written: list[Path] = field(default_factory=list)
    #: Points this rank measured (its share), and how many ranks shared the work.
    measured: int = 0
    ranks: int = 1
    seconds: float = 0.0
    #: Why nothing was measured although something is stale (another process held the lock), or "".
    skipped: str = ""
    #: The profile resolved after the tuned files were written (or the one given, when nothing changed).
    profile: Any = None

    def describe(self) -> str:
        if self.skipped:
            return f"device {self.index}: not tuned: {self.skipped}"
        if not self.plan.grids:
            return f"device {self.index}: nothing stale"
        parts = []
        for op, ch in self.changes.items():
            moved = ", ".join(_change(k, a, b) for k, (a, b) in ch.items()) or "no value changed"
            parts.append(f"{op} ({moved})")
        share = f", this rank measured {self.measured} of {len(self.plan.points())} points on {self.ranks} ranks" if self.ranks > 1 else ""
        return f"device {self.index}: re-measured {'; '.join(parts)} in {self.seconds:.1f} s{share}"


def cannot_measure(prof: Profile) -> str:
    """Why :class:`hwprofile.sweep.GpuTimer` cannot time kernels for ``prof``'s device ("" when it can)."""
    if prof.device.simulated:
        return f"device {prof.device.index} ({prof.device.name}) is simulated ({_env.DEVICE.name}): there is no GPU to time"
    try:
        import torch
    except ImportError:
        return "torch is not installed: measuring needs torch with CUDA"
    if not torch.cuda.is_available():
        return "torch sees no GPU (torch.cuda.is_available() is False)"
    return ""


def capturing() -> bool:
    """Whether this thread's current CUDA stream is capturing a graph (torch only asked if already imported)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001 - a torch without CUDA cannot be capturing
        return False


def tune(
    device: int | str | Any = None,
    *,
    everything: bool = False,
    ops: Sequence[str] | None = None,
    timer: Timer | None = None,
    reps: int = 15,
    ties: str = "kernel",
    group: Any = None,
    timeout: float | None = None,
    lock_timeout: float = LOCK_TIMEOUT_S,
    progress: Callable[[int, int, str], None] | None = None,
) -> TuneResult:
    """Re-measure what is stale on ``device`` (default: the current one), write its tuned files, resolve it again.

    For engines at a point they choose: after the model is loaded, before CUDA graphs are captured
    (tuning allocates and captures graphs of its own). ``everything`` re-measures every op with a
    kernel; ``ops`` limits tuning to those ops. ``timer`` replaces the GPU timer (any
    :class:`hwprofile.sweep.Timer`; a simulated device can be tuned only with one). Inside a
    torch.distributed job (or ``group``; ``False`` for none) every rank must call it: the ranks split
    the points and exchange them, each collective bounded by ``timeout`` seconds (default: from the
    estimate). Processes of one host sharing a config directory wait for each other up to
    ``lock_timeout`` seconds. Returns a :class:`TuneResult`; raises :class:`TuneError` (on every rank
    alike) or :class:`hwprofile.WriteError` (the previous files are kept).
    """
    from . import profiles, tuning

    t0 = time.perf_counter()
    if capturing():
        raise TuneError(
            "hwprofile.tune() was called while a CUDA graph is being captured: tuning allocates memory and captures graphs of its "
            "own. Call it before capture (after the model is loaded)"
        )
    if ties not in ("fallback", "kernel"):
        raise TuneError(f"ties={ties!r}: give 'fallback' or 'kernel'")
    job = _job(group)
    prof = profiles.profile(device)
    index = prof.device.index
    directory = tuning.tuned_dir(prof.device, os.environ)
    mine: dict[str, Any] = {"host": socket.gethostname(), "dir": str(directory), "identity": tuning.device_identity(prof.device)}
    hello = job.exchange(mine, timeout or 120.0, "their devices")
    leader = next(r for r, h in enumerate(hello) if (h["host"], h["dir"]) == (mine["host"], mine["dir"])) == job.rank
    locks: list[Any] = []  # the host's lock, then the fleet's: released in reverse order
    mine = {"error": None, "lock": True, "why": ""}
    p: Plan | None = None
    try:
        if leader:
            prof = _take_locks(prof, directory, everything, ops, lock_timeout, locks, mine)
        if mine["error"] is None:
            p = _plan_here(prof, everything, ops, timer, directory, mine)
        got = job.exchange(mine, (timeout or 120.0) + (lock_timeout if job.size > 1 else 0.0), "their plans")
        job.check(got, "planning")
        assert p is not None  # job.check raised if any rank, this one included, has no plan
        if not all(g["lock"] for g in got):
            held = [r for r, g in enumerate(got) if not g["lock"]]
            why = next((g["why"] for g in got if g.get("why")), "") or (
                f"another process on the host of rank(s) {', '.join(map(str, held))} was still tuning after {lock_timeout:g} s; "
                "the values already there apply")
            log.warning("hwprofile tune: %s", why)
            return TuneResult(index, p, skipped=why, ranks=job.size, seconds=time.perf_counter() - t0, profile=prof)
        # the same work on every rank of a SKU: the union of what any of them found stale
        same = [r for r, h in enumerate(hello) if h["identity"] == hello[job.rank]["identity"]]
        grids = _union_of_grids(got, same)
        date = got[same[0]]["date"]
        bw = float(got[same[0]]["bw"])
        p = Plan(p.index, p.device, p.findings, {op: tuple(g) for op, g in grids.items()}, p.bandwidth)
        if not grids:
            if any(got[r]["grids"] for r in range(job.size)):
                pass  # other SKUs of the job have work: this rank still takes part in the exchange below
            else:
                log.info("hwprofile tune: device %d: nothing stale", index)
                return TuneResult(index, p, ranks=job.size, seconds=time.perf_counter() - t0, profile=prof)
        share = split(p.points(), len(same), bw, reps)[same.index(job.rank)] if grids else []
        est = max((sum(cost(q, bw, reps) for q in s) for s in split(p.points(), len(same), bw, reps)), default=0.0)
        log.info("hwprofile tune: device %d: measuring %d point(s) of %s (estimated %.0f s)",
                 index, len(share), ", ".join(grids) or "nothing", est)
        mine = _measure_share(prof, share, timer, reps, progress)
        got = job.exchange(mine, timeout or max(120.0, 4 * est + 60), "their measurements")
        job.check(got, "measuring")
        points = {(d["op"], int(d["m"]), int(d["n"]), int(d["k"])): _point(d) for r in same for d in got[r]["points"]}
        result = TuneResult(index, p, measured=len(share), ranks=job.size, profile=prof)
        mine = _write_tuned(prof, grids, points, ties, date, directory, leader, result)
        got = job.exchange(mine, timeout or 120.0, "whether their files were written")
        written = sorted({w for g in got for w in g.get("written", ())})
        job.check(got, "writing the tuned files", "every file is whole (old or new); " + (
            f"written before the failure: {', '.join(written)}" if written else "no tuned file was changed"))
    finally:
        for held in reversed(locks):
            held.release()
    result.profile = profiles._rebuild(index)
    result.seconds = time.perf_counter() - t0
    for f in p.findings:
        for note in f.leftovers:
            log.warning("hwprofile tune: %s", note)
    log.info("hwprofile tune: %s", result.describe())
    return result


def _take_locks(prof: Any, directory: Path, everything: bool, ops: Sequence[str] | None, lock_timeout: float, locks: list[Any],
                mine: dict[str, Any]) -> Any:
    """The host leader's locks: the host's (``locks[0]``), then the fleet's within what is left of ``lock_timeout``.

    Records in ``mine`` whether both were taken (``lock``, ``why``) or the error; returns the profile to tune (resolved
    again when another process held the host's lock: it may have written fresh tables).
    """
    from . import profiles

    try:
        waited_from = time.monotonic()
        lock = _HostLock(directory, lock_timeout)
        locks.append(lock)
        mine["lock"] = lock.acquire()
        if lock.waited and mine["lock"]:
            prof = profiles._rebuild(prof.device.index)  # the process we waited for may have written fresh tables
        if mine["lock"]:  # the fleet's lock within what is left of the same bound (the other ranks wait on it)
            left = max(0.0, lock_timeout - (time.monotonic() - waited_from))
            prof, fleet, mine["why"] = _fleet_lock(prof, everything, ops, left)
            if fleet is not None:
                locks.append(fleet)
            mine["lock"] = not mine["why"]
    except HwprofileError as exc:
        mine["error"] = str(exc)
    return prof


def _plan_here(prof: Any, everything: bool, ops: Sequence[str] | None, timer: Any, directory: Path, mine: dict[str, Any]) -> Plan | None:
    """This rank's plan (what is stale here), its grids put into ``mine`` for the exchange; an error goes there instead."""
    try:
        p = plan(prof, everything=everything, ops=ops)
        why = "" if timer is not None or not p.grids else cannot_measure(prof)
        if why:
            raise TuneError(f"cannot measure on device {prof.device.index}: {why}")
        for op in p.grids:
            from ._files import check_writable

            check_writable(directory / f"{op}.toml", what="tuned file")  # before any GPU time is spent
        mine.update(grids={op: [list(g) for g in grid] for op, grid in p.grids.items()}, date=time.strftime("%Y-%m-%d"),
                    bw=p.bandwidth)
    except HwprofileError as exc:
        mine["error"] = str(exc)
        return None
    return p


def _union_of_grids(got: list[dict[str, Any]], same: list[int]) -> dict[str, list[tuple[int, int, int]]]:
    """The union of the grids the ranks ``same`` (one SKU) found stale, in op-table order."""
    grids: dict[str, list[tuple[int, int, int]]] = {}
    for r in same:
        for op, grid in got[r]["grids"].items():
            grids.setdefault(op, [tuple(g) for g in grid])
    return {op: grids[op] for op in TABLE if op in grids}


def _measure_share(prof: Any, share: list[tuple[str, int, int, int]], timer: Any, reps: int,
                   progress: Callable[[int, int, str], None] | None) -> dict[str, Any]:
    """This rank's share of the points, measured: ``{"error": None | why, "points": [...]}`` for the exchange."""
    from . import sweep

    mine: dict[str, Any] = {"error": None, "points": []}
    try:
        if share:  # a rank with no share (another SKU has the work) needs no timer, nor a GPU
            t = timer if timer is not None else sweep.GpuTimer(prof, reps=reps)
            for i, (op, m, n, k) in enumerate(share):
                mine["points"].append(_point_dict(t.measure(op, m, n, k), op))
                if progress:
                    progress(i + 1, len(share), f"{op} M={m} N={n} K={k}")
    except Exception as exc:  # noqa: BLE001 - every rank must hear of it, or the others wait for points that never come
        mine = {"error": f"measuring on device {prof.device.index} failed: {type(exc).__name__}: {exc}", "points": []}
    return mine


def _write_tuned(prof: Any, grids: dict[str, list[tuple[int, int, int]]], points: dict[Any, Any], ties: str, date: str,
                 directory: Path, leader: bool, result: TuneResult) -> dict[str, Any]:
    """Fit and write each op's tuned file from the exchanged points (as ``hwprofile sweep`` does), into ``result``;
    ``{"error": None}``, or the error and the files written before it, for the exchange."""
    from . import sweep, tuned_layers

    mine: dict[str, Any] = {"error": None}
    try:
        for op, grid in grids.items():
            doc = sweep.run(prof, op, grid, _Replay(points), ties=ties, date=date, box=sweep.box_grid(op))  # as hwprofile sweep chooses
            target = directory / f"{op}.toml"
            sweep.write(doc, target)
            result.written.append(target)
            if leader and prof.plugin is not None:  # the other hosts of this SKU read it instead of tuning
                tuned_layers.publish_tuned(prof.device, prof.plugin.name, op, target.read_text(encoding="utf-8"))
            result.changes[op] = {
                key: (prof[key], value) for key, value in doc["thresholds"].items() if key in prof.settings and prof[key] != value
            }
    except HwprofileError as exc:
        mine["error"] = f"writing on device {prof.device.index} failed: {exc}"
        mine["written"] = [str(w) for w in result.written]
    return mine


def at_first_profile(prof: Profile) -> Profile:
    """``HWPROFILE_TUNE=stale``: tune ``prof``'s device before its first ``profile()`` returns; the profile to return.

    Called by :func:`hwprofile.profiles.profile` once it has cached ``prof`` and released its lock (so
    tuning, which resolves the device's profile, finds it instead of recursing). Never on a simulated device,
    never inside CUDA-graph capture; a failure is a warning, and the values already there apply.
    """
    if prof.device.simulated:
        return prof
    if capturing():
        log.warning(
            "hwprofile: %s=stale: the first profile() of device %d came inside CUDA-graph capture, where tuning cannot run; "
            "the values already there apply. Resolve the profile (or call hwprofile.tune()) before capture",
            _env.TUNE.name, prof.device.index,
        )
        return prof
    why = cannot_measure(prof)
    if why:
        log.warning(
            "hwprofile: %s=stale: cannot tune device %d (%s); the values already there apply", _env.TUNE.name, prof.device.index, why
        )
        return prof
    try:
        result = tune(prof.device.index)
    except HwprofileError as exc:
        log.warning("hwprofile: %s=stale: tuning device %d failed (%s); the values already there apply", _env.TUNE.name,
                    prof.device.index, exc)
        return prof
    return result.profile if result.profile is not None else prof


def _change(key: str, before: Any, after: Any) -> str:
    """One changed value in words; a per-shape table (``<op>.measured``) by its size, not its text."""
    from . import tuning

    if key == tuning.measured_key(key.rsplit(".", 1)[0]):
        def size(text: Any) -> str:
            return f"{len([e for e in str(text).split(';') if e.strip()])} measured shapes"

        return f"{key} {size(before)} -> {size(after)}"
    return f"{key} {before} -> {after}"
