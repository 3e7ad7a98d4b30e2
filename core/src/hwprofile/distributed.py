"""Cross-rank agreement over the engine's torch.distributed group; never a transport of its own, never torch at import.

Every rank of a group must have resolved the same profile, or the job stops with the ranks and keys
named. Never imported by ``import hwprofile``; torch.distributed is imported inside the functions
that need it. The one collective goes through the group the engine already initialised (gloo on the
CPU, NCCL on the rank's current CUDA device).

    import torch.distributed as dist, hwprofile.distributed
    dist.init_process_group("nccl")
    torch.cuda.set_device(local_rank)
    agreement = hwprofile.distributed.check_agreement()   # every rank; raises AgreementError on a difference
    log.info("%s", agreement.table())

The common case costs one ``all_gather`` of a fixed 128-byte record per rank (a SHA-256 over every
compared key, plus the rank's host, device index and fingerprint for the table). Only when the
digests differ does every rank gather every rank's full summary (a padded byte all_gather) to name the
differing keys, values, provenance, ranks and hosts. Every rank takes the same path, because every
rank sees the same gathered digests.

``torchrun --nproc-per-node N -m hwprofile.distributed`` is the bring-up command (see ``main``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pickle
import socket
import struct
import sys
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from . import __version__, _state
from ._log import get_logger
from ._record import Record, _set, final
from .errors import AgreementError, HwprofileError

if TYPE_CHECKING:
    from .profiles import Profile

log = get_logger(__name__)

MIXED_CHOICES: Final = ("error", "allow")

# Scopes of a compared key (_SCOPES lists them weakest first; a key takes the strictest scope any rank gives it):
#   job     must be equal on every rank of the group (software versions, deterministic/strict, downstream plugins)
#   present must be equal on every rank that has it (an architecture plugin's version, a value the user set)
#   device  follows from the GPU model: with mixed="allow" it is compared only among ranks with the same model
#   model   the GPU model itself (name, capability): with mixed="allow" it may differ
_SCOPES: Final = ("model", "device", "present", "job")
_JOB_SETTINGS: Final = ("deterministic", "strict")  # modes the user picks for the whole job
_ABSENT: Final = "(absent)"

_RECORD: Final = struct.Struct("<32s8sHh84s")  # digest, fingerprint, device index, local rank, host (utf-8, cut)
RECORD_BYTES: Final = _RECORD.size  # 128


@final
class Entry(Record):
    """One compared key of one rank: its value as text, where it came from, and how widely it must agree."""

    __slots__ = ("value", "source", "scope")

    #: Canonical text of the value (booleans and strings as JSON writes them); the only part compared.
    value: str
    #: Provenance: the layer and plugin, env var or file that decided it. Shown, never compared.
    source: str
    #: One of ``_SCOPES``: how widely the key must agree.
    scope: str

    def __init__(self, value: str, source: str, scope: str) -> None:
        _set(self, "value", value)
        _set(self, "source", source)
        _set(self, "scope", scope)


@final
class RankSummary(Record):
    """What one rank resolved: who it is (rank, host, device) and every compared key.

    Sent between ranks as plain data (:meth:`to_wire`), so ranks running different hwprofile
    versions can still read each other's summaries, and the difference shows as a key.
    """

    __slots__ = (
        "rank", "host", "local_rank", "device_index", "device_name", "device_sm", "plugin", "target", "fingerprint", "digest", "entries",
        "disabled",
    )

    #: Global rank.
    rank: int
    host: str
    #: ``LOCAL_RANK`` if the launcher set it.
    local_rank: int | None
    #: CUDA index of the checked device, in that process's numbering.
    device_index: int
    device_name: str
    device_sm: str
    #: ``"sm90 (hwprofile-sm90 0.1.0)"``, or ``"none"``.
    plugin: str
    #: ``"sm_90a"``, or ``"-"``.
    target: str
    #: The profile's fingerprint.
    fingerprint: str
    #: Hex SHA-256 over the compared values and the fingerprint (:func:`entries_digest`).
    digest: str
    #: Every compared key.
    entries: Mapping[str, Entry]
    #: ``HWPROFILE_DISABLE_PLUGINS`` on that rank: explains an absent plugin.
    disabled: tuple[str, ...]

    def __init__(
        self, *, rank: int, host: str, local_rank: int | None, device_index: int, device_name: str, device_sm: str, plugin: str,
        target: str, fingerprint: str, digest: str, entries: Mapping[str, Entry], disabled: tuple[str, ...] = (),
    ) -> None:
        _set(self, "rank", rank)
        _set(self, "host", host)
        _set(self, "local_rank", local_rank)
        _set(self, "device_index", device_index)
        _set(self, "device_name", device_name)
        _set(self, "device_sm", device_sm)
        _set(self, "plugin", plugin)
        _set(self, "target", target)
        _set(self, "fingerprint", fingerprint)
        _set(self, "digest", digest)
        _set(self, "entries", MappingProxyType(dict(entries)))
        _set(self, "disabled", tuple(disabled))

    def to_wire(self) -> dict[str, Any]:
        """Plain data (str, int, None, tuples, dicts) to gather from every rank."""
        out: dict[str, Any] = {s: getattr(self, s) for s in self.__slots__ if s != "entries"}
        out["entries"] = {k: (e.value, e.source, e.scope) for k, e in self.entries.items()}
        return out

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> RankSummary:
        entries = {str(k): Entry(str(v[0]), str(v[1]), str(v[2])) for k, v in dict(d.get("entries", {})).items()}
        local = d.get("local_rank")
        return cls(
            rank=int(d["rank"]), host=str(d.get("host", "?")), local_rank=None if local is None else int(local),
            device_index=int(d.get("device_index", -1)), device_name=str(d.get("device_name", "?")), device_sm=str(d.get("device_sm", "?")),
            plugin=str(d.get("plugin", "?")), target=str(d.get("target", "?")), fingerprint=str(d.get("fingerprint", "?")),
            digest=str(d.get("digest", "")), entries=entries, disabled=tuple(str(x) for x in d.get("disabled", ())),
        )

    @property
    def model(self) -> tuple[str, str]:
        """The GPU model: (name, sm)."""
        return (self.device_name, self.device_sm)

    def __repr__(self) -> str:
        return f"<RankSummary rank {self.rank} on {self.host}: {self.device_name} ({self.device_sm}), {self.plugin}, {self.fingerprint}>"


@final
class Holding(Record):
    """One value of a differing key, with its provenance and the ranks (and hosts) that hold it."""

    __slots__ = ("value", "sources", "ranks", "hosts")

    value: str
    #: Distinct provenance texts among those ranks.
    sources: tuple[str, ...]
    ranks: tuple[int, ...]
    #: Host -> its ranks holding this value.
    hosts: Mapping[str, tuple[int, ...]]

    def __init__(self, value: str, sources: tuple[str, ...], ranks: tuple[int, ...], hosts: Mapping[str, tuple[int, ...]]) -> None:
        _set(self, "value", value)
        _set(self, "sources", tuple(sources))
        _set(self, "ranks", tuple(ranks))
        _set(self, "hosts", MappingProxyType(dict(hosts)))


@final
class Difference(Record):
    """A key whose value differs between ranks that must agree on it."""

    __slots__ = ("key", "scope", "holdings")

    key: str
    scope: str
    #: One per value, most-held first.
    holdings: tuple[Holding, ...]

    def __init__(self, key: str, scope: str, holdings: tuple[Holding, ...]) -> None:
        _set(self, "key", key)
        _set(self, "scope", scope)
        _set(self, "holdings", tuple(holdings))

    def values(self) -> dict[str, tuple[int, ...]]:
        """value -> ranks holding it."""
        return {h.value: h.ranks for h in self.holdings}


@final
class Agreement(Record):
    """Every rank of the group resolved the same profile (up to GPU models, with ``mixed="allow"``)."""

    __slots__ = ("ranks", "models", "mixed", "gathered", "seconds")

    #: One summary per rank of the group, in group order.
    ranks: tuple[RankSummary, ...]
    #: (device name, sm) -> ranks; more than one only with ``mixed="allow"``.
    models: Mapping[tuple[str, str], tuple[int, ...]]
    mixed: str
    #: Whether every rank's full summary was gathered (a mismatch, mixed models, or ``gather=True``);
    #: otherwise the other ranks' keys are this rank's, which their equal digests prove.
    gathered: bool
    #: Wall time of the check on this rank.
    seconds: float

    def __init__(
        self, ranks: tuple[RankSummary, ...], models: Mapping[tuple[str, str], tuple[int, ...]], mixed: str, gathered: bool, seconds: float,
    ) -> None:
        _set(self, "ranks", tuple(ranks))
        _set(self, "models", MappingProxyType(dict(models)))
        _set(self, "mixed", mixed)
        _set(self, "gathered", gathered)
        _set(self, "seconds", seconds)

    @property
    def digest(self) -> str:
        """The common digest, or ``""`` when accepted models differ."""
        digests = {r.digest for r in self.ranks}
        return digests.pop() if len(digests) == 1 else ""

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.host for r in self.ranks))

    def describe(self) -> str:
        """One line for a log: how many ranks and hosts agree, on what."""
        n, h = self.size, len(self.hosts)
        head = f"hwprofile: {n} rank{'s' * (n != 1)} on {h} host{'s' * (h != 1)} agree"
        if len(self.models) > 1:
            models = "; ".join(f"{_who(r)}: {name} ({sm})" for (name, sm), r in self.models.items())
            return f"{head} apart from their GPU models, accepted by mixed='allow' ({models})"
        r0 = self.ranks[0]
        return f"{head} on {r0.device_name} ({r0.device_sm}), plugin {r0.plugin}, fingerprint {r0.fingerprint} (digest {self.digest[:12]})"

    def table(self) -> str:
        """:meth:`describe`, then one row per rank: rank, host, local rank, device, model, plugin, target, fingerprint."""
        return self.describe() + "\n" + _table([_row_cells(r) for r in self.ranks], _HEADER)

    def as_dict(self) -> dict[str, Any]:
        return {
            "agree": True,
            "mixed": self.mixed,
            "digest": self.digest,
            "models": [{"name": n, "sm": sm, "ranks": list(r)} for (n, sm), r in self.models.items()],
            "ranks": [_row(r) for r in self.ranks],
            "seconds": self.seconds,
        }

    def __repr__(self) -> str:
        return f"<Agreement {self.describe()}>"


# --- the local summary -----------------------------------------------------------------------------


def _text(v: Any) -> str:
    """Canonical text of a value: booleans and strings as JSON writes them, numbers as Python does."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, str):
        import json

        return json.dumps(v)
    return str(v)


