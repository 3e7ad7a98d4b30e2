"""Real-GPU tests of the kernels of the plugin serving the GPU in hand (any GPU; skipped cleanly without one).

Every output is poisoned with NaN before the launch, so an unwritten element fails; inputs are
fresh random data; the reference is float64.
"""

from __future__ import annotations

import pytest

import hwprofile
from hwprofile import ops

pytestmark = pytest.mark.hwprofile_gpu()  # whatever GPU is present, through its own plugin's kernels
torch = pytest.importorskip("torch")

from tests.conftest import rel  # noqa: E402  (the GPU tests' shared float64 check; `table` is a conftest fixture)


def run(
    table: ops._dispatch._Table, op: str, x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, out_dtype: torch.dtype,
    mode: int = 0, split: bool | None = None,
) -> torch.Tensor:
    m, n = x.shape[0], w.shape[0]
    out = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
    assert ops.run_kernel(op, out, x, w, scale, split_k=split)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("n", [256, 384, 100])
@pytest.mark.parametrize("m", list(range(1, 17)))
def test_router_gemm_every_m(table: ops._dispatch._Table, m: int, n: int) -> None:
    k = 7168 if n != 100 else 7176  # 100 / 7176: tails in N and K
    x = torch.randn(m, k, device="cuda").bfloat16()
    w = torch.randn(n, k, device="cuda").bfloat16()
    out = run(table, "router_gemm", x, w, None, torch.float32)
    assert rel(out, x.double() @ w.double().t()) < 1e-5


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize(("n", "k"), [(2048, 7168), (4096, 4096), (64, 512), (65536, 512), (2056, 17408), (12344, 1024), (7168, 16384)])
def test_gemv_bf16(table: ops._dispatch._Table, n: int, k: int, split: bool) -> None:
    x = torch.randn(1, k, device="cuda").bfloat16()
    w = torch.randn(n, k, device="cuda").bfloat16()
    out = run(table, "gemv", x, w, None, torch.bfloat16, split=split)
    assert rel(out, x.double() @ w.double().t()) < 1e-2


@pytest.mark.parametrize("mode", [ops.TENSOR_SCALE, ops.ROW_SCALE])
@pytest.mark.parametrize(("n", "k"), [(2048, 7168), (4096, 4096), (64, 512), (57344, 7168), (2056, 16384)])
def test_fp8_gemv(table: ops._dispatch._Table, n: int, k: int, mode: int) -> None:
    x = torch.randn(1, k, device="cuda").bfloat16()
    w = (torch.randn(n, k, device="cuda") * 3).to(torch.float8_e4m3fn)
    scale = (torch.rand(n, device="cuda") + 0.5) if mode == ops.ROW_SCALE else torch.tensor([0.7], device="cuda")
    out = run(table, "fp8_gemv", x, w, scale, torch.bfloat16, mode)
    ref = x.double() @ (w.double() * scale.double().reshape(-1, 1)).t()
    assert rel(out, ref) < 1e-2


def test_ops_dispatch_and_count_on_gpu(table: ops._dispatch._Table) -> None:
    x = torch.randn(3, 7168, device="cuda").bfloat16()
    w = torch.randn(256, 7168, device="cuda").bfloat16()
    out = ops.router_gemm(x, w)
    assert out.dtype == torch.float32
    big = torch.randn(40, 7168, device="cuda").bfloat16()
    assert ops.router_gemm(big, w).dtype == torch.float32  # M = 40 > threshold: cuBLAS fp32 path
    stats = hwprofile.profile(0).stats.as_dict()["router_gemm"]
    assert stats["kernel"] >= 1 and stats["fallback"] >= 1


def test_cuda_graph_capture_and_replay(table: ops._dispatch._Table) -> None:
    x = torch.randn(1, 4096, device="cuda").bfloat16()
    w = torch.randn(4096, 4096, device="cuda").bfloat16()
    ops.gemv(x, w)  # warm: compile and load outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = ops.gemv(x, w)
    x.copy_(torch.randn(1, 4096, device="cuda").bfloat16())
    g.replay()
    torch.cuda.synchronize()
    assert rel(y, x.double() @ w.double().t()) < 1e-2


def test_launch_checks_reject_misaligned_inputs(table: ops._dispatch._Table) -> None:
    base = torch.randn(1, 4096 + 1, device="cuda").bfloat16()
    x = base[:, 1:]  # not 16-byte aligned: the op must not launch on it
    w = torch.randn(2048, 4096, device="cuda").bfloat16()
    before = hwprofile.profile(0).stats.as_dict().get("gemv", {}).get("fallback", 0)
    out = ops.gemv(x, w)
    assert rel(out, x.double() @ w.double().t()) < 1e-2
    assert hwprofile.profile(0).stats.as_dict()["gemv"]["fallback"] == before + 1
