"""Tuning: stamps, tuned-thresholds files, and whether a measured value still holds. Never imports torch.

A threshold tuned against one fallback silently goes wrong when the fallback changes (the design
guide's case 1). So every tuned value, and every shipped plugin threshold that was measured, carries
a :class:`Stamp`: the device (UUID-free), the plugin and its version, the kernel's source digest,
the digest of the launches the plugin plans for the op's sweep grid (:func:`plan_digest`: tiles,
grid, PDL can change while the source does not), and the **fallback identity** (the fallback
function, torch's version, cuBLAS/cuBLASLt's version), read from package metadata only.

:func:`compare` sorts what differs between a stamp and the running system into three kinds, so
that a warning fires only when it means something (a warning that fires for everyone is noise):

* **stale**: something the measurement depended on changed: another GPU generation, another
  plugin, another kernel source, another launch plan, another fallback function, or, on a real
  GPU, another major.minor of torch or cuBLAS. Patch versions never count.
* **note**: worth knowing, not wrong: measured on another card of the same capability
  ("measured on NVIDIA H200"), by another version of the same plugin with the same kernel, or
  library versions that differ on a *simulated* device (whose libraries are not the ones that ran).
* **unknown**: one side is not known (torch not installed, no cuBLAS wheel): "cannot tell", never
  "changed".

A stale shipped threshold still applies and is reported once per process (until ``hwprofile.reset()``);
a stale tuned file is ignored (the shipped value applies) with one warning per file. The ``strict``
setting (``HWPROFILE_STRICT=1``, or any layer that sets it) turns both into an error: both are
reported by :meth:`Staleness.report` once the profile's settings are resolved, so strict is read
once, as the setting it is, never from the environment here. ``hwprofile explain KEY`` shows the details.

A stamp stands for one op's sweep, so a measured value applies only when its stamp names the op
that owns its key (:func:`untied`; the owner is the op whose settings declare the key,
:func:`hwprofile.optable.owner`). A tuned file whose stamp names an op this hwprofile does not know,
or that sets a key of another op or of no op, is an error naming the file, the key and the op
(:func:`read_tuned`), like any other malformed tuned file; a plugin value so stamped is an error
naming the plugin (:meth:`Staleness.shipped`). A key no op owns (``strict``, a plugin's own setting)
is never in a tuned file (a sweep writes only its op's settings), but a plugin may stamp its own
setting with the sweep of the (known) op its value was derived from: it is then stale when that
op's measurement is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Protocol

from . import _env, _state
from ._log import get_logger
from ._record import Record, final
from .errors import SettingError
from .optable import TABLE, GateDef
from .stamps import Shape as Shape  # stamps live in a leaf (settings types them); tuning's face keeps their names
from .stamps import Stamp as Stamp
from .stamps import _shape as _shape
from .stamps import current as current
from .stamps import device_identity as device_identity
from .stamps import fallback_identity as fallback_identity
from .stamps import shape_text as shape_text

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._registry_records import Selection
    from .device import DeviceInfo


class SettingsResolver(Protocol):
    """What tuned files are added to: ``settings.SettingsResolver``. A protocol, so that this module imports no
    settings (settings parses ``<op>.measured`` with :func:`parse_measured`: a circle, type-checking imports counted)."""

    def add(self, kind: Any, source: str, values: Mapping[str, Any] | None, *, who: str,
            check: Callable[[str, Stamp], str] | None = None, stamp: Stamp | None = None, drop_stale: bool = False) -> None: ...


class ResolvedSetting(Protocol):
    """What :meth:`Staleness.report` reads of the resolved ``strict`` setting (``settings.ResolvedSetting``)."""

    @property
    def value(self) -> Any: ...
    @property
    def winner(self) -> Any: ...

log = get_logger(__name__)


# A tuned file holds a stamp and a few thresholds (under 2 KiB); sweep writes raw samples elsewhere.
# Anything much larger is not a tuned file, and parsing it would cost every first profile() (an
# 8 MB file took 4.8 s), so it is refused with an error that says what to do.
MAX_TUNED_BYTES = 1 << 20
SAMPLES_DIR = "samples"

_UNKNOWN = ("", "unknown", "not installed")
_LIBRARIES = ("torch", "cublas", "cublaslt")


_plans: dict[tuple[Any, ...], str] = {}  # plan_digest per (op, kernel spec identity); reset() clears it


@_state.on_reset
def _forget_plans() -> None:
    _plans.clear()


#: :attr:`Stamp.plan` of what runs now while the plan cannot be computed without the CUDA driver (a real GPU
#: whose SM count nobody read yet): the first dispatch table compares it (:mod:`hwprofile.ops._verify`)
PLAN_AT_LAUNCH: Final = "at-first-launch"
PLAN_AT_LAUNCH_WHY: Final = (
    "launch plan: compared at the first launch on this GPU (the plan needs the GPU's SM count, which only the CUDA "
    "driver gives, and profile() never starts the driver: a forked worker must still be able to use CUDA)"
)


def plan_waits_for_driver(spec: Any) -> bool:
    """Whether ``spec``'s plans need the CUDA driver still (``hwprofile.plugin.Planner`` of a real GPU, unresolved)."""
    return getattr(getattr(spec, "configure", None), "resolved", True) is False


