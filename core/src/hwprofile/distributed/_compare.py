"""Comparing rank summaries and wording the verdict; pure: never a collective, never torch, never I/O.

:func:`compare` takes every rank's :class:`~hwprofile.distributed._summary.RankSummary` and returns
the :class:`Difference` list and the GPU models; every rank runs it on the same gathered summaries,
so every rank reaches the same verdict. :func:`_message` words an ``AgreementError``;
:class:`Agreement` is the verdict when the ranks agree, with its one-line and per-rank renderings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

from .. import _env
from .._record import Record, _set, final
from .._text import table
from ._summary import _SCOPES, Entry, RankSummary

MIXED_CHOICES: Final = ("error", "allow")
_ABSENT: Final = "(absent)"


@final
class Holding(Record):
    """One value of a differing key, with its provenance and the ranks (and hosts) that hold it."""

    value: str
    #: Distinct provenance texts among those ranks.
    sources: tuple[str, ...]
    ranks: tuple[int, ...]
    #: Host -> its ranks holding this value.
    hosts: Mapping[str, tuple[int, ...]]

    def __post_init__(self) -> None:
        _set(self, "sources", tuple(self.sources))
        _set(self, "ranks", tuple(self.ranks))
        _set(self, "hosts", MappingProxyType(dict(self.hosts)))


@final
class Difference(Record):
    """A key whose value differs between ranks that must agree on it."""

    key: str
    scope: str
    #: One per value, most-held first.
    holdings: tuple[Holding, ...]

    def __post_init__(self) -> None:
        _set(self, "holdings", tuple(self.holdings))

    def values(self) -> dict[str, tuple[int, ...]]:
        """value -> ranks holding it."""
        return {h.value: h.ranks for h in self.holdings}


@final
class Agreement(Record):
    """Every rank of the group resolved the same profile (up to GPU models, with ``mixed="allow"``)."""

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

    def __post_init__(self) -> None:
        _set(self, "ranks", tuple(self.ranks))
        _set(self, "models", MappingProxyType(dict(self.models)))

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
        return self.describe() + "\n" + table([_row_cells(r) for r in self.ranks], _HEADER)

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
        return f"not loaded on this rank: disabled by {_env.DISABLE_PLUGINS.name}={','.join(s.disabled)}"
    if key.startswith("plugin."):
        return f"not loaded on this rank (not installed, disabled by {_env.DISABLE_PLUGINS.name}, or it does not serve this device)"
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
        f"  Fix: make the installed plugins, {_env.PREFIX}* variables and tuned files alike on every rank; "
        "'hwprofile explain <key>' on a rank shows a setting's whole chain, and "
        "'torchrun --nproc-per-node N -m hwprofile.distributed' checks a cluster before a job starts."
    )
    return "\n".join(lines)


def _check_mixed(mixed: object) -> None:
    if mixed not in MIXED_CHOICES:
        raise ValueError(f"check_agreement(mixed={mixed!r}): use 'error' (every rank must run the same GPU model) or 'allow'")


# --- text: rank lists and the per-rank table (also the bring-up command's) ----------------------------


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
