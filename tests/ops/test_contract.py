"""The calling conventions of an engine on every op (CPU: the fallback path), fallback precision,
and tests derived from the peers' kernel tests (SGLang, TensorRT-LLM, FlashInfer, vLLM, DeepGEMM:
their shapes, input recipes and tolerances; the GPU-marked twins in test_ops_gpu.py run the kernels).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import hwprofile
from hwprofile import ops
from hwprofile.optable import OPS
from hwprofile.plugin import PREBUILT_SHAPES

from .contract import CHECKS, OpUnderTest, bf16_ulp
from .reference import REFERENCES, operands

torch = pytest.importorskip("torch")

K_SMALL = 64


def bf16(*shape: int) -> Any:
    return torch.randn(*shape).bfloat16()


def e4m3(n: int, k: int, spread: float = 2.0) -> Any:
    return (torch.randn(n, k) * spread).to(torch.float8_e4m3fn)


def ref(op: str, x: Any, w: Any, scale: Any = None) -> Any:
    """The op's float64 reference (a scaled op's scale defaults to 0.5 per tensor)."""
    if OPS[op].scaled:
        return REFERENCES[op](x, w, torch.tensor([0.5]) if scale is None else scale)
    return REFERENCES[op](x, w)


# --- the contract, over every op of the table ------------------------------------------------------


@pytest.mark.parametrize("name", list(OPS))
def test_every_op_has_a_float64_reference(name: str) -> None:
    assert name in REFERENCES, f"op {name!r} has no float64 reference in tests/ops/reference.py: its paths cannot be checked"


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", list(OPS))
def test_contract(name: str, check: Callable[[OpUnderTest], None]) -> None:
    if name not in REFERENCES:
        pytest.fail(f"op {name!r} has no float64 reference")
    check(OpUnderTest(OPS[name], getattr(ops, name)))


@pytest.mark.parametrize("name", list(PREBUILT_SHAPES))
def test_a_family_member_computes_the_familys_math(name: str) -> None:
    """An op the table puts in the skinny-GEMM family (``OpDef.family``) gets the family's kernel on every plugin built on
    it, which computes ``x . (w * scale)^T`` and nothing else: the op's own fallback must compute that too, within one
    rounding of the output dtype. An op with an epilogue declared a member fails here, not on a Blackwell GPU."""
    torch.manual_seed(1)
    op = OPS[name]
    args = operands(op, (3,), 64, 256)
    x2 = args[0].reshape(-1, 256)
    got = ops.fallback(name)(x2, *args[1:]).double()
    w = args[1].double() * (args[2].double().reshape(-1, 1) if op.scaled else 1)
    want = x2.double() @ w.t()
    assert got.shape == want.shape and bool(((got - want).abs() <= bf16_ulp(want) + 1e-3 * want.abs().max()).all()), (
        f"{name} is declared in the skinny-GEMM family, but its fallback does not compute x . (w * scale)^T"
    )


def test_errors_name_the_argument() -> None:
    x, w = bf16(2, K_SMALL), bf16(8, K_SMALL)
    with pytest.raises(ValueError, match="router_gemm: weight must be torch.bfloat16"):
        ops.router_gemm(x, w.float())
    with pytest.raises(ValueError, match="gemv: x must be torch.bfloat16"):
        ops.gemv(x.half(), w)
    with pytest.raises(ValueError, match="fp8_gemv: w must be torch.float8_e4m3fn"):
        ops.fp8_gemv(x, w, torch.ones(1))
    with pytest.raises(ValueError, match=r"fp8_gemv: scale must have 1 element .* got shape \(2, 4\)"):
        ops.fp8_gemv(x, e4m3(8, K_SMALL), torch.ones(2, 4))


def test_device_is_accepted_as_torch_device_or_string(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    p = hwprofile.profile(0)
    assert (
        hwprofile.profile("cuda:0") is p
        and hwprofile.profile(torch.device("cuda", 0)) is p
        and hwprofile.profile(torch.device("cuda:0")) is p
    )
    with pytest.raises(hwprofile.DeviceError, match="'cpu' is not a CUDA device"):
        hwprofile.profile("cpu")


# --- fallback precision ---------------------------------------------------------------------------


@pytest.mark.parametrize("per_row", [False, True])
def test_fp8_fallback_rounds_once_after_an_fp32_product(per_row: bool) -> None:
    """Within one bf16 rounding of the float64 reference: the kernel's precision (fp32 accumulation, one rounding)."""
    torch.manual_seed(0)
    n, k = 256, 4096
    x, w = bf16(1, k), e4m3(n, k)
    scale = (torch.rand(n) * 1e-3 + 1e-4) if per_row else torch.tensor([3.7e-4])
    out = ops.fp8_gemv(x, w, scale)
    r = ref("fp8_gemv", x, w, scale)
    bound = bf16_ulp(r) * 0.5 + r.abs() * 1e-5  # correctly rounded, up to fp32 accumulation error
    assert bool(((out.double() - r).abs() <= bound).all()), float(((out.double() - r).abs() / bf16_ulp(r)).max())
    # the old fallback rounded w * scale to bf16 before the GEMM: it misses that bound (this test can fail)
    old = torch.nn.functional.linear(x, (w.float() * scale.reshape(-1, 1)).bfloat16())
    assert not bool(((old.double() - r).abs() <= bound).all())