def plan_digest(op: str, spec: Any, shapes: Iterable[Shape] = ()) -> str:
    """SHA-256 of the launches ``spec`` plans for ``op``'s default sweep grid, then ``shapes`` (a per-shape
    table's shapes outside the grid, sorted), every split-K choice and scale mode, and of what it plans
    with where its ``configure`` says (``plan_basis``: the device's SM count and shared memory).

    What a stamp records beside the kernel source: the same source launched with other tiles, grid
    or PDL is another measurement. A shape the plan refuses is part of the plan (its error type).
    Without ``shapes`` the digest is the grid's alone (what stamps written before per-shape tables
    record). Memoised per spec and shapes until ``hwprofile.reset()`` (a plan is a pure function of the shape).
    """
    # what configure plans with (hwprofile.plugin.Planner's plan_basis: the device's SM count and shared
    # memory; else the callable itself), so two devices of one plugin never share a memoised digest
    configure = getattr(spec, "configure", None)
    basis = getattr(configure, "plan_basis", None) or repr(configure)
    grid = TABLE[op].grid
    extra = tuple(sorted(set(shapes) - set(grid)))
    key = (op, getattr(spec, "plugin", None), getattr(spec, "package", None), getattr(spec, "source", None),
           tuple(getattr(spec, "instances", ())), basis, extra)
    found = _plans.get(key)
    if found is None:
        found = _plans[key] = _plan_digest(op, spec, (*grid, *extra))
    return found


def _plan_args(d: Any, n: int, k: int, mode: int) -> dict[str, int]:
    """What ``configure`` takes besides (M, N, K, split_k): a scaled op's scale mode; a gate's selection, that of the
    served router of (N, K) (``GateDef.router_for``, what its grid and benchmark time), since the plan depends on it."""
    if isinstance(d, GateDef):
        r = d.router_for(n, k)
        return {"n_group": r.n_group, "topk_group": r.topk_group, "top_k": r.top_k}
    return {"scale": mode} if d.scaled else {}


def _plan_digest(op: str, spec: Any, grid: Iterable[Shape]) -> str:
    import hashlib

    d = TABLE[op]
    h = hashlib.sha256()
    basis = getattr(spec.configure, "plan_basis", None)  # what the plan was computed for (hwprofile.plugin.Planner)
    if basis:
        h.update(repr(("basis", str(basis))).encode())
    for m, n, k in grid:
        for split_k in (True, False):
            for mode in d.scale_modes:
                try:
                    la = spec.configure(m=m, n=n, k=k, split_k=split_k, **_plan_args(d, n, k, mode))
                    item: tuple[Any, ...] = (
                        str(la.name_expression), tuple(map(int, la.grid)), tuple(map(int, la.block)), int(la.shared_bytes), bool(la.pdl)
                    )
                except RecursionError:
                    raise  # a configure that resolves profiles: a bug of the plugin, not a refusal
                except Exception as exc:  # noqa: BLE001 - a refusal is recorded, not raised
                    item = ("refused", type(exc).__name__)
                h.update(repr((m, n, k, split_k, mode, item)).encode())
    return h.hexdigest()


# --- per-shape decisions -------------------------------------------------------------------------
#
# A sweep fits one cost model per op (``<op>.model``, :mod:`hwprofile.costmodel`) and writes one
# decision per measured shape: the setting ``<op>.measured`` (declared by the op table, a str so that
# every layer, stamp, staleness check, ``explain`` and the cross-rank agreement treat it as any other
# setting) holds them as ``MxNxK=PATH:KERNEL_US/FALLBACK_US`` entries separated by "; "
# (``1x4096x7168=kernel:3.1/7.2``; ``-`` for a kernel that could not run the shape). Inside the
# kernel's limits, dispatch takes the measured path at those shapes and the model's faster predicted
# path elsewhere, the model corrected by these times (``hwprofile.ops._route.route``).

