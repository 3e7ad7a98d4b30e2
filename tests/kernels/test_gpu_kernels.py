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


# --- the served-model shape classes (issue 21, item 3): long K, the widest vocabulary, every catalog router

LONG_K = [2880, 8192, 14336, 16384, 25600, 28672, 32768]
WIDEST_VOCAB = 202048  # Llama-4 (core/src/hwprofile/models.toml); tests/kernels/test_plans.py holds it to the catalog
ROUTER_N = [8, 16, 32, 128, 160, 256, 384, 512]
ROUTER_K = [2048, 2880, 4096, 5120, 6144, 7168]


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("n", [2056, 8192])
@pytest.mark.parametrize("k", LONG_K)
def test_gemv_bf16_long_k(table: ops._dispatch._Table, n: int, k: int, split: bool) -> None:
    """N = 2056 splits K over a cluster (and has a row tail); N = 8192 takes the persistent or the chunked kernel."""
    x = torch.randn(1, k, device="cuda").bfloat16()
    w = torch.randn(n, k, device="cuda").bfloat16()
    out = run(table, "gemv", x, w, None, torch.bfloat16, split=split)
    assert rel(out, x.double() @ w.double().t()) < 1e-2


@pytest.mark.parametrize("mode", [ops.TENSOR_SCALE, ops.ROW_SCALE])
@pytest.mark.parametrize("n", [2056, 8192])
@pytest.mark.parametrize("k", LONG_K)
def test_fp8_gemv_long_k(table: ops._dispatch._Table, n: int, k: int, mode: int) -> None:
    """K past 16384 streams x through shared memory in chunks; 2880 = 180 vectors of 16 (not a multiple of 512)."""
    x = torch.randn(1, k, device="cuda").bfloat16()
    w = (torch.randn(n, k, device="cuda") * 3).to(torch.float8_e4m3fn)
    scale = (torch.rand(n, device="cuda") + 0.5) if mode == ops.ROW_SCALE else torch.tensor([0.7], device="cuda")
    for split in (True, False):
        out = run(table, "fp8_gemv", x, w, scale, torch.bfloat16, mode, split=split)
        ref = x.double() @ (w.double() * scale.double().reshape(-1, 1)).t()
        assert rel(out, ref) < 1e-2, f"split_k={split}"


@pytest.mark.parametrize("k", [2880, 5120])
@pytest.mark.parametrize("op", ["gemv", "fp8_gemv"])
def test_gemv_widest_vocabulary(table: ops._dispatch._Table, op: str, k: int) -> None:
    """The LM head of the widest vocabulary in the model catalog (N = 202048), bf16 and FP8 weights."""
    x = torch.randn(1, k, device="cuda").bfloat16()
    if op == "gemv":
        w = torch.randn(WIDEST_VOCAB, k, device="cuda").bfloat16()
        scale, mode, ref = None, 0, x.double() @ w.double().t()
    else:
        w = (torch.randn(WIDEST_VOCAB, k, device="cuda") * 3).to(torch.float8_e4m3fn)
        scale, mode = torch.rand(WIDEST_VOCAB, device="cuda") + 0.5, ops.ROW_SCALE
        ref = (x.double() @ w.double().t()) * scale.double()
    out = run(table, op, x, w, scale, torch.bfloat16, mode)
    assert rel(out, ref) < 1e-2


@pytest.mark.parametrize("k", ROUTER_K)
@pytest.mark.parametrize("n", ROUTER_N)
def test_router_gemm_catalog_routers(table: ops._dispatch._Table, n: int, k: int) -> None:
    """Every catalog router (N experts x hidden K) at every M = 1..16, split-K on and off, against float64."""
    w = torch.randn(n, k, device="cuda").bfloat16()
    for m in range(1, 17):
        x = torch.randn(m, k, device="cuda").bfloat16()
        ref = x.double() @ w.double().t()
        for split in (True, False):
            out = run(table, "router_gemm", x, w, None, torch.float32, split=split)
            assert rel(out, ref) < 1e-5, f"M={m}, split_k={split}"


