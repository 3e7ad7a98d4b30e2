"""A profile's tuned layers: the tuned files of this device, then the fleet store's tuned tables. Never imports torch.

What a tuned table is and when it is stale is :mod:`hwprofile.tuning`'s; this module adds tables to a settings
resolver as layers (a stale one stays in the chain, unapplied), and moves them through the fleet store
(``HWPROFILE_REMOTE``): the envelope (:data:`TUNED_MAGIC`, checksum), the checks a value read from the store
passes before it is a layer (:func:`decode_tuned`), and publishing a re-tuned table (:func:`publish_tuned`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from . import _env, tuning
from .errors import SettingError
from .optable import TABLE

if TYPE_CHECKING:
    from .device import DeviceInfo
    from .stamps import Stamp
    from .tuning import SettingsResolver, Staleness


def add_tuned_layers(resolver: SettingsResolver, info: DeviceInfo, staleness: Staleness, environ: Mapping[str, str]) -> None:
    """Add every tuned file for ``info`` as a layer; a stale file's values stay in the chain, unapplied.

    Then, with a fleet store (``HWPROFILE_REMOTE``), the store's table of each op that has a kernel
    here and no fresh local file (:func:`add_remote_layers`).
    """
    fresh: set[str] = set()
    for p in tuning.tuned_files(info, environ):
        stamp, thresholds = tuning.read_tuned(p)
        if not _add_tuned(resolver, f"tuned file {p}", stamp, thresholds, staleness):
            fresh.add(stamp.op)
    add_remote_layers(resolver, info, staleness, environ, skip=fresh)


def _add_tuned(resolver: SettingsResolver, where: str, stamp: Stamp, thresholds: dict[str, Any], staleness: Staleness) -> str:
    """Add one tuned table as a layer; what makes it stale (``""``: fresh, applied)."""
    what = staleness.tuned_file(where, stamp)
    mkey, spec = tuning.measured_key(stamp.op), staleness.kernels.get(stamp.op)
    if not what and spec is not None and isinstance(thresholds.get(mkey), str):
        refused = tuning.untakeable(stamp.op, tuning.parse_measured(stamp.op, thresholds[mkey], where=where), spec)
        if refused:
            raise SettingError(
                f"{where}: [thresholds] {mkey} sends shape(s) to the {stamp.op} kernel that it cannot take here: "
                f"{'; '.join(f'{tuning.shape_text(s)} ({why})' for s, why in list(refused.items())[:3])}"
                f"{' ...' if len(refused) > 3 else ''}. Regenerate the file with "
                f"'hwprofile sweep {stamp.op}' on this plugin, or remove the entries. Nothing of the file is applied"
            )

    def check(key: str, st: Any, what: str = what) -> str:
        return what

    resolver.add("tuned", where, thresholds, who=where, stamp=stamp, check=check, drop_stale=True)
    return what


# --- the fleet store's tuned tables ----------------------------------------------------------------

#: What starts a tuned table in the fleet store: magic, then sha256 of the body, then the body (the tuned file's TOML).
TUNED_MAGIC = b"HWPTUNED"


def encode_tuned(text: str) -> bytes:
    """A tuned file's text as a fleet-store value: :data:`TUNED_MAGIC`, the body's sha256, the body."""
    import hashlib

    body = text.encode("utf-8")
    return TUNED_MAGIC + hashlib.sha256(body).digest() + body


def decode_tuned(data: bytes, device: str, plugin: str, op: str, where: str) -> tuple[Stamp, dict[str, Any]] | str:
    """The stamp and thresholds of a fleet-store value, or what is wrong with it.

    Checked as a tuned file is (size, TOML, stamp, :func:`parse_tuned`'s checks), plus the envelope
    (magic, checksum) and the key: the stamp must name the device SKU, plugin and op of the key it
    was read from (a value copied under another key is refused).
    """
    import hashlib

    head = len(TUNED_MAGIC) + 32
    if len(data) < head or not data.startswith(TUNED_MAGIC):
        return "is not a tuned table (no HWPTUNED magic)"
    if len(data) - head > tuning.MAX_TUNED_BYTES:
        return f"is {len(data) - head} bytes, over the {tuning.MAX_TUNED_BYTES}-byte limit of a tuned file"
    body = data[head:]
    if hashlib.sha256(body).digest() != data[len(TUNED_MAGIC) : head]:
        return "is truncated or corrupt (checksum mismatch)"
    try:
        stamp, thresholds = tuning.parse_tuned(body.decode("utf-8"), where)
    except UnicodeDecodeError:
        return "is not UTF-8 text"
    except SettingError as exc:
        return f"is malformed ({exc})"
    if (stamp.device, stamp.plugin, stamp.op) != (device, plugin, op):
        return f"belongs to another key (its stamp names {stamp.device} / {stamp.plugin} / {stamp.op})"
    return stamp, thresholds


def publish_tuned(info: DeviceInfo, plugin: str, op: str, text: str) -> bool:
    """Put one op's tuned file text in the fleet store, if one is configured (best effort: False when not published)."""
    from . import _remote

    store = _remote.store()
    if store is None:
        return False
    return store.put("tuned", _remote.tuned_key(tuning.device_identity(info), plugin, op), encode_tuned(text))


def add_remote_layers(
    resolver: SettingsResolver, info: DeviceInfo, staleness: Staleness, environ: Mapping[str, str], *, skip: Iterable[str] = ()
) -> None:
    """Add the fleet store's tuned table of every op that has a kernel here, except ``skip`` (ops a fresh local file decides).

    Read after the local files, in one round trip. A value that fails :func:`decode_tuned` (or that
    sends shapes to a kernel that cannot take them) is one warning and skipped, never applied; a stale
    one is reported and left unapplied exactly as a stale tuned file is.
    """
    if _env.REMOTE.read(environ) is None:
        return  # no store: the first profile() imports nothing more
    from . import _remote

    store = _remote.store(environ)
    plugin = staleness.selection.plugin
    if store is None or plugin is None:
        return
    device = tuning.device_identity(info)
    keys = {_remote.tuned_key(device, plugin.name, op): op for op in TABLE if op in staleness.kernels and op not in set(skip)}
    got = store.get_many("tuned", list(keys), len(TUNED_MAGIC) + 32 + tuning.MAX_TUNED_BYTES)
    for key, op in keys.items():
        data = got.get(key)
        if data is None:
            continue
        where = f"remote tuned table {key} in {store.shown}"
        found = decode_tuned(data, device, plugin.name, op, where)
        if isinstance(found, str):
            _remote.note("tuned", "rejected")
            tuning.warn_once(f"hwprofile: {where} {found}; it is not applied (the local values apply; a re-tune publishes over it)")
            continue
        try:
            _add_tuned(resolver, where, *found, staleness)
        except SettingError as exc:
            _remote.note("tuned", "rejected")
            tuning.warn_once(f"hwprofile: {exc} [{where} is not applied]")
            continue
        _remote.note("tuned", "hits")