MEASURED_FORMAT = (
    "MxNxK=kernel|fallback[@split|@nosplit]:KERNEL_US/FALLBACK_US entries separated by '; ' "
    "(e.g. 1x4096x7168=kernel@nosplit:3.1/7.2; @VARIANT: the kernel variant that was faster there, whose time KERNEL_US is)"
)

#: the kernel variants a sweep times where their plans differ, by name: the split-K choice (``gemv.split_k``)
VARIANTS: Final = {"split": True, "nosplit": False}


@final
class Measured(Record):
    """One measured shape: the path the sweep chose and both times (µs per call; ``None``: the kernel could not run it)."""

    kernel: bool  #: True: the kernel is taken at this shape
    kernel_us: float | None  #: the faster variant's time where ``variant`` names one
    fallback_us: float
    #: the kernel variant that was faster here (a key of :data:`VARIANTS`), or None: the profile's ``gemv.split_k``
    #: (a sweep that timed one variant, or one whose variants plan alike)
    variant: str | None = None


def measured_key(op: str) -> str:
    """The setting that holds ``op``'s per-shape decisions."""
    return f"{op}.measured"


_parsed: dict[tuple[str, str], Mapping[Shape, Measured]] = {}  # parse_measured per (op, text); only valid texts


def parse_measured(op: str, text: str, *, where: str) -> Mapping[Shape, Measured]:
    """The per-shape decisions of ``op`` in ``text`` (the ``<op>.measured`` format), checked against the op table.

    Refused, naming ``where``, the entry and what to do: an entry not in the format, a repeated
    shape, a time that is not a positive number, a kernel decision without a kernel time, and a
    shape the op's kernels cannot take by the op table (M above the kernel's largest M, K not a
    multiple of its 16-byte loads). The plugin's own limits are checked by :func:`untakeable`.
    Valid texts are remembered (dispatch tables are rebuilt per profile; the text rarely changes).
    """
    found = _parsed.get((op, text))
    if found is not None:
        return found
    key = measured_key(op)
    out: dict[Shape, Measured] = {}
    for i, entry in enumerate(e for e in text.replace(";", " ").split() if e):
        def bad(why: str, entry: str = entry, i: int = i) -> SettingError:
            return SettingError(
                f"{where}: {key} entry {i + 1} {entry!r} {why}; write {MEASURED_FORMAT}, or regenerate it with "
                f"'hwprofile sweep {op}'. The entry is not applied"
            )

        shape, decision = _measured_entry(op, entry, out, bad)
        out[shape] = decision
    found = _parsed[(op, text)] = MappingProxyType(out)
    return found


def _measured_entry(op: str, entry: str, seen: Container[Shape], bad: Callable[[str], SettingError]) -> tuple[Shape, Measured]:
    """One entry of :func:`parse_measured`'s text, its rules in order (``seen``: the shapes before it; ``bad`` words a refusal)."""
    shape_s, eq, rest = entry.partition("=")
    path, colon, times = rest.partition(":")
    path, at, variant = path.partition("@")
    if at and variant not in VARIANTS:
        raise bad(f"names kernel variant {variant!r}, not one of {', '.join(VARIANTS)}")
    kernel_s, slash, fallback_s = times.partition("/")
    if not (eq and colon and slash):
        raise bad("is not in the format")
    try:
        shape = _shape(shape_s)
    except ValueError:
        raise bad(f"has shape {shape_s!r}, not MxNxK with integer M, N, K") from None
    if path not in ("kernel", "fallback"):
        raise bad(f"names path {path!r}, not 'kernel' or 'fallback'")
    try:
        fallback_us = float(fallback_s)
        kernel_us = None if kernel_s == "-" else float(kernel_s)
    except ValueError:
        raise bad(f"has times {times!r}, not KERNEL_US/FALLBACK_US in microseconds ('-' for no kernel time)") from None
    if not all(math.isfinite(t) and t > 0 for t in (fallback_us, kernel_us if kernel_us is not None else 1.0)):
        raise bad(f"has times {times!r}: each must be a positive number of microseconds")
    if path == "kernel" and kernel_us is None:
        raise bad("takes the kernel but records no kernel time (the kernel did not run there)")
    if min(shape) < 1:
        raise bad("has an empty dimension (M, N and K must be >= 1)")
    if shape in seen:
        raise bad(f"repeats shape {shape_text(shape)}")
    if path == "kernel":
        why = beyond_limits(op, shape)
        if why:
            raise bad(f"routes it to the {op} kernel, which {why}: a shape the kernel cannot take")
    if at and kernel_us is None:
        raise bad(f"names kernel variant {variant!r} but records no kernel time")
    return shape, Measured(path == "kernel", kernel_us, fallback_us, variant if at else None)


