"""The cache entry format: ``magic | sha256(body) | body``, encoded and verified in memory. Never touches the disk.

An entry carries its key, key document, target, lowered names and compile log, then the cubin;
:func:`decode` verifies the checksum, the key, the target and every requested name, for a file
and a fleet-store value alike (:mod:`hwprofile.kernels.cache`, "Entries carry their key").
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from ._cache_key import key_of
from .toolchain import CompiledKernel

MAGIC = b"HWPCUBIN"
MAX_ENTRY_BYTES = 256 << 20


def encode(compiled: CompiledKernel, doc: Mapping[str, Any]) -> bytes:
    meta = json.dumps(
        {"key": compiled.key, "inputs": dict(doc), "target": compiled.target, "lowered": dict(compiled.lowered), "log": compiled.log}
    ).encode()
    body = struct.pack("<I", len(meta)) + meta + compiled.cubin
    return MAGIC + hashlib.sha256(body).digest() + body


def decode(data: bytes, key: str, target: str | None = None, expressions: Sequence[str] = ()) -> tuple[CompiledKernel | None, str]:
    """``(entry, "")`` for a valid entry of ``key``, else ``(None, what is wrong with it)``."""
    head = len(MAGIC) + 32
    if len(data) < head + 4 or not data.startswith(MAGIC):
        return None, "is truncated or corrupt"
    digest, body = data[len(MAGIC) : head], data[head:]
    if hashlib.sha256(body).digest() != digest:
        return None, "is truncated or corrupt (checksum mismatch)"
    (n,) = struct.unpack("<I", body[:4])
    try:
        meta = json.loads(body[4 : 4 + n])
    except ValueError:
        return None, "has malformed metadata"
    lowered = meta.get("lowered") if isinstance(meta, dict) else None
    ok = (
        isinstance(meta, dict)
        and isinstance(meta.get("key"), str)
        and isinstance(meta.get("inputs"), dict)
        and isinstance(meta.get("target"), str)
        and isinstance(meta.get("log", ""), str)
        and isinstance(lowered, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in lowered.items())
    )
    if not ok or not isinstance(lowered, dict):
        return None, "has malformed metadata"
    if meta["key"] != key or key_of(meta["inputs"]) != key:
        return None, f"belongs to another key ({str(meta['key'])[:16]}...): it was misfiled or copied here"
    if target is not None and meta["target"] != target:
        return None, f"was built for {meta['target']}, not {target}"
    missing = [e for e in expressions if e not in lowered]
    if missing:
        return None, f"lacks the instance(s) {', '.join(missing)}"
    return CompiledKernel(key, meta["target"], body[4 + n :], lowered, meta.get("log", ""), cached=True), ""


def entry_name(key: str) -> str:
    return f"{key}.cubin"
