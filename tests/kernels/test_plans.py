"""Launch plans of every architecture plugin's kernels, on the CPU (simulated devices): each plan
fits its SM, covers every output row, and names an entry point of that plugin's own source; each
source refuses the targets it was not written for.
"""

from __future__ import annotations

import re

import pytest

import hwprofile
from hwprofile.errors import KernelCompileError
from hwprofile.kernels.spec import Launch

SIMS = {"h200": "hwp90", "gb300": "hwp100", "rtx-pro-6000": "hwp120", "dgx-spark": "hwp120"}
ROUTER = [(m, n, k) for m in range(1, 17) for n in (1, 100, 256, 384, 4096) for k in (16, 7168)]


def rows_per_block(expr: str) -> tuple[int, bool]:
    """Weight rows one block (or one row group, for persistent kernels) covers, and whether the grid is persistent."""
    args = [a.strip() for a in expr[expr.index("<") + 1 : -1].split(",")]
    name = expr[: expr.index("<")]
    if name.endswith("_router"):
        return 8 * int(args[2]), False
    if name.endswith("_skinny_mma"):
        return 8 * int(args[4]), False
    if name.endswith("_gemv_simt"):
        return int(args[3]) * int(args[4]), False
    if name == "hwp90_gemv":
        return int(args[1]) * int(args[2]), True
    raise AssertionError(f"unknown kernel {expr}")


