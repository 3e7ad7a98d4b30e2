"""The sm120 plugin's plans, on the CPU: its SMs have about 99 KB of shared memory per block, so the
GEMV's staged x slice is split over a cluster where it would not fit, on both of its devices."""

from __future__ import annotations

import pytest

from hwprofile.plugin import plan_skinny_gemm, profile_for, simulated_device

DEVICES = {(12, 0): 188, (12, 1): 48}  # RTX PRO 6000, DGX Spark GB10: SM counts the plugin plans for


@pytest.mark.parametrize("cc", sorted(DEVICES))
def test_gemv_splits_k_until_x_fits_99_kb(cc: tuple[int, int]) -> None:
    prof = profile_for(simulated_device(cc))
    assert prof.plugin is not None and prof.plugin.name == "sm120"
    gemv = prof.kernels["gemv"]
    la = gemv.configure(m=1, n=65536, k=65536, split_k=True)  # 128 KB of x: needs a split
    assert la.name_expression.startswith("hwp120_gemv_simt<") and la.grid[1] == 2 and la.shared_bytes == 64 * 1024
    with pytest.raises(ValueError, match="exceeds"):
        gemv.configure(m=1, n=65536, k=65536, split_k=False)


def test_tuning_follows_the_device() -> None:
    import hwprofile_sm120

    for cc, sms in DEVICES.items():
        t = hwprofile_sm120._TUNING[cc]
        assert (t.sm_count, t.max_shared_bytes, t.prefix) == (sms, 99 * 1024, "hwp120")
        # N = 4096 is 512 groups of 8 rows: under 3 a SM on 188 SMs (split K over 2 blocks), over 3 on 48
        la = plan_skinny_gemm(t, m=1, n=4096, k=4096, fp8=False, out="bf16", scale=0, split_k=True)
        assert la.grid[1] == {188: 2, 48: 1}[sms]
