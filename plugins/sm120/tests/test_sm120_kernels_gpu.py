"""hwprofile-sm120's kernels on its own GPU (skipped cleanly elsewhere): every instance the profile dispatches passes
the self-test, and the planner's edges (tails in N and K, every cluster split, the largest K that fits shared
memory) match a float64 reference. Until this has run on such a GPU the kernels are correct by construction only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import hwprofile
from hwprofile import ops, selftest

pytestmark = pytest.mark.hwprofile_gpu("sm_120", "sm_121")
torch = pytest.importorskip("torch")


@pytest.fixture
def prof(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    monkeypatch.setenv("HWPROFILE_STRICT", "1")
    monkeypatch.setenv("HWPROFILE_DISABLE_PLUGINS", "myengine")
    monkeypatch.setenv("HWPROFILE_CONFIG_DIR", str(tmp_path))
    hwprofile.reset()
    ops.reset_dispatch()
    p = hwprofile.profile(0)
    assert p.plugin is not None and p.plugin.name == "sm120"
    return p


def rel(out: Any, ref: Any) -> float:
    assert torch.isfinite(out).all(), "an element the kernel never wrote"
    return float((out.double() - ref).norm() / ref.norm())


def test_every_dispatched_instance_passes_the_selftest(prof: Any) -> None:
    report = selftest.run(prof, force=True, apply=False)
    assert report.verdicts and report.ok, [(v.instance, v.shape, v.error) for v in report.verdicts if not v.ok]
    assert all(v.instance.startswith("hwp120_") for v in report.verdicts)


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 100, 7176), (9, 4104, 7168), (16, 8, 64), (3, 65536, 512)])
def test_skinny_mma_edges(prof: Any, m: int, n: int, k: int, split: bool) -> None:
    x, w = torch.randn(m, k, device="cuda").bfloat16(), torch.randn(n, k, device="cuda").bfloat16()
    out = torch.full((m, n), float("nan"), device="cuda")
    assert ops.run_kernel("linear_bf16_fp32", out, x, w, split_k=split)
    torch.cuda.synchronize()
    assert rel(out, x.double() @ w.double().t()) < 1e-4


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize(("n", "k"), [(64, 512), (2056, 17408), (57344, 7168), (12344, 1024)])
def test_gemv_edges(prof: Any, n: int, k: int, split: bool) -> None:
    x, w = torch.randn(1, k, device="cuda").bfloat16(), torch.randn(n, k, device="cuda").bfloat16()
    out = torch.full((1, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert ops.run_kernel("gemv", out, x, w, split_k=split)
    torch.cuda.synchronize()
    assert rel(out, x.double() @ w.double().t()) < 1e-2