def uncovered(table: Mapping[Shape, Measured], stamp: Stamp) -> list[Shape]:
    """The shapes of ``table`` that ``stamp``'s plan digest does not cover (neither its op's grid nor
    ``stamp.shapes``): a plan change there would go unseen. None when the stamp records no plan
    (then the plan is "cannot tell" for every shape)."""
    if not stamp.plan or stamp.op not in TABLE:
        return []
    covered = set(TABLE[stamp.op].grid) | set(stamp.shapes)
    return sorted(s for s in table if s not in covered)


def beyond_limits(op: str, shape: Shape) -> str:
    """Why the op table says ``op``'s kernels cannot take ``shape`` (``""``: they can), in words."""
    d = TABLE[op]
    m, n, k = shape
    max_m = d.max_m if isinstance(d.max_m, int) else _setting_max(d, d.max_m)
    if m > max_m:
        return f"takes M <= {max_m}"
    if k % d.k_vec:
        return f"needs K % {d.k_vec} == 0 (16-byte loads)"
    for what, v, lo, hi in _limits(d, n, k):
        if not lo <= v <= hi:
            return f"takes {what} in [{lo}, {hi}]"
    return ""


def _limits(d: Any, n: int, k: int) -> list[tuple[str, int, int, int]]:
    """(dimension, value, lo, hi) for the kernel limits the op table declares: the defaults of its N and K
    bounds are what its kernels take (``optable._kernel_limits``); its plugin's plan says the rest (:func:`untakeable`)."""
    default = {s[0]: s[2] for s in d.settings}
    out = []
    for what, v, lo, hi in (("N", n, d.min_n, d.max_n), ("K", k, d.min_k, d.max_k)):
        lo_v = lo if isinstance(lo, int) else int(default[lo])
        hi_v = hi if isinstance(hi, int) else int(default[hi])
        out.append((what, v, lo_v, hi_v))
    return out


def _setting_max(d: Any, key: str) -> int:
    """The declared maximum of the op's int setting ``key`` (the router's 16 for ``router_gemm.max_tokens``)."""
    hi = next(s[6] for s in d.settings if s[0] == key)
    return int(hi) if hi is not None else 1 << 30


def format_measured(table: Mapping[Shape, Measured]) -> str:
    """The ``<op>.measured`` text of ``table``, sorted by shape (what a sweep writes)."""
    def us(t: float | None) -> str:
        return "-" if t is None else f"{t:.3f}".rstrip("0").rstrip(".")

    def path(d: Measured) -> str:
        return ("kernel" if d.kernel else "fallback") + (f"@{d.variant}" if d.variant else "")

    return "; ".join(f"{shape_text(s)}={path(d)}:{us(d.kernel_us)}/{us(d.fallback_us)}" for s, d in sorted(table.items()))


def untakeable(op: str, table: Mapping[Shape, Measured], spec: Any) -> dict[Shape, str]:
    """The kernel decisions of ``table`` that ``spec`` (the selected plugin's kernel) cannot plan, with the planner's words.

    Each is tried with and without split-K and in every scale mode: a decision that sends a shape
    to a kernel that refuses it would fail at the first call (or run a wrong launch).
    """
    d = TABLE[op]
    bad: dict[Shape, str] = {}
    for (m, n, k), dec in sorted(table.items()):
        if not dec.kernel:
            continue
        for split_k in (False, True):
            for mode in d.scale_modes:
                try:
                    spec.configure(m=m, n=n, k=k, split_k=split_k, **_plan_args(d, n, k, mode))
                except RecursionError:
                    raise
                except Exception as exc:  # noqa: BLE001 - a refusal is what is being asked about
                    bad[(m, n, k)] = f"{type(exc).__name__}: {exc}"
                    break
            else:
                continue
            break
    return bad


@_state.on_reset
def _forget_parsed() -> None:
    _parsed.clear()


# --- comparing a stamp with what runs now --------------------------------------------------------


@final
class Comparison(Record):
    """What differs between a stamp and the running system, sorted by what it means (module doc)."""

    stale: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()

    @property
    def is_stale(self) -> bool:
        return bool(self.stale)


def _major_minor(version: str) -> tuple[int, ...] | None:
    """``"2.11.0+cu130"`` -> ``(2, 11)``; ``None`` when the text has no leading number."""
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


