"""Op contracts on every fallback path (CPU) and dispatch decisions on every simulated architecture."""

from __future__ import annotations

import pytest

import hwprofile
from hwprofile import costmodel, ops, tuning
from hwprofile.optable import OPS

torch = pytest.importorskip("torch")
ARCHS = ["h200", "b200", "gb300", "rtx-pro-6000", "dgx-spark", "l40s", "a100"]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


def rand(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float32).to(dtype)


@pytest.fixture(params=ARCHS)
def arch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> hwprofile.Profile:
    monkeypatch.setenv("HWPROFILE_DEVICE", request.param)
    hwprofile.reset()
    ops.reset_dispatch()
    return hwprofile.profile(0)


@pytest.mark.parametrize(("m", "n", "k"), [(1, 256, 7168), (6, 384, 7168), (16, 256, 7168), (33, 100, 40)])
def test_router_gemm_contract_fp32(arch: hwprofile.Profile, m: int, n: int, k: int) -> None:
    h, w = rand(m, k), rand(n, k)
    out = ops.router_gemm(h, w)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    assert rel_err(out, h.double() @ w.double().t()) < 1e-5


def test_linear_contract_fp32(arch: hwprofile.Profile) -> None:
    x, w = rand(5, 64), rand(24, 64)
    out = ops.linear_bf16_fp32(x, w)
    assert out.dtype == torch.float32 and out.shape == (5, 24)
    assert rel_err(out, x.double() @ w.double().t()) < 1e-5


def test_gemv_contract_bf16(arch: hwprofile.Profile) -> None:
    x, w = rand(1, 1024), rand(2048, 1024)
    out = ops.gemv(x, w)
    assert out.dtype == torch.bfloat16 and out.shape == (1, 2048)
    assert rel_err(out, x.double() @ w.double().t()) < 1e-2


@pytest.mark.parametrize("per_row", [False, True])
def test_fp8_gemv_contract(arch: hwprofile.Profile, per_row: bool) -> None:
    n, k = 512, 1024
    x = rand(1, k)
    w = (torch.randn(n, k) * 2).to(torch.float8_e4m3fn)
    scale = (torch.rand(n) + 0.5) if per_row else torch.tensor([0.37])
    out = ops.fp8_gemv(x, w, scale.float())
    ref = x.double() @ (w.double() * scale.double().reshape(-1, 1)).t()
    assert out.dtype == torch.bfloat16 and out.shape == (1, n)
    assert rel_err(out, ref) < 1e-2


