"""Real-GPU tests of the sm90 kernels' own paths: odd shapes through each planned kernel, and
programmatic dependent launch (PDL) in chains where a kernel's input was written by the launch
right before it (run on the H200; skipped cleanly elsewhere).

Outputs are poisoned with NaN, inputs are fresh random data, references are float64.
"""

from __future__ import annotations

import pytest

from hwprofile import ops
from hwprofile.kernels import _pipeline as jit

pytestmark = pytest.mark.hwprofile_gpu("sm_90")
torch = pytest.importorskip("torch")

from tests.conftest import rel  # noqa: E402  (the GPU tests' shared float64 check; `table` is a conftest fixture)


def launch(
    table: ops._Table,
    op: str,
    out: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor | None = None,
    mode: int = 0,
    split: bool = True,
) -> jit.Launch:
    """Launch ``op``'s planned kernel directly (no predicate): the shapes here are outside the dispatch box on purpose."""
    m, k = x.shape
    n = w.shape[0]
    spec = table.prof.kernels[op]
    la = spec.configure(m=m, n=n, k=k, split_k=split, **({"scale": mode} if op == "fp8_gemv" else {}))
    kern = jit.load(spec, table.prof.target, la, 0, ops._ARG_TYPES)
    kern.launch(
        la,
        torch.cuda.current_stream().cuda_stream,
        (out.data_ptr(), x.data_ptr(), w.data_ptr(), scale.data_ptr() if scale is not None else 0, m, n, k),
    )
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
def test_router_kernel_odd_shapes(table: ops._Table, m: int, n: int, k: int, split: bool) -> None:
    x = torch.randn(m, k, device="cuda").bfloat16()
    w = torch.randn(n, k, device="cuda").bfloat16()
    out = torch.full((m, n), float("nan"), device="cuda")
    la = launch(table, "router_gemm", out, x, w, split=split)
    torch.cuda.synchronize()
    assert la.name_expression.startswith("hwp90_router<") and la.pdl
    assert rel(out, x.double() @ w.double().t()) < 1e-5


def test_router_kernel_is_deterministic(table: ops._Table) -> None:
    x = torch.randn(16, 7168, device="cuda").bfloat16()
    w = torch.randn(384, 7168, device="cuda").bfloat16()
    outs = []
    for _ in range(5):
        out = torch.full((16, 384), float("nan"), device="cuda")
        launch(table, "router_gemm", out, x, w)
        outs.append(out)
    torch.cuda.synchronize()
    assert all(torch.equal(outs[0], o) for o in outs[1:])  # fixed-order reduction over warps and cluster ranks


@pytest.mark.parametrize(("n", "k"), [(3176, 8), (3177, 520), (5000, 7176), (12345, 4104), (40000, 1032), (3200, 16392)])
def test_persistent_gemv_odd_shapes(table: ops._Table, n: int, k: int) -> None:
    x = torch.randn(1, k, device="cuda").bfloat16()
    w = torch.randn(n, k, device="cuda").bfloat16()
    out = torch.full((1, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    la = launch(table, "gemv", out, x, w)
    torch.cuda.synchronize()
    assert la.name_expression.startswith("hwp90_gemv<")
    assert rel(out, x.double() @ w.double().t()) < 1e-2


@pytest.mark.parametrize(("n", "k"), [(2050, 7184), (100, 16), (9000, 4112)])
def test_fp8_gemv_odd_shapes(table: ops._Table, n: int, k: int) -> None:
    x = torch.randn(1, k, device="cuda").bfloat16()
    w = (torch.randn(n, k, device="cuda") * 3).to(torch.float8_e4m3fn)
    scale = torch.rand(n, device="cuda") + 0.5
    out = torch.full((1, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    launch(table, "fp8_gemv", out, x, w, scale, ops.ROW_SCALE)
    torch.cuda.synchronize()
    assert rel(out, x.double() @ (w.double() * scale.double()[:, None]).t()) < 1e-2


def test_pdl_chain_reads_what_the_previous_launch_wrote(table: ops._Table) -> None:
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
        launch(table, "router_gemm", outs[i], x, w)
    torch.cuda.synchronize()
    for xi, wi, oi in zip(xs, ws, outs, strict=True):
        assert rel(oi, xi.double() @ wi.double().t()) < 1e-5


def test_pdl_chain_of_kernels_feeding_each_other(table: ops._Table) -> None:
    """router -> its fp32 output cast to bf16 -> GEMV -> GEMV, back to back, also inside a CUDA graph."""
    k = 4096
    x0 = torch.randn(1, k, device="cuda").bfloat16()
    w1 = torch.randn(k, k, device="cuda").bfloat16() / 64
    w2 = torch.randn(3584, k, device="cuda").bfloat16() / 64
    r = torch.full((1, k), float("nan"), device="cuda")
    h = torch.empty(1, k, device="cuda", dtype=torch.bfloat16)
    y1 = torch.full((1, k), float("nan"), device="cuda", dtype=torch.bfloat16)
    y2 = torch.full((1, 3584), float("nan"), device="cuda", dtype=torch.bfloat16)

    def chain() -> None:
        launch(table, "router_gemm", r, x0, w1)
        h.copy_(r)
        launch(table, "gemv", y1, h, w1)
        launch(table, "gemv", y2, y1, w2)

    def check() -> None:
        ref_r = x0.double() @ w1.double().t()
        assert rel(r, ref_r) < 1e-5
        assert rel(y1, h.double() @ w1.double().t()) < 1e-2
        assert rel(y2, y1.double() @ w2.double().t()) < 1e-2

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
