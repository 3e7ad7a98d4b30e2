"""Per-target hardware limits a launch plan must fit, checked on the CPU; never imports CUDA.

A plan that exceeds one of these is refused by the driver at launch (``cuFuncSetAttribute`` for the
dynamic shared memory, ``cuLaunchKernel(Ex)`` for threads, registers or the cluster): checking every
plan of every target here finds that on a machine without the GPU, before a first run on it.

Values: the CUDA C++ Programming Guide (CUDA 12.8-13.0), "Compute Capabilities", table "Technical
Specifications per Compute Capability" (threads per block, registers per thread / block / SM,
shared memory per SM and per block with opt-in) and section "Thread Block Clusters" (clusters from
compute capability 9.0; 8 blocks is the portable cluster size every such device must launch). The
opt-in per-block figure is what ``cudaDevAttrMaxSharedMemoryPerBlockOptin`` reports and what the
catalog's ``max_shared_memory_per_block_optin`` holds; a test holds the two equal.

The static shared memory of a kernel (``__shared__`` arrays) counts against the same per-block limit
as the dynamic shared memory its plan asks for: :func:`check` adds it, read from the compile log
(:func:`static_shared_bytes`) or declared by the caller.
"""

from __future__ import annotations

import re
from typing import Final

from .._record import Record, final

_KIB: Final = 1024


@final
class Limits(Record):
    """One compute capability's published per-block and per-SM limits."""

    compute_capability: tuple[int, int]
    max_threads_per_block: int
    max_threads_per_sm: int
    max_registers_per_thread: int
    max_registers_per_block: int
    max_registers_per_sm: int
    max_shared_per_block: int  #: opt-in, bytes: static + dynamic shared memory of one block
    max_shared_per_sm: int  #: bytes
    clusters: bool  #: thread-block clusters (compute capability 9.0 and later)
    max_cluster: int  #: the portable cluster size (1: no clusters)


def _row(cc: tuple[int, int], threads_sm: int, smem_block_kib: int, smem_sm_kib: int) -> Limits:
    clusters = cc >= (9, 0)
    smem_block, smem_sm = smem_block_kib * _KIB, smem_sm_kib * _KIB
    return Limits(cc, 1024, threads_sm, 255, 64 * _KIB, 64 * _KIB, smem_block, smem_sm, clusters, 8 if clusters else 1)


#: compute capability -> its limits (the guide's table, columns 8.0 .. 12.1)
TABLE: Final[dict[tuple[int, int], Limits]] = {
    r.compute_capability: r
    for r in (
        _row((8, 0), 2048, 163, 164),  # A100
        _row((8, 6), 1536, 99, 100),  # GA10x
        _row((8, 7), 2048, 163, 164),  # Jetson Orin
        _row((8, 9), 1536, 99, 100),  # Ada (L40S, RTX 40)
        _row((9, 0), 2048, 227, 228),  # Hopper
        _row((10, 0), 2048, 227, 228),  # B200, GB200
        _row((10, 3), 2048, 227, 228),  # B300, GB300
        _row((11, 0), 2048, 227, 228),  # Thor
        _row((12, 0), 1536, 99, 100),  # RTX PRO 6000, RTX 5090
        _row((12, 1), 1536, 99, 100),  # DGX Spark GB10
    )
}

_TARGET_RE = re.compile(r"^sm_(\d+?)(\d)[af]?$")


def capability(target: str) -> tuple[int, int]:
    """``"sm_120a"`` -> ``(12, 0)``; a ValueError for anything else."""
    m = _TARGET_RE.match(target)
    if m is None:
        raise ValueError(f"not an NVRTC target: {target!r} (expected sm_XY, sm_XYa or sm_XYf)")
    return int(m.group(1)), int(m.group(2))


def for_target(target: str) -> Limits:
    """The limits of ``target``'s compute capability; a ValueError naming the known ones otherwise."""
    cc = capability(target)
    lim = TABLE.get(cc)
    if lim is None:
        known = ", ".join(f"{a}.{b}" for a, b in TABLE)
        raise ValueError(f"no published limits recorded for {target} (compute capability {cc[0]}.{cc[1]}); known: {known}")
    return lim


_SMEM_RE = re.compile(r"(\d+) bytes smem")
_REG_RE = re.compile(r"Used (\d+) registers")


def static_shared_bytes(log: str) -> int:
    """The largest static shared memory (``__shared__``) ptxas reports in a compile log (0 if none)."""
    return max((int(x) for x in _SMEM_RE.findall(log)), default=0)


def check(
    target: str,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    shared_bytes: int,
    *,
    cluster: int | None = None,
    static_shared: int = 0,
    registers: int | None = None,
) -> list[str]:
    """What a launch of ``grid`` x ``block`` with ``shared_bytes`` of dynamic shared memory breaks on ``target``.

    ``cluster`` is the blocks per cluster (the skinny-GEMM kernels cluster ``grid[1]`` blocks:
    pass ``grid[1]``); ``static_shared`` the kernel's static shared memory and ``registers`` its
    registers per thread, from the compiled cubin (:func:`static_shared_bytes`, the log's "Used N
    registers"). An empty list: it fits.
    """
    lim = for_target(target)
    out = []
    threads = block[0] * block[1] * block[2]
    if threads < 1 or threads > lim.max_threads_per_block:
        out.append(f"{threads} threads per block: {target} allows 1..{lim.max_threads_per_block}")
    smem = shared_bytes + static_shared
    if smem > lim.max_shared_per_block:
        out.append(
            f"{smem} bytes of shared memory per block ({shared_bytes} dynamic + {static_shared} static): "
            f"{target} allows {lim.max_shared_per_block}"
        )
    if cluster is not None and cluster > 1:
        if not lim.clusters:
            out.append(f"a cluster of {cluster} blocks: {target} has no thread-block clusters")
        elif cluster > lim.max_cluster:
            out.append(f"a cluster of {cluster} blocks: {target}'s portable cluster is at most {lim.max_cluster}")
        elif grid[0] * grid[1] * grid[2] % cluster:
            out.append(f"grid {grid} is not a whole number of clusters of {cluster} blocks")
    if registers is not None:
        if registers > lim.max_registers_per_thread:
            out.append(f"{registers} registers per thread: {target} allows {lim.max_registers_per_thread}")
        if registers * threads > lim.max_registers_per_block:
            out.append(f"{registers} registers x {threads} threads per block: {target} allows {lim.max_registers_per_block}")
    return out


def registers(log: str) -> int | None:
    """The largest register count per thread ptxas reports in a compile log (None if it reports none)."""
    found = _REG_RE.findall(log)
    return max(int(x) for x in found) if found else None
