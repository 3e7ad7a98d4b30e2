"""Verdicts of kernel instances checked against float64: their stamp, their file, their fleet key. Never runs a kernel.

A *verdict* says whether one kernel instance (op, name expression, shape) computed the op's
contract within tolerance on one device. It is stamped with everything the result depends on: the
device SKU and compute capability, the driver, the plugin and its version, the NVRTC target, the
kernel source digest and the launch plan (grid, block, shared memory, PDL); a verdict whose stamp
differs from what would run now is no verdict. ``hwprofile selftest`` and verification on first use
(:mod:`hwprofile.ops._verify`) write the same records to the same file, one per device SKU:
``<config dir>/selftest/<device>.json`` (written whole through :func:`hwprofile._files.atomic_write`),
and a fleet store (``HWPROFILE_REMOTE``) shares them under a key made of the stamp's digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from . import _files
from ._log import get_logger
from ._record import Record, final

if TYPE_CHECKING:
    from .kernels.spec import Launch
    from .profiles import Profile

log = get_logger("hwprofile.verdicts")

#: Version of the verdict file's layout.
FORMAT: Final = 1
#: Largest relative error (float64 reference) a kernel may show, by output dtype: fp32 output accumulates
#: in fp32 over K <= 2^20 terms; bf16 output rounds to 8 bits of mantissa.
TOLERANCE: Final = {"float32": 1e-4, "bfloat16": 1e-2}
#: The largest verdict value read from a fleet store (bytes): one verdict is a few hundred.
MAX_REMOTE_BYTES: Final = 16 << 10

Key = tuple[str, str, tuple[int, int, int]]  #: (op, name expression, (M, N, K))


@final
class Outcome(Record):
    """What checking one instance gave: passed, the largest relative error (None: nothing compared), the error in words."""

    ok: bool
    rel_error: float | None = None
    error: str = ""


@dataclass
class Verdict:
    """One instance's stamped result (what the verdict file holds per instance)."""

    op: str
    instance: str
    stamp: dict[str, Any]
    ok: bool
    rel_error: float | None
    error: str
    shape: tuple[int, int, int]
    date: str
    fresh: bool = False  #: run in this process (False: read from the file or the fleet store, its stamp matching)
    where: str = ""  #: who ran it: "this process", the file, or the fleet store

    @property
    def key(self) -> Key:
        return (self.op, self.instance, self.shape)

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "instance": self.instance, "stamp": self.stamp, "ok": self.ok, "rel_error": self.rel_error,
                "error": self.error, "shape": list(self.shape), "date": self.date}

    def describe(self) -> str:
        """In words, for ``explain``, ``show`` and ``doctor``: verified (where, when) or failed (why)."""
        if self.ok:
            err = "" if self.rel_error is None else f", relative error {self.rel_error:.2g}"
            return f"verified {self.date} ({self.where or 'stored'}{err})"
        return f"FAILED {self.date} ({self.where or 'stored'}): {self.error or f'relative error {self.rel_error:.3g}'}"


def from_dict(v: Any) -> Verdict | None:
    """A verdict from its JSON form; None for a malformed one (that instance is checked again)."""
    try:
        shape = tuple(int(x) for x in v["shape"])
        if len(shape) != 3:
            return None
        rel = v["rel_error"]
        return Verdict(str(v["op"]), str(v["instance"]), dict(v["stamp"]), bool(v["ok"]), None if rel is None else float(rel),
                       str(v["error"]), (shape[0], shape[1], shape[2]), str(v["date"]))
    except (KeyError, TypeError, ValueError):
        return None


def stamp(prof: Profile, op: str, plan: Launch, shape: tuple[int, int, int], scale: int) -> dict[str, Any]:
    """What a verdict depends on: device SKU, driver, plugin, target, kernel digest, the launch plan and shape.

    Reads nothing from the driver: the plan is the one being launched, the driver version NVML's.
    """
    spec = prof.kernels[op]
    dev = prof.device
    return {
        "format": FORMAT,
        "device": dev.name,
        "compute_capability": list(dev.compute_capability),
        "driver": dev.driver_version or "",
        "plugin": f"{spec.plugin} ({spec.distribution_version})",
        "target": prof.target or "",
        "kernel": spec.source_digest(),
        "plan": f"{plan.name_expression} grid={list(plan.grid)} block={list(plan.block)} smem={plan.shared_bytes} pdl={plan.pdl}",
        "shape": list(shape),
        "scale": scale,
    }