def check_fits(launch: Launch, n: int, smem_limit: int, sm_count: int) -> None:
    assert launch.shared_bytes <= smem_limit
    assert launch.grid[1] in (1, 2, 4, 8) and launch.grid[2] == 1  # portable cluster of grid.y blocks
    assert launch.block[0] % 32 == 0 and launch.block[0] <= 1024 and launch.block[1:] == (1, 1)
    rows, persistent = rows_per_block(launch.name_expression)
    groups = -(-n // rows)
    if persistent:
        assert 1 <= launch.grid[0] <= min(groups, 2 * sm_count)  # the block loop covers the remaining groups
    else:
        assert launch.grid[0] == groups  # every row covered, no empty block


@pytest.mark.parametrize("sim", list(SIMS))
def test_launch_plans_fit_the_sm_and_name_the_plugins_entry_points(sim: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", sim)
    hwprofile.reset()
    p = hwprofile.profile(0)
    attrs = p.device.attributes()
    smem, sms = attrs.max_shared_memory_per_block_optin, attrs.sm_count
    prefix = SIMS[sim]
    for op in ("router_gemm", "linear_bf16_fp32"):
        for m, n, k in ROUTER:
            for split in (True, False):
                la = p.kernels[op].configure(m=m, n=n, k=k, split_k=split)
                check_fits(la, n, smem, sms)
                assert la.name_expression.startswith(prefix + "_")
                e = la.name_expression
                assert e.startswith("hwp90_router<") if prefix == "hwp90" else e.startswith(prefix + "_skinny_mma<false, float,")
    for op, scales in (("gemv", (0,)), ("fp8_gemv", (1, 2))):
        for n in (64, 2048, 3168, 57344, 152064):
            for k in (512, 7168, p["gemv.max_k"], 16384):
                for split in (True, False):
                    for sc in scales:
                        la = p.kernels[op].configure(m=1, n=n, k=k, split_k=split, **({"scale": sc} if op == "fp8_gemv" else {}))
                        check_fits(la, n, smem, sms)
                        assert la.name_expression.startswith(prefix + "_")
    for spec in p.kernels.values():
        assert all(e.startswith(prefix + "_") for e in spec.instances), spec.op


def test_sm90_router_plan_uses_pdl_and_the_measured_splits(monkeypatch: pytest.MonkeyPatch) -> None:
    from hwprofile_sm90.planning import plan_router

    # variants_sm90 rounds 3-5: N=256 -> 8 rows a block, cluster of 8; N=384 -> 16 rows a block, cluster of 8;
    # fewer groups -> a cluster of 4 with 16 warps
    assert plan_router(m=1, n=256, k=7168, split_k=True).name_expression == "hwp90_router<1, 8, 1, 8, 4, true, true, 2>"
    assert plan_router(m=16, n=256, k=7168, split_k=True).name_expression == "hwp90_router<2, 8, 1, 8, 4, true, true, 2>"
    assert plan_router(m=8, n=384, k=7168, split_k=True).name_expression == "hwp90_router<1, 8, 2, 8, 4, true, true, 2>"
    assert plan_router(m=9, n=384, k=7168, split_k=True).name_expression == "hwp90_router<2, 8, 2, 8, 4, true, true, 2>"
    assert plan_router(m=2, n=1024, k=7168, split_k=True).name_expression == "hwp90_router<1, 16, 2, 4, 2, true, true, 1>"
    # 59 MB of weights: no L2 prefetch (it would evict what the running call has yet to read)
    assert plan_router(m=8, n=4096, k=7168, split_k=True).name_expression == "hwp90_router<1, 8, 1, 1, 4, false, true, 2>"
    assert plan_router(m=9, n=4096, k=7168, split_k=True).name_expression == "hwp90_router<2, 8, 2, 1, 4, false, true, 2>"
    la = plan_router(m=4, n=256, k=7168, split_k=False)
    assert la.grid == (32, 1, 1) and la.pdl
    with pytest.raises(ValueError, match="M=17"):
        plan_router(m=17, n=256, k=7168, split_k=True)
    with pytest.raises(ValueError, match="multiple of 8"):
        plan_router(m=1, n=256, k=7170, split_k=True)


def test_sm90_gemv_plan() -> None:
    from hwprofile_sm90.planning import plan_gemv

    small = plan_gemv(m=1, n=2048, k=7168, split_k=True)
    assert small.name_expression.startswith("hwp90_gemv_simt<false,") and small.grid[1] == 2  # cluster split-K fills the SMs
    big = plan_gemv(m=1, n=57344, k=7168, split_k=True)
    assert big.name_expression == "hwp90_gemv<false, 8, 2, 4, 0>" and big.grid == (264, 1, 1) and big.shared_bytes == 7168 * 2
    assert plan_gemv(m=1, n=2048, k=7168, split_k=False).name_expression.startswith("hwp90_gemv<")  # no split: persistent
    fp8 = plan_gemv(m=1, n=57344, k=7168, split_k=True, fp8=True, scale=2)
    assert fp8.name_expression.startswith("hwp90_gemv_simt<true,") and fp8.name_expression.endswith(", 2>")
    with pytest.raises(ValueError, match="shared memory"):
        plan_gemv(m=1, n=57344, k=120000, split_k=True)


def test_sm120_plan_splits_k_until_x_fits_99_kb() -> None:
    from hwprofile.kernels.skinny_gemm import ArchTuning, plan

    t = ArchTuning(sm_count=48, max_shared_bytes=99 * 1024, prefix="hwp120")
    la = plan(t, m=1, n=65536, k=65536, fp8=False, out="bf16", scale=0, split_k=True)  # 128 KB of x: needs a split
    assert la.grid[1] == 2 and la.shared_bytes == 64 * 1024
    with pytest.raises(ValueError, match="exceeds"):
        plan(t, m=1, n=65536, k=65536, fp8=False, out="bf16", scale=0, split_k=False)


@pytest.mark.parametrize(("sim", "foreign"), [("h200", "sm_100a"), ("gb300", "sm_90a"), ("rtx-pro-6000", "sm_100a")])
def test_each_source_refuses_foreign_targets(sim: str, foreign: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cuda.bindings")
    from hwprofile.kernels import toolchain

    monkeypatch.setenv("HWPROFILE_DEVICE", sim)
    hwprofile.reset()
    spec = hwprofile.profile(0).kernels["gemv"]
    with pytest.raises(KernelCompileError, match=re.escape("kernels are built for")):
        opts = toolchain.CompileOptions(foreign, toolchain.include_dirs())
        toolchain.nvrtc_compile(spec.read_source(), spec.source, opts, [spec.instances[0]], what="guard check")
