"""A first run on the GPU in hand, whatever it is (skipped cleanly without one): the self-test passes, and a
launch the driver refuses, forced through a test plugin, falls back with one warning and never crashes.

The test plugin is a downstream plugin registered in-process: its ``gemv`` kernel is the architecture
plugin's own, with a plan no driver launches (a cluster kernel on a grid that is not a whole number of
its clusters; more threads per block than any GPU has; more shared memory than any SM has).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

import hwprofile
from hwprofile import ops, selftest
from hwprofile.kernels.spec import Launch
from hwprofile.plugin import hookimpl

pytestmark = pytest.mark.hwprofile_gpu()
torch = pytest.importorskip("torch")


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    monkeypatch.delenv("HWPROFILE_STRICT", raising=False)
    monkeypatch.setenv("HWPROFILE_DISABLE_PLUGINS", "myengine")
    monkeypatch.setenv("HWPROFILE_CONFIG_DIR", str(tmp_path / "config"))
    hwprofile.reset()
    ops.reset_dispatch()
    prof = hwprofile.profile(0)
    if not prof.kernels:
        pytest.skip(f"{prof.device.name}: no architecture plugin with kernels serves it")
    yield prof
    hwprofile.reset()
    ops.reset_dispatch()


def test_selftest_passes_on_this_gpu(gpu: Any) -> None:
    report = selftest.run(gpu, force=True, apply=False)
    bad = [f"{v.op} {v.instance} {v.shape}: {v.error}" for v in report.verdicts if not v.ok]
    print(f"self-test on {report.device}: {len(report.verdicts)} instances, worst relative error "
          f"{max(v.rel_error or 0 for v in report.verdicts):.3g}")
    assert report.verdicts and not bad, bad
    assert {v.op for v in report.verdicts} == {c.op for c in selftest.cases(gpu)}
    again = selftest.run(gpu, apply=False)
    assert not any(v.fresh for v in again.verdicts)  # stamped on this device: reused, not re-run


class ForcedFailure:
    """A downstream plugin whose gemv kernel is the architecture plugin's, with an impossible plan of one ``kind``."""

    def __init__(self, base: Any, kind: str) -> None:
        self.base, self.kind = base, kind

    def configure(self, **shape: Any) -> Launch:
        p = self.base.configure(**shape)
        if self.kind == "cluster":  # a cluster of grid.y blocks on a grid of one row of blocks
            return Launch(p.name_expression, (p.grid[0], 1, 1), p.block, p.shared_bytes, p.pdl)
        if self.kind == "threads":
            return Launch(p.name_expression, p.grid, (2048, 1, 1), p.shared_bytes, p.pdl)
        return Launch(p.name_expression, p.grid, p.block, 400 * 1024, p.pdl)  # "smem": over every SM's limit

    @hookimpl
    def hwprofile_kernels(self, device: Any, target: str) -> list[Any]:
        return [self.base.replace(configure=self.configure)]


@pytest.mark.parametrize("kind", ["threads", "smem", "cluster"])
def test_forced_launch_failure_falls_back_with_one_warning(gpu: Any, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    n, k = 2048, 4096
    base = gpu.kernels["gemv"]
    if kind == "cluster" and base.configure(m=1, n=n, k=k, split_k=True).grid[1] < 2:
        pytest.skip("this plugin plans no cluster for the shape")
    monkeypatch.setenv("HWPROFILE_GEMV_SPLIT_K", "1")
    hwprofile.reset()
    hwprofile.profiles.registry().register(ForcedFailure(base, kind), "forced-launch-failure")
    ops.reset_dispatch()
    assert hwprofile.profile(0).kernels["gemv"].plugin == "forced-launch-failure"
    ops._dispatch.table(0)  # resolved before the warning is awaited: only the launch may warn inside
    x = torch.randn(1, k, device="cuda").bfloat16()
    w = torch.randn(n, k, device="cuda").bfloat16()
    ref = torch.nn.functional.linear(x, w)
    with pytest.warns(RuntimeWarning, match="gemv kernel failed to launch on cuda:0") as got:
        if kind == "cluster":  # the gates admit it (a cluster of 1): the op meets the refusal itself
            y = ops.gemv(x, w)
        else:  # the plan gate refuses these before a launch; run_kernel launches without routing
            out = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
            assert ops.run_kernel("gemv", out, x, w) is False
            y = ops.gemv(x, w)
    assert len(got) == 1, [str(g.message) for g in got]
    print(f"{kind}: {got[0].message}")
    assert "CUDA_ERROR" in str(got[0].message)
    torch.testing.assert_close(y, ref)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning: from now on the fallback, silently
        torch.testing.assert_close(ops.gemv(x, w), ref)
    torch.cuda.synchronize()  # the refused launch left no error behind
    assert ops.decide("gemv", hwprofile.profile(0), m=1, n=n, k=k).gate in ("failed", "plan")
    r = ops.router_gemm(torch.randn(2, 7168, device="cuda").bfloat16(), torch.randn(256, 7168, device="cuda").bfloat16())
    assert torch.isfinite(r).all()  # the other kernels still run
