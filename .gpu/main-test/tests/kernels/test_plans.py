"""Launch plans of every architecture plugin's kernels, on the CPU (simulated devices): each plan
fits its SM, covers every output row, and names an entry point of that plugin's own source; each
source refuses the targets it was not written for. The shared skinny-GEMM planner's own rules are
here too; one plugin's particular plans are tested with that plugin (plugins/*/tests).
"""

from __future__ import annotations

import re

import pytest

import hwprofile
from hwprofile.errors import KernelCompileError
from hwprofile.kernels.skinny_gemm import PREBUILT_SHAPES, ArchTuning, kernel_specs, plan, prebuilt_instances
from hwprofile.kernels.spec import Launch
from hwprofile.optable import OPS

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


def test_plan_splits_k_until_x_fits_the_shared_memory() -> None:
    t = ArchTuning(sm_count=48, max_shared_bytes=99 * 1024)
    la = plan(t, m=1, n=65536, k=65536, fp8=False, out="bf16", scale=0, split_k=True)  # 128 KB of x: needs a split
    assert la.grid[1] == 2 and la.shared_bytes == 64 * 1024
    assert plan(t, m=1, n=65536, k=4 * 65536, fp8=False, out="bf16", scale=0, split_k=True).grid[1] == 8  # 512 KB: 8 blocks
    with pytest.raises(ValueError, match="exceeds"):
        plan(t, m=1, n=65536, k=65536, fp8=False, out="bf16", scale=0, split_k=False)


def test_prebuilt_instances_cover_every_scale_mode_and_split_choice() -> None:
    seen: list[dict[str, object]] = []

    def configure(**kw: object) -> Launch:
        seen.append(kw)
        return Launch(f"k<{kw.get('scale', '-')}, {kw['split_k']}>", (1, 1, 1), (32, 1, 1))

    assert prebuilt_instances("fp8_gemv", configure, ((1, 64, 512),)) == ("k<1, False>", "k<1, True>", "k<2, False>", "k<2, True>")
    seen.clear()
    assert prebuilt_instances("gemv", configure) == ("k<-, False>", "k<-, True>")  # unscaled: no scale= passed
    assert len(seen) == 2 * len(PREBUILT_SHAPES["gemv"]) and all("scale" not in kw for kw in seen)
    assert set(PREBUILT_SHAPES) == set(OPS)


def test_family_specs_prebuild_what_they_plan() -> None:
    t = ArchTuning(sm_count=148, max_shared_bytes=227 * 1024, prefix="hwpx")
    specs = kernel_specs("pkg", "kernels/x.cu", t)
    assert [s.op for s in specs] == list(OPS)
    for s in specs:
        assert s.instances == prebuilt_instances(s.op, s.configure) and all(e.startswith("hwpx_") for e in s.instances)


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


@pytest.mark.parametrize(
    ("sim", "expr", "why"),
    [
        ("rtx-pro-6000", "hwp120_gemv_simt<false, __nv_bfloat16, 1, 4, 2, 16, 4, 0>", "portable cluster size"),
        ("gb300", "hwp100_skinny_mma<false, float, 1, 8, 16, 1, 4, 0>", "static shared memory of the reduction"),
    ],
)
def test_shared_entry_points_refuse_instances_past_the_sms_limits(sim: str, expr: str, why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """hwprofile/skinny_entry.cuh's static_asserts hold against each plugin's own Limits."""
    pytest.importorskip("cuda.bindings")
    from hwprofile.kernels import toolchain

    monkeypatch.setenv("HWPROFILE_DEVICE", sim)
    hwprofile.reset()
    prof = hwprofile.profile(0)
    spec = prof.kernels["gemv"]
    assert prof.target is not None
    with pytest.raises(KernelCompileError, match=re.escape(why)):
        opts = toolchain.CompileOptions(prof.target, toolchain.include_dirs())
        toolchain.nvrtc_compile(spec.read_source(), spec.source, opts, [expr], what="limit check")
