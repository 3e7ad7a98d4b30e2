"""What this rank resolved, as comparable entries and one digest; never a collective, never torch at import.

A rank's :class:`RankSummary` names who it is (rank, host, local rank, device) and holds one
:class:`Entry` per key that must agree across ranks (:func:`profile_entries`), each with its value,
its provenance and its scope; :func:`entries_digest` hashes the values. :func:`resolve_device`
picks the device whose profile this rank checks. torch is imported inside the functions that
need it (``profile_entries`` reads its version; ``resolve_device`` only looks at an already
imported torch).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from .. import _env, _state
from .._log import get_logger
from .._record import Record, _set, final
from .._version import __version__
from ..errors import HwprofileError

if TYPE_CHECKING:
    from ..profiles import Profile

log = get_logger("hwprofile.distributed")  # the package's logger, as before it was split into modules


# Scopes of a compared key (_SCOPES lists them weakest first; _compare.compare gives a key the strictest scope any rank gives it):
#   job     must be equal on every rank of the group (software versions, deterministic/strict, downstream plugins)
#   present must be equal on every rank that has it (an architecture plugin's version: H100 and H200 ranks share sm90)
#   device  follows from the GPU model: with mixed="allow" it is compared only among ranks with the same model
#   model   the GPU model itself (name, capability): with mixed="allow" it may differ
# A key's scope follows from the key alone, never from its provenance: values, never provenance, are compared, so a
# user's override equal to what the plugin gives that model is no difference (it would be, were "the user set it" a scope).
_SCOPES: Final = ("model", "device", "present", "job")
_JOB_SETTINGS: Final = ("deterministic", "strict")  # modes the user picks for the whole job


@final
class Entry(Record):
    """One compared key of one rank: its value as text, where it came from, and how widely it must agree."""

    #: Canonical text of the value (booleans and strings as JSON writes them); the only part compared.
    value: str
    #: Provenance: the layer and plugin, env var or file that decided it. Shown, never compared.
    source: str
    #: One of ``_SCOPES``: how widely the key must agree.
    scope: str


@final
class RankSummary(Record):
    """What one rank resolved: who it is (rank, host, device) and every compared key.

    Sent between ranks as plain data (:meth:`to_wire`), so ranks running different hwprofile
    versions can still read each other's summaries, and the difference shows as a key.
    """

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
    disabled: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _set(self, "entries", MappingProxyType(dict(self.entries)))
        _set(self, "disabled", tuple(self.disabled))

    def to_wire(self) -> dict[str, Any]:
        """Plain data (str, int, None, tuples, dicts) to gather from every rank."""
        out: dict[str, Any] = {s: getattr(self, s) for s in self.__record_fields__ if s != "entries"}
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
        from .. import kernels

        major, minor = kernels.nvrtc_version()
    except Exception as exc:  # noqa: BLE001 - a missing toolchain is a value to compare, not a failure here
        return "unavailable", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:160]
    from .._entrypoints import installed_version

    nv = installed_version("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu12")
    return f"{major}.{minor}", f"cuda-bindings NVRTC{f' (nvidia-cuda-nvrtc {nv})' if nv else ''}"


def _kernel_digest(spec: Any) -> str:
    """What decides the cubin besides the target and NVRTC: source and every header, options, instances.

    Path-free, as the kernel cache key is: an include directory in the options is a placeholder (its
    headers are in the source digest as content), so ranks whose plugins sit under different install
    prefixes agree.
    """
    from ..kernels import include_dirs

    doc = repr((spec.package, spec.source, spec.source_digest(include_dirs()), spec.nvrtc_options.portable,
                tuple(spec.instances)))
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

    env = os.environ if environ is None else environ
    d = prof.device
    out: dict[str, Entry] = {}
    out["hwprofile"] = Entry(__version__, "hwprofile core", "job")
    out["torch"] = Entry(str(torch.__version__), "the torch imported by this process (its fallbacks compute the numbers)", "job")
    out["nvrtc"] = Entry(*_nvrtc(), "job")
    pci = f", PCI {d.pci_bus_id}" if d.pci_bus_id else ""
    where = f"simulated by {_env.DEVICE.name}" if d.simulated else f"CUDA device {d.index}{pci}"
    out["device.name"] = Entry(d.name, where, "model")
    out["device.capability"] = Entry(f"{d.compute_capability[0]}.{d.compute_capability[1]}", where, "model")
    p = prof.plugin
    disable = _env.DISABLE_PLUGINS.name
    reason = prof.selection.reason + (f" ({disable}={env[disable]})" if env.get(disable) else "")
    out["plugin"] = Entry(p.name if p else "none", reason, "device")  # a pin (HWPROFILE_PLUGIN) is provenance: in the reason
    out["plugin.target"] = Entry(prof.target or "none", reason, "device")
    for part in prof.participants:
        ident = f"{part.distribution} {part.version}" if part.distribution else f"not installed as a distribution ({part.module})"
        if part.arch is not None:
            out[f"plugin.{part.name}"] = Entry(ident, f"architecture plugin selected for {d.sm}", "present")
        else:
            out[f"plugin.{part.name}"] = Entry(ident, "downstream plugin (takes part in every profile)", "job")
    # Where a value came from (plugin, tuned file, the user's environment) is shown, never compared, and never widens the
    # comparison: with mixed="allow" a setting is compared among the ranks of one model whoever set it.
    for key, s in prof.settings.items():
        out[f"setting.{key}"] = Entry(_text(s.value), _setting_source(s), "job" if key in _JOB_SETTINGS else "device")
    for name, e in prof.env_defaults.items():
        if e.user_set:
            out[f"env.{name}"] = Entry(_text(e.user_value), f"set by the user (default {e.value!r} from {e.source} not applied)", "device")
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
    return _env.DISABLE_PLUGINS.read(os.environ if environ is None else environ)


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
    from ..profiles import detect

    visible = len(detect().devices)  # plugin-named simulated devices count too
    if local is not None and visible > 1:
        if local >= visible:
            raise HwprofileError(
                f"LOCAL_RANK={local} but this process sees only {visible} device(s); pass device= to check_agreement "
                "or give each rank its own device (CUDA_VISIBLE_DEVICES, torch.cuda.set_device)"
            )
        return local
    return 0


@_state.on_reset
def _forget_summaries() -> None:
    """After ``hwprofile.reset()``: drop the entries computed for the old profiles and the warn-once devices."""
    _local_cache.clear()
    _warned_devices.clear()