def compare(stamp: Stamp, now: Stamp, *, real_gpu: bool) -> Comparison:
    """Sort the differences between ``stamp`` and ``now`` into stale, notes and unknown.

    ``real_gpu`` is False for a simulated device: the libraries installed here are not the ones that
    would run on it, so their versions are a note, never stale.
    """
    stale: list[str] = []
    notes: list[str] = []
    unknown: list[str] = []
    if stamp.compute_capability != now.compute_capability:
        cc, ncc = stamp.compute_capability, now.compute_capability
        stale.append(f"measured on compute capability {cc[0]}.{cc[1]} ({stamp.device}), this device is {ncc[0]}.{ncc[1]}")
    elif stamp.device != now.device:
        notes.append(f"measured on {stamp.device}")
    if stamp.plugin != now.plugin:
        stale.append(f"measured with plugin {stamp.plugin!r}, {now.plugin!r} is selected")
    elif stamp.plugin_version != now.plugin_version:
        notes.append(f"measured with {stamp.plugin} {stamp.plugin_version}, {now.plugin_version or 'unknown'} is installed")
    if not stamp.kernel or not now.kernel:
        unknown.append(
            "kernel source: cannot tell (" + ("the stamp records none" if not stamp.kernel else "no kernel for this op now") + ")"
        )
    elif stamp.kernel != now.kernel:
        stale.append(f"kernel source changed ({stamp.kernel[:12]} -> {now.kernel[:12]})")
    if not stamp.plan:
        unknown.append("launch plan: cannot tell (the stamp records none)")
    elif now.plan == PLAN_AT_LAUNCH:
        unknown.append(PLAN_AT_LAUNCH_WHY)
    elif not now.plan:
        unknown.append("launch plan: cannot tell (none to compare with here: no kernel for this op, or not computed)")
    elif stamp.plan != now.plan:
        stale.append(f"launch plan changed ({stamp.plan[:12]} -> {now.plan[:12]}): the kernel is launched differently now")
    fa, fb = stamp.fallback.get("function"), now.fallback.get("function")
    if fa and fb and fa != fb:
        stale.append(f"fallback function changed ({fa} -> {fb})")
    _compare_libraries(stamp, now, real_gpu, stale, notes, unknown)
    return Comparison(tuple(stale), tuple(notes), tuple(unknown))


def _compare_libraries(stamp: Stamp, now: Stamp, real_gpu: bool, stale: list[str], notes: list[str], unknown: list[str]) -> None:
    """:func:`compare` for the fallback's libraries (torch, cuBLAS, cuBLASLt): a major.minor change is stale on a real
    GPU (a note on a simulated one), a version not known on either side cannot be told."""
    for lib in _LIBRARIES:
        if (
            lib == "cublaslt"
            and stamp.fallback.get("cublaslt") == stamp.fallback.get("cublas")
            and now.fallback.get("cublaslt") == now.fallback.get("cublas")
        ):
            continue  # one wheel: already compared as cuBLAS
        a, b = stamp.fallback.get(lib), now.fallback.get(lib)
        if a is None:
            continue  # the stamp does not record it
        if a in _UNKNOWN or b is None or b in _UNKNOWN:
            unknown.append(f"fallback {lib}: cannot tell (measured with {a or 'unknown'}, here {b or 'unknown'})")
            continue
        ma, mb = _major_minor(a), _major_minor(b)
        if ma is None or mb is None:
            unknown.append(f"fallback {lib}: cannot tell (versions {a!r}, {b!r})")
        elif ma != mb:
            what = f"fallback {lib} {'.'.join(map(str, ma))} -> {'.'.join(map(str, mb))}"
            (stale if real_gpu else notes).append(what if real_gpu else f"{what} (simulated device: not compared)")


def untied(key: str, op: str, *, tuned: bool) -> str:
    """Why a value of setting ``key`` stamped for op ``op`` cannot be tied to that measurement; ``""`` when it can.

    A stamp records one op's sweep (that op's kernel, fallback and grid), so it vouches for values
    of that op's own settings (:func:`hwprofile.optable.owner`) and of no other op's. A key no op
    owns is never in a tuned file (``tuned``: a sweep writes only its op's settings); a plugin may
    stamp such a setting of its own with the sweep its value was derived from. An op this hwprofile
    does not know vouches for nothing: its sweep cannot be compared with anything that runs here.
    """
    from .optable import owner

    if op not in TABLE:
        from ._version import __version__

        return f"the stamp names op {op!r}, which hwprofile {__version__} does not know (ops: {', '.join(TABLE)})"
    own = owner(key)
    if own is not None and own.name != op:
        return f"{key} belongs to op {own.name}, but the stamp names op {op!r} (another kernel, measured against another fallback)"
    if own is None and tuned:
        return f"{key} belongs to no op, and a sweep of {op} decides only {op}'s settings"
    return ""


