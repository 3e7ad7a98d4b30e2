"""Crossover logic with made-up timings, the stamped tuned file round trip, and the GPU sweep."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import hwprofile
from hwprofile import costmodel, sweep, tuning
from hwprofile.ops import decide
from hwprofile.profiles import build_profile
from hwprofile.registry import Registry
from hwprofile.sweep import Point


def pt(m: int, kernel: float, fallback: float, n: int = 256, k: int = 7168, jitter: float = 0.005, seed: int = 0) -> Point:
    rnd = random.Random(seed * 1000 + m * 7 + n)
    return Point(
        m,
        n,
        k,
        [kernel * (1 + rnd.uniform(-jitter, jitter)) for _ in range(15)],
        [fallback * (1 + rnd.uniform(-jitter, jitter)) for _ in range(15)],
    )


def test_verdict_respects_noise() -> None:
    assert sweep.verdict(pt(1, 4.0, 7.0)) == "kernel"
    assert sweep.verdict(pt(1, 7.0, 4.0)) == "fallback"
    assert sweep.verdict(pt(1, 5.0, 5.05)) == "tie"  # 1 % apart: under the 2 % floor
    noisy = pt(1, 5.0, 5.6, jitter=0.3)  # 12 % apart but replays scatter by +-30 %
    assert noisy.noise > 0.1 and sweep.verdict(noisy) == "tie"
    assert sweep.verdict(Point(1, 256, 7168, [], [5.0] * 5)) == "fallback"  # no kernel for the shape


def law(m: int, n: int, k: int, launch: float, tbps: float) -> float:
    """A path's µs by the cost model's own trend: a fixed cost plus the bytes a router call moves at ``tbps``."""
    return launch + costmodel.call_bytes("router_gemm", m, n, k) / (tbps * 1e6)


def test_the_sweep_fits_the_cost_model_from_its_points() -> None:
    """What replaced the prefix and box rules: every measured point feeds the model (launch = 0.9 x the fastest
    sample, a bandwidth per power of two of bytes), and the model predicts the faster path where nobody measured."""
    shapes = [(m, n, 7168) for m in (1, 2, 4, 8, 16) for n in (256, 384, 1024)]
    pts = [pt(m, law(m, n, k, 3.0, 2.0), law(m, n, k, 6.0, 2.0), n=n, k=k, jitter=0.0) for m, n, k in shapes]
    chosen, notes = sweep.thresholds_for("router_gemm", pts, "fallback")
    assert set(chosen) == {"router_gemm.model"} and notes == []  # no box, no prefix: the kernel's limits are the op table's
    model = costmodel.parse("router_gemm", str(chosen["router_gemm.model"]), where="test")
    assert model.samples == len(shapes) and model.kernel is not None
    fastest = min(law(m, n, k, 3.0, 2.0) for m, n, k in shapes)
    assert model.kernel.launch_us == pytest.approx(costmodel.LAUNCH_FRACTION * fastest, rel=1e-3)
    assert model.fallback.launch_us == pytest.approx(costmodel.LAUNCH_FRACTION * min(law(*s, 6.0, 2.0) for s in shapes), rel=1e-3)
    p = costmodel.predict(model, {}, 3, 512, 7168)  # never measured: the trend alone, the kernel's smaller fixed cost wins
    assert p.kernel and p.neighbours == ()
    assert p.kernel_us == pytest.approx(law(3, 512, 7168, 3.0, 2.0), rel=0.15)
    assert p.fallback_us == pytest.approx(law(3, 512, 7168, 6.0, 2.0), rel=0.15)


def test_a_sweep_of_one_shape_writes_its_decision_but_no_model() -> None:
    """A fit needs two measured shapes: one shape is a legitimate sweep (its decision is measured), not a crash."""
    chosen, notes = sweep.thresholds_for("router_gemm", [pt(1, 4.0, 7.0)], "fallback")
    assert chosen == {} and len(notes) == 1 and "no router_gemm.model written" in notes[0] and "at least 2" in notes[0]
    assert sweep.decision_table([pt(1, 4.0, 7.0)], "fallback")[(1, 256, 7168)].kernel


def test_a_kernel_that_never_ran_is_never_predicted_faster() -> None:
    chosen, notes = sweep.thresholds_for("router_gemm", [Point(m, 256, 7168, [], [5.0] * 5) for m in (1, 2)], "fallback")
    model = costmodel.parse("router_gemm", str(chosen["router_gemm.model"]), where="test")
    assert model.kernel is None and any("kernel ran at no measured shape" in n for n in notes)
    assert not costmodel.predict(model, {}, 1, 384, 7168).kernel


def test_decisions_are_per_shape_not_one_prefix_or_box() -> None:
    """Where one N loses from M = 6 and the other wins throughout, each measured shape keeps its own decision
    (the old prefix rule gave both N the common prefix); exactly equal medians go to ``ties``."""
    pts = [pt(m, 4.0, 7.0, n=256) for m in range(1, 9)] + [pt(m, 4.0 if m < 6 else 8.0, 7.0, n=384) for m in range(1, 9)]
    table = sweep.decision_table(pts, "fallback")
    assert all(table[(m, 256, 7168)].kernel for m in range(1, 9))
    assert [table[(m, 384, 7168)].kernel for m in range(1, 9)] == [True] * 5 + [False] * 3
    equal = Point(1, 256, 7168, [5.0] * 5, [5.0] * 5)
    assert not sweep.decision_table([equal], "fallback")[(1, 256, 7168)].kernel
    assert sweep.decision_table([equal], "kernel")[(1, 256, 7168)].kernel


class FakeTimer:
    def __init__(self, table: dict[int, tuple[float, float]]) -> None:
        self.table = table

    def measure(self, op: str, m: int, n: int, k: int) -> Point:
        kernel, fallback = self.table[m]
        return pt(m, kernel, fallback, n=n, k=k)


@pytest.fixture
def h200(monkeypatch: pytest.MonkeyPatch) -> hwprofile.Profile:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    monkeypatch.setenv("HWPROFILE_DISABLE_PLUGINS", "myengine")
    hwprofile.reset()
    return hwprofile.profile(0)


def test_sweep_document_round_trip(h200: hwprofile.Profile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    timer = FakeTimer({m: (4.0, 7.0) if m <= 6 else (8.0, 7.0) for m in range(1, 17)})
    box = sweep.box_grid("router_gemm")
    doc = sweep.run(h200, "router_gemm", sweep.default_grid("router_gemm"), timer, date="2026-11-30", box=box)
    measured, model = doc["thresholds"]["router_gemm.measured"], doc["thresholds"]["router_gemm.model"]
    assert set(doc["thresholds"]) == {"router_gemm.measured", "router_gemm.model"}  # no box: the kernel's limits are the op table's
    fitted = costmodel.parse("router_gemm", model, where="test")
    assert fitted.samples == len(doc["measurements"]) and fitted.kernel is not None
    assert len(tuning.parse_measured("router_gemm", measured, where="test")) == len(doc["measurements"])
    st = doc["stamp"]
    assert st["plugin"] == "sm90" and st["compute_capability"] == [9, 0] and st["kernel"]
    extra = [tuple(map(int, x.split("x"))) for x in st["shapes"]]  # the catalog's shapes outside the op's grid
    assert extra and not set(extra) & set(box)
    assert st["plan"] == tuning.plan_digest("router_gemm", h200.kernels["router_gemm"], extra)  # the launches it measured
    assert st["fallback"]["function"] == "torch.mm(out_dtype=torch.float32)" and "torch" in st["fallback"] and "uuid" not in str(st).lower()
    assert len(doc["measurements"]) == len(sweep.default_grid("router_gemm")) > 32 and doc["measurements"][0]["kernel_samples"]
    f = tmp_path / "router.toml"
    sweep.write(doc, f)
    env = {"HWPROFILE_DEVICE": "h200", "HWPROFILE_DISABLE_PLUGINS": "myengine", "HWPROFILE_TUNED_FILE": str(f)}
    reg = Registry(env).load_entry_points()
    prof = build_profile(h200.device, reg, env)
    for key, value in (("router_gemm.model", model), ("router_gemm.measured", measured)):
        r = prof.explain(key)
        assert r.value == value and r.winner.kind == "tuned" and r.winner.stamp.date == "2026-11-30" and r.winner.stamp.plan == st["plan"]
    assert decide("router_gemm", prof, m=3, n=256, k=7168).basis == "measured"  # the file's table routes


def test_tuned_file_for_other_gpu_is_stale_not_a_crash(h200: hwprofile.Profile, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    doc = sweep.run(h200, "router_gemm", [(1, 256, 7168), (2, 256, 7168)], FakeTimer({1: (4.0, 7.0), 2: (4.0, 7.0)}), date="2026-11-30")
    f = tmp_path / "t.toml"
    sweep.write(doc, f)
    env = {"HWPROFILE_DEVICE": "rtx-pro-6000", "HWPROFILE_TUNED_FILE": str(f)}
    reg = Registry(env).load_entry_points()
    rtx = hwprofile.detect(env).devices[0]
    prof = build_profile(rtx, reg, env)
    for key in ("router_gemm.model", "router_gemm.measured"):
        r = prof.explain(key)
        assert r.winner.kind != "tuned" and "compute capability 9.0" in r.chain[-1].stale
    assert decide("router_gemm", prof, m=1, n=256, k=7168).basis != "measured"


def test_a_one_shape_tuned_file_keeps_the_model_below_it(h200: hwprofile.Profile, tmp_path: Path) -> None:
    doc = sweep.run(h200, "router_gemm", [(1, 256, 7168)], FakeTimer({1: (4.0, 7.0)}), date="2026-11-30")
    assert "router_gemm.model" not in doc["thresholds"] and any("no router_gemm.model written" in n for n in doc["sweep"]["notes"])
    f = tmp_path / "t.toml"
    sweep.write(doc, f)
    env = {"HWPROFILE_DEVICE": "h200", "HWPROFILE_DISABLE_PLUGINS": "myengine", "HWPROFILE_TUNED_FILE": str(f)}
    prof = build_profile(h200.device, Registry(env).load_entry_points(), env)
    assert prof.explain("router_gemm.measured").winner.kind == "tuned"
    assert prof.explain("router_gemm.model").value == h200.explain("router_gemm.model").value  # the plugin's, untouched
    d = decide("router_gemm", prof, m=1, n=256, k=7168)
    assert (d.path, d.basis) == ("kernel", "measured") and str(f) in d.reason


def test_plot_writes_png(h200: hwprofile.Profile, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    doc = sweep.run(h200, "gemv", [(1, n, k) for n in (2048, 4096) for k in (2048, 4096)], FakeTimer({1: (4.0, 7.0)}), date="2026-11-30")
    sweep.plot(doc, tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"


def test_sweep_cli_refuses_simulated_device(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from hwprofile.cli import main

    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    assert main(["sweep", "router_gemm"]) == 2
    assert "simulated" in capsys.readouterr().err


@pytest.mark.hwprofile_gpu("sm_90")
def test_gpu_sweep_writes_stamped_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from hwprofile.cli import main

    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    hwprofile.reset()
    out = tmp_path / "router.toml"
    assert main(["sweep", "router_gemm", "--m", "1,2", "--n", "256", "--reps", "5", "--output", str(out)]) == 0
    import tomllib

    doc = tomllib.loads(out.read_text())
    assert doc["stamp"]["plugin"] == "sm90" and "measurements" not in doc  # the tuned file holds no raw samples
    assert costmodel.parse("router_gemm", doc["thresholds"]["router_gemm.model"], where=str(out)).samples == 2
    table = tuning.parse_measured("router_gemm", doc["thresholds"]["router_gemm.measured"], where=str(out))
    assert set(table) == {(1, 256, 7168), (2, 256, 7168)}
    samples = tomllib.loads((tmp_path / doc["sweep"]["samples"]).read_text())  # they sit beside it, in samples/
    assert samples["stamp"] == doc["stamp"] and len(samples["measurements"]) == 2


def test_run_to_run_noise_from_independent_passes() -> None:
    p = pt(1, 27.5, 29.1)  # 5.5 % apart, replays agree to 0.5 %
    assert sweep.verdict(p) == "kernel"
    p.kernel_passes, p.fallback_passes = [27.5, 30.4], [29.1, 28.9]  # a second pass disagrees by 10 %
    assert p.noise > 0.09 and sweep.verdict(p) == "tie"


@pytest.mark.hwprofile_gpu("sm_90")
def test_gpu_sweep_measures_model_shapes_and_reports_regret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One model's shapes plus one box edge on the GPU: a per-shape table, its stamp's shapes, the regret report."""
    from hwprofile.cli import main

    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    hwprofile.reset()
    out = tmp_path / "gemv.toml"
    argv = ["sweep", "gemv", "--models", "llama-3.1-8b", "--shapes", "2048x2048", "--reps", "3", "--output", str(out), "--report"]
    assert main(argv) == 0
    import tomllib

    doc = tomllib.loads(out.read_text())
    table = tuning.parse_measured("gemv", doc["thresholds"]["gemv.measured"], where=str(out))
    assert (1, 2048, 2048) in table and (1, 4096, 14336) in table  # the box edge and Llama-3.1-8B's down projection
    assert doc["stamp"]["plan"] and "1x4096x14336" in doc["stamp"]["shapes"]
    printed = capsys.readouterr().out
    assert "regret" in printed and "geomean" in printed
    env = {"HWPROFILE_TUNED_FILE": str(out)}
    prof = build_profile(hwprofile.profile(0).device, Registry(env).load_entry_points(), env)
    from hwprofile.ops import decide

    d = decide("gemv", prof, m=1, n=4096, k=14336)
    assert d.basis == "measured" and d.path == ("kernel" if table[(1, 4096, 14336)].kernel else "fallback")


def test_a_near_tie_goes_to_the_kernel_unless_told_otherwise() -> None:
    """Within the noise (replays and passes), the kernel by default (fewer moving parts); a clear win either way stands."""
    near = Point(1, 128256, 4096, [243.0] * 15, [241.7] * 15, [242.0, 244.0, 243.0], [241.0, 252.0, 240.0])  # 5 % pass spread
    assert sweep.verdict(near) == "tie"
    assert sweep.decision_table([near], "kernel")[(1, 128256, 4096)].kernel
    assert not sweep.decision_table([near], "fallback")[(1, 128256, 4096)].kernel  # the faster median
    clear = Point(1, 4096, 4096, [30.0] * 15, [20.0] * 15, [30.0, 30.1], [20.0, 20.1])
    assert not sweep.decision_table([clear], "kernel")[(1, 4096, 4096)].kernel


def test_the_cold_l2_rotation_covers_four_times_the_l2() -> None:
    assert sweep.rotate_factor(60 << 20) == 240 << 20 and sweep.rotate_factor(0) == 0
