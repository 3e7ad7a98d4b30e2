"""The sm100 plugin's plans, on the CPU: one plugin serves B200 and B300 (148 SMs) and GB300 (152),
and each is planned for its own SM count; the long-K GEMVs stream x through shared memory in chunks."""

from __future__ import annotations

import pytest

import hwprofile
from hwprofile import tuning


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


def test_gb300_plan_digest_is_not_b300s(monkeypatch: pytest.MonkeyPatch) -> None:
    """Same capability (10.3), same plugin: a sweep stamped on one does not carry the other's plan digest."""
    digests = {}
    for name in ("b300", "gb300"):
        prof = profile(name, monkeypatch)
        digests[name] = {op: tuning.plan_digest(op, spec) for op, spec in prof.kernels.items()}
    assert all(digests["b300"][op] != digests["gb300"][op] for op in digests["b300"])


@pytest.mark.parametrize("op", ["gemv", "fp8_gemv"])
def test_long_k_streams_x_in_chunks(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = profile("b200", monkeypatch).kernels[op]
    kw = {"scale": 2} if op == "fp8_gemv" else {}
    whole = spec.configure(m=1, n=8192, k=16384, split_k=False, **kw)  # 32 KB of x: staged whole
    assert whole.shared_bytes == 32 * 1024 and not whole.name_expression.endswith(("512>", "256>"))
    for k in (25600, 28672, 32768):
        la = spec.configure(m=1, n=8192, k=k, split_k=False, **kw)
        assert la.shared_bytes == 16 * 1024 and la.name_expression.endswith(", 256>" if op == "fp8_gemv" else ", 512>")
