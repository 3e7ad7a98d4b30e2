"""The cache key: a JSON document of every compile input, and its SHA-256. Never touches the disk, never holds a machine path.

The rules are :mod:`hwprofile.kernels.cache`'s ("Key", "The key is portable"): source and every
header it reaches by content, the full flag list with include directories as placeholders, target,
name expressions, NVRTC's version and build, hwprofile's version and the supplying plugin's.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import toolchain

if TYPE_CHECKING:
    from .spec import KernelSpec
    from .toolchain import CompileOptions

FORMAT = 2


def key_document(spec: KernelSpec, options: CompileOptions, expressions: Sequence[str]) -> dict[str, Any]:
    """Every input of one compile, as a JSON-able document (what the key hashes and entries store)."""
    from .._version import __version__
    from .spec import _resolve_include, _source_digest

    dirs = options.header_dirs()
    pre = []
    for name in options.extra.pre_includes:
        found = _resolve_include(name, dirs)
        pre.append([os.path.basename(name), _source_digest(str(found), dirs) if found is not None else None])
    return {
        "format": FORMAT,
        "source": _source_digest(str(spec.source_path()), dirs),
        "pre_includes": pre,
        "options": options.as_key(),
        "names": list(expressions),
        "nvrtc": [*toolchain.nvrtc_version(), toolchain.nvrtc_build()],
        "hwprofile": __version__,
        "plugin": spec.distribution_version,
    }


def key_of(doc: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
