"""Start-up trick: entry points and installed versions read from ``*.dist-info`` directories by hand.

Never imports ``importlib.metadata`` on the common path and never imports the plugins it finds.

Why: ``importlib.metadata.entry_points()`` parses every installed distribution's metadata: 29.7-36.9 ms
(plus 12-19 ms to import it) on a machine with a few hundred packages, which would dominate the first
``profile()`` (benchmarks/RESULTS.md, "Start-up"). Reading only ``entry_points.txt`` of the
``*.dist-info`` and ``*.egg-info`` directories on ``sys.path``, and name and version from the header of
the matching ones, gives the same answer in a few ms. Zip imports fall back to ``importlib.metadata``.
Equivalence: ``tests/plugins/test_entrypoints.py`` checks the answer against ``importlib.metadata`` for the
installed plugins and for every installed distribution's version.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

from . import _state
from ._record import Record, final

#: The entry-point group of hwprofile plugins (here, not in ``registry``: reading it needs no pluggy).
ENTRY_POINT_GROUP = "hwprofile.plugins"
_SEPARATORS = re.compile(r"[-_.]+")


def _normalise(name: str) -> str:
    """A distribution name as PEP 503 compares them: ``jaraco.functools`` is ``jaraco-functools`` is ``Jaraco_Functools``."""
    return _SEPARATORS.sub("-", name).lower()


@final
class EntryPoint(Record):
    """One entry point of a group, with the distribution that declares it."""

    name: str
    value: str
    distribution: str | None
    version: str | None

    def load(self) -> Any:
        import importlib

        module, _, attr = self.value.partition(":")
        obj = importlib.import_module(module.strip())
        for part in filter(None, attr.strip().split(".")):
            obj = getattr(obj, part)
        return obj


_EGG_DIR = re.compile(r"^(?P<name>[^-]+?)(?:-(?P<version>[^-]+?))?(?:-py\d[^-]*)?\.egg-info$")


def _metadata_dir(d: str) -> tuple[str, str | None, str] | None:
    """``(name, version, header file)`` of a ``name-version.dist-info`` or ``*.egg-info`` directory name.

    Plain string tests first: a site-packages directory holds hundreds of entries, and a regex per
    entry showed up in the first ``profile()``'s time.
    """
    if d.endswith(".dist-info"):
        name, _, version = d[:-10].partition("-")
        if name and version and "-" not in version:
            return name, version, "METADATA"
        return None
    if d.endswith(".egg-info"):
        m = _EGG_DIR.match(d)
        if m is not None:
            return m.group("name"), m.group("version"), "PKG-INFO"
    return None


def find_entry_points(group: str) -> list[EntryPoint]:
    """Entry points of ``group`` from every ``*.dist-info`` and ``*.egg-info`` on ``sys.path``, first found wins.

    Why not ``importlib.metadata.entry_points()``: the module docstring (29.7-36.9 ms plus 12-19 ms
    to import it with a few hundred packages, against a few ms here); zip imports fall back to it.
    """
    import sys

    out: list[EntryPoint] = []
    seen_dists: set[str] = set()
    if any(e and os.path.isfile(e) for e in sys.path):
        return _entry_points_slow(group)  # zip imports: let importlib.metadata handle them
    header = f"[{group}]"
    for entry, d, meta in _metadata_dirs():
        dist = _normalise(meta[0])
        if dist in seen_dists:
            continue  # shadowed by an earlier sys.path entry, as importlib.metadata does
        seen_dists.add(dist)
        try:
            with open(os.path.join(entry, d, "entry_points.txt"), encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        if header not in text:
            continue
        name_, version = _dist_header(os.path.join(entry, d, meta[2]), meta[0], meta[1])
        for name, value in _ini_section(text, group):
            out.append(EntryPoint(name, value, name_, version))
    return out


def _ini_section(text: str, section: str) -> list[tuple[str, str]]:
    """``name = value`` pairs of one ``[section]`` of an entry_points.txt (the spec's INI subset)."""
    out, current = [], None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].strip()
        elif current == section and "=" in line:
            name, _, value = line.partition("=")
            out.append((name.strip(), value.strip()))
    return out


