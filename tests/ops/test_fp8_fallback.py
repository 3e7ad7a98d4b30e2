"""The FP8 fallback's split path on the CPU (torch's CPU ``_scaled_mm``): the split is exact, the product is the kernel's precision."""

from __future__ import annotations

from typing import Any

import pytest

from hwprofile.ops import _fallbacks as F

from .contract import bf16_ulp

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def bound() -> None:
    F.bind(torch)


def factors(parts: int = 3) -> Any:
    return torch.tensor(F.FP8_PART_SCALES[:parts], dtype=torch.float32).reshape(-1, 1, 1)


def rows() -> Any:
    torch.manual_seed(0)
    x = torch.randn(7, 512).bfloat16()
    x[1] *= 1e-38  # tiny
    x[2] = 0  # zero
    x[3] *= 3e37  # near bf16's maximum
    x[4, 3] = 3000.0  # an outlier: its neighbours are more than 2^14 below it
    x[5] = (torch.randn(512) * 2**-130).bfloat16()  # bf16 subnormals
    x[6] = torch.tensor(float(torch.finfo(torch.bfloat16).max)).bfloat16()
    return x


@pytest.mark.parametrize("fused", [True, False])
def test_the_split_is_exact(fused: bool) -> None:
    x = rows()
    q, s = F.fp8_split(x, factors(), fused)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (3 * 7, 512)
    rec = (q.double().view(3, 7, 512) * s.double()).sum(0)
    for i in (0, 1, 2, 3, 5, 6):
        assert torch.equal(rec[i], x[i].double()), i
    amax = float(x[4].double().abs().max())
    assert float((rec[4] - x[4].double()).abs().max()) <= amax * 2.0**-28  # the outlier's neighbours: the third part


def test_two_parts_miss_an_outliers_neighbours() -> None:
    """Why three parts: with two (s2 = s1 / 16) an element 2^14 below its row's largest loses bits (this test can fail)."""
    x = rows()
    q, s = F.fp8_split(x, factors(2))
    rec = (q.double().view(2, 7, 512) * s.double()).sum(0)
    exact = [bool(torch.equal(rec[i], x[i].double())) for i in range(7)]
    assert exact == [True, True, True, True, False, True, True]
    assert float((rec[4] - x[4].double()).abs().max()) > 3000.0 * 2.0**-30


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_split_mm_is_within_the_kernels_bound(per_row: bool, m: int) -> None:
    torch.manual_seed(1)
    n, k = 96, 1024
    x = torch.randn(m, k).bfloat16()
    x[0, 5] = 2000.0
    w = (torch.randn(n, k) * 2).to(torch.float8_e4m3fn)
    scale = (torch.rand(n) + 0.25) if per_row else torch.tensor([3.7e-4])
    out = F.fp8_split_mm(x, w, scale, torch.ones(()), factors())
    r = x.double() @ (w.double() * scale.double().reshape(-1, 1)).t()
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    tol = bf16_ulp(r) * 0.5 + r.abs() * 1e-5  # correctly rounded, up to fp32 accumulation error
    assert bool(((out.double() - r).abs() <= tol).all())
    assert torch.equal(out, F.fp8_split_mm(x, w, scale, torch.ones(()), factors(), fused=False))


def test_the_cpu_takes_the_dequantising_path(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    monkeypatch.setattr(F, "fp8_split_mm", lambda *a, **kw: seen.append("split"))
    x, w, s = torch.randn(1, 4096).bfloat16(), torch.randn(1024, 4096).to(torch.float8_e4m3fn), torch.ones(1)
    out = F.fp8_mm(x, w, s)
    assert not seen and out.shape == (1, 1024)
    assert F.FALLBACKS["fp8_gemv"] is F.fp8_mm


@pytest.mark.parametrize("fused", [True, False])
def test_split_mm_gives_the_references_infinities_and_nans(fused: bool) -> None:
    """A row holding +-inf gives the reference's +-inf (NaN where inf meets a zero weight), a NaN row NaN; the others stay exact."""
    torch.manual_seed(2)
    n, k = 48, 256
    x = torch.randn(5, k).bfloat16()
    x[1, 7] = float("inf")
    x[2, 9] = -float("inf")
    x[3, 11] = float("nan")
    x[4, 3], x[4, 200] = float("inf"), float("inf")  # two infinities of one sign
    w = (torch.randn(n, k) * 2).to(torch.float8_e4m3fn)
    w[5, 7] = 0.0  # inf * 0: NaN in the reference
    w[:, 3] = w[:, 200].abs().to(torch.float8_e4m3fn)
    w[:, 200] = w[:, 3]  # row 4: both products of one sign, whichever it is
    scale = torch.rand(n) + 0.25
    out = F.fp8_split_mm(x, w, scale, torch.ones(()), factors(), fused=fused)
    ref = (x.float() @ (w.float() * scale.reshape(-1, 1)).t()).bfloat16()
    for i in range(5):
        assert torch.equal(out[i].isnan(), ref[i].isnan()), (i, out[i], ref[i])
        inf = ref[i].isinf()
        assert torch.equal(out[i][inf], ref[i][inf]), i
    assert bool(out[1].isinf().sum() == n - 1) and bool(out[1, 5].isnan()) and bool(out[2].isinf().all())
    assert bool(out[3].isnan().all()) and bool(out[4].isinf().all())
    clean = F.fp8_split_mm(x[:1], w, scale, torch.ones(()), factors(), fused=fused)
    assert torch.equal(out[0], clean[0])  # a finite row is untouched by its neighbours' infinities
