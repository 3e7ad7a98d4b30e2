"""The moe_gate selection kernel of the sm90 plugin on the CPU: its plan's bounds, its place in the profile, and NVRTC builds
of its source for sm_90a, sm_100a and sm_120a (generic CUDA: it must build clean for every target, with no spills)."""

from __future__ import annotations

import pytest

from hwprofile.plugin import OPS, profile_for, simulated_device
from hwprofile_sm90.moe_gate import INSTANCE, MAX_M, MAX_N, OP, SOURCE, kernel_spec, plan_gate


def test_plan_is_one_warp_per_token_with_pdl() -> None:
    for m in (1, 4, 16):
        la = plan_gate(m=m, n=256, n_group=8, topk_group=4, top_k=8)
        assert (la.name_expression, la.grid, la.block, la.shared_bytes, la.pdl) == (INSTANCE, (m, 1, 1), (32, 1, 1), 0, True)
    assert plan_gate(m=16, n=384, n_group=1, topk_group=1, top_k=8).grid == (16, 1, 1)  # Kimi-K2
    assert plan_gate(m=1, n=512, n_group=16, topk_group=8, top_k=16).grid == (1, 1, 1)


@pytest.mark.parametrize(("shape", "match"), [
    ({"m": MAX_M + 1}, "M = 1..16 tokens, got M=17"),
    ({"m": 0}, "got M=0"),
    ({"n": MAX_N + 8}, "N = 2..512 experts, got N=520"),
    ({"top_k": 33, "n": 512, "n_group": 1, "topk_group": 1}, "top_k = 1..32, got top_k=33"),
    ({"n_group": 64}, "n_group = 1..32 dividing N"),
    ({"n_group": 7}, "n_group = 1..32 dividing N"),
    ({"topk_group": 9}, "topk_group <= n_group"),
    ({"n": 32, "n_group": 32, "topk_group": 4, "top_k": 2}, "groups need >= 2, got 1"),
])
def test_plan_refuses_what_the_kernel_cannot_take(shape: dict[str, int], match: str) -> None:
    args = {"m": 4, "n": 256, "n_group": 8, "topk_group": 4, "top_k": 8, **shape}
    with pytest.raises(ValueError, match=match):
        plan_gate(**args)


def test_the_h200_profile_carries_the_selection_kernel_beside_the_op_tables() -> None:
    prof = profile_for(simulated_device((9, 0)))
    spec = prof.kernels[OP]
    assert OP not in OPS and spec.source == SOURCE and spec.instances == (INSTANCE,) and spec.plugin == "sm90"
    assert set(prof.kernels) == {*OPS, OP}


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a", "sm_120a"])
def test_source_builds_for_every_target_without_spills(target: str) -> None:
    pytest.importorskip("cuda.bindings.nvrtc")
    from hwprofile.kernels import _pipeline as jit
    from hwprofile.kernels import limits

    c = jit.compile_spec(kernel_spec("hwprofile_sm90").replace(plugin="sm90"), target, (INSTANCE,))
    assert c.cubin[:4] == b"\x7fELF"
    assert c.spill_bytes in (None, 0), f"{INSTANCE} spills {c.spill_bytes} B on {target}"
    regs = limits.registers(c.log)
    assert regs is not None and regs <= 64, f"{INSTANCE}: {regs} registers on {target}"
    assert limits.static_shared_bytes(c.log) == 2 * MAX_N * 4 + 32 * 4  # scores, choices, group scores
