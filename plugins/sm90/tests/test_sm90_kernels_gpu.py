"""Real-GPU tests of the sm90 kernels' own paths: odd shapes through each planned kernel, and
programmatic dependent launch (PDL) in chains where a kernel's input was written by the launch
right before it (run on the H200; skipped cleanly elsewhere).

Kernels are launched through ``hwprofile.ops.run_kernel``, which takes no routing decision: the
shapes here lie outside the dispatch box on purpose. Outputs are poisoned with NaN, inputs are
fresh random data, references are float64.
"""

from __future__ import annotations

from typing import Any

import pytest

from hwprofile.plugin import NO_SCALE, ROW_SCALE, Launch, op_def
from pytest_hwprofile import rel_error

pytestmark = pytest.mark.hwprofile_gpu("sm_90")
torch = pytest.importorskip("torch")

from hwprofile import ops  # noqa: E402  (after torch: the ops need it)


def launch(
    prof: Any,
    op: str,
    out: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor | None = None,
    mode: int = NO_SCALE,
    split: bool = True,
) -> Launch:
    """Launch ``op``'s kernel on the operands; return the plan it ran (the profile's spec planned for this shape and mode)."""
    m, k = x.shape
    n = w.shape[0]
    la: Launch = prof.kernels[op].configure(m=m, n=n, k=k, split_k=split, **({"scale": mode} if op_def(op).scaled else {}))
    assert ops.run_kernel(op, out, x, w, scale, split_k=split), f"{op}: the kernel could not be built or loaded"
    return la


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize(
    ("m", "n", "k"),
    [
        (1, 8, 8),
        (3, 100, 520),
        (7, 250, 7176),
        (9, 391, 7168),
        (16, 384, 16),
        (12, 4104, 7168),
        (16, 4096, 2056),
        (5, 1, 7168),
        (13, 33, 24),
    ],
)
def test_router_kernel_odd_shapes(hwprofile_strict_gpu: Any, m: int, n: int, k: int, split: bool) -> None:
    x = torch.randn(m, k, device="cuda").bfloat16()
    w = torch.randn(n, k, device="cuda").bfloat16()
    out = torch.full((m, n), float("nan"), device="cuda")
    la = launch(hwprofile_strict_gpu, "router_gemm", out, x, w, split=split)
    torch.cuda.synchronize()
    assert la.name_expression.startswith("hwp90_router<") and la.pdl
    assert rel_error(out, x.double() @ w.double().t()) < 1e-5


def test_router_kernel_is_deterministic(hwprofile_strict_gpu: Any) -> None:
    x = torch.randn(16, 7168, device="cuda").bfloat16()
    w = torch.randn(384, 7168, device="cuda").bfloat16()
    outs = []
    for _ in range(5):
        out = torch.full((16, 384), float("nan"), device="cuda")
        launch(hwprofile_strict_gpu, "router_gemm", out, x, w)
        outs.append(out)
    torch.cuda.synchronize()
    assert all(torch.equal(outs[0], o) for o in outs[1:])  # fixed-order reduction over warps and cluster ranks


