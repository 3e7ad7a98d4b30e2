"""What every ``hwprofile`` command group shares: value formatting, the progress bar, the profile of ``--device``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _fmt(v: Any, key: str = "") -> str:
    if key.endswith(".measured") and isinstance(v, str) and v:  # a per-shape table: its size here, its entries in explain
        n = len(v.replace(";", " ").split())
        return f"<{n} measured shape{'s' if n != 1 else ''}>"
    if key.endswith(".model") and isinstance(v, str) and v:  # a cost model: whether it was fitted here, its text in explain
        fitted = next((f.split("=", 1)[1].strip() for f in v.split(";") if f.strip().startswith("samples=")), "0")
        return f"<cost model fitted on {fitted} samples>" if fitted not in ("", "0") else "<cost model: a default, not fitted>"
    return json.dumps(v) if isinstance(v, (bool, str)) or v is None else str(v)


def _sm(d: Any) -> str:
    return f"{d.sm}, simulated" if d.simulated else d.sm


def _progress(enabled: bool, width: int) -> Any:
    """A progress callback drawing a bar on stderr, or ``None`` when stderr is not a terminal."""
    if not enabled or not sys.stderr.isatty():
        return None

    def progress(done: int, total: int, what: str) -> None:
        bar = "#" * (20 * done // total)
        print(f"\r[{bar:<20}] {done}/{total} {what}".ljust(width), end="\n" if done == total else "", file=sys.stderr, flush=True)

    return progress


def _profile(args: argparse.Namespace) -> Any:
    from .profiles import profile

    return profile(args.device)
