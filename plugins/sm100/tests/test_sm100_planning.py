"""The sm100 plugin's plans, on the CPU: one plugin serves B200 and B300 (148 SMs) and GB300 (152), and each is
planned for its own SM count. What every plugin on the shared family must hold is pytest_hwprofile.family's."""

from __future__ import annotations

import pytest

import hwprofile
from hwprofile import tuning
from hwprofile.plugin import PREBUILT_SHAPES
from pytest_hwprofile.family import FamilyPlanChecks


class TestSm100Plans(FamilyPlanChecks):
    plugin, prefix = "sm100", "hwp100"
    devices = ("b200", "b300", "gb300")
    same_capability = ("b300", "gb300")  # 10.3: 148 and 152 SMs


def profile(name: str, monkeypatch: pytest.MonkeyPatch) -> hwprofile.Profile:
    monkeypatch.setenv("HWPROFILE_DEVICE", name)
    hwprofile.reset()
    prof = hwprofile.profile(0)
    assert prof.plugin is not None and prof.plugin.name == "sm100"
    return prof


@pytest.mark.parametrize(("name", "sms", "cluster"), [("b200", 148, 4), ("b300", 148, 4), ("gb300", 152, 8)])
def test_router_cluster_follows_the_devices_sm_count(name: str, sms: int, cluster: int, monkeypatch: pytest.MonkeyPatch) -> None:
    prof = profile(name, monkeypatch)
    assert prof.device.attributes().sm_count == sms
    # N = 424: 53 groups of 8 rows; the cluster doubles while groups x split < 1.4 x SMs (212 < 212.8 only on 152)
    la = prof.kernels["router_gemm"].configure(m=4, n=424, k=7168, split_k=True)
    assert la.name_expression.startswith("hwp100_skinny_mma<false, float,") and la.grid == (53, cluster, 1)


def test_gb300_plan_digest_is_not_b300s_for_any_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Same capability (10.3), same plugin: a sweep stamped on one carries none of the other's plan digests."""
    digests = {}
    for name in ("b300", "gb300"):
        prof = profile(name, monkeypatch)
        digests[name] = {op: tuning.plan_digest(op, prof.kernels[op]) for op in PREBUILT_SHAPES}  # the family ops
    assert all(digests["b300"][op] != digests["gb300"][op] for op in digests["b300"])


@pytest.mark.parametrize("op", ["gemv", "fp8_gemv"])
def test_long_k_chunk_width(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunk of x a streamed GEMV holds: 512 bf16 weight vectors, 256 FP8 ones (the template's last argument)."""
    spec = profile("b200", monkeypatch).kernels[op]
    kw = {"scale": 2} if op == "fp8_gemv" else {}
    for k in (25600, 28672, 32768):
        la = spec.configure(m=1, n=8192, k=k, split_k=False, **kw)
        assert la.shared_bytes == 16 * 1024 and la.name_expression.endswith(", 256>" if op == "fp8_gemv" else ", 512>")
