"""Crossover logic with made-up timings, the stamped tuned file round trip, and the GPU sweep."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import hwprofile
from hwprofile import sweep, tuning
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


def test_max_tokens_prefix_ties_and_non_monotone() -> None:
    pts = [pt(m, 4.0 + 0.2 * m, 7.0) for m in range(1, 13)]  # kernel wins to M=11 (6.2 vs 7), tie at 12 (6.4)
    pts += [pt(13, 7.0, 7.0), pt(14, 8.0, 7.0), pt(15, 5.0, 7.0)]
    m, notes = sweep.max_tokens(pts, ties="fallback")
    assert m == 12 and any("M=15" in n for n in notes)
    m_ties, _ = sweep.max_tokens(pts, ties="kernel")
    assert m_ties == 13  # the tie at 13 now goes to the kernel; 14 loses
    assert sweep.max_tokens([pt(1, 9.0, 7.0)])[0] == 0


def test_max_tokens_needs_every_n_to_win() -> None:
    pts = [pt(m, 4.0, 7.0, n=256) for m in range(1, 9)] + [pt(m, 4.0 if m < 6 else 8.0, 7.0, n=384) for m in range(1, 9)]
    assert sweep.max_tokens(pts)[0] == 5


def test_predicate_box() -> None:
    pts = []
    for n in (2048, 4096, 7168, 12288):
        for k in (2048, 7168, 16384):
            kernel_wins = n <= 7168 and k <= 7168
            pts.append(pt(1, 10.0 if kernel_wins else 12.0, 11.5, n=n, k=k))
    pts.append(pt(1, 5.0, 11.5, n=28672, k=2048))  # isolated win outside the box
    max_n, max_k, notes = sweep.predicate_box(pts)
    assert (max_n, max_k) == (7168, 7168) and any("N=28672" in x for x in notes)


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
    measured = doc["thresholds"].pop("router_gemm.measured")
    assert doc["thresholds"] == {  # the rule is chosen from the box edges only, not from the catalog's sparse shapes
        "router_gemm.max_tokens": 6,
        "router_gemm.min_n": 256,
        "router_gemm.max_n": 384,
        "router_gemm.min_k": 7168,
        "router_gemm.max_k": 7168,
    }
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
    r = build_profile(h200.device, reg, env).explain("router_gemm.max_tokens")
    assert r.value == 6 and r.winner.kind == "tuned" and r.winner.stamp.date == "2026-11-30" and r.winner.stamp.plan == st["plan"]


def test_tuned_file_for_other_gpu_is_stale_not_a_crash(h200: hwprofile.Profile, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    doc = sweep.run(h200, "router_gemm", [(1, 256, 7168)], FakeTimer({1: (4.0, 7.0)}), date="2026-11-30")
    f = tmp_path / "t.toml"
    sweep.write(doc, f)
    env = {"HWPROFILE_DEVICE": "rtx-pro-6000", "HWPROFILE_TUNED_FILE": str(f)}
    reg = Registry(env).load_entry_points()
    spark = hwprofile.detect(env).devices[0]
    r = build_profile(spark, reg, env).explain("router_gemm.max_tokens")
    assert r.winner.kind != "tuned" and "compute capability 9.0" in r.chain[-1].stale


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
    assert doc["thresholds"]["router_gemm.max_tokens"] in (0, 1, 2)
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
