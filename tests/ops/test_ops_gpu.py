"""The public ops on the real GPU in hand (any; its plugin's kernels and thresholds): every path, the engine's
calling conventions, the peers' shapes, fallback precision against the kernel's, torch.compile and CUDA graphs
(skipped cleanly without the GPU)."""

from __future__ import annotations

from typing import Any

import pytest

import hwprofile
from hwprofile import ops
from hwprofile.optable import OPS

pytestmark = pytest.mark.hwprofile_gpu()  # whatever GPU is present, through its own plugin's kernels
torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def strict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    monkeypatch.setenv("HWPROFILE_STRICT", "1")
    monkeypatch.setenv("HWPROFILE_DISABLE_PLUGINS", "myengine")  # the architecture plugin's own thresholds
    hwprofile.reset()
    ops.reset_dispatch()
    if not hwprofile.profile(0).kernels:
        pytest.skip(f"{hwprofile.profile(0).device.name}: no architecture plugin with kernels serves it")


def takes_kernel(op: str, m: int, n: int, k: int) -> int:
    """1 if the device's profile sends this shape to the kernel, else 0 (the expected step of the kernel count)."""
    return int(ops.decide(op, hwprofile.profile(0), m=m, n=n, k=k).path == "kernel")


def bf16(*shape: int) -> Any:
    return torch.randn(*shape, device="cuda").bfloat16()


def e4m3(n: int, k: int) -> Any:
    return (torch.randn(n, k, device="cuda") * 2).to(torch.float8_e4m3fn)


def rel(out: Any, ref: Any) -> float:
    assert not torch.isnan(out).any()
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def counts(op: str) -> dict[str, int]:
    return dict(hwprofile.profile(0).stats.as_dict().get(op, {"kernel": 0, "fallback": 0}))


@pytest.mark.parametrize("op", [name for name, op in OPS.items() if not op.scaled])
@pytest.mark.parametrize(("m", "n", "k"), [(0, 256, 7168), (4, 0, 7168), (1, 0, 4096), (4, 256, 0)])
def test_empty_problems_on_the_gpu(op: str, m: int, n: int, k: int) -> None:
    """N = 0 used to launch a grid of 0 blocks (CUDA_ERROR_INVALID_VALUE)."""
    out = getattr(ops, op)(bf16(m, k), bf16(n, k))
    torch.cuda.synchronize()
    assert out.shape == (m, n) and not out.any()


@pytest.mark.parametrize("experts", [256, 384])
@pytest.mark.parametrize("tokens", list(range(1, 17)))
def test_sglang_router_shapes_take_the_kernel(tokens: int, experts: int) -> None:
    h, w = bf16(tokens, 7168), bf16(experts, 7168)
    before = counts("router_gemm")["kernel"]
    out = ops.router_gemm(h, w)
    assert counts("router_gemm")["kernel"] == before + takes_kernel("router_gemm", tokens, experts, 7168)
    assert out.dtype == torch.float32 and rel(out, h.double() @ w.double().t()) < 1e-5
    assert torch.allclose(out, h.float() @ w.float().t(), rtol=5e-2, atol=1e-3)  # TensorRT-LLM's tolerance


def test_router_batch_dims_out_and_column_major_weight() -> None:
    h = bf16(2, 3, 7168)
    w = bf16(256, 7168)
    out = torch.full((2, 3, 256), float("nan"), device="cuda")
    assert ops.router_gemm(h, w, out=out) is out
    assert rel(out, h.double() @ w.double().t()) < 1e-5
    wt = bf16(7168, 256)  # FlashInfer passes weight.t()
    assert rel(ops.router_gemm(h[0], wt.t()), h[0].double() @ wt.double()) < 1e-5


@pytest.mark.parametrize("n", [1024, 4096])
def test_an_unmeasured_router_width_takes_the_path_the_cost_model_predicts(n: int) -> None:
    """A router width no sweep measured: the op takes what decide() says (the cost model's faster path; on the H200
    that is the kernel at N=1024), counted on that path, fp32 and within fp32 precision either way."""
    h, w = bf16(2, 7168), bf16(n, 7168)
    d = ops.decide("router_gemm", hwprofile.profile(0), m=2, n=n, k=7168)
    assert d.basis in ("model", "limit"), d  # not a measured shape
    before = counts("router_gemm")
    out = ops.router_gemm(h, w)
    after = counts("router_gemm")
    took = "kernel" if after["kernel"] == before["kernel"] + 1 else "fallback"
    assert took == d.path and after["kernel"] + after["fallback"] == before["kernel"] + before["fallback"] + 1
    assert out.dtype == torch.float32 and rel(out, h.double() @ w.double().t()) < 1e-5