@pytest.mark.parametrize("k", [2880, 8192, 14336, 28672])
@pytest.mark.parametrize("n", [160, 4096])
def test_linear_bf16_fp32_long_k(table: ops._dispatch._Table, n: int, k: int) -> None:
    """The fp32-output small-M linear at M = 1..16 on K past the swept 7168."""
    w = torch.randn(n, k, device="cuda").bfloat16()
    for m in range(1, 17):
        x = torch.randn(m, k, device="cuda").bfloat16()
        out = run(table, "linear_bf16_fp32", x, w, None, torch.float32, split=True)
        assert rel(out, x.double() @ w.double().t()) < 1e-5, f"M={m}"


def test_plans_use_this_gpus_own_attributes(table: ops._dispatch._Table) -> None:
    """The plans' SM count and shared memory are the driver's for this GPU (not the reference card's)."""
    attrs = table.prof.device.attributes()
    assert not table.prof.device.simulated and attrs.sm_count and attrs.max_shared_memory_per_block_optin
    basis = table.prof.kernels["gemv"].configure.plan_basis
    assert f"sm_count={attrs.sm_count}," in basis
    assert f"max_shared_bytes={min(attrs.max_shared_memory_per_block_optin, 227 * 1024)}," in basis


# --- the FP8 GEMV at M = 1..16 (M = 1: the SIMT kernel; M = 2..16: the tensor-core kernel, hwprofile/skinny_fp8.cuh) ---