def _retune(key: str, op: str) -> str:
    """What to do about a tuned file's value of ``key`` that :func:`untied` refused."""
    from .optable import owner

    own = owner(key)
    if op not in TABLE:
        how = f"'hwprofile sweep {own.name}'" if own is not None else f"'hwprofile sweep OP' (OP one of {', '.join(TABLE)})"
        return f"Regenerate the file with {how}, or remove it"
    if own is not None:
        return f"Remove {key} from the file, or tune it with 'hwprofile sweep {own.name}' (which writes a file of its own)"
    return (
        f"Remove {key} from the file: a tuned file holds only settings of its stamp's op; set any other setting with its "
        f"variable ({_env.PREFIX}{key.upper().replace('.', '_')} for {key}; 'hwprofile show' lists the settings)"
    )


_warned: set[str] = set()
_warned_shipped = [False]


@_state.on_reset
def _forget_warnings() -> None:
    """A reset (new environment or plugins) may make other values stale: warn again."""
    _warned.clear()
    _warned_shipped[0] = False


def warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        log.warning(msg)


class Staleness:
    """Compares stamps with what runs now for one profile being resolved; :meth:`report` says what is stale."""

    def __init__(self, info: DeviceInfo, selection: Selection, kernels: Mapping[str, Any]) -> None:
        self.info, self.selection, self.kernels = info, selection, kernels
        self._now: dict[tuple[str, bool, tuple[Shape, ...]], Stamp] = {}
        self.stale_shipped: list[tuple[str, Stamp, tuple[str, ...]]] = []
        #: The warning for each stale tuned file, in the order the files were read.
        self.stale_files: list[str] = []

    def now(self, op: str, *, plan: bool = False, shapes: tuple[Shape, ...] = ()) -> Stamp:
        """What a sweep would stamp now; the plan digest only when asked (it evaluates the plan over the
        grid and ``shapes``, the stamp's per-shape table's shapes)."""
        key = (op, plan, shapes)
        if key not in self._now:
            p = self.selection.plugin
            spec = self.kernels.get(op)
            digest = spec.source_digest() if spec is not None else ""
            planned = ""
            if plan and spec is not None:
                # a real GPU's plan needs its SM count, which only the driver gives: checked at the first launch
                planned = PLAN_AT_LAUNCH if plan_waits_for_driver(spec) else plan_digest(op, spec, shapes)
            self._now[key] = current(
                op, self.info, p.name if p else "", (p.version or "") if p else "", digest, plan=planned, shapes=shapes
            )
        return self._now[key]

    def compare(self, stamp: Stamp) -> Comparison:
        if stamp.op not in TABLE:
            return Comparison(unknown=(f"op {stamp.op!r} has no known fallback: cannot tell",))
        return compare(stamp, self.now(stamp.op, plan=bool(stamp.plan), shapes=stamp.shapes), real_gpu=not self.info.simulated)

    def shipped(self, key: str, stamp: Any, *, who: str = "a plugin") -> str:
        """A plugin's measured threshold: a stale one is recorded (reported by :meth:`report`) and still used.

        One whose stamp cannot be tied to ``key`` (:func:`untied`: another op's stamp, or an op this
        hwprofile does not know) is a :class:`SettingError` naming ``who`` (the plugin), the key and
        the stamp's op: the plugin's code is wrong, on every device and in every environment.
        """
        if not isinstance(stamp, Stamp):
            return ""
        why = untied(key, stamp.op, tuned=False)
        if why:
            from .optable import owner

            own = owner(key)
            fix = (
                f"stamp it with the stamp of op {own.name}'s sweep "
                f"(hwprofile.plugin.shipped_stamp(__name__, 'measured/{own.name}.toml', op={own.name!r}))"
                if own is not None
                else f"stamp it with the sweep of a known op ({', '.join(TABLE)}) or with none"
            )
            raise SettingError(f"{who} gives {key} a value its stamp cannot vouch for: {why}. Fix the plugin: {fix}")
        c = self.compare(stamp)
        if c.stale:
            self.stale_shipped.append((key, stamp, c.stale))
        return "; ".join(c.stale)

    def report(self, strict: ResolvedSetting) -> None:
        """Report what is stale, once the settings are resolved (``strict`` is the resolved ``strict``
        setting). When it is on, the first stale item is a :class:`SettingError` naming the layer that
        turned it on; otherwise one short warning per process for the stale shipped thresholds, then
        one per stale tuned file."""
        on = bool(strict.value)
        why = f"strict is on ({strict.winner.source}): stale values are errors"
        self._report_shipped(on, why)
        for msg in self.stale_files:
            if on:
                raise SettingError(f"{msg} [{why}]")
            warn_once(msg)

    def _report_shipped(self, strict: bool, strict_why: str) -> None:
        if not self.stale_shipped:
            return
        keys = [k for k, _, _ in self.stale_shipped]
        st = self.stale_shipped[0][1]
        why = sorted({w for _, _, ws in self.stale_shipped for w in ws})
        ops = " ".join(sorted({s.op for _, s, _ in self.stale_shipped}))
        msg = (
            f"hwprofile: {len(keys)} threshold(s) shipped by {st.plugin} {st.plugin_version} are stale on device {self.info.index} "
            f"({why[0]}{f' and {len(why) - 1} more' if len(why) > 1 else ''}); they still apply. "
            f"Details: hwprofile explain {keys[0]}; re-measure: hwprofile sweep OP (ops: {ops})"
        )
        if strict:
            raise SettingError(f"{msg} [{strict_why}; stale keys: {', '.join(keys)}]")
        if not _warned_shipped[0]:
            _warned_shipped[0] = True
            log.warning(msg)

    def tuned_file(self, where: str, stamp: Stamp) -> str:
        """What changed since a tuned file was measured (``""``: nothing). A stale file is recorded, its
        values are not applied, and :meth:`report` warns once per file (an error under ``strict``)."""
        c = self.compare(stamp)
        if not c.stale:
            return ""
        msg = (
            f"hwprofile: {where} is stale for device {self.info.index} ({'; '.join(c.stale)}); its values are ignored "
            f"and the shipped ones apply. Re-tune with: hwprofile sweep {stamp.op} --device {self.info.index}"
        )
        self.stale_files.append(msg)
        return "; ".join(c.stale)


