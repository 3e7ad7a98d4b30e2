"""Edges found by review: operands on different devices never yield a silent result; decide() checks its sizes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import hwprofile  # noqa: E402
from hwprofile import ops  # noqa: E402
from hwprofile.optable import OPS  # noqa: E402

BF16, F8 = torch.bfloat16, torch.float8_e4m3fn


@pytest.mark.parametrize("op", [name for name, op in OPS.items() if not op.scaled])
def test_weight_on_another_device_is_an_error_on_the_2d_path(op: str) -> None:
    x = torch.randn(1, 64, dtype=BF16)
    w = torch.empty(16, 64, dtype=BF16, device="meta")
    with pytest.raises(ValueError, match="is on meta"):
        getattr(ops, op)(x, w)


def test_fp8_scale_on_another_device_is_an_error() -> None:
    x = torch.randn(1, 64, dtype=BF16)
    w = torch.randn(16, 64).to(F8)
    with pytest.raises(ValueError, match="is on meta"):
        ops.fp8_gemv(x, w, torch.empty(16, dtype=torch.float32, device="meta"))
    with pytest.raises(ValueError, match="is on meta"):
        ops.fp8_gemv(x, w.to("meta"), torch.ones(1, dtype=torch.float32))


@pytest.mark.parametrize(("m", "n", "k"), [(-1, 256, 7168), (2.5, 256, 7168), (1, -256, 7168), (1, 256, True)])
def test_decide_refuses_sizes_that_are_not_counts(monkeypatch: pytest.MonkeyPatch, m: object, n: object, k: object) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    with pytest.raises(ValueError, match="must be an int >= 0"):
        ops.decide("router_gemm", hwprofile.profile(0), m=m, n=n, k=k)  # type: ignore[arg-type]