def fp8_reference(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``x . (w * scale)^T`` and the bound each element must meet: one bf16 rounding of the result
    (2^-8 relative) plus fp32 accumulation over K (K * 2^-24 of the sum of magnitudes)."""
    s = scale.double().reshape(-1, 1) if scale.numel() == w.shape[0] and w.shape[0] != 1 else scale.double().reshape(())
    wd = w.double() * s
    ref = x.double() @ wd.t()
    mag = x.double().abs() @ wd.abs().t()
    return ref, ref.abs() * 2.0**-8 + mag * (x.shape[1] * 2.0**-24) + 1e-30


def assert_fp8_close(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> None:
    assert not torch.isnan(out).any(), "an output element was not written (or is NaN where the reference is not)"
    ref, bound = fp8_reference(x, w, scale)
    err = (out.double() - ref).abs()
    worst = float((err / bound).max())
    assert worst <= 1.0, f"worst error {worst:.3g} x the bound (bf16 rounding + fp32 accumulation)"


def fp8_scale(mode: int, n: int) -> torch.Tensor:
    return (torch.rand(n, device="cuda") + 0.5) if mode == ops.ROW_SCALE else torch.tensor([0.7], device="cuda")


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("mode", [ops.TENSOR_SCALE, ops.ROW_SCALE])
@pytest.mark.parametrize("m", list(range(1, 17)))
@pytest.mark.parametrize(("n", "k"), [(4096, 4096), (2056, 7184), (100, 16), (1000, 4112)])
def test_fp8_gemv_every_m(table: ops._dispatch._Table, m: int, n: int, k: int, mode: int, split: bool) -> None:
    """Every M the kernel takes, against float64 elementwise; N and K off every tile (2056, 100, 1000 rows; K = 16,
    7184, 4112: not multiples of a 64-wide chunk), both scale modes, split-K on and off."""
    x = torch.randn(m, k, device="cuda").bfloat16()
    w = (torch.randn(n, k, device="cuda") * 3).to(torch.float8_e4m3fn)
    scale = fp8_scale(mode, n)
    out = run(table, "fp8_gemv", x, w, scale, torch.bfloat16, mode, split=split)
    assert_fp8_close(out, x, w, scale)


@pytest.mark.parametrize("m", [1, 2, 8, 9, 16])
@pytest.mark.parametrize("mode", [ops.TENSOR_SCALE, ops.ROW_SCALE])
def test_fp8_gemv_extreme_weights(table: ops._dispatch._Table, m: int, mode: int) -> None:
    """Every finite e4m3 code (the largest, +-448; every subnormal; +0 and -0) in every row, exactly dequantised."""
    n, k = 520, 2048
    finite = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8, device="cuda")  # 254 codes
    codes = finite[torch.randint(0, finite.numel(), (n, k), device="cuda")]
    codes[:, :254] = finite  # each row holds each code at least once
    codes[0] = 0x7E  # a row of 448s
    codes[1] = 0x01  # a row of the smallest subnormal, 2^-9
    codes[2] = 0x80  # a row of -0
    w = codes.view(torch.float8_e4m3fn)
    x = torch.randn(m, k, device="cuda").bfloat16()
    scale = fp8_scale(mode, n)
    out = run(table, "fp8_gemv", x, w, scale, torch.bfloat16, mode)
    assert_fp8_close(out, x, w, scale)
    assert torch.equal(out[:, 2], torch.zeros_like(out[:, 2]))


@pytest.mark.parametrize("m", [1, 2, 8, 16])
def test_fp8_gemv_nan_weight_makes_its_row_nan(table: ops._dispatch._Table, m: int) -> None:
    """An e4m3 NaN (0x7f, 0xff) anywhere in a weight row makes that row's output NaN for every token, as the
    dequantised product does; the other rows stay exact."""
    n, k = 264, 4096
    w = (torch.randn(n, k, device="cuda") * 3).to(torch.float8_e4m3fn)
    wb = w.view(torch.uint8)
    bad = {5: (0, 0x7F), 17: (k - 1, 0xFF), 200: (1000, 0x7F), 263: (2047, 0xFF)}
    for row, (col, code) in bad.items():
        wb[row, col] = code
    x = torch.randn(m, k, device="cuda").bfloat16()
    scale = fp8_scale(ops.ROW_SCALE, n)
    out = run(table, "fp8_gemv", x, w, scale, torch.bfloat16, ops.ROW_SCALE)
    rows = sorted(bad)
    assert torch.isnan(out[:, rows]).all()
    keep = [r for r in range(n) if r not in bad]
    wk = w[keep]
    assert_fp8_close(out[:, keep].contiguous(), x, wk, scale[keep])


def test_fp8_gemv_inf_in_x_and_overflow(table: ops._dispatch._Table) -> None:
    """An infinite activation gives an infinite (or NaN where 0 * inf) result as the float64 product does; a sum past
    bf16's range rounds to inf."""
    m, n, k = 4, 256, 1024
    x = torch.randn(m, k, device="cuda").bfloat16()
    x[1, 7] = float("inf")
    w = (torch.rand(n, k, device="cuda") + 0.5).to(torch.float8_e4m3fn)  # positive weights: row 1 of out is +inf
    scale = torch.tensor([1.0], device="cuda")
    out = run(table, "fp8_gemv", x, w, scale, torch.bfloat16, ops.TENSOR_SCALE)
    assert torch.isposinf(out[1]).all()
    others = [0, 2, 3]
    assert_fp8_close(out[others].contiguous(), x[others].contiguous(), w, scale)
    big = torch.tensor([3e38], device="cuda")  # |sum| x 3e38 is past bf16's 3.39e38
    x2 = torch.ones(2, k, device="cuda").bfloat16()
    out2 = run(table, "fp8_gemv", x2, w, big, torch.bfloat16, ops.TENSOR_SCALE)
    assert torch.isposinf(out2).all()


def test_fp8_gemv_is_deterministic_at_every_m_tile(table: ops._dispatch._Table) -> None:
    for m in (2, 16):
        x = torch.randn(m, 7168, device="cuda").bfloat16()
        w = (torch.randn(2048, 7168, device="cuda") * 3).to(torch.float8_e4m3fn)
        scale = fp8_scale(ops.ROW_SCALE, 2048)
        outs = [run(table, "fp8_gemv", x, w, scale, torch.bfloat16, ops.ROW_SCALE, split=True) for _ in range(4)]
        assert all(torch.equal(outs[0], o) for o in outs[1:])  # fixed-order sums over warps and cluster ranks
