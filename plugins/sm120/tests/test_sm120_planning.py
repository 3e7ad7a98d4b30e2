"""The sm120 plugin's plans, on the CPU: its SMs have about 99 KB of shared memory per block, and each device is
planned for its own SM count. What every plugin on the shared family must hold is pytest_hwprofile.family's."""

from __future__ import annotations

import pytest

from hwprofile.plugin import plan_skinny_gemm, profile_for, simulated_device
from pytest_hwprofile.family import FamilyPlanChecks

DEVICES = {(12, 0): 188, (12, 1): 48}  # RTX PRO 6000, DGX Spark GB10: SM counts the plugin plans for


class TestSm120Plans(FamilyPlanChecks):
    plugin, prefix = "sm120", "hwp120"
    devices = ("rtx-pro-6000", "rtx-5090", "dgx-spark")
    same_capability = ("rtx-5090", "rtx-pro-6000")  # 12.0: 170 and 188 SMs


@pytest.mark.parametrize("cc", sorted(DEVICES))
def test_gemv_streams_long_x_through_99_kb(cc: tuple[int, int]) -> None:
    prof = profile_for(simulated_device(cc))
    assert prof.plugin is not None and prof.plugin.name == "sm120"
    gemv = prof.kernels["gemv"]
    for split in (True, False):  # 128 KB of x: neither staged whole nor refused
        la = gemv.configure(m=1, n=65536, k=65536, split_k=split)
        assert la.name_expression.startswith("hwp120_gemv_simt<") and la.name_expression.endswith(", 512>")
        assert la.shared_bytes == 16 * 1024 <= 99 * 1024


@pytest.mark.parametrize(("name", "split"), [("rtx-5090", 1), ("rtx-pro-6000", 2)])
def test_each_cc_12_0_card_splits_for_its_own_sms(name: str, split: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both CC 12.0: the catalog's RTX 5090 (170 SMs) is not planned as the RTX PRO 6000 (188)."""
    import hwprofile

    monkeypatch.setenv("HWPROFILE_DEVICE", name)
    hwprofile.reset()
    prof = hwprofile.profile(0)
    # N = 4200: 525 groups of 8 rows, under 3 a SM on 188 SMs (split K over 2 blocks), not on 170
    assert prof.kernels["gemv"].configure(m=1, n=4200, k=4096, split_k=True).grid == (525, split, 1)


def test_tuning_follows_the_device() -> None:
    import hwprofile_sm120

    for cc, sms in DEVICES.items():
        t = hwprofile_sm120._TUNING[cc]
        assert (t.sm_count, t.max_shared_bytes, t.prefix) == (sms, 99 * 1024, "hwp120")
        # N = 4096 is 512 groups of 8 rows: under 3 a SM on 188 SMs (split K over 2 blocks), over 3 on 48
        la = plan_skinny_gemm(t, m=1, n=4096, k=4096, fp8=False, out="bf16", scale=0, split_k=True)
        assert la.grid[1] == {188: 2, 48: 1}[sms]