@pytest.mark.parametrize(("n", "k"), [(2048, 2048), (4096, 4096), (12288, 4096), (2112, 1536), (576, 512)])
def test_gemv_kernel_and_fallback_precision(n: int, k: int) -> None:
    """Inside the box the kernel runs; the fallback (F.linear) is at least as precise, and both within 1 bf16 ulp."""
    x, w = bf16(1, k), bf16(n, k)
    r = x.double() @ w.double().t()
    out = ops.gemv(x, w)
    fb = ops.fallback("gemv")(x, w)
    e_k, e_f = rel(out, r), rel(fb, r)
    assert e_k < 1e-2 and e_f <= e_k * 1.1 + 1e-6, (e_k, e_f)


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize(("n", "k"), [(2048, 7168), (4096, 4096), (57344, 7168)])
def test_fp8_fallback_is_at_least_as_precise_as_the_kernel(n: int, k: int, per_row: bool) -> None:
    x, w = bf16(1, k), e4m3(n, k)
    scale = (torch.rand(n, device="cuda") * 1e-3 + 1e-4) if per_row else torch.tensor([3e-4], device="cuda")
    r = x.double() @ (w.double() * scale.double().reshape(-1, 1)).t()
    before = counts("fp8_gemv")["kernel"]
    out = ops.fp8_gemv(x, w, scale)
    assert counts("fp8_gemv")["kernel"] == before + takes_kernel("fp8_gemv", 1, n, k)
    fb = ops.fallback("fp8_gemv")(x, w, scale)
    e_k, e_f = rel(out, r), rel(fb, r)
    assert e_f <= e_k * 1.05 + 1e-7, (e_k, e_f)
    torch.testing.assert_close(out.double(), r, atol=2e-2, rtol=2e-2)  # FlashInfer W8A16 tolerance


def test_fp8_fallback_memory_stays_at_one_chunk() -> None:
    n, k = 152064, 5120  # Qwen2 vocabulary x hidden: 778 MB of e4m3
    x, w, s = bf16(1, k), e4m3(n, k), torch.rand(n, device="cuda") + 0.5
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = ops.fallback("fp8_gemv")(x, w, s)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    print(f"fp8 fallback N={n} K={k}: peak extra {extra / 2**20:.1f} MiB (a full fp32 copy would be {n * k * 4 / 2**20:.0f} MiB)")
    assert extra < 2 * ops._fallbacks.FP8_CHUNK_ELEMENTS * 2 + 8 * n * 4
    assert out.shape == (1, n)


def test_compile_fullgraph_inductor_on_gpu() -> None:
    torch._dynamo.reset()

    def gate(h: Any, w: Any) -> Any:
        logits = ops.router_gemm(h, w)
        return torch.topk(logits.sigmoid(), 8, dim=-1)

    h, w = bf16(4, 7168), bf16(256, 7168)
    before = counts("router_gemm")["kernel"]
    v, i = torch.compile(gate, fullgraph=True)(h, w)
    v2, i2 = gate(h, w)
    assert torch.allclose(v, v2) and torch.equal(i, i2)
    assert counts("router_gemm")["kernel"] >= before + 2


def test_compile_reduce_overhead_cuda_graphs() -> None:
    torch._dynamo.reset()

    def step(x: Any, w1: Any, w2: Any) -> Any:
        return ops.gemv(ops.gemv(x, w1), w2)

    x, w1, w2 = bf16(1, 4096), bf16(4096, 4096), bf16(4096, 4096)
    f = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):
        y = f(x, w1, w2)
    x.copy_(bf16(1, 4096))
    y = f(x, w1, w2).clone()
    assert rel(y, ops.fallback("gemv")(ops.fallback("gemv")(x, w1), w2).double()) < 2e-2


@pytest.mark.parametrize("op", [name for name in OPS if name != "linear_bf16_fp32"])  # linear: no kernel by default (max_tokens 0)
def test_cuda_graph_capture_of_the_public_ops(op: str) -> None:
    k, n = (7168, 256) if op == "router_gemm" else (4096, 4096)
    x = bf16(4 if op == "router_gemm" else 1, k)
    w = e4m3(n, k) if op == "fp8_gemv" else bf16(n, k)
    args = (x, w, torch.rand(n, device="cuda") + 0.5) if op == "fp8_gemv" else (x, w)
    fn = getattr(ops, op)
    fn(*args)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = fn(*args)
    x.copy_(bf16(*x.shape))
    g.replay()
    torch.cuda.synchronize()
    assert rel(y, fn(*args).double()) < 1e-6