def assess(prof: Any, stamp: Stamp) -> Comparison:
    """The comparison of one stamp with what runs for a resolved profile (for ``explain``)."""
    return Staleness(prof.device, prof.selection, prof.kernels).compare(stamp)


# --- tuned files ---------------------------------------------------------------------------------


def config_dir(environ: Mapping[str, str]) -> str:
    """``HWPROFILE_CONFIG_DIR`` (``~`` expanded), else the user config dir for "hwprofile" as platformdirs defines it.

    The rules (XDG on Linux, a relative ``XDG_CONFIG_HOME`` ignored, a user with no home) are
    :mod:`hwprofile._paths`'; a user with no home has no config dir (a :class:`SettingError` naming
    what to set).
    """
    from . import _paths

    return str(_paths.config_root(environ))


def tuned_dir(info: DeviceInfo, environ: Mapping[str, str]) -> Path:
    """Default location of tuned files for a device: ``<config dir>/tuned/<slug of name and sm>/`` (``nvidia-h200-sm-90``).

    A :class:`SettingError` when there is no config dir (no home, no ``HWPROFILE_CONFIG_DIR``).
    """
    import re

    slug = re.sub(r"[^a-z0-9]+", "-", f"{info.name} {info.sm}".lower()).strip("-")
    return Path(config_dir(environ)) / "tuned" / slug


def tuned_files(info: DeviceInfo, environ: Mapping[str, str]) -> list[Path]:
    """Tuned files for a device: every ``*.toml`` in its default directory, then ``HWPROFILE_TUNED_FILE`` entries.

    Only the directory itself is read: sweep's raw samples live in its ``samples/`` subdirectory.
    A user with no home and no ``HWPROFILE_CONFIG_DIR`` has no default directory: only the
    ``HWPROFILE_TUNED_FILE`` entries are read (``hwprofile doctor`` says why). A ``~`` in either
    variable is expanded; one that cannot be is an error naming the variable.
    """
    from . import _paths

    try:
        d: Path | None = tuned_dir(info, environ)
    except SettingError:
        if _env.CONFIG_DIR.read(environ) is not None:
            raise  # the user's own value could not be expanded: say so
        d = None  # no home: there is no default tuned directory to read
    files = sorted(d.glob("*.toml")) if d is not None and d.is_dir() else []
    files += [Path(_paths.expand(p, environ, what=_env.TUNED_FILE.name)) for p in _env.TUNED_FILE.read(environ)]
    return files