@pytest.mark.parametrize(("n", "k"), [(3176, 8), (3177, 520), (5000, 7176), (12345, 4104), (40000, 1032), (3200, 16392)])
def test_persistent_gemv_odd_shapes(hwprofile_strict_gpu: Any, n: int, k: int) -> None:
    x = torch.randn(1, k, device="cuda").bfloat16()
    w = torch.randn(n, k, device="cuda").bfloat16()
    out = torch.full((1, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    la = launch(hwprofile_strict_gpu, "gemv", out, x, w)
    torch.cuda.synchronize()
    assert la.name_expression.startswith("hwp90_gemv<")
    assert rel_error(out, x.double() @ w.double().t()) < 1e-2


@pytest.mark.parametrize(("n", "k"), [(2050, 7184), (100, 16), (9000, 4112)])
def test_fp8_gemv_odd_shapes(hwprofile_strict_gpu: Any, n: int, k: int) -> None:
    x = torch.randn(1, k, device="cuda").bfloat16()
    w = (torch.randn(n, k, device="cuda") * 3).to(torch.float8_e4m3fn)
    scale = torch.rand(n, device="cuda") + 0.5
    out = torch.full((1, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    launch(hwprofile_strict_gpu, "fp8_gemv", out, x, w, scale, ROW_SCALE)
    torch.cuda.synchronize()
    assert rel_error(out, x.double() @ (w.double() * scale.double()[:, None]).t()) < 1e-2


def test_pdl_chain_reads_what_the_previous_launch_wrote(hwprofile_strict_gpu: Any) -> None:
    """Each router call's x and w are written by the launch right before it (a copy kernel); with
    PDL the router starts early, so anything it read before griddepcontrol.wait would be stale."""
    k, n = 7168, 256
    xs = [torch.randn(8, k, device="cuda").bfloat16() for _ in range(12)]
    ws = [torch.randn(n, k, device="cuda").bfloat16() for _ in range(12)]
    x = torch.empty(8, k, device="cuda", dtype=torch.bfloat16)
    w = torch.empty(n, k, device="cuda", dtype=torch.bfloat16)
    outs = [torch.full((8, n), float("nan"), device="cuda") for _ in xs]
    for i in range(len(xs)):
        x.copy_(xs[i])
        w.copy_(ws[i])
        launch(hwprofile_strict_gpu, "router_gemm", outs[i], x, w)
    torch.cuda.synchronize()
    for xi, wi, oi in zip(xs, ws, outs, strict=True):
        assert rel_error(oi, xi.double() @ wi.double().t()) < 1e-5


def test_pdl_chain_of_kernels_feeding_each_other(hwprofile_strict_gpu: Any) -> None:
    """router -> its fp32 output cast to bf16 -> GEMV -> GEMV, back to back, also inside a CUDA graph."""
    prof = hwprofile_strict_gpu
    k = 4096
    x0 = torch.randn(1, k, device="cuda").bfloat16()
    w1 = torch.randn(k, k, device="cuda").bfloat16() / 64
    w2 = torch.randn(3584, k, device="cuda").bfloat16() / 64
    r = torch.full((1, k), float("nan"), device="cuda")
    h = torch.empty(1, k, device="cuda", dtype=torch.bfloat16)
    y1 = torch.full((1, k), float("nan"), device="cuda", dtype=torch.bfloat16)
    y2 = torch.full((1, 3584), float("nan"), device="cuda", dtype=torch.bfloat16)

    def chain() -> None:
        launch(prof, "router_gemm", r, x0, w1)
        h.copy_(r)
        launch(prof, "gemv", y1, h, w1)
        launch(prof, "gemv", y2, y1, w2)

    def check() -> None:
        ref_r = x0.double() @ w1.double().t()
        assert rel_error(r, ref_r) < 1e-5
        assert rel_error(y1, h.double() @ w1.double().t()) < 1e-2
        assert rel_error(y2, y1.double() @ w2.double().t()) < 1e-2

    chain()
    torch.cuda.synchronize()
    check()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        chain()
    torch.cuda.current_stream().wait_stream(s)
    x0.copy_(torch.randn(1, k, device="cuda").bfloat16())
    for t in (r, y1, y2):
        t.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    check()


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize(("m", "n", "k"), [(2, 2050, 7184), (9, 100, 16), (16, 9000, 4112), (5, 57344, 7168), (16, 128256, 4096)])
def test_fp8_gemv_tensor_core_kernel_odd_shapes(hwprofile_strict_gpu: Any, m: int, n: int, k: int, split: bool) -> None:
    """M = 2..16 runs hwp90_skinny_mma (kernels/sm90_fp8.cu), N and K off its tiles, split-K on and off."""
    x = torch.randn(m, k, device="cuda").bfloat16()
    w = (torch.randn(n, k, device="cuda") * 3).to(torch.float8_e4m3fn)
    scale = torch.rand(n, device="cuda") + 0.5
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    la = launch(hwprofile_strict_gpu, "fp8_gemv", out, x, w, scale, ROW_SCALE, split=split)
    torch.cuda.synchronize()
    assert la.name_expression.startswith("hwp90_skinny_mma<true, __nv_bfloat16, ")
    ref = x.double() @ (w.double() * scale.double()[:, None]).t()
    bound = ref.abs() * 2.0**-8 + (x.double().abs() @ (w.double().abs() * scale.double()[:, None]).t()) * k * 2.0**-24
    assert not torch.isnan(out).any()
    assert bool(((out.double() - ref).abs() <= bound).all())
