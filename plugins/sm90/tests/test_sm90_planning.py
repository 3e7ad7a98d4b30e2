"""The sm90 launch plans, on the CPU: the kernels, tiles, clusters and grids the variant sweeps chose
(benchmarks/variants_sm90.py), and the refusals of shapes the kernels cannot take."""

from __future__ import annotations

import pytest

from hwprofile.plugin import OPS, PREBUILT_SHAPES
from hwprofile_sm90.planning import SOURCE, kernel_specs, plan_gemv, plan_router


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
    assert set(specs) == set(PREBUILT_SHAPES) and all(s.source == SOURCE for s in specs.values())
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
    assert all(e.startswith("hwp90_gemv_simt<true,") for e in specs["fp8_gemv"].instances)