def test_fp8_fallback_never_dequantises_the_whole_weight_to_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, int]] = []
    real = ops._fallbacks.mm_fp32

    def spy(x: Any, w: Any) -> Any:
        seen.append((w.dtype, w.numel()))
        return real(x, w)

    monkeypatch.setattr(ops._fallbacks, "mm_fp32", spy)
    monkeypatch.setattr(ops._fallbacks, "FP8_CHUNK_ELEMENTS", 4096)
    n, k = 100, 512
    x, w, s = bf16(1, k), e4m3(n, k), torch.rand(n) + 0.5
    out = ops.fp8_gemv(x, w, s)
    assert all(dt == torch.bfloat16 and numel <= 4096 for dt, numel in seen) and len(seen) == -(-n // 8)
    monkeypatch.setattr(ops._fallbacks, "FP8_CHUNK_ELEMENTS", 1 << 24)
    assert torch.equal(out, ops.fp8_gemv(x, w, s))  # chunking changes nothing


def test_fp32_ops_are_exact_to_fp32_accumulation() -> None:
    x, w = bf16(16, 7168), bf16(256, 7168)
    for fn in (ops.router_gemm, ops.linear_bf16_fp32):
        out = fn(x, w)
        r = ref("router_gemm", x, w)
        assert float((out.double() - r).norm() / r.norm()) < 1e-6


# --- from the peers' kernel tests -------------------------------------------------------------------


@pytest.mark.parametrize("experts", [256, 384])
@pytest.mark.parametrize("tokens", [1, 2, 3, 5, 6, 8, 13, 16])
def test_sglang_dsv3_router_gemm_recipe(tokens: int, experts: int) -> None:
    """SGLang test_dsv3_router_gemm: tokens 1..16, 256/384 experts, hidden 7168, randn bf16, contiguous;
    TensorRT-LLM's twin compares fp32 logits with rtol 5e-2 against the fp32 matmul."""
    h, w = bf16(tokens, 7168), bf16(experts, 7168)
    out = ops.router_gemm(h, w)
    assert out.dtype == torch.float32 and out.shape == (tokens, experts)
    assert torch.allclose(out, h.float() @ w.float().t(), rtol=5e-2, atol=1e-3)
    assert float((out.double() - ref("router_gemm", h, w)).abs().max()) < 1e-3


@pytest.mark.parametrize("tokens", [1, 2, 3, 5, 8, 13, 16])
def test_flashinfer_dsv3_router_column_major_weight(tokens: int) -> None:
    """FlashInfer test_dsv3_router_gemm_op: mat_b = randn(experts, hidden).t() (column major), fp32 out for 256 experts."""
    h = bf16(tokens, 7168)
    wt = bf16(7168, 256)  # the [K, N] tensor whose transpose is the [N, K] weight
    out = ops.router_gemm(h, wt.t())
    assert torch.allclose(out, h.float() @ wt.float(), rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize("batch", [1, 2, 3, 4])
@pytest.mark.parametrize(("n", "k"), [(16, 8), (64, 32), (256, 128), (1024, 512), (1024, 6144), (2048, 8192)])
def test_vllm_skinny_gemm_shapes_within_one_ulp(batch: int, n: int, k: int) -> None:
    """vLLM's skinny-GEMM tests (LLMM1 / wvSplitK): batch 1..4, K % 8 == 0 from 8 to 8192; fp32-accumulating
    kernels are held to 1 ULP of the output dtype."""
    x, w = bf16(batch, k), bf16(n, k)
    out = ops.gemv(x, w)
    r = ref("gemv", x, w)
    acc = 1e-6 * (x.double().abs() @ w.double().abs().t())  # fp32 accumulation error where the sum cancels
    assert bool(((out.double() - r).abs() <= bf16_ulp(r) + acc).all())


def deepgemm_calc_diff(x: Any, y: Any) -> float:
    """DeepGEMM's similarity measure (1 - cosine-like); its bf16 GEMM tests require < 1e-3 (fp32 out: < 1e-5)."""
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


@pytest.mark.parametrize(("m", "n", "k"), [(1, 2112, 7168), (4, 576, 7168), (1, 4096, 512), (8, 1536, 1024)])
def test_deepgemm_shapes(m: int, n: int, k: int) -> None:
    x, w = bf16(m, k), bf16(n, k)
    assert deepgemm_calc_diff(ops.linear_bf16_fp32(x, w), ref("router_gemm", x, w)) < 1e-5
    assert deepgemm_calc_diff(ops.gemv(x, w), ref("gemv", x, w)) < 1e-3


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize(("n", "k"), [(256, 1024), (1024, 4096), (128, 7168)])
def test_flashinfer_w8a16_tolerance(n: int, k: int, per_row: bool) -> None:
    """FlashInfer's W8A16 GEMM test: bf16 activations, e4m3 weights with a scale, atol = rtol = 2e-2 vs the dequantised product."""
    x, w = bf16(1, k), e4m3(n, k, spread=1.0)
    scale = (torch.rand(n) * 0.02 + 0.01) if per_row else torch.tensor(0.02)
    out = ops.fp8_gemv(x, w, scale)
    torch.testing.assert_close(out.double(), ref("fp8_gemv", x, w, scale), atol=2e-2, rtol=2e-2)
