"""Per-target limit tables (hwprofile.kernels.limits) and every plan of every target checked against them on the CPU:
threads, dynamic + static shared memory, cluster size, and the compiled cubins' registers and spills (NVRTC here).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

import hwprofile
from hwprofile import catalog
from hwprofile.kernels import limits
from hwprofile.kernels.skinny_gemm import PREBUILT_SHAPES
from hwprofile.optable import OPS

from .spills import known_spills

ROOT = Path(__file__).resolve().parents[2]
#: one simulated device per compute capability, read from the catalog (never a hand-made list)
SIMS = sorted({e.compute_capability: name for name, e in reversed(catalog.CATALOG.items())}.values())


def _profile(sim: str) -> Any:
    with mock.patch.dict(os.environ, {"HWPROFILE_DEVICE": sim}):
        hwprofile.reset()
        prof = hwprofile.profile(0)
    if not prof.kernels:
        pytest.skip(f"{sim}: no installed plugin with kernels serves it")
    return prof


def test_the_table_agrees_with_the_catalog() -> None:
    for name, e in catalog.CATALOG.items():
        lim = limits.TABLE[e.compute_capability]
        assert lim.max_shared_per_block == e.max_shared_memory_per_block_optin, name
        assert lim.max_shared_per_block < lim.max_shared_per_sm  # 1 KB per block is reserved by the system
    assert all(lim.clusters == (cc >= (9, 0)) for cc, lim in limits.TABLE.items())
    assert limits.for_target("sm_120a").compute_capability == (12, 0)
    assert limits.capability("sm_100f") == (10, 0) and limits.capability("sm_90") == (9, 0)
    with pytest.raises(ValueError, match="compute capability 7.5"):
        limits.for_target("sm_75")
    with pytest.raises(ValueError, match="not an NVRTC target"):
        limits.capability("compute_90")


def test_check_names_each_limit() -> None:
    assert limits.check("sm_90a", (8, 2, 1), (256, 1, 1), 0, cluster=2) == []
    problems = limits.check("sm_120a", (3, 16, 1), (2048, 1, 1), 100 * 1024, cluster=16, static_shared=1024, registers=64)
    text = "; ".join(problems)
    assert "2048 threads per block" in text
    assert "103424 bytes of shared memory per block (102400 dynamic + 1024 static): sm_120a allows 101376" in text
    assert "portable cluster is at most 8" in text
    assert "64 registers x 2048 threads" in text
    assert limits.check("sm_80", (4, 2, 1), (128, 1, 1), 0, cluster=2) == ["a cluster of 2 blocks: sm_80 has no thread-block clusters"]
    assert limits.check("sm_90a", (3, 2, 1), (128, 1, 1), 0, cluster=4) == ["grid (3, 2, 1) is not a whole number of clusters of 4 blocks"]
    assert limits.check("sm_90a", (1, 1, 1), (32, 1, 1), 0, registers=256) == ["256 registers per thread: sm_90a allows 255"]
    # exactly at the limit fits; one byte of static shared memory over it does not
    at = limits.TABLE[(9, 0)].max_shared_per_block
    assert limits.check("sm_90a", (1, 1, 1), (32, 1, 1), at) == []
    assert limits.check("sm_90a", (1, 1, 1), (32, 1, 1), at, static_shared=16)


def test_static_shared_memory_and_registers_are_read_from_the_ptxas_log() -> None:
    log = "ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem\nptxas info    : Used 83 registers, 16 bytes smem"
    assert limits.static_shared_bytes(log) == 2048 and limits.registers(log) == 83
    assert limits.static_shared_bytes("ptxas info    : Used 83 registers, used 1 barriers") == 0


def _plans(prof: Any) -> dict[tuple[str, str], list[Any]]:
    """Every plan of every op of ``prof``: its pre-built shapes, its sweep grid and the ranges the plan tests use."""
    shapes: dict[str, set[tuple[int, int, int]]] = {op: set(PREBUILT_SHAPES.get(op, ())) | set(d.grid) for op, d in OPS.items()}
    for op in ("router_gemm", "linear_bf16_fp32"):
        shapes[op] |= {(m, n, k) for m in range(1, 17) for n in (1, 100, 256, 384, 4096) for k in (16, 7168, 16384)}
    for op in ("gemv", "fp8_gemv"):
        shapes[op] |= {(1, n, k) for n in (64, 2048, 57344, 152064) for k in (512, 7168, 17408)}
    out: dict[tuple[str, str], list[Any]] = {}
    for op, spec in prof.kernels.items():
        d = OPS.get(op)
        if d is None:  # a plugin's kernel for no op of the table (a scaffold's sample): no plans to check here
            continue
        for m, n, k in sorted(shapes[op]):
            for split in (True, False):
                for sc in d.scale_modes:
                    try:
                        la = spec.configure(m=m, n=n, k=k, split_k=split, **({"scale": sc} if d.scaled else {}))
                    except ValueError:
                        continue  # a shape the planner refuses is the plan gate's (tests/ops/test_launch_faults.py)
                    out.setdefault((op, la.name_expression), []).append(la)
    return out


@pytest.mark.parametrize("sim", SIMS)
def test_every_plan_of_every_target_fits_its_limits(sim: str) -> None:
    prof = _profile(sim)
    plans = _plans(prof)
    assert plans
    for (op, _), launches in plans.items():
        for la in launches:
            assert limits.check(prof.target, la.grid, la.block, la.shared_bytes, cluster=la.grid[1]) == [], (sim, op, la)


@pytest.mark.parametrize("sim", SIMS)
def test_compiled_instances_fit_registers_spills_and_static_shared_memory(sim: str) -> None:
    """Every instance any plan names, compiled for its target: registers, spills, static + the largest dynamic shared memory."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from hwprofile.kernels import _pipeline as jit

    prof = _profile(sim)
    known = known_spills(jit.nvrtc_version())
    for (op, expr), launches in sorted(_plans(prof).items()):
        c = jit.compile_spec(prof.kernels[op], prof.target, (expr,))
        regs = limits.registers(c.log)
        assert regs is not None, f"{expr}: ptxas reported no register count"
        static = limits.static_shared_bytes(c.log)
        assert (c.spill_bytes or 0) <= known.get((prof.target, op), 0), f"{expr} spills {c.spill_bytes} B on {prof.target}"
        worst = max(launches, key=lambda la: la.shared_bytes)
        problems = limits.check(
            prof.target, worst.grid, worst.block, worst.shared_bytes, cluster=worst.grid[1], static_shared=static, registers=regs
        )
        assert problems == [], (sim, expr, problems)
