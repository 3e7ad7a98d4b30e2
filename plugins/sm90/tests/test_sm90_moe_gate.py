"""The fused moe_gate kernel of the sm90 plugin on the CPU: its plan (the router GEMM's tiling with the selection's
bucket), the bounds it refuses, its place in the profile, and an NVRTC build for sm_90a without spills."""

from __future__ import annotations

import pytest

from hwprofile.plugin import OPS, profile_for, simulated_device
from hwprofile_sm90.moe_gate import OP, PREBUILT, SOURCE, kernel_spec, plan_gate
from hwprofile_sm90.planning import router_tiles

GATE = {"n_group": 8, "topk_group": 4, "top_k": 8}  # DeepSeek-V3's selection


@pytest.mark.parametrize(("m", "n", "k"), [(1, 256, 7168), (16, 256, 7168), (4, 384, 7168), (1, 64, 2048), (9, 512, 2048)])
def test_plan_is_the_router_gemms_tiling_with_the_selection_bucket(m: int, n: int, k: int) -> None:
    sel = GATE if n % 8 == 0 and n // 8 >= 2 else {"top_k": 6}
    la = plan_gate(m=m, n=n, k=k, split_k=True, **sel)
    mt, warps, nt, ksplit, unroll, pf, minb, groups = router_tiles(m=m, n=n, k=k, split_k=True)
    bucket = next(b for b in (64, 128, 256, 512) if n <= b)
    pf_text = "true" if pf else "false"
    assert la.name_expression == f"hwp90_moe_gate<{mt}, {warps}, {nt}, {ksplit}, {unroll}, {pf_text}, {minb}, {bucket}>"
    assert (la.grid, la.block, la.shared_bytes, la.pdl) == ((groups, ksplit, 1), (warps * 32, 1, 1), 0, True)


def test_split_k_off_plans_one_block_per_cluster() -> None:
    assert plan_gate(m=1, n=256, k=7168, split_k=False, **GATE).grid[1] == 1
    assert plan_gate(m=1, n=256, k=7168, split_k=True, **GATE).grid[1] > 1  # 32 groups leave most of 132 SMs idle


@pytest.mark.parametrize(("shape", "match"), [
    ({"m": 17}, "M=17"),
    ({"m": 0}, "M=0"),
    ({"n": 520}, "N = 2..512 experts, got N=520"),
    ({"k": 7169}, "K"),
    ({"top_k": 33, "n": 512, "n_group": 1, "topk_group": 1}, "top_k = 1..32, got top_k=33"),
    ({"n_group": 64}, "n_group = 1..32 dividing N"),
    ({"n_group": 7}, "n_group = 1..32 dividing N"),
    ({"topk_group": 9}, "topk_group <= n_group"),
    ({"n": 32, "n_group": 32, "topk_group": 4, "top_k": 2}, "groups need >= 2, got 1"),
])
def test_plan_refuses_what_the_kernel_cannot_take(shape: dict[str, int], match: str) -> None:
    args = {"m": 4, "n": 256, "k": 7168, **GATE, **shape}
    with pytest.raises(ValueError, match=match):
        plan_gate(split_k=True, **args)


def test_the_h200_profile_carries_the_fused_gate_beside_the_gemm_ops() -> None:
    prof = profile_for(simulated_device((9, 0)))
    spec = prof.kernels[OP]
    assert OP not in OPS and spec.source == SOURCE and spec.plugin == "sm90"
    assert set(prof.kernels) == {*OPS, OP}
    # the pre-built instances are DeepSeek-V3's and Kimi-K2's routers at the fewest and most tokens
    want = {plan_gate(m=m, n=n, k=k, split_k=True, sm_count=132).name_expression for n, k in PREBUILT for m in (1, 16)}
    assert set(spec.instances) == want


def test_the_h200_profile_gives_the_gate_a_model_that_predicts_the_kernel() -> None:
    from hwprofile import costmodel

    prof = profile_for(simulated_device((9, 0)))
    model = costmodel.parse(OP, prof[f"{OP}.model"], where="test")
    assert costmodel.predict(model, {}, 1, 256, 7168).kernel  # one launch against torch's dozen
    assert "not measured" in prof.explain(f"{OP}.model").winner.reason


def test_source_builds_for_sm90a_without_spills() -> None:
    pytest.importorskip("cuda.bindings.nvrtc")
    from hwprofile.kernels import _pipeline as jit

    spec = kernel_spec("hwprofile_sm90")
    inst = spec.instances[0]
    c = jit.compile_spec(spec.replace(plugin="sm90"), "sm_90a", (inst,))
    assert c.cubin[:4] == b"\x7fELF"
    assert c.spill_bytes in (None, 0), f"{inst} spills {c.spill_bytes} B on sm_90a"