def remote_key(st: dict[str, Any], namespace: str) -> str:
    """The fleet store's key of the verdict with stamp ``st``: its digest (the stamp names device, driver, kernel, plan)."""
    digest = hashlib.sha256(json.dumps(st, sort_keys=True).encode()).hexdigest()
    return f"{namespace}:verdict:{digest}"


def encode(v: Verdict) -> bytes:
    return json.dumps({"format": FORMAT, "verdict": v.as_dict()}, sort_keys=True).encode()


def decode(data: bytes, st: dict[str, Any]) -> Verdict | None:
    """A verdict read from the fleet store, if it is well formed and stamped exactly ``st`` (else None: not trusted)."""
    try:
        doc = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None
    v = from_dict(doc.get("verdict"))
    if v is None or v.stamp != st:
        return None
    v.where = "the fleet store"
    return v


def path_for(prof: Profile, environ: Any = None) -> Path:
    """``<config dir>/selftest/<slug of the device's name and sm>.json``: one file per device SKU."""
    from .tuning import config_dir

    info = prof.device
    slug = re.sub(r"[^a-z0-9]+", "-", f"{info.name} {info.sm}".lower()).strip("-")
    return Path(config_dir(os.environ if environ is None else environ)) / "selftest" / f"{slug}.json"


def read(path: Path) -> dict[Key, Verdict]:
    """The verdicts a file holds, by (op, instance, shape); an unreadable or foreign file holds none (checked again, then replaced)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("hwprofile: kernel verdicts %s are unreadable (%s): the instances are checked again", path, exc)
        return {}
    out: dict[Key, Verdict] = {}
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return out
    for item in doc.get("verdicts", ()):
        v = from_dict(item)
        if v is not None:
            v.where = f"stored in {path.name}"
            out[v.key] = v
    return out


def write(path: Path, verdicts: Any) -> None:
    """Replace ``path`` by these verdicts (whole, through :func:`hwprofile._files.atomic_write`)."""
    _files.ensure_directory(path.parent, what="kernel verdict directory")
    doc = {"format": FORMAT, "verdicts": [v.as_dict() for v in sorted(verdicts, key=lambda v: (v.op, v.instance, v.shape))]}
    _files.atomic_write(path, json.dumps(doc, indent=1) + "\n", what="kernel verdicts")


def summary(prof: Profile) -> dict[str, dict[str, Any]]:
    """Per op with a kernel: the stored verdicts of ``prof``'s device that match its installed kernel, passed and failed,
    and whether verification is on and who decided (``show``, ``doctor``). Reads the file; runs nothing."""
    try:
        have = list(read(path_for(prof)).values())
    except Exception as exc:  # noqa: BLE001 - a report never fails on its verdict file (no config dir, unreadable)
        log.info("no kernel verdicts for %s: %s", prof.device.name, exc)
        have = []
    on = bool(prof["verify"]) if "verify" in prof else True
    who = prof.explain("verify").winner.source if "verify" in prof else "core"
    out: dict[str, dict[str, Any]] = {}
    for op, spec in prof.kernels.items():
        digest = spec.source_digest()
        mine = [v for v in have if v.op == op and v.stamp.get("kernel") == digest and v.stamp.get("device") == prof.device.name]
        failed = [v for v in mine if not v.ok]
        out[op] = {"verify": on, "verify_source": who, "passed": len(mine) - len(failed), "failed": len(failed),
                   "first_failure": failed[0].describe() if failed else None}
    return out


def summary_text(row: dict[str, Any]) -> str:
    """One op's :func:`summary` row in a few words (``show``'s kernel table)."""
    if not row["verify"]:
        return f"off ({row['verify_source']})"
    if row["failed"]:
        return f"{row['failed']} FAILED, {row['passed']} verified"
    return f"{row['passed']} verified" if row["passed"] else "not yet verified"