_listing_cache: dict[str, list[tuple[str, tuple[str, str | None, str]]]] = {}


def _metadata_dirs() -> Iterator[tuple[str, str, tuple[str, str | None, str]]]:
    """``(sys.path entry, directory, (name, version, header))`` of every distribution's metadata
    directory, in ``sys.path`` order.

    Each sys.path directory is listed once per process (entry points and installed versions both
    read it during the first ``profile()``); :func:`clear_cache` forgets the listings.
    """
    import sys

    for entry in sys.path:
        if not entry:
            continue
        found = _listing_cache.get(entry)
        if found is None:
            try:
                names = os.listdir(entry)
            except OSError:  # missing, a file (zip) or unreadable: holds no metadata directories
                continue
            found = [(d, meta) for d in names if (meta := _metadata_dir(d)) is not None]
            _listing_cache[entry] = found
        for d, meta in found:
            yield entry, d, meta


@_state.on_reset
def clear_cache() -> None:
    """Forget directory listings and installed versions (after installing or removing packages)."""
    global _dist_cache
    _listing_cache.clear()
    _dist_cache = None


def installed_version(*names: str) -> str | None:
    """Version of the first installed distribution among ``names`` (``*.dist-info`` on sys.path), or None.

    Used for fallback identities (torch, cuBLAS), NVRTC's wheel versions and ``hwprofile doctor``,
    without importing them or scanning every distribution's metadata; cached per process.
    """
    index = _dist_index()
    for name in names:
        v = index.get(_normalise(name))
        if v is not None:
            return v
    return None


_dist_cache: dict[str, str] | None = None


def _dist_index() -> dict[str, str]:
    global _dist_cache
    if _dist_cache is None:
        found: dict[str, str] = {}
        for _, _d, meta in _metadata_dirs():
            if meta[2] == "METADATA":
                found.setdefault(_normalise(meta[0]), meta[1] or "")
        _dist_cache = found
    return _dist_cache


def _dist_header(path: str, name: str, version: str | None) -> tuple[str, str | None]:
    """``Name:`` and ``Version:`` from a METADATA / PKG-INFO header (the spelling the distribution uses)."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith("Name:"):
                    name = line[5:].strip()
                elif line.startswith("Version:"):
                    version = line[8:].strip()
                elif not line.strip():
                    break
    except OSError:
        pass
    return name, version


def _entry_points_slow(group: str) -> list[EntryPoint]:
    from importlib import metadata

    out = []
    for ep in metadata.entry_points(group=group):
        dist = ep.dist.metadata["Name"] if ep.dist is not None else None
        out.append(EntryPoint(ep.name, ep.value, dist, ep.dist.version if ep.dist is not None else None))
    return out


_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[str | int, ...]:
    """Sort key that orders digit runs as numbers: ``sm90 < sm100 < sm120``, ``sm_90a < sm_100a``.

    For listing plugins and targets (``hwprofile plugins``, ``--version``, ``doctor``, ``compile``);
    the registry's own order (which decides nothing about layering between architectures) is unchanged.
    """
    return tuple(int(p) if i % 2 else p.lower() for i, p in enumerate(_DIGITS.split(name)))


def package_file(package: str, relpath: str) -> str | None:
    """Path of ``relpath`` inside top-level package ``package`` as ``import package`` would find it
    (the first ``sys.path`` entry holding ``package/__init__.py``), without importing it; ``None`` if absent.

    ``hwprofile doctor`` reads ``torch/version.py`` as text through it: importing torch costs seconds
    (and torch's own warnings) for two strings.
    """
    import sys

    for entry in sys.path:
        base = os.path.join(entry or os.curdir, package)
        if os.path.isfile(os.path.join(base, "__init__.py")):
            path = os.path.join(base, relpath)
            return path if os.path.isfile(path) else None
    return None