def read_tuned(p: Path) -> tuple[Stamp, dict[str, Any]]:
    """The stamp and thresholds of one tuned file; errors name the file and the fix.

    Every threshold must be one its stamp's measurement decides (:func:`untied`): a stamp naming
    an op this hwprofile does not know, or a key of another op or of no op, is an error naming the
    file, the key and the op.

    Files from older sweeps carry their raw ``[[measurements]]`` inline, after the tables resolving
    needs; only the text before them is parsed (falling back to the whole file if that part is not
    a complete document).
    """
    where = f"tuned file {p}"
    try:
        size = p.stat().st_size
        if size > MAX_TUNED_BYTES:
            raise SettingError(
                f"{where} is {size / 2**20:.1f} MiB; a tuned file holds a stamp and a few thresholds and may be at most "
                f"{MAX_TUNED_BYTES // 2**20} MiB. Move raw measurements out of it ('hwprofile sweep' writes them to "
                f"{SAMPLES_DIR}/), or fix {_env.TUNED_FILE.name} / the tuned directory"
            )
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SettingError(f"{where}: file not found; fix {_env.TUNED_FILE.name} or run 'hwprofile sweep' to write it") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingError(f"{where}: cannot be read ({exc}); regenerate it with 'hwprofile sweep'") from None
    return parse_tuned(text, where)


def parse_tuned(text: str, where: str) -> tuple[Stamp, dict[str, Any]]:
    """The stamp and thresholds of a tuned file's text (:func:`read_tuned`'s checks after reading; ``where`` names it in errors)."""
    import tomllib  # only when a tuned table exists

    doc: dict[str, Any] | None = None
    cut = text.find("\n[[measurements]]")
    if cut >= 0:
        try:
            head = tomllib.loads(text[:cut])
            if isinstance(head.get("thresholds"), dict) and isinstance(head.get("stamp"), dict):
                doc = head
        except tomllib.TOMLDecodeError:
            doc = None
    if doc is None:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise SettingError(f"{where}: not valid TOML ({exc}); regenerate it with 'hwprofile sweep'") from None
    thresholds = doc.get("thresholds")
    if not isinstance(thresholds, dict):
        raise SettingError(f"{where}: no [thresholds] table; regenerate it with 'hwprofile sweep'")
    if not isinstance(doc.get("stamp"), dict):
        raise SettingError(
            f"{where}: no [stamp] table saying what the thresholds were measured against; regenerate it with 'hwprofile sweep'"
        )
    stamp = Stamp.from_dict(doc["stamp"], where=where)
    for key in thresholds:
        why = untied(str(key), stamp.op, tuned=True)
        if why:
            fix = _retune(str(key), stamp.op)
            raise SettingError(f"{where}: [thresholds] sets {key}, which its [stamp] cannot vouch for: {why}. {fix}")
    mkey = measured_key(stamp.op)
    if mkey in thresholds:
        text = thresholds[mkey]
        if not isinstance(text, str):
            raise SettingError(
                f"{where}: [thresholds] {mkey} must be a string of {MEASURED_FORMAT}; regenerate it with 'hwprofile sweep {stamp.op}'"
            )
        loose = [shape_text(s) for s in uncovered(parse_measured(stamp.op, text, where=where), stamp)]
        if loose:
            raise SettingError(
                f"{where}: [thresholds] {mkey} decides shape(s) {', '.join(loose[:4])}{' ...' if len(loose) > 4 else ''} that the "
                f"[stamp]'s launch plan (stamp.shapes) does not cover; regenerate the file with 'hwprofile sweep {stamp.op}'. "
                "Nothing of the file is applied"
            )
    return stamp, thresholds


# --- what nobody measured here ---------------------------------------------------------------------

#: What :func:`unmeasured` and ``hwprofile explain`` call a value no measurement stands behind.
NOT_MEASURED = "not measured on this architecture"


def unmeasured(prof: Any) -> dict[str, str]:
    """The values of ``prof`` a sweep decides that no measurement stands behind on this SKU, key -> why, for ``explain``.

    A sweep decides an op's cost model and per-shape decisions (``<op>.model``, ``<op>.measured``);
    the op's other settings are the kernel's limits and switches (what it takes), which nothing measures.
    Such a value counts as measured when the winning layer carries a stamp (a shipped sweep, a tuned
    file) or the user set it (the environment: the user's decision). Anything else, a plugin's rule or
    the op table's default, is "no measurement for this SKU": what ``hwprofile tune`` measures first.
    Ops the profile has no kernel for are left out (nothing routes on their values).
    """
    from .costmodel import model_key
    from .optable import owner

    out: dict[str, str] = {}
    for key, r in prof.settings.items():
        op = owner(key)
        if op is None or op.name not in prof.kernels or key not in (measured_key(op.name), model_key(op.name)):
            continue
        w = r.winner
        if w.stamp is not None or w.kind == "env":
            continue
        out[key] = f"{NOT_MEASURED} ({prof.device.name}): no measurement for this SKU; {w.source} gives {w.value!r}" + (
            f" because {w.reason}" if w.reason else ""
        )
    return out