def test_bad_inputs_are_clear_errors() -> None:
    x, w = rand(2, 64), rand(8, 64)
    with pytest.raises(ValueError, match="hidden must be torch.bfloat16"):
        ops.router_gemm(x.float(), w)
    with pytest.raises(ValueError, match=r"hidden must be \[\.\.\., K\] with K=32 \(from weight \(8, 32\)\), got \(2, 64\)"):
        ops.router_gemm(x, rand(8, 32))
    with pytest.raises(ValueError, match="scale must have 1 element"):
        ops.fp8_gemv(rand(1, 64), w.to(torch.float8_e4m3fn), torch.ones(3))
    with pytest.raises(ValueError, match="scale must be a float32"):
        ops.fp8_gemv(rand(1, 64), w.to(torch.float8_e4m3fn), torch.ones(1, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"w must have 2 dimensions \[N, K\]"):
        ops.linear_bf16_fp32(rand(1, 2, 64), rand(1, 8, 64))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        ops.gemv([1.0], w)  # type: ignore[arg-type]


# --- dispatch decisions: the kernel's limits, then measured shapes, then the cost model -----


def test_router_decision_follows_threshold(arch: hwprofile.Profile) -> None:
    limit = arch["router_gemm.max_tokens"]
    has = "router_gemm" in arch.kernels
    for m in range(1, 20):
        d = ops.decide("router_gemm", arch, m=m, n=256, k=7168)
        assert d.path == ("kernel" if has and m <= limit else "fallback"), (m, d)
    assert ops.decide("router_gemm", arch, m=1, n=256, k=7170).path == "fallback"


def test_router_threshold_moves_with_user_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    monkeypatch.setenv("HWPROFILE_ROUTER_GEMM_MAX_TOKENS", "4")
    hwprofile.reset()
    p = hwprofile.profile(0)
    assert [ops.decide("router_gemm", p, m=m, n=256, k=7168).path for m in (4, 5)] == ["kernel", "fallback"]


def _hopper(monkeypatch: pytest.MonkeyPatch) -> hwprofile.Profile:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    return hwprofile.profile(0)


def _measured_or_predicted(p: hwprofile.Profile, op: str, m: int, n: int, k: int) -> tuple[str, str, float | None, float]:
    """(basis, path, kernel µs, fallback µs) the profile's own ``<op>.measured`` and ``<op>.model`` give at a shape inside
    the kernel's limits: the measured decision if the sweep measured the shape, else the faster predicted path."""
    table = tuning.parse_measured(op, p[tuning.measured_key(op)], where="the profile")
    hit = table.get((m, n, k))
    if hit is not None:
        return "measured", "kernel" if hit.kernel else "fallback", hit.kernel_us, hit.fallback_us
    model = costmodel.parse(op, p[costmodel.model_key(op)], where="the profile")
    pred = costmodel.predict(model, {s: (d.kernel_us, d.fallback_us) for s, d in table.items()}, m, n, k)
    return "model", "kernel" if pred.kernel else "fallback", pred.kernel_us, pred.fallback_us


@pytest.mark.parametrize(
    ("n", "k", "limit"),  # limit: the kernel limit that refuses the shape at M = 1 (None: inside the kernel's limits)
    [
        (2048, 7168, None),
        (4096, 4096, None),
        (7168, 2048, None),
        (7168, 16384, None),
        (12288, 4096, None),  # the old roof range: no longer a box, the sweep's measurement decides
        (4104, 4096, None),
        (4096, 7680, None),
        (28672, 4096, None),
        (57344, 7168, None),
        (152064, 5120, None),
        (2048, 3584, None),
        (2048, 3000, None),  # K % 8: the kernel's 16-byte loads
        (2048, 2880, None),
        (2048, 3004, "k_multiple"),
        (2048, 256, None),  # no K box: the kernel's limit is one 16-byte load
        (2050, 4096, "n_multiple"),
        (64, 512, None),
        (56, 512, "n"),
        (7168, 4608, None),
    ],
)
def test_gemv_predicate_edges_on_hopper(no_downstream: None, monkeypatch: pytest.MonkeyPatch, n: int, k: int, limit: str | None) -> None:
    """sm90 on the H200: the kernel's limits refuse, naming the limit; inside them a shape of the sweep's grid is measured
    and takes the path measured there, any other shape the faster path sm90's shipped cost model predicts."""
    p = _hopper(monkeypatch)
    d = ops.decide("gemv", p, m=1, n=n, k=k)
    if limit is not None:
        assert (d.path, d.gate, d.basis) == ("fallback", limit, "limit")
    else:
        assert (d.basis, d.path, d.kernel_us, d.fallback_us) == _measured_or_predicted(p, "gemv", 1, n, k), d.reason
        assert (d.basis == "measured") == ((1, n, k) in OPS["gemv"].grid), "every sweep measures its grid"
    d = ops.decide("gemv", p, m=2, n=n, k=k)
    assert (d.path, d.gate) == ("fallback", "m")  # the kernel takes M = 1 only: its first limit


def test_fp8_predicate_on_hopper_covers_every_measured_n(no_downstream: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    p = hwprofile.profile(0)
    for n, k in [(2048, 7168), (12288, 4096), (28672, 4096), (152064, 5120)]:
        assert ops.decide("fp8_gemv", p, m=1, n=n, k=k).path == "kernel"


def test_linear_threshold_on_hopper(no_downstream: None, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _hopper(monkeypatch)
    assert p["linear_bf16_fp32.max_tokens"] == 16  # sm90: the kernel's limit
    for m in (8, 16):  # sweep: the kernel wins at every M to 16
        d = ops.decide("linear_bf16_fp32", p, m=m, n=4096, k=7168)
        assert (d.path, d.basis) == ("kernel", "measured"), d.reason
    d = ops.decide("linear_bf16_fp32", p, m=17, n=256, k=7168)
    assert (d.path, d.gate) == ("fallback", "m")
    d = ops.decide("linear_bf16_fp32", p, m=4, n=8192, k=7168)  # past the sweep's N: predicted, not measured
    want = _measured_or_predicted(p, "linear_bf16_fp32", 4, 8192, 7168)
    assert want[0] == "model" and (d.basis, d.path, d.kernel_us, d.fallback_us) == want, d.reason


def test_sm120_predicate(no_downstream: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """sm120 is measured nowhere: the bandwidth rule predicts (a bf16 GEMV ties with cuBLAS, so the fallback; the FP8
    kernel moves a third of the bytes, so the kernel) and says so; the kernel's limits hold whatever is predicted."""
    monkeypatch.setenv("HWPROFILE_DEVICE", "rtx-pro-6000")
    hwprofile.reset()
    p = hwprofile.profile(0)
    top = p["gemv.max_k"]
    for k in (4096, top):
        d = ops.decide("gemv", p, m=1, n=4096, k=k)
        assert (d.path, d.gate, d.basis) == ("fallback", "model", "model") and d.kernel_us == d.fallback_us
        assert "predicted, not measured on this SKU" in d.reason
    assert ops.decide("gemv", p, m=1, n=4096, k=top + 8).gate == "k"
    d = ops.decide("fp8_gemv", p, m=1, n=28672, k=4096)
    assert (d.path, d.basis) == ("kernel", "model") and "predicted, not measured on this SKU" in d.reason
    # a user model predicting the kernel (what 'hwprofile tune' fits where it wins): the kernel as far as the limit
    # the user sets, whatever split-K says (the kernels stream x, so the planner takes any K), the fallback past it
    monkeypatch.setenv("HWPROFILE_GEMV_MODEL", "kernel=0|10:100; fallback=50|10:0.01; near=0; n_weight=4; samples=2")
    monkeypatch.setenv("HWPROFILE_GEMV_MAX_K", "131072")
    for split in ("0", "1"):
        monkeypatch.setenv("HWPROFILE_GEMV_SPLIT_K", split)
        hwprofile.reset()
        p = hwprofile.profile(0)
        assert [ops.decide("gemv", p, m=1, n=4096, k=k).path for k in (4096, 17408, 17920, 131072)] == ["kernel"] * 4
        assert ops.decide("gemv", p, m=1, n=4096, k=131080).gate == "k"


def test_no_plugin_means_fallback_with_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "l40s")
    hwprofile.reset()
    d = ops.decide("gemv", hwprofile.profile(0), m=1, n=4096, k=4096)
    assert d.path == "fallback" and "no architecture plugin" in d.reason


def test_deterministic_mode_keeps_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    monkeypatch.setenv("HWPROFILE_DETERMINISTIC", "1")
    hwprofile.reset()
    p = hwprofile.profile(0)
    for op in OPS:
        assert ops.decide(op, p, m=1, n=2048, k=7168).path == "fallback"


def test_cpu_calls_count_as_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    ops.gemv(rand(1, 512), rand(64, 512))
    # CPU tensors never reach the device table: the op is still correct and takes the torch path.
    assert hwprofile.profile(0).stats.as_dict().get("gemv", {}).get("kernel", 0) == 0


def test_stats_shown_in_the_process_that_ran_ops(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from hwprofile.cli import main

    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    ops.reset_dispatch()
    p = hwprofile.profile(0)
    p.stats.counts.clear()
    t = ops._dispatch._Table(p)
    t.routes["gemv"].counts["kernel"] += 3
    t.routes["gemv"].counts["fallback"] += 1
    assert main(["show"]) == 0  # counters are shown whenever an op ran in this process
    out = capsys.readouterr().out
    assert "gemv" in out and "3" in out and "1" in out
    assert p.stats.as_dict()["gemv"] == {"kernel": 3, "fallback": 1}


def test_launch_gate_names_the_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    x, w, out = rand(1, 512), rand(64, 512), torch.empty(1, 64, dtype=torch.bfloat16)
    check = ops._kernel.check_operands
    with pytest.raises(ValueError, match="gemv: out must be torch.bfloat16"):
        check("gemv", 0, -1, out.float(), x, w, None)
    with pytest.raises(ValueError, match=r"gemv: w must have shape \(64, 512\)"):
        check("gemv", 0, -1, out, x, rand(64, 256), None)
    with pytest.raises(ValueError, match="gemv: out must be on cuda:0"):
        check("gemv", 0, -1, out, x, w, None)
    with pytest.raises(ValueError, match="fp8_gemv: the kernel needs a float32 scale"):
        check("fp8_gemv", 0, -1, out, x, w.to(torch.float8_e4m3fn), None)
    with pytest.raises(ValueError, match="gemv: run_kernel needs CUDA tensors, got x on cpu"):
        ops.run_kernel("gemv", out, x, w)
    with pytest.raises(KeyError, match="no op 'gemvv'.*known ops: router_gemm"):
        ops.run_kernel("gemvv", out, x, w)


def test_kernel_failure_warns_once_then_falls_back_or_raises_in_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    from hwprofile.errors import KernelCompileError
    from hwprofile.kernels import _pipeline as jit

    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    t = ops._dispatch._Table(hwprofile.profile(0))

    def boom(*a: object, **k: object) -> None:
        raise KernelCompileError("NVRTC failed to compile kernel 'gemv' of plugin sm90 for sm_90a: error")

    monkeypatch.setattr(jit, "load", boom)
    x, w, out = rand(1, 512), rand(64, 512), torch.empty(1, 64, dtype=torch.bfloat16)
    with pytest.warns(RuntimeWarning, match="gemv kernel unavailable"):
        assert ops._kernel.launch(t, "gemv", out, x, w, None, 1, 64, 512, 0) is False
    assert "gemv" in t.failed
    t.strict = True
    t.launches.clear()
    with pytest.raises(KernelCompileError):
        ops._kernel.launch(t, "gemv", out, x, w, None, 1, 64, 512, 0)