def _nvrtc() -> tuple[str, str]:
    try:
        from . import kernels

        major, minor = kernels.nvrtc_version()
    except Exception as exc:  # noqa: BLE001 - a missing toolchain is a value to compare, not a failure here
        return "unavailable", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:160]
    from .registry import installed_version

    nv = installed_version("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu12")
    return f"{major}.{minor}", f"cuda-bindings NVRTC{f' (nvidia-cuda-nvrtc {nv})' if nv else ''}"


def _kernel_digest(spec: Any) -> str:
    """What decides the cubin besides the target and NVRTC: source and every header, options, instances."""
    doc = repr((spec.package, spec.source, spec.source_digest(with_cuda_headers=True), tuple(spec.options), tuple(spec.instances)))
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def _setting_source(s: Any) -> str:
    w = s.winner
    text = f"{w.kind}: {w.source}"
    ignored = [f"{x.kind} {x.source} ignored ({x.stale})" for x in s.chain if not x.applied]
    return text + (f"; {'; '.join(ignored)}" if ignored else "")


def profile_entries(prof: Profile, environ: Mapping[str, str] | None = None) -> dict[str, Entry]:
    """Every key of a profile that must agree across ranks, with its provenance and scope.

    ``environ`` (default ``os.environ``) is the environment the profile was resolved from; it only
    explains a plugin selection (a pin or a disable list).
    """
    import torch

    from .registry import DISABLE_ENV, PIN_ENV

    env = os.environ if environ is None else environ
    d = prof.device
    out: dict[str, Entry] = {}
    out["hwprofile"] = Entry(__version__, "hwprofile core", "job")
    out["torch"] = Entry(str(torch.__version__), "the torch imported by this process (its fallbacks compute the numbers)", "job")
    out["nvrtc"] = Entry(*_nvrtc(), "job")
    where = "simulated by HWPROFILE_DEVICE" if d.simulated else f"CUDA device {d.index}" + (f", PCI {d.pci_bus_id}" if d.pci_bus_id else "")
    out["device.name"] = Entry(d.name, where, "model")
    out["device.capability"] = Entry(f"{d.compute_capability[0]}.{d.compute_capability[1]}", where, "model")
    p = prof.plugin
    pinned = env.get(PIN_ENV, "").strip()
    reason = prof.selection.reason + (f" ({DISABLE_ENV}={env[DISABLE_ENV]})" if env.get(DISABLE_ENV) else "")
    out["plugin"] = Entry(p.name if p else "none", reason, "job" if pinned else "device")
    out["plugin.target"] = Entry(prof.target or "none", reason, "device")
    for part in prof.participants:
        ident = f"{part.distribution} {part.version}" if part.distribution else f"not installed as a distribution ({part.module})"
        if part.arch is not None:
            out[f"plugin.{part.name}"] = Entry(ident, f"architecture plugin selected for {d.sm}", "present")
        else:
            out[f"plugin.{part.name}"] = Entry(ident, "downstream plugin (takes part in every profile)", "job")
    # A value the user chose (an env var) is the user's choice for every rank, whatever its GPU model: it must agree on
    # every rank that has the key ("present": a key only another model's plugin declares is absent there, not different).
    for key, s in prof.settings.items():
        scope = "job" if key in _JOB_SETTINGS else "present" if s.winner.kind == "env" else "device"
        out[f"setting.{key}"] = Entry(_text(s.value), _setting_source(s), scope)
    for name, e in prof.env_defaults.items():
        if e.user_set:
            out[f"env.{name}"] = Entry(_text(e.user_value), f"set by the user (default {e.value!r} from {e.source} not applied)", "present")
        else:
            out[f"env.{name}"] = Entry(_text(e.value), f"env default from {e.source}", "device")
    for op, spec in prof.kernels.items():
        src = f"plugin {spec.plugin} ({spec.distribution_version}): {spec.package}/{spec.source}, {len(spec.instances)} instance(s)"
        out[f"kernel.{op}"] = Entry(_kernel_digest(spec), src, "device")
    return out


