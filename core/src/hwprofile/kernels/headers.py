"""Which CUDA header directory NVRTC compiles against: the one whose CUDA major is NVRTC's. Never imports CUDA.

NVRTC 12 fails inside CUDA 13's ``cuda_fp8.hpp`` (and the reverse is not supported either), and a
CUDA 12 setup often has a CUDA 13 runtime wheel installed too (a dependency of something else), in
which case cuda.pathfinder may return the CUDA 13 headers first. So every candidate directory is
read for its ``CUDART_VERSION`` and the first one of NVRTC's major wins; :func:`choose` reports a
mismatch in words when there is none, and ``hwprofile doctor`` fails on it.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable

_VERSION_RE = re.compile(rb"#\s*define\s+CUDART_VERSION\s+(\d+)")


def cuda_major(directory: str) -> int | None:
    """The CUDA major of a header directory (``CUDART_VERSION`` in ``cuda_runtime_api.h``), or ``None``."""
    try:
        with open(os.path.join(directory, "cuda_runtime_api.h"), "rb") as f:
            m = _VERSION_RE.search(f.read(1 << 16))
    except OSError:
        return None
    return int(m.group(1)) // 1000 if m else None


def candidates(found_by_pathfinder: str | None) -> list[str]:
    """Header directories to consider, in order: cuda.pathfinder's choice, the NVIDIA wheels on
    ``sys.path`` (``nvidia/cu13/include``, ``nvidia/cuda_runtime/include`` for CUDA 12), then
    ``CUDA_PATH`` / ``CUDA_HOME``."""
    out: list[str] = [found_by_pathfinder] if found_by_pathfinder else []
    for entry in sys.path:
        base = os.path.join(entry or ".", "nvidia")
        if not os.path.isdir(base):
            continue
        try:
            names = sorted(os.listdir(base), reverse=True)
        except OSError:
            continue
        out += [os.path.join(base, n, "include") for n in names if re.fullmatch(r"cu\d+", n)]
        out.append(os.path.join(base, "cuda_runtime", "include"))
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            out.append(os.path.join(os.environ[var], "include"))
    unique = list(dict.fromkeys(out))
    return [d for d in unique if os.path.isfile(os.path.join(d, "cuda_runtime_api.h"))]


def choose(nvrtc_major: int | None, dirs: Iterable[str]) -> tuple[str | None, str | None]:
    """``(directory, problem)``: the first directory of NVRTC's CUDA major (problem ``None``), else
    the first directory at all with the mismatch in words, or ``(None, reason)`` when there is none."""
    from .._install import hwprofile_extra

    dirs = list(dirs)
    if not dirs:
        return None, f"no CUDA headers (cuda_runtime_api.h) found: install nvidia-cuda-runtime with {hwprofile_extra('cu13')} (or cu12)"
    if nvrtc_major is None:
        return dirs[0], None
    for d in dirs:
        if cuda_major(d) == nvrtc_major:
            return d, None
    found = ", ".join(f"{d} (CUDA {cuda_major(d)})" for d in dirs)
    return dirs[0], (
        f"NVRTC is CUDA {nvrtc_major} but the CUDA headers found are not: {found}; NVRTC {nvrtc_major} cannot compile "
        f"against them. Install the matching runtime headers: {hwprofile_extra(f'cu{nvrtc_major}')}"
    )
