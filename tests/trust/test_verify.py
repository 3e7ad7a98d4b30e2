"""Verification on first use (CPU): a kernel instance proves itself against float64 before it serves a routed call.

The check itself (:func:`hwprofile.ops._verify.check`) runs here on CPU tensors with kernels written in torch, right
and wrong in the ways real kernels go wrong (a tail column, an unwritten row, a per-row scale read as per-tensor,
saturated extremes, an accumulator never cleared, one bf16 rounding too many). The integration goes through the
public ops and the real ``_kernel._load`` with a host kernel (``verify_seam``): a passing verdict is stored and
reused, a failing instance disables its op with one warning and the op stays right, an unverified instance inside a
capture is a clear error, ``HWPROFILE_VERIFY=off`` is the user's choice and ``explain`` says so.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest

import hwprofile
from hwprofile import ops
from hwprofile.errors import KernelError, NotVerifiedError, NotWarmedError
from hwprofile.ops import _verify
from hwprofile.optable import NO_SCALE, OPS, ROW_SCALE, TENSOR_SCALE

from .conftest import Seam

torch = pytest.importorskip("torch")

SHAPES = [(1, 256, 512), (3, 136, 1024), (16, 384, 2048)]


def kernel(op: str, bug: str = "") -> Any:
    """``run_once(out, x, w, scale)`` computing ``op`` in torch, with one bug on purpose."""
    d = OPS[op]

    def run_once(out: Any, x: Any, w: Any, s: Any) -> None:
        wf = w.float()
        if bug == "saturate":  # a dequantisation that clamps the weight's largest values
            wf = wf.clamp(-240, 240) if d.w_dtype.startswith("float8") else wf.clamp(-8, 8)
        if s is not None:
            sf = s.float().reshape(-1, 1)
            if bug == "row_scale_as_tensor":
                sf = sf[:1]
            wf = wf * sf
        res = x.float() @ wf.t()
        if bug == "tail":
            res[:, -1] += res[:, -1].abs() + 1
        if bug == "accumulator":
            res += 1e-3
        if bug == "bf16_once_more":
            res = res.to(torch.bfloat16).float() * (1 + 2.0 ** -6)
        if bug == "unwritten_row":
            res = res[:-1]
            out[: res.shape[0]] = res.to(out.dtype)
            return
        out.copy_(res.to(out.dtype))

    return run_once


def modes(op: str) -> tuple[int, ...]:
    return OPS[op].scale_modes if OPS[op].scaled else (NO_SCALE,)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_a_right_kernel_passes_on_every_input_set(op: str, shape: tuple[int, int, int]) -> None:
    for mode in modes(op):
        res = _verify.check(op, shape, mode, torch.device("cpu"), kernel(op))
        assert res.ok, (op, shape, mode, res.error)
        assert res.rel_error is not None and res.rel_error <= 1e-2


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("bug", ["tail", "accumulator", "unwritten_row", "saturate"])
def test_a_wrong_kernel_fails_naming_the_inputs_and_the_error(op: str, bug: str) -> None:
    res = _verify.check(op, (4, 136, 1024), modes(op)[-1], torch.device("cpu"), kernel(op, bug))
    assert not res.ok
    assert "inputs:" in res.error
    if bug == "unwritten_row":
        assert "NaN" in res.error
    if bug == "saturate":
        assert res.error.startswith("extremes inputs")


def test_a_row_scale_read_as_a_tensor_scale_fails() -> None:
    res = _verify.check("fp8_gemv", (1, 256, 1024), ROW_SCALE, torch.device("cpu"), kernel("fp8_gemv", "row_scale_as_tensor"))
    assert not res.ok
    assert _verify.check("fp8_gemv", (1, 256, 1024), TENSOR_SCALE, torch.device("cpu"), kernel("fp8_gemv")).ok


def test_fp32_output_holds_fp32_precision() -> None:
    """A router kernel that rounds its fp32 logits through bf16 is wrong (the DESIGN's fp32 contract)."""
    res = _verify.check("router_gemm", (4, 256, 7168), NO_SCALE, torch.device("cpu"), kernel("router_gemm", "bf16_once_more"))
    assert not res.ok and "above 0.0001" in res.error


def test_zero_activations_must_give_exact_zeros() -> None:
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    w = torch.randn(8, 64).to(torch.bfloat16)
    out = torch.zeros(2, 8)
    assert _verify.compare("router_gemm", out, x, w, None).ok
    out[1, 3] = 1e-30
    res = _verify.compare("router_gemm", out, x, w, None)
    assert not res.ok and "row 1 must be exactly zero" in res.error


def test_reference_chunks_cover_every_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_verify, "REF_CHUNK", 7)
    x = torch.randn(2, 32).to(torch.bfloat16)
    w = torch.randn(20, 32).to(torch.bfloat16)
    out = x.float() @ w.float().t()
    assert _verify.compare("router_gemm", out, x, w, None).ok
    out[0, 19] += 10
    assert not _verify.compare("router_gemm", out, x, w, None).ok


# --- through the public ops and the real _load ---------------------------------------------------


def _xw(n: int = 256, k: int = 1024, m: int = 1) -> tuple[Any, Any]:
    return torch.randn(m, k).to(torch.bfloat16), torch.randn(n, k).to(torch.bfloat16)


def _verdicts(s: Seam) -> list[dict[str, Any]]:
    files = list((s.config / "selftest").glob("*.json"))
    return [v for f in files for v in json.loads(f.read_text())["verdicts"]]