def entries_digest(entries: Mapping[str, Entry], fingerprint: str) -> bytes:
    """SHA-256 over every compared value (not the provenance) and the profile fingerprint: 32 bytes."""
    doc = repr((tuple(sorted((k, e.value) for k, e in entries.items())), fingerprint))
    return hashlib.sha256(doc.encode()).digest()


_local_cache: dict[int, tuple[Any, dict[str, Entry], bytes]] = {}


def _local(prof: Profile) -> tuple[dict[str, Entry], bytes]:
    """Entries and digest of this process's profile, computed once per profile object."""
    hit = _local_cache.get(prof.device.index)
    if hit is not None and hit[0] is prof:
        return hit[1], hit[2]
    entries = profile_entries(prof)
    digest = entries_digest(entries, prof.fingerprint)
    _local_cache[prof.device.index] = (prof, entries, digest)
    return entries, digest


def disabled_plugins(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Plugin names blocked by ``HWPROFILE_DISABLE_PLUGINS`` (as the registry reads it)."""
    from .registry import DISABLE_ENV

    env = os.environ if environ is None else environ
    return tuple(n.strip() for n in env.get(DISABLE_ENV, "").split(",") if n.strip())


def _local_rank() -> int | None:
    v = os.environ.get("LOCAL_RANK", "").strip()
    return int(v) if v.lstrip("-").isdigit() else None


_warned_devices: set[tuple[int, int]] = set()


def resolve_device(device: int | None, *, cuda_backend: bool) -> int:
    """The CUDA index (this process's numbering) whose profile this rank checks.

    An explicit ``device`` wins. Otherwise torch's current device, when torch has initialised CUDA
    or the group runs on CUDA (NCCL: the device it communicates on). Otherwise ``LOCAL_RANK``
    when this process sees several devices (launchers that expose every GPU to every rank, before
    ``torch.cuda.set_device``; simulated ``HWPROFILE_DEVICE=a,b,...`` lists too). Otherwise 0 (one
    visible device, as with a per-rank ``CUDA_VISIBLE_DEVICES``).
    """
    if device is not None:
        return int(device)
    local = _local_rank()
    torch = sys.modules.get("torch")
    if torch is not None and (cuda_backend or torch.cuda.is_initialized()):
        current = int(torch.cuda.current_device())
        if local is not None and local != current and torch.cuda.device_count() > 1 and (local, current) not in _warned_devices:
            _warned_devices.add((local, current))
            log.warning(
                "hwprofile: this rank (LOCAL_RANK=%d) checks CUDA device %d, torch's current device, among %d visible; "
                "if every rank of this host uses device %d, call torch.cuda.set_device(local_rank) before check_agreement",
                local, current, torch.cuda.device_count(), current,
            )
        return current
    from . import device as _device

    visible = len(_device.detect().devices)
    if local is not None and visible > 1:
        if local >= visible:
            raise HwprofileError(
                f"LOCAL_RANK={local} but this process sees only {visible} device(s); pass device= to check_agreement "
                "or give each rank its own device (CUDA_VISIBLE_DEVICES, torch.cuda.set_device)"
            )
        return local
    return 0


# --- comparison ------------------------------------------------------------------------------------


def compare(summaries: Sequence[RankSummary], mixed: str = "error") -> tuple[list[Difference], dict[tuple[str, str], tuple[int, ...]]]:
    """The differences between ranks that must agree, and the GPU models with their ranks.

    Pure: every rank runs it on the same gathered summaries and reaches the same verdict.
    """
    _check_mixed(mixed)
    models: dict[tuple[str, str], list[int]] = {}
    for s in summaries:
        models.setdefault(s.model, []).append(s.rank)
    keys = sorted({k for s in summaries for k in s.entries}, key=_key_order)
    diffs: list[Difference] = []
    for key in keys:
        present = [s.entries[key].scope for s in summaries if key in s.entries]
        scope = max(present, key=_strictness)
        if scope == "present":
            groups = [[s for s in summaries if key in s.entries]]
        elif mixed == "allow" and scope in ("model", "device"):
            groups = [[s for s in summaries if s.model == m] for m in models]
        else:
            groups = [list(summaries)]
        for g in groups:
            d = _difference(key, scope, g)
            if d is not None:
                diffs.append(d)
    if not diffs:  # equal keys but different digests: the fingerprint (or the digest scheme itself) differs
        for g in [[s for s in summaries if s.model == m] for m in models] if mixed == "allow" else [list(summaries)]:
            d = _difference("fingerprint", "job", g, lambda s: Entry(s.fingerprint, "the profile's fingerprint", "job"))
            d = d or _difference(
                "digest", "job", g, lambda s: Entry(s.digest[:16], "the agreement digest (another hwprofile version?)", "job")
            )
            if d is not None:
                diffs.append(d)
    return diffs, {m: tuple(r) for m, r in models.items()}


def _strictness(scope: str) -> int:
    """Position in _SCOPES; a scope this version does not know (another hwprofile on that rank) counts as job."""
    return _SCOPES.index(scope) if scope in _SCOPES else len(_SCOPES)


_ORDER: Final = ("hwprofile", "torch", "nvrtc", "device.", "plugin", "setting.", "env.", "kernel.")


def _key_order(key: str) -> tuple[int, str]:
    """Causes before consequences: versions, the device, plugins, then settings, env defaults, kernels."""
    return next((i for i, p in enumerate(_ORDER) if key.startswith(p)), len(_ORDER)), key


def _difference(key: str, scope: str, group: Sequence[RankSummary], get: Any = None) -> Difference | None:
    by_value: dict[str, list[RankSummary]] = {}
    for s in group:
        e = get(s) if get is not None else s.entries.get(key)
        by_value.setdefault(e.value if e is not None else _ABSENT, []).append(s)
    if len(by_value) < 2:
        return None
    holdings = []
    for value, holders in sorted(by_value.items(), key=lambda kv: (-len(kv[1]), kv[1][0].rank)):
        sources = []
        for s in holders:
            e = get(s) if get is not None else s.entries.get(key)
            src = e.source if e is not None else _absent_reason(key, s)
            if src not in sources:
                sources.append(src)
        hosts: dict[str, list[int]] = {}
        for s in holders:
            hosts.setdefault(s.host, []).append(s.rank)
        holdings.append(Holding(value, tuple(sources), tuple(s.rank for s in holders), {h: tuple(r) for h, r in hosts.items()}))
    return Difference(key, scope, tuple(holdings))


def _absent_reason(key: str, s: RankSummary) -> str:
    if key.startswith("plugin.") and key[7:] in s.disabled:
        return f"not loaded on this rank: disabled by HWPROFILE_DISABLE_PLUGINS={','.join(s.disabled)}"
    if key.startswith("plugin."):
        return "not loaded on this rank (not installed, disabled by HWPROFILE_DISABLE_PLUGINS, or it does not serve this device)"
    if key.startswith("kernel."):
        return f"no kernel for this op on this rank (plugin {s.plugin})"
    if key.startswith("setting."):
        return "not declared on this rank (the plugin declaring it is not loaded)"
    if key.startswith("env."):
        return "no plugin on this rank proposes this variable"
    return "not reported by this rank (another hwprofile version?)"


_MAX_LISTED = 16


def _message(
    diffs: Sequence[Difference], summaries: Sequence[RankSummary], models: Mapping[tuple[str, str], tuple[int, ...]], mixed: str
) -> str:
    n = len(summaries)
    lines = [
        f"hwprofile: the {n} ranks of the process group do not agree on their profiles: {len(diffs)} key(s) differ "
        "(every rank raises this error). Ranks that dispatch differently compute different numbers, and a "
        "tensor-parallel job diverges or hangs."
    ]
    if len(models) > 1 and mixed == "error":
        desc = "; ".join(f"{_who(r)}: {name} ({sm})" for (name, sm), r in models.items())
        lines.append(
            f"  The ranks run different GPU models ({desc}). If that is intended, pass mixed='allow' "
            "(bring-up: --mixed allow); model-dependent keys are then compared only among ranks of one model."
        )
    for d in diffs[:_MAX_LISTED]:
        lines.append(f"  {d.key}:")
        for h in d.holdings:
            where = ", ".join(f"{_ranks(r)} (host {host})" for host, r in h.hosts.items())
            lines.append(f"    = {h.value}  on {'ranks' if len(h.ranks) > 1 else 'rank'} {where}, from {' | '.join(h.sources)}")
    if len(diffs) > _MAX_LISTED:
        lines.append(f"  ... and {len(diffs) - _MAX_LISTED} more (AgreementError.differences has them all)")
    lines.append(
        "  Fix: make the installed plugins, HWPROFILE_* variables and tuned files alike on every rank; "
        "'hwprofile explain <key>' on a rank shows a setting's whole chain, and "
        "'torchrun --nproc-per-node N -m hwprofile.distributed' checks a cluster before a job starts."
    )
    return "\n".join(lines)


# --- the collective ----------------------------------------------------------------------------------

_calls: dict[str, int] = {}  # checks per group in this process: numbers the store keys of a failed wait


def _check_mixed(mixed: str) -> None:
    if mixed not in MIXED_CHOICES:
        raise ValueError(f"check_agreement(mixed={mixed!r}): use 'error' (every rank must run the same GPU model) or 'allow'")


def _seconds(timeout: float | timedelta | None) -> float | None:
    if timeout is None:
        return None
    s = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if not s > 0:
        raise ValueError(
            f"check_agreement(timeout={timeout!r}): give a positive number of seconds, or None for the process group's timeout"
        )
    return s


def check_agreement(
    group: Any = None,
    *,
    device: int | None = None,
    mixed: str = "error",
    timeout: float | timedelta | None = None,
    gather: bool = False,
) -> Agreement:
    """Check that every rank of ``group`` (default: the world) resolved the same profile.

    Call it on every rank of the group, after ``init_process_group`` (and ``torch.cuda.set_device``)
    and before the first forward. It compares plugin identities and versions, every resolved
    setting, env defaults, kernel source digests, the NVRTC and torch versions, the
    deterministic/strict modes and the GPU model. ``mixed="allow"`` accepts different GPU models
    when everything that does not follow from the model agrees. ``timeout`` (seconds) bounds the wait
    for the other ranks (default: the process group's timeout); ``gather=True`` always gathers every
    rank's full summary (the bring-up command does). Every rank must pass the same ``mixed``,
    ``timeout`` and ``gather``.

    Returns an :class:`Agreement`; raises :class:`hwprofile.AgreementError` on every rank when the
    profiles differ, naming each differing key, its values, their provenance and the ranks and hosts
    holding each, or when a rank did not take part within ``timeout``.
    """
    _check_mixed(mixed)
    wait_s = _seconds(timeout)
    t0 = time.perf_counter()
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        raise HwprofileError(f"check_agreement needs torch with torch.distributed ({exc})") from None
    if not dist.is_available() or not dist.is_initialized():
        raise HwprofileError(
            "check_agreement: torch.distributed is not initialised in this process; call torch.distributed.init_process_group() "
            "first (or run the bring-up check: torchrun --nproc-per-node N -m hwprofile.distributed)"
        )
    from .profiles import profile

    pg, ranks, me, cuda, tag = _group_info(dist, group)
    index = resolve_device(device, cuda_backend=cuda)
    prep = _prepare(torch, pg, tag, len(ranks), index, profile(index), me, cuda)
    mine = prep.mine
    if len(ranks) == 1:
        return Agreement((mine,), {mine.model: (me,)}, mixed, gathered=True, seconds=time.perf_counter() - t0)

    seq = _calls[tag] = _calls.get(tag, 0) + 1
    gather_one = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    try:
        work = gather_one(prep.out, prep.inp, group=group, async_op=True)
        if wait_s is None:
            work.wait()
        else:
            work.wait(timedelta(seconds=wait_s))
        host_out = prep.out.cpu()  # NCCL: waits for the gather; gloo: the same tensor
        raw = ctypes.string_at(host_out.data_ptr(), host_out.numel())  # contiguous uint8; no numpy needed, no per-byte loop
    except Exception as exc:  # a timeout or a peer that died: say which ranks were missing
        raise _missing_error(dist, tag, seq, me, ranks, wait_s, exc) from exc

    if not gather and raw == prep.raw:  # the same answer as last time on this group: every rank agreed then
        return Agreement(prep.summaries, {mine.model: ranks}, mixed, gathered=False, seconds=time.perf_counter() - t0)
    records = [_RECORD.unpack_from(raw, i * RECORD_BYTES) for i in range(len(ranks))]
    if len({r[0] for r in records}) == 1 and not gather:
        prep.summaries = tuple(
            mine.replace(
                rank=rank,
                host=r[4].rstrip(b"\0").decode(errors="replace"),
                local_rank=None if r[3] < 0 else r[3],
                device_index=r[2],
                fingerprint=r[1].hex(),
            )
            for rank, r in zip(ranks, records, strict=True)
        )
        prep.raw = raw
        return Agreement(prep.summaries, {mine.model: ranks}, mixed, gathered=False, seconds=time.perf_counter() - t0)

    try:
        wires = _gather_bytes(torch, dist, group, pickle.dumps(mine.to_wire()), prep.inp.device, len(ranks))
    except Exception as exc:  # a peer that died between the two collectives
        raise _missing_error(dist, tag, seq, me, ranks, wait_s, exc) from exc
    summaries = tuple(RankSummary.from_wire(pickle.loads(w)) for w in wires)
    diffs, models = compare(summaries, mixed)
    if diffs:
        msg = _message(diffs, summaries, models, mixed)
        raise AgreementError(msg, differences=tuple(diffs), ranks=summaries)
    agreement = Agreement(summaries, models, mixed, gathered=True, seconds=time.perf_counter() - t0)
    if len(models) > 1 and me == ranks[0]:
        log.warning(
            "%s. Kernels and thresholds follow each model, so results differ between the models in the last bits; everything else agrees.",
            agreement.describe(),
        )
    return agreement


def _gather_bytes(torch: Any, dist: Any, group: Any, payload: bytes, dev: Any, size: int) -> list[bytes]:
    """Every rank's ``payload``, in group order: lengths, then one padded uint8 all_gather.

    Not ``all_gather_object``: torch's object collectives need numpy, which engines need not have
    (torch does not require it), and the bring-up command always takes this path.
    """
    n = torch.tensor([len(payload)], dtype=torch.int64, device=dev)
    lengths = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(size)]
    dist.all_gather(lengths, n, group=group)
    sizes = [int(t.item()) for t in lengths]
    width = max(sizes)
    buf = torch.zeros(width, dtype=torch.uint8)
    buf[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    outs = [torch.empty(width, dtype=torch.uint8, device=dev) for _ in range(size)]
    dist.all_gather(outs, buf.to(dev), group=group)
    got = []
    for t, k in zip(outs, sizes, strict=True):
        host = t.cpu().contiguous()
        got.append(ctypes.string_at(host.data_ptr(), k))
    return got


# Weak references only: holding a process group here would keep it alive past destroy_process_group(), into
# interpreter shutdown, where tearing gloo down aborts the process ("terminate called without an active exception").
_groups: dict[int, tuple[Any, tuple[int, ...], int, bool, str]] = {}


def _group_info(dist: Any, group: Any) -> tuple[Any, tuple[int, ...], int, bool, str]:
    """(the group, its global ranks, this rank, whether it gathers CUDA tensors, a name for store keys), cached per group object."""
    pg = group if group is not None else dist.group.WORLD
    hit = _groups.get(id(pg))
    if hit is not None and hit[0]() is pg:
        return pg, hit[1], hit[2], hit[3], hit[4]
    if dist.get_rank(pg) < 0:
        raise HwprofileError(
            f"check_agreement: rank {dist.get_rank()} is not a member of the group it was given; call it on the group's ranks only"
        )
    ranks = tuple(int(r) for r in dist.get_process_group_ranks(pg))
    backend = str(dist.get_backend(pg)).lower()
    cuda = "nccl" in backend and "gloo" not in backend  # a combined "cpu:gloo,cuda:nccl" group gathers CPU tensors over gloo
    name = getattr(pg, "group_name", None) if group is not None else "world"
    tag = str(name or "ranks-" + "-".join(map(str, ranks)))
    _groups[id(pg)] = (weakref.ref(pg), ranks, int(dist.get_rank()), cuda, tag)
    return pg, ranks, int(dist.get_rank()), cuda, tag


class _Prepared:
    """What repeated checks of one group and device reuse: this rank's summary, its record, the buffers."""

    __slots__ = ("cuda_index", "disabled", "group", "inp", "local_rank", "mine", "out", "prof", "raw", "summaries")

    def __init__(self, group: Any, prof: Any, mine: RankSummary, inp: Any, out: Any, cuda_index: int | None) -> None:
        self.group = weakref.ref(group)  # the process group this was built for (a re-initialised world is another)
        self.prof = prof  # the profile object summarised (a reset() makes a new one)
        self.mine = mine
        self.local_rank = mine.local_rank
        self.disabled = mine.disabled
        self.inp, self.out = inp, out  # the 128-byte record and the gather buffer, on the group's device
        self.cuda_index = cuda_index
        self.raw = b""  # the last gathered bytes that agreed, and their summaries
        self.summaries: tuple[RankSummary, ...] = ()


_prepared: dict[tuple[str, int], _Prepared] = {}


def _prepare(torch: Any, pg: Any, tag: str, size: int, index: int, prof: Profile, me: int, cuda: bool) -> _Prepared:
    """This rank's summary and record for ``prof``, built once per (group, device, profile, LOCAL_RANK, disable list)."""
    local_rank, disabled = _local_rank(), disabled_plugins()
    cuda_index = int(torch.cuda.current_device()) if cuda else None
    prep = _prepared.get((tag, index))
    same = prep is not None and prep.group() is pg and prep.prof is prof
    if prep is not None and same and (prep.local_rank, prep.disabled, prep.cuda_index) == (local_rank, disabled, cuda_index):
        return prep
    entries, digest = _local(prof)
    host = socket.gethostname()
    mine = RankSummary(
        rank=me,
        host=host,
        local_rank=local_rank,
        device_index=index,
        device_name=prof.device.name,
        device_sm=prof.device.sm,
        plugin=prof.plugin.label if prof.plugin else "none",
        target=prof.target or "-",
        fingerprint=prof.fingerprint,
        digest=digest.hex(),
        entries=entries,
        disabled=disabled,
    )
    dev = torch.device("cuda", cuda_index) if cuda else torch.device("cpu")
    record = _RECORD.pack(
        digest, bytes.fromhex(prof.fingerprint[:16].ljust(16, "0")), index, -1 if local_rank is None else local_rank, host.encode()[:84]
    )
    inp = torch.frombuffer(bytearray(record), dtype=torch.uint8).to(dev)
    out = torch.empty(size * RECORD_BYTES, dtype=torch.uint8, device=dev)
    prep = _prepared[(tag, index)] = _Prepared(pg, prof, mine, inp, out, cuda_index)
    return prep


@_state.on_reset
def _forget_profiles() -> None:
    """After ``hwprofile.reset()``: drop the summaries and gather buffers built for the old profiles.

    ``_calls`` stays: it numbers store keys, which must stay in step with the other ranks.
    """
    _local_cache.clear()
    _prepared.clear()
    _warned_devices.clear()


def _missing_error(
    dist: Any, tag: str, seq: int, me: int, ranks: Sequence[int], wait_s: float | None, exc: BaseException
) -> AgreementError:
    """After a failed wait: mark this rank as arrived in the group's store, give the others a moment, name who never came."""
    missing: list[int] = []
    arrived: list[int] = []
    try:
        store = dist.distributed_c10d._get_default_store()
        prefix = f"hwprofile/agreement/{tag}/{seq}/"
        store.set(prefix + str(me), "1")
        grace = min(5.0, max(1.0, (wait_s or 10.0) / 2))
        deadline = time.monotonic() + grace
        others = [r for r in ranks if r != me]
        while True:
            missing = [r for r in others if not store.check([prefix + str(r)])]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        arrived = [r for r in ranks if r not in missing]
    except Exception as store_exc:  # noqa: BLE001 - naming the ranks is a courtesy; the failure is reported anyway
        log.info("hwprofile: could not ask the process group's store which ranks arrived: %s", store_exc)
    waited = f"{wait_s:g} s" if wait_s is not None else "the process group's timeout"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if missing:
        who = (
            f"rank{'s' * (len(missing) > 1)} {_ranks(missing)} had not called check_agreement when rank {me} gave up "
            f"(rank{'s' * (len(arrived) > 1)} {_ranks(arrived)} had)"
        )
    elif arrived:
        who = f"every rank reached check_agreement, but the collective failed on rank {me}"
    else:
        who = f"rank {me} cannot tell which of ranks {_ranks(ranks)} are missing (the process group's store did not answer)"
    msg = (
        f"hwprofile: check_agreement on rank {me} waited {waited} for the {len(ranks)} ranks of its group: {who}. "
        f"torch.distributed said: {first}. Every rank must call check_agreement after init_process_group and before the "
        "first forward; a rank that is still loading, crashed, or skipped the call would hang the job at its first collective. "
        "Raise timeout= if ranks legitimately arrive later."
    )
    return AgreementError(msg, missing=tuple(missing))


# --- helpers ------------------------------------------------------------------------------------------


def _who(ranks: Sequence[int]) -> str:
    """``"rank 3"`` or ``"ranks 0-2, 5"``."""
    return f"rank{'s' * (len(set(ranks)) > 1)} {_ranks(ranks)}"


def _ranks(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    rs = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}" if j > i + 1 else f"{rs[i]}, {rs[j]}")
        i = j + 1
    return ", ".join(parts)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


# --- bring-up command -------------------------------------------------------------------------------

_TORCHRUN_ENV: Final = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def main(argv: Sequence[str] | None = None) -> int:
    """``torchrun --nproc-per-node N [--nnodes ...] -m hwprofile.distributed``: check a cluster before a job.

    Every rank resolves its own profile (its LOCAL_RANK's device) and joins one check; rank 0
    prints the per-rank table. Exit status: 0 agree, 1 disagree or a rank missing, 2 usage error.
    """
    import argparse

    p = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node N -m hwprofile.distributed",
        description="Check that every rank of a torchrun job resolves the same hwprofile profile.",
    )
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto", help="auto: nccl with a GPU per local rank, else gloo")
    p.add_argument("--mixed", choices=list(MIXED_CHOICES), default="error", help="allow: accept different GPU models that otherwise agree")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for every rank (default 120)")
    p.add_argument("--json", action="store_true", help="rank 0 prints the result as JSON")
    args = p.parse_args(argv)

    missing_env = [v for v in _TORCHRUN_ENV if v not in os.environ]
    if missing_env:
        print(
            f"hwprofile.distributed: not started by torchrun ({', '.join(missing_env)} unset). Run it on every node as\n"
            "  torchrun --nproc-per-node N -m hwprofile.distributed                      (one host)\n"
            "  torchrun --nnodes M --nproc-per-node N --rdzv-backend c10d --rdzv-endpoint HOST:PORT "
            "-m hwprofile.distributed   (each of M hosts)\n"
            "or call hwprofile.distributed.check_agreement() in the engine after init_process_group.",
            file=sys.stderr,
        )
        return 2
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    backend = args.backend
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    if backend == "auto":
        # NCCL needs a GPU of its own per rank: with more ranks on this host than GPUs (a simulated
        # job on a one-GPU machine), it fails with "invalid usage"; gloo checks the same profiles
        backend = "nccl" if 0 < local_ranks <= gpus else "gloo"
    if backend == "nccl":
        if local_ranks > gpus:
            print(
                f"hwprofile.distributed: rank {rank}: error: --backend nccl needs one GPU per rank, but this host runs "
                f"{local_ranks} ranks and torch sees {gpus} GPU(s); use --backend gloo or fewer ranks per host",
                file=sys.stderr,
            )
            return 2
        torch.cuda.set_device(_local_rank() or 0)
    timeout = timedelta(seconds=max(args.timeout, 1.0) + 30)
    dist.init_process_group(backend, timeout=timeout)
    together = True  # every rank reached the end of the check: they can leave together
    try:
        try:
            agreement = check_agreement(mixed=args.mixed, timeout=args.timeout, gather=True)
        except AgreementError as exc:
            together = bool(exc.differences)
            if rank == 0 or not exc.differences:  # every rank knows the differences; a missing rank is seen by each waiting one
                if args.json:
                    print(json_dumps({"agree": False, "error": str(exc), "ranks": [_row(r) for r in exc.ranks]}))
                else:
                    if exc.ranks:
                        print(_table([_row_cells(r) for r in exc.ranks], _HEADER))
                    print(str(exc), file=sys.stderr)
            return 1
        except HwprofileError as exc:
            together = False
            print(f"hwprofile.distributed: rank {rank}: error: {exc}", file=sys.stderr)
            return 2
        if rank == 0:
            print(json_dumps(agreement.as_dict()) if args.json else agreement.table())
        return 0
    finally:
        sys.stdout.flush()
        if together:
            # A rank that tears gloo down while a peer is still using its connections can make the peer abort
            # ("terminate called without an active exception"): leave together.
            dist.barrier()
            dist.destroy_process_group()


_HEADER: Final[list[str]] = ["rank", "host", "local", "device", "model", "plugin", "target", "fingerprint"]


def _row_cells(r: RankSummary) -> list[str]:
    return [
        str(r.rank),
        r.host,
        "-" if r.local_rank is None else str(r.local_rank),
        f"cuda:{r.device_index}",
        f"{r.device_name} ({r.device_sm})",
        r.plugin,
        r.target,
        r.fingerprint,
    ]


def _row(r: RankSummary) -> dict[str, Any]:
    return {k: v for k, v in r.to_wire().items() if k != "entries"}


def json_dumps(doc: Any) -> str:
    import json

    return json.dumps(doc, indent=2, default=str)


if __name__ == "__main__":  # pragma: no cover - exercised through torchrun in the tests
    sys.exit(main())
