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


def _gate_args() -> tuple[object, object]:
    torch.manual_seed(0)
    return torch.randn(2, 64, dtype=BF16), torch.randn(16, 64, dtype=BF16)


@pytest.mark.parametrize(
    ("scale", "error", "match"),
    [
        (float("nan"), ValueError, "routed_scaling_factor must be finite and > 0, .*got nan|finite and > 0"),
        (float("inf"), ValueError, "finite and > 0"),
        (-float("inf"), ValueError, "finite and > 0"),
        (0.0, ValueError, "finite and > 0"),
        (-1.0, ValueError, "finite and > 0"),
        ("2.5", TypeError, "routed_scaling_factor must be a real number .*str '2.5'"),
        (True, TypeError, "routed_scaling_factor must be a real number .*bool"),
        (None, TypeError, "routed_scaling_factor must be a real number"),
    ],
)
def test_moe_gate_refuses_a_scaling_factor_that_is_not_a_finite_positive_number(scale: object, error: type, match: str) -> None:
    x, w = _gate_args()
    with pytest.raises(error, match=match):
        ops.moe_gate(x, w, top_k=2, n_group=1, topk_group=1, routed_scaling_factor=scale)  # type: ignore[arg-type]


@pytest.mark.parametrize("flag", ["no", "False", 0, 1, None, torch.tensor(True)])
def test_moe_gate_refuses_a_renormalize_that_is_not_a_bool(flag: object) -> None:
    x, w = _gate_args()
    with pytest.raises(TypeError, match="renormalize must be a bool"):
        ops.moe_gate(x, w, top_k=2, n_group=1, topk_group=1, renormalize=flag)  # type: ignore[arg-type]


def test_moe_gate_takes_real_scalars_of_any_kind() -> None:
    x, w = _gate_args()
    a = ops.moe_gate(x, w, top_k=2, n_group=1, topk_group=1, routed_scaling_factor=2.5)
    b = ops.moe_gate(x, w, top_k=2, n_group=1, topk_group=1, routed_scaling_factor=5 // 2 + 0.5)
    c = ops.moe_gate(x, w, top_k=2, n_group=1, topk_group=1, routed_scaling_factor=2)
    assert torch.equal(a[1], b[1]) and torch.allclose(c[1] * 1.25, a[1])


@pytest.mark.parametrize("shapes", [{"router_gemm": [(1, 256, 7168)]}, {"moe_gate": [(1, 256, 7168)]}])
def test_warmup_of_a_gpu_this_torch_cannot_reach_is_a_clear_error(shapes: dict[str, list[tuple[int, int, int]]],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    if torch.cuda.is_available():
        pytest.skip("this torch reaches a GPU")
    from hwprofile.errors import HwprofileError
    from hwprofile.kernels import _pipeline

    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    monkeypatch.setattr(_pipeline, "compile_spec", lambda *a, **k: pytest.fail("nothing is compiled before the check"))
    with pytest.raises(HwprofileError) as e:  # not torch's AssertionError("Torch not compiled with CUDA enabled")
        ops.warmup(shapes=shapes)
    msg = str(e.value)
    assert msg.startswith("hwprofile.ops.warmup cannot warm device 0 (NVIDIA H200") and "simulated by HWPROFILE_DEVICE" in msg
    assert ("CPU build" in msg or "CUDA device(s)" in msg) and "hwprofile compile --arch sm_90a --warm" in msg
