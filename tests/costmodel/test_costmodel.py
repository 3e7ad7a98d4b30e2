"""The cost model (hwprofile.costmodel): the fit recovers known parameters, is monotone, refuses bad samples;
leave-one-model-out numbers on a synthetic catalog; dispatch through the model; the held-out plot file."""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path

import pytest

import hwprofile
from hwprofile import costmodel as cm
from hwprofile import sweep
from hwprofile.errors import SettingError
from hwprofile.ops import decide

OP = "gemv"


def synthetic(launch: float, tbps: float, n: int, k: int) -> float:
    return launch + cm.call_bytes(OP, 1, n, k) / (tbps * 1e6)


def grid_samples(kernel_tbps: float = 3.0, fallback_tbps: float = 2.0) -> list[cm.Sample]:
    return [cm.Sample(1, n, k, synthetic(2.0, kernel_tbps, n, k), synthetic(5.0, fallback_tbps, n, k))
            for n in (1024, 2048, 4096, 8192, 16384) for k in (1024, 2048, 4096, 8192)]


def test_fit_recovers_a_known_launch_and_bandwidth() -> None:
    model = cm.fit(OP, grid_samples())
    assert model.kernel is not None and model.samples == 20
    assert model.kernel.knots[-1][1] == pytest.approx(3.0, rel=0.2)  # the bandwidth the big calls reach (launch a floor: biased up)
    assert model.fallback.knots[-1][1] == pytest.approx(2.0, rel=0.2)
    assert model.kernel.launch_us <= 2.0 + 1.1 and model.fallback.launch_us <= 5.0 + 1.1  # 0.9 x the fastest call
    for n, k in ((3000, 3000), (12000, 6000)):
        p = cm.predict(model, {}, 1, n, k)  # the trend alone: within 20 % (the launch is a floor, not fitted)
        assert p.kernel_us == pytest.approx(synthetic(2.0, 3.0, n, k), rel=0.2)
        assert p.fallback_us == pytest.approx(synthetic(5.0, 2.0, n, k), rel=0.2)
        assert p.kernel and not p.neighbours


def test_the_trend_never_falls_as_the_problem_grows() -> None:
    # a bandwidth that jumps (a faster plan for big weights) must not make a bigger call cheaper
    samples = [cm.Sample(1, n, 4096, 3.0 + (0.2 if n < 8192 else 0.01) * n / 1024, 9.0) for n in (1024, 2048, 4096, 8192, 16384)]
    fit = cm.fit(OP, samples).kernel
    assert fit is not None
    times = [fit.time(cm.call_bytes(OP, 1, n, 4096)) for n in range(512, 65536, 512)]
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(times))
    assert [w for _, w in fit.knots] == sorted(w for _, w in fit.knots)


@pytest.mark.parametrize(("samples", "words"), [
    ([cm.Sample(1, 64, 64, 1.0, 2.0)], "at least 2"),
    ([cm.Sample(1, 64, 64, 1.0, 2.0), cm.Sample(1, 64, 64, 1.0, 2.0)], "appears twice"),
    ([cm.Sample(1, 64, 64, -1.0, 2.0), cm.Sample(1, 128, 64, 1.0, 2.0)], "positive number"),
    ([cm.Sample(1, 64, 64, 1.0, math.nan), cm.Sample(1, 128, 64, 1.0, 2.0)], "positive number"),
    ([cm.Sample(0, 64, 64, 1.0, 2.0), cm.Sample(1, 128, 64, 1.0, 2.0)], "empty dimension"),
])
def test_bad_samples_are_refused_naming_the_op_and_what_to_do(samples: list[cm.Sample], words: str) -> None:
    with pytest.raises(SettingError, match=words) as exc:
        cm.fit(OP, samples)
    assert "hwprofile sweep gemv" in str(exc.value)


def test_the_text_round_trips_and_malformed_text_is_refused() -> None:
    model = cm.fit(OP, grid_samples())
    text = cm.format_model(model)
    again = cm.parse(OP, text, where="test")
    assert cm.format_model(again) == text
    for bad in ("kernel=1|20:1", "kernel=x|20:1; fallback=1|20:1", "kernel=1|21:2,20:3; fallback=1|20:1",
                "kernel=1|20:3,21:2; fallback=1|20:1", "kernel=1|20:1; fallback=1|20:1; near=-1", "bogus=1"):
        with pytest.raises(SettingError, match="gemv.model"):
            cm.parse(OP, bad, where="test")


def test_the_local_correction_follows_the_nearest_measured_shapes() -> None:
    model = cm.fit(OP, grid_samples())
    # measured: around N = 5120 the kernel is 30 % slower than its trend; the prediction there follows
    measured = {(1, 5120, k): (1.3 * synthetic(2.0, 3.0, 5120, k), synthetic(5.0, 2.0, 5120, k)) for k in (2048, 4096, 8192)}
    p = cm.predict(model, measured, 1, 5120, 3072)
    assert p.neighbours and set(p.neighbours) <= set(measured)
    assert p.kernel_us == pytest.approx(1.3 * synthetic(2.0, 3.0, 5120, 3072), rel=0.05)  # the measured shapes' times, not the trend's


