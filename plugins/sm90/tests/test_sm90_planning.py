"""The sm90 launch plans, on the CPU: the kernels, tiles, clusters and grids the variant sweeps chose
(benchmarks/variants_sm90.py), and the refusals of shapes the kernels cannot take."""

from __future__ import annotations

import pytest

from hwprofile.plugin import OPS, PREBUILT_SHAPES
from hwprofile_sm90.planning import SOURCE, SOURCE_FP8, kernel_specs, plan_gemv, plan_router


def test_router_plan_uses_pdl_and_the_measured_splits() -> None:
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


def test_gemv_plan() -> None:
    small = plan_gemv(m=1, n=2048, k=7168, split_k=True)
    assert small.name_expression.startswith("hwp90_gemv_simt<false,") and small.grid[1] == 2  # cluster split-K fills the SMs
    big = plan_gemv(m=1, n=57344, k=7168, split_k=True)
    assert big.name_expression == "hwp90_gemv<false, 8, 2, 4, 0>" and big.grid == (264, 1, 1) and big.shared_bytes == 7168 * 2
    assert plan_gemv(m=1, n=2048, k=7168, split_k=False).name_expression.startswith("hwp90_gemv<")  # no split: persistent
    fp8 = plan_gemv(m=1, n=57344, k=7168, split_k=True, fp8=True, scale=2)
    assert fp8.name_expression.startswith("hwp90_gemv_simt<true,") and fp8.name_expression.endswith(", 2>")
    # K past what 2 blocks' copies of x take (2 x K x 2 bytes > 227 KB): the shared kernel streams x in chunks
    assert plan_gemv(m=1, n=57344, k=58112, split_k=True).name_expression.startswith("hwp90_gemv<")
    long = plan_gemv(m=1, n=57344, k=58120, split_k=True)
    assert long.name_expression == "hwp90_gemv_simt<false, __nv_bfloat16, 1, 4, 2, 1, 4, 0, 512>" and long.shared_bytes == 16 * 1024
    with pytest.raises(ValueError, match="multiple of 8"):
        plan_gemv(m=1, n=57344, k=120004, split_k=True)
    with pytest.raises(ValueError, match="multiple of 16"):
        plan_gemv(m=1, n=57344, k=2888, split_k=True, fp8=True, scale=1)


def test_specs_cover_every_op_and_prebuild_the_familys_shapes() -> None:
    specs = {s.op: s for s in kernel_specs("hwprofile_sm90")}
    assert set(specs) == set(PREBUILT_SHAPES)
    assert all(s.source == (SOURCE_FP8 if OPS[s.op].scaled else SOURCE) for s in specs.values())
    for op, spec in specs.items():
        scales = OPS[op].scale_modes if OPS[op].scaled else (None,)
        planned = {
            spec.configure(m=m, n=n, k=k, split_k=sk, **({} if sc is None else {"scale": sc})).name_expression
            for m, n, k in PREBUILT_SHAPES[op]
            for sc in scales
            for sk in (True, False)
        }
        assert set(spec.instances) == planned and list(spec.instances) == sorted(planned), op
    assert all(e.startswith("hwp90_router<") for op in ("router_gemm", "linear_bf16_fp32") for e in specs[op].instances)
    fp8 = specs["fp8_gemv"].instances
    assert all(e.startswith(("hwp90_gemv_simt<true,", "hwp90_skinny_mma<true, __nv_bfloat16, ")) for e in fp8)
    # both M tiles of the tensor-core kernel are pre-built (M = 2: 8 tokens, M = 16: 16 tokens)
    assert {e.split(", ")[2] for e in fp8 if e.startswith("hwp90_skinny_mma")} == {"1", "2"}


@pytest.mark.parametrize("m", range(2, 17))
def test_fp8_gemv_takes_the_tensor_core_kernel_at_m_2_to_16(m: int) -> None:
    """M = 2..16 reads each weight once for all tokens (hwp90_skinny_mma), in the M tile that holds M; M = 1 stays SIMT."""
    la = plan_gemv(m=m, n=4096, k=4096, split_k=True, fp8=True, scale=2)
    mt = 1 if m <= 8 else 2
    assert la.name_expression == f"hwp90_skinny_mma<true, __nv_bfloat16, {mt}, 8, 4, 2, {4 if mt == 1 else 2}, 2>"
    assert la.grid == (128, 2, 1) and la.block == (256, 1, 1) and la.shared_bytes == 0  # 32 rows a block, K split in 2
    off = plan_gemv(m=m, n=4096, k=4096, split_k=False, fp8=True, scale=2)
    assert off.grid == (128, 1, 1) and f", 8, 4, 1, {4 if mt == 1 else 2}, 2>" in off.name_expression
    assert plan_gemv(m=1, n=4096, k=4096, split_k=True, fp8=True, scale=2).name_expression.startswith("hwp90_gemv_simt<true,")


def test_fp8_tensor_core_split_k_is_a_variant_of_small_n() -> None:
    """Split-K (a cluster along grid.y) where N alone leaves SMs idle, off where the grid fills them or K is short."""
    on = plan_gemv(m=8, n=2048, k=7168, split_k=True, fp8=True, scale=1)
    off = plan_gemv(m=8, n=2048, k=7168, split_k=False, fp8=True, scale=1)
    assert on.grid == (64, 4, 1) and ", 8, 4, 4, 4, 1>" in on.name_expression  # 64 blocks x 2 < 1.4 x 132 <= 64 x 4
    assert off.grid == (64, 1, 1) and ", 8, 4, 1, 4, 1>" in off.name_expression
    assert plan_gemv(m=8, n=28672, k=4096, split_k=True, fp8=True, scale=1).grid[1] == 1  # 1792 blocks: no split
    assert plan_gemv(m=8, n=64, k=512, split_k=True, fp8=True, scale=1).grid[1] == 1  # 8 chunks of 64: fewer than 2 a warp


def test_fp8_gemv_m_limit_names_the_kernel() -> None:
    with pytest.raises(ValueError, match="sm90 FP8 GEMV kernel takes 1 <= M <= 16, got M=17"):
        plan_gemv(m=17, n=4096, k=4096, split_k=True, fp8=True, scale=1)
    with pytest.raises(ValueError, match="M = 1, got M=2"):
        plan_gemv(m=2, n=4096, k=4096, split_k=True)  # the bf16 GEMV kernel stays M = 1