def test_first_call_verifies_then_serves_and_the_verdict_is_reused(seam: Seam) -> None:
    k = seam.kernel("gemv")
    x, w = _xw()
    assert ops.decide("gemv", hwprofile.profile(0), m=1, n=256, k=1024).path == "kernel"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = ops.gemv(x, w)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w), rtol=1e-2, atol=1e-2)
    assert len(k.launches) == 3 + 1  # three input sets, then the call itself
    (v,) = _verdicts(seam)
    assert v["ok"] and v["op"] == "gemv" and v["shape"] == [1, 256, 1024] and v["stamp"]["device"].startswith("NVIDIA RTX PRO 6000")
    ops.gemv(x, w)
    assert len(k.launches) == 5  # no check again in this process
    hwprofile.reset()
    ops.reset_dispatch()
    ops.gemv(x, w)
    assert len(k.launches) == 6  # nor in the next one: the stored verdict's stamp matches
    d = ops._verify.state(hwprofile.profile(0), "gemv", _plan("gemv", 1, 256, 1024), (1, 256, 1024), NO_SCALE)
    assert "verified" in d and "stored in" in d


def _plan(op: str, m: int, n: int, k: int) -> Any:
    prof = hwprofile.profile(0)
    return prof.kernels[op].configure(m=m, n=n, k=k, split_k=bool(prof["gemv.split_k"]))


def test_a_failing_instance_is_disabled_with_one_warning_and_the_op_stays_right(seam: Seam) -> None:
    seam.kernel("gemv", lambda out, x, w: (x.float() @ w.float().t()) * 1.5)
    x, w = _xw()
    with pytest.warns(RuntimeWarning, match=r"gemv kernel disabled on cuda:0 .*hwp\w*gemv\w*<.*failed verification against float64") as got:
        y = ops.gemv(x, w)
    assert len(got) == 1
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w))  # the fallback's result, never the wrong one
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(ops.gemv(x, w), torch.nn.functional.linear(x, w))
    d = ops.decide("gemv", hwprofile.profile(0), m=1, n=256, k=1024)
    assert (d.path, d.gate) == ("fallback", "failed")
    (v,) = _verdicts(seam)
    assert not v["ok"] and "relative error" in v["error"]
    # the next process reads the failed verdict: disabled at once, without running the kernel again
    launches = len(seam.kernels["gemv"].launches)
    hwprofile.reset()
    ops.reset_dispatch()
    with pytest.warns(RuntimeWarning, match="failed verification"):
        torch.testing.assert_close(ops.gemv(x, w), torch.nn.functional.linear(x, w))
    assert len(seam.kernels["gemv"].launches) == launches


def test_strict_mode_raises_on_a_failing_instance(seam: Seam, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_STRICT", "1")
    hwprofile.reset()
    ops.reset_dispatch()
    seam.kernel("router_gemm", lambda out, x, w: None)  # writes nothing
    x, w = _xw(256, 7168, 4)
    with pytest.raises(KernelError, match="router_gemm on cuda:0 .*NaN"):
        ops.router_gemm(x, w)


def test_an_unverified_instance_inside_a_capture_is_a_clear_error(seam: Seam) -> None:
    seam.kernel("gemv")
    x, w = _xw()
    seam.capturing = True
    with pytest.raises(NotVerifiedError, match=r"gemv \(M=1, N=256, K=1024\) .*no verdict .*hwprofile.ops.warmup\(device=0") as e:
        ops.gemv(x, w)
    assert isinstance(e.value, NotWarmedError)
    assert seam.kernels["gemv"].launches == []  # nothing reached the stream
    seam.capturing = False
    ops.warmup(0, {"gemv": [(1, 256, 1024)]})  # verifies
    seam.capturing = True
    y = ops.gemv(x, w)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w), rtol=1e-2, atol=1e-2)


def test_a_verdict_for_another_kernel_source_is_no_verdict(seam: Seam) -> None:
    seam.kernel("gemv")
    x, w = _xw()
    ops.gemv(x, w)
    path = next((seam.config / "selftest").glob("*.json"))
    doc = json.loads(path.read_text())
    doc["verdicts"][0]["stamp"]["kernel"] = "0" * 64
    path.write_text(json.dumps(doc))
    hwprofile.reset()
    ops.reset_dispatch()
    n = len(seam.kernels["gemv"].launches)
    ops.gemv(x, w)
    assert len(seam.kernels["gemv"].launches) == n + 4  # checked again


def test_verify_off_is_the_users_choice_and_explain_says_so(seam: Seam, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_VERIFY", "off")
    hwprofile.reset()
    ops.reset_dispatch()
    k = seam.kernel("gemv")
    ops.gemv(*_xw())
    assert len(k.launches) == 1 and _verdicts(seam) == []
    prof = hwprofile.profile(0)
    assert prof.explain("verify").winner.source == "environment HWPROFILE_VERIFY"
    said = _verify.state(prof, "gemv", _plan("gemv", 1, 256, 1024), (1, 256, 1024), NO_SCALE)
    assert "verification off (environment HWPROFILE_VERIFY)" in said


def test_simulated_devices_run_nothing_and_say_not_yet_verified(monkeypatch: pytest.MonkeyPatch, no_downstream: None) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "b200")
    hwprofile.reset()
    prof = hwprofile.profile(0)
    assert not _verify.enabled(prof)
    plan = prof.kernels["router_gemm"].configure(m=8, n=256, k=7168, split_k=bool(prof["gemv.split_k"]))
    assert "not yet verified" in _verify.state(prof, "router_gemm", plan, (8, 256, 7168), NO_SCALE)