def test_leave_one_model_out_on_a_synthetic_catalog() -> None:
    """Two 'models': the kernel wins everywhere but at N = 5120 (a plan with a bad tail). Held out, each model's
    shapes are predicted from the other's: the N = 5120 shapes of one from the N = 5120 shapes of the other."""
    def times(n: int, k: int) -> tuple[float, float]:
        kernel = synthetic(2.0, 3.5, n, k) * (1.25 if n == 5120 else 1.0)
        return kernel, synthetic(3.0, 3.3, n, k)

    a = {(1, 5120, 4096), (1, 4096, 4096), (1, 8192, 2048)}
    b = {(1, 5120, 6144), (1, 4096, 6144), (1, 8192, 3072)}
    box = [(1, n, k) for n in (2048, 16384) for k in (2048, 8192)]
    samples = [cm.Sample(*s, *times(s[1], s[2])) for s in sorted(a | b | set(box))]
    rows = cm.cross_validate(OP, samples, {"a": a, "b": b}, box)
    assert {(r.model, (r.m, r.n, r.k)) for r in rows} == {("a", s) for s in a} | {("b", s) for s in b}
    assert all(r.regret == 1.0 for r in rows), [(r.model, r.n, r.k, r.path) for r in rows]
    assert {r.n: r.path for r in rows} == {5120: "fallback", 4096: "kernel", 8192: "kernel"}
    sm = cm.summary(rows)
    assert sm["shapes"] == 6 and sm["geomean"] == 1.0 and sm["over"] == 0 and sm["models"] == ["a", "b"]
    # a wrong path is counted: with no N = 5120 shape in the fit, the trend (kernel) is taken there
    held = cm.holdout(OP, [s for s in samples if s.n != 5120], [cm.Sample(1, 5120, 5000, *times(5120, 5000))], {(1, 5120, 5000): "c"})
    kt, ft = times(5120, 5000)
    assert len(held) == 1 and held[0].path == "kernel" and held[0].regret == pytest.approx(kt / ft)
    assert cm.summary(held)["over"] == 1


def test_the_held_out_plot_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows = cm.holdout(OP, grid_samples(), [cm.Sample(1, 3000, 3000, 9.0, 8.0)], {(1, 3000, 3000): "m"})
    out = tmp_path / "heldout.png"
    sweep.plot_regret({OP: rows}, out)
    assert out.read_bytes()[:4] == b"\x89PNG"


@pytest.fixture
def h200(monkeypatch: pytest.MonkeyPatch) -> hwprofile.Profile:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    for key in [k for k in os.environ if k.startswith("HWPROFILE_") and k != "HWPROFILE_DEVICE"]:
        monkeypatch.delenv(key)
    hwprofile.reset()
    yield hwprofile.profile(0)
    hwprofile.reset()


def test_dispatch_measured_first_then_the_model_inside_the_kernels_limits(h200: hwprofile.Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    d = decide(OP, h200, m=1, n=5120, k=5120)  # measured on the H200: the fallback was faster
    assert (d.path, d.basis, d.gate) == ("fallback", "measured", "measured") and d.kernel_us == 18.763
    d = decide(OP, h200, m=1, n=4096, k=6000)  # not measured: the model decides, and says on what
    assert d.basis == "model" and d.kernel_us is not None and d.fallback_us is not None
    assert (d.path == "kernel") == (d.kernel_us < d.fallback_us)
    assert "fitted on NVIDIA H200" in d.reason and "nearest measured shapes" in d.reason
    d = decide(OP, h200, m=1, n=4100, k=6000)  # a kernel limit holds whatever the model says
    assert (d.path, d.basis, d.gate) == ("fallback", "limit", "n_multiple")
    # a measured decision overrides the model: make the model say "kernel" everywhere, the measured fallback stays
    fast = "kernel=0|10:100; fallback=50|10:0.01; near=0; n_weight=4; samples=2"
    monkeypatch.setenv("HWPROFILE_GEMV_MODEL", fast)
    hwprofile.reset()
    prof = hwprofile.profile(0)
    assert decide(OP, prof, m=1, n=5120, k=5120).path == "fallback"
    assert decide(OP, prof, m=1, n=5120, k=5000).path == "kernel"


def test_an_unmeasured_sku_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "b200")
    hwprofile.reset()
    try:
        prof = hwprofile.profile(0)
        d = decide("router_gemm", prof, m=4, n=64, k=3072)
        assert d.path == "kernel" and d.basis == "model" and "predicted, not measured on this SKU" in d.reason
        assert "not measured on SM100" in prof.explain("router_gemm.model").winner.reason
    finally:
        hwprofile.reset()


def test_a_call_looks_its_memo_up_once_on_the_kernel_route(h200: hwprofile.Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: _dispatch.call looked the memo up, then _dispatch looked it up again on the kernel route."""
    torch = pytest.importorskip("torch")
    from hwprofile import ops
    from hwprofile.ops import _dispatch, _kernel

    class Counting(dict):  # type: ignore[type-arg]
        gets = 0

        def get(self, *a: object) -> object:
            Counting.gets += 1
            return super().get(*a)

    monkeypatch.setattr(_dispatch, "_cpu_index", 0)
    monkeypatch.setattr(_kernel, "launch", lambda *a: True)
    e = _dispatch.ENTRIES["router_gemm"]
    monkeypatch.setattr(e, "memo", Counting())
    x, w = torch.zeros(4, 7168, dtype=torch.bfloat16), torch.zeros(256, 7168, dtype=torch.bfloat16)
    ops.router_gemm(x, w)  # first call: routed and remembered
    assert decide("router_gemm", h200, m=4, n=256, k=7168).path == "kernel"
    Counting.gets = 0
    ops.router_gemm(x, w)
    assert Counting.gets == 1
