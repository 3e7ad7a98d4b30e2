"""Per-shape decisions (``<op>.measured``): the sweep writes them (and the cost model, ``<op>.model``), dispatch
takes them before the model, stamps and staleness cover them, bad ones are refused; the regret report and plot;
the CLI flags.

Everything runs on the CPU with a fake timer (the ``Timer`` protocol) on a simulated H200.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import tomli_w

import hwprofile
from hwprofile import costmodel, models, sweep, tuning
from hwprofile.errors import SettingError
from hwprofile.ops import _dispatch, decide
from hwprofile.optable import OPS
from hwprofile.profiles import build_profile
from hwprofile.registry import Registry
from hwprofile.sweep import Point

#: the largest K the gemv kernel takes (the op table's default of gemv.max_k)
GEMV_MAX_K = next(int(str(d[2])) for d in OPS["gemv"].settings if d[0] == "gemv.max_k")

#: cost models whose predictions are known without fitting (costmodel.MODEL_FORMAT): the same bandwidth, one
#: path with a far smaller fixed cost, so it is predicted faster at every shape
KERNEL_FASTER = "kernel=1|10:1,40:1; fallback=100|10:1,40:1; near=0"
FALLBACK_FASTER = "kernel=100|10:1,40:1; fallback=1|10:1,40:1; near=0"

ENV = {"HWPROFILE_DEVICE": "h200", "HWPROFILE_DISABLE_PLUGINS": "myengine"}


class ShapeTimer:
    """Kernel and fallback times per shape, from a function of (op, M, N, K); a shape it returns
    ``None`` for as kernel time is one the kernel could not run."""

    def __init__(self, times: Any) -> None:
        self.times = times
        self.calls: list[tuple[str, int, int, int]] = []

    def measure(self, op: str, m: int, n: int, k: int) -> Point:
        self.calls.append((op, m, n, k))
        kernel, fallback = self.times(op, m, n, k)
        rnd = random.Random(m * 31 + n * 7 + k)
        ks = [] if kernel is None else [kernel * (1 + rnd.uniform(-0.003, 0.003)) for _ in range(9)]
        return Point(m, n, k, ks, [fallback * (1 + rnd.uniform(-0.003, 0.003)) for _ in range(9)])


def gemv_times(op: str, m: int, n: int, k: int) -> tuple[float | None, float]:
    """A kernel that wins for N <= 4096 and K <= 7168 (the box), also at N = 2048, K = 16384 (outside
    it, as the H200 sweep notes say), loses elsewhere; K > 17408 it cannot take."""
    if k > 17408:
        return None, 50.0
    wins = (n <= 4096 and k <= 7168) or (n == 2048 and k == 16384)
    return (10.0, 13.0) if wins else (14.0, 12.0)


@pytest.fixture
def h200(monkeypatch: pytest.MonkeyPatch) -> hwprofile.Profile:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    hwprofile.reset()
    return hwprofile.profile(0)


def resolve(env_extra: Mapping[str, str], prof: hwprofile.Profile) -> hwprofile.Profile:
    env = {**ENV, **env_extra}
    return build_profile(prof.device, Registry(env).load_entry_points(), env)


def gemv_doc(prof: hwprofile.Profile, grid: list[tuple[int, int, int]] | None = None) -> dict[str, Any]:
    box = sweep.box_grid("gemv")
    return sweep.run(prof, "gemv", grid or sweep.default_grid("gemv"), ShapeTimer(gemv_times), date="2026-12-02", box=box)


def write_doc(doc: dict[str, Any], path: Path) -> Path:
    sweep.write(doc, path)
    return path


# --- the sweep's result --------------------------------------------------------------------------


def test_default_grid_is_the_catalog_plus_the_box_edges() -> None:
    for op in OPS:
        grid = sweep.default_grid(op)
        assert set(models.shapes(op, models.load())) <= set(grid) and set(sweep.box_grid(op)) <= set(grid)
        assert grid == sorted(set(grid))
    assert (1, 4096, 14336) in sweep.default_grid("fp8_gemv")  # Llama-3.1-8B's down projection, outside today's box
    assert (1, 2048, 7168) not in sweep.model_grid("gemv", ["qwen3-8b"])  # --models picks some


def test_sweep_writes_one_decision_per_measured_shape(h200: hwprofile.Profile) -> None:
    doc = gemv_doc(h200)
    th = doc["thresholds"]
    assert set(th) == {"gemv.measured", "gemv.model"}  # no box: the kernel's limits are the op table's
    model = costmodel.parse("gemv", th["gemv.model"], where="test")  # fitted on every measured shape, box edges included
    assert model.samples == len(doc["measurements"]) and model.kernel is not None
    fastest_kernel = min(r["kernel_us"] for r in doc["measurements"] if r["kernel_us"] > 0)  # ~10 µs, the timer's kernel win
    assert model.kernel.launch_us == pytest.approx(costmodel.LAUNCH_FRACTION * fastest_kernel, rel=1e-3)
    fastest_fallback = min(r["fallback_us"] for r in doc["measurements"])
    assert model.fallback.launch_us == pytest.approx(costmodel.LAUNCH_FRACTION * fastest_fallback, rel=1e-3)
    table = tuning.parse_measured("gemv", th["gemv.measured"], where="test")
    assert set(table) == {(r["m"], r["n"], r["k"]) for r in doc["measurements"]}
    assert {(r["m"], r["n"], r["k"]) for r in doc["measurements"] if r["box"]} == set(sweep.box_grid("gemv"))
    assert table[(1, 2048, 16384)].kernel and table[(1, 2048, 16384)].kernel_us == pytest.approx(10.0, rel=0.01)
    assert not table[(1, 7168, 8192)].kernel  # Llama-3.1-70B tp=8 gate_up, where the fallback won
    no_kernel = [d for s, d in table.items() if s[2] > 17408]  # K beyond the kernel: it could not run ('-' in the file)
    assert no_kernel and all(not d.kernel and d.kernel_us is None for d in no_kernel)
    extra = [tuple(map(int, s.split("x"))) for s in doc["stamp"]["shapes"]]
    assert set(extra) == set(table) - set(sweep.box_grid("gemv"))
    assert doc["stamp"]["plan"] == tuning.plan_digest("gemv", h200.kernels["gemv"], extra)
    assert doc["stamp"]["plan"] != tuning.plan_digest("gemv", h200.kernels["gemv"])  # the extra shapes are part of the plan


def test_a_kernel_win_dispatch_cannot_route_is_recorded_as_the_fallback(h200: hwprofile.Profile) -> None:
    """With gemv.k_multiple raised to 512, gpt-oss's K = 2880 is no multiple of it: the kernel may run it under
    run_kernel, but dispatch would never send it there, so the table must not claim it (it would be refused)."""
    prof = resolve({"HWPROFILE_GEMV_K_MULTIPLE": "512"}, h200)
    doc = sweep.run(prof, "gemv", [(1, 2560, 2880), (1, 2048, 2048)], ShapeTimer(lambda *a: (5.0, 9.0)), date="2026-12-02")
    table = tuning.parse_measured("gemv", doc["thresholds"]["gemv.measured"], where="t")
    assert not table[(1, 2560, 2880)].kernel and table[(1, 2560, 2880)].kernel_us == pytest.approx(5.0, rel=0.01)
    assert table[(1, 2048, 2048)].kernel
    assert any("1x2560x2880" in n and "K % 512" in n for n in doc["sweep"]["notes"])


def test_format_round_trips() -> None:
    table = {(1, 4096, 7168): tuning.Measured(True, 3.1, 7.2), (1, 2048, 40960): tuning.Measured(False, None, 50.0)}
    text = tuning.format_measured(table)
    assert text == "1x2048x40960=fallback:-/50; 1x4096x7168=kernel:3.1/7.2"
    assert dict(tuning.parse_measured("gemv", text, where="t")) == table


# --- dispatch ------------------------------------------------------------------------------------


def test_dispatch_takes_the_measured_decision_and_the_model_elsewhere(h200: hwprofile.Profile, tmp_path: Path) -> None:
    f = write_doc(gemv_doc(h200), tmp_path / "gemv.toml")
    prof = resolve({"HWPROFILE_TUNED_FILE": str(f)}, h200)
    d = decide("gemv", prof, m=1, n=2048, k=16384)  # measured: the kernel won
    assert (d.path, d.basis) == ("kernel", "measured") and d.reason.startswith("measured at this shape")
    assert re.search(r"kernel (9\.9|10\.0)\d* µs vs fallback 1[23]\.\d+ µs", d.reason) and str(f) in d.reason
    assert d.kernel_us == pytest.approx(10.0, rel=0.01) and d.fallback_us == pytest.approx(13.0, rel=0.01)
    d = decide("gemv", prof, m=1, n=7168, k=8192)  # measured, the fallback won
    assert (d.path, d.basis, d.gate) == ("fallback", "measured", "measured") and "fallback 12" in d.reason
    # never measured, inside the kernel's limits: the file's fitted model predicts, corrected by the file's measured times
    model = costmodel.parse("gemv", prof["gemv.model"], where="test")
    times = {s: (m.kernel_us, m.fallback_us) for s, m in tuning.parse_measured("gemv", prof["gemv.measured"], where="test").items()}
    for shape in ((1, 2048, 3072), (1, 12288, 3072), (1, 6144, 10240)):
        p = costmodel.predict(model, times, *shape)
        d = decide("gemv", prof, m=shape[0], n=shape[1], k=shape[2])
        assert (d.path, d.basis) == ("kernel" if p.kernel else "fallback", "model") and d.reason.startswith("predicted")
        assert (d.kernel_us, d.fallback_us) == pytest.approx((p.kernel_us, p.fallback_us)) and str(f) in d.reason
    d = decide("gemv", prof, m=1, n=2048, k=2 * GEMV_MAX_K)  # beyond what the kernel takes: a limit, never a prediction
    assert (d.path, d.basis, d.gate) == ("fallback", "limit", "k") and d.kernel_us is None
    assert decide("gemv", prof, m=0, n=2048, k=16384).basis == "fixed"
    assert str(f) not in decide("gemv", h200, m=1, n=2048, k=16384).reason  # without the file: the plugin's values


def test_the_model_decides_both_ways_where_nothing_was_measured(h200: hwprofile.Profile) -> None:
    """A constructed model sends an unmeasured shape to the path it predicts faster; a measured shape keeps its decision."""
    for model, path in ((KERNEL_FASTER, "kernel"), (FALLBACK_FASTER, "fallback")):
        prof = resolve({"HWPROFILE_GEMV_MODEL": model, "HWPROFILE_GEMV_MEASURED": "1x2048x16384=fallback:13/10"}, h200)
        d = decide("gemv", prof, m=1, n=2048, k=3072)
        assert (d.path, d.basis) == (path, "model") and d.reason.startswith("predicted")
        assert (d.gate is None) == (path == "kernel") and (d.kernel_us is not None and d.fallback_us is not None)
        assert (d.kernel_us < d.fallback_us) == (path == "kernel")
        d = decide("gemv", prof, m=1, n=2048, k=16384)
        assert (d.path, d.basis) == ("fallback", "measured")


def test_the_route_memo_serves_measured_decisions(h200: hwprofile.Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-shape answer is memoised like any other: one dict lookup per call when the memo hits."""
    monkeypatch.setenv("HWPROFILE_GEMV_MEASURED", "1x2048x16384=kernel:10/13")
    monkeypatch.setenv("HWPROFILE_GEMV_MODEL", FALLBACK_FASTER)  # everywhere else the model says fallback
    hwprofile.reset()
    e = _dispatch.ENTRIES["gemv"]
    _, r, gate = _dispatch._remember(e, 0, 1, 2048, 16384)
    assert gate is None and e.memo[(0, 1, 2048, 16384)][2] is None and (1, 2048, 16384) in r.measured
    assert _dispatch.route(r, 1, 2048, 16392) == "model"  # a neighbour nobody measured: the model


def test_a_stale_tuned_file_applies_no_measured_decision(h200: hwprofile.Profile, tmp_path: Path) -> None:
    doc = gemv_doc(h200)
    doc["stamp"]["kernel"] = "0" * 64  # measured with another kernel source
    prof = resolve({"HWPROFILE_TUNED_FILE": str(write_doc(doc, tmp_path / "gemv.toml"))}, h200)
    r = prof.explain("gemv.measured")
    assert r.winner.kind != "tuned" and "kernel source changed" in r.chain[-1].stale
    assert prof.explain("gemv.model").winner.kind != "tuned"  # the file's model is stale with it
    assert "gemv.toml" not in decide("gemv", prof, m=1, n=2048, k=16384).reason
    assert prof["gemv.measured"] == h200["gemv.measured"] and prof["gemv.model"] == h200["gemv.model"]  # the plugin's, as without the file


def test_a_changed_plan_at_a_measured_shape_is_stale(h200: hwprofile.Profile, tmp_path: Path) -> None:
    """The plan digest covers the measured shapes outside the grid: a plan that changes only there is caught."""
    doc = gemv_doc(h200)
    extra = [tuple(map(int, s.split("x"))) for s in doc["stamp"]["shapes"]]
    doc["stamp"]["plan"] = tuning.plan_digest("gemv", h200.kernels["gemv"], extra[:-1])  # as if the last one was planned differently
    prof = resolve({"HWPROFILE_TUNED_FILE": str(write_doc(doc, tmp_path / "gemv.toml"))}, h200)
    assert "launch plan changed" in prof.explain("gemv.measured").chain[-1].stale


def test_agreement_and_provenance_see_the_table(h200: hwprofile.Profile, tmp_path: Path) -> None:
    """A declared setting: the resolved value (what ranks compare) and its stamp come with it."""
    doc = gemv_doc(h200)
    prof = resolve({"HWPROFILE_TUNED_FILE": str(write_doc(doc, tmp_path / "gemv.toml"))}, h200)
    r = prof.explain("gemv.measured")
    assert r.value == doc["thresholds"]["gemv.measured"] and r.winner.kind == "tuned" and r.winner.stamp.shapes
    assert prof.fingerprint != h200.fingerprint


# --- refused, never applied ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("1x4096x7168=kernel:3.1", "is not in the format"),
        ("1x4096=kernel:3.1/7.2", "not MxNxK"),
        ("1x4096x7168=cublas:3.1/7.2", "names path 'cublas'"),
        ("1x4096x7168=kernel:fast/7.2", "not KERNEL_US/FALLBACK_US"),
        ("1x4096x7168=kernel:-3/7.2", "positive number"),
        ("1x4096x7168=kernel:-/7.2", "records no kernel time"),
        ("1x4096x7168=kernel:3/7; 1x4096x7168=fallback:3/2", "repeats shape 1x4096x7168"),
        ("2x4096x7168=kernel:3.1/7.2", "takes M <= 1"),  # the GEMV kernels take M = 1
        ("1x4096x7172=kernel:3.1/7.2", "K % 8"),
        (f"1x4096x{2 * GEMV_MAX_K}=kernel:3.1/7.2", f"K in [{OPS['gemv'].k_vec}, {GEMV_MAX_K}]"),  # beyond what the kernel takes
        ("1x4096x0=fallback:3.1/7.2", "empty dimension"),
    ],
)
def test_a_malformed_or_untakeable_entry_is_refused_naming_file_and_entry(
    h200: hwprofile.Profile, tmp_path: Path, entry: str, why: str
) -> None:
    doc = gemv_doc(h200, grid=[(1, 2048, 2048)])
    doc["thresholds"]["gemv.measured"] = entry
    f = write_doc(doc, tmp_path / "gemv.toml")
    with pytest.raises(SettingError) as exc:
        resolve({"HWPROFILE_TUNED_FILE": str(f)}, h200)
    msg = str(exc.value)
    assert str(f) in msg and "gemv.measured" in msg and why in msg and "hwprofile sweep gemv" in msg


def test_a_measured_shape_the_stamps_plan_does_not_cover_is_refused(h200: hwprofile.Profile, tmp_path: Path) -> None:
    doc = gemv_doc(h200, grid=[(1, 2048, 2048)])
    doc["thresholds"]["gemv.measured"] = "1x2048x12288=kernel:10/13"  # not in the grid, not in stamp.shapes
    f = write_doc(doc, tmp_path / "gemv.toml")
    with pytest.raises(SettingError, match=r"1x2048x12288 that the \[stamp\]'s launch plan .* does not cover; regenerate .*sweep gemv'"):
        resolve({"HWPROFILE_TUNED_FILE": str(f)}, h200)


def test_a_table_of_another_op_is_refused(h200: hwprofile.Profile, tmp_path: Path) -> None:
    doc = gemv_doc(h200, grid=[(1, 2048, 2048)])
    doc["thresholds"]["fp8_gemv.measured"] = "1x2048x2048=kernel:1/2"
    f = write_doc(doc, tmp_path / "gemv.toml")
    with pytest.raises(SettingError, match=r"fp8_gemv\.measured.*belongs to op fp8_gemv"):
        resolve({"HWPROFILE_TUNED_FILE": str(f)}, h200)


def test_a_plan_refusal_is_refused_from_any_layer(h200: hwprofile.Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin's planner has the last word on what its kernel takes (here: M > 16 for the router)."""
    class Refusing:
        def configure(self, **kw: Any) -> None:
            if kw["n"] > 512:
                raise ValueError("too wide")

    table = tuning.parse_measured("router_gemm", "4x1024x7168=kernel:3/6; 4x256x7168=kernel:3/6", where="t")
    assert tuning.untakeable("router_gemm", table, Refusing()) == {(4, 1024, 7168): "ValueError: too wide"}
    monkeypatch.setenv("HWPROFILE_ROUTER_GEMM_MEASURED", "17x256x7168=kernel:3/6")
    hwprofile.reset()
    with pytest.raises(SettingError, match=r"HWPROFILE_ROUTER_GEMM_MEASURED.*M <= 16.*not applied"):
        decide("router_gemm", hwprofile.profile(0), m=1, n=256, k=7168)  # refused when the variable is read (profile())


def test_an_unknown_op_in_a_tuned_file_is_refused(h200: hwprofile.Profile, tmp_path: Path) -> None:
    doc = gemv_doc(h200, grid=[(1, 2048, 2048)])
    doc["stamp"]["op"] = "conv2d"
    f = write_doc(doc, tmp_path / "gemv.toml")
    with pytest.raises(SettingError, match=rf"{f}.*op 'conv2d'.*(Regenerate|remove)"):
        resolve({"HWPROFILE_TUNED_FILE": str(f)}, h200)


def test_stamp_shapes_must_be_shapes(tmp_path: Path) -> None:
    st = tuning.Stamp("gemv", "d", (9, 0), "sm90", "1", "k", shapes=[(1, 2, 3)]).as_dict()
    assert tuning.Stamp.from_dict(st, where="x").shapes == ((1, 2, 3),)
    with pytest.raises(SettingError, match="incomplete or malformed"):
        tuning.Stamp.from_dict({**st, "shapes": ["1x2"]}, where="x")


# --- the regret report and plot ------------------------------------------------------------------


def test_report_gives_both_times_the_path_and_its_regret(h200: hwprofile.Profile) -> None:
    doc = gemv_doc(h200)
    rows = {(r.m, r.n, r.k): r for r in sweep.report(h200, doc)}
    assert len(rows) == len(doc["measurements"])
    win = rows[(1, 2048, 16384)]
    assert (win.path, win.basis) == ("kernel", "measured") and win.regret == pytest.approx(1.0)
    nokernel = next(r for r in rows.values() if r.kernel_us is None)
    assert nokernel.path == "fallback" and nokernel.regret == 1.0
    # without the per-shape table the model decides; one that predicts the fallback leaves the win on the table: regret 1.3
    doc["thresholds"]["gemv.measured"] = ""
    doc["thresholds"]["gemv.model"] = FALLBACK_FASTER
    lost = {(r.m, r.n, r.k): r for r in sweep.report(h200, doc)}[(1, 2048, 16384)]
    assert (lost.path, lost.basis) == ("fallback", "model") and lost.regret == pytest.approx(1.3, rel=0.01)
    doc["thresholds"]["gemv.model"] = KERNEL_FASTER
    taken = {(r.m, r.n, r.k): r for r in sweep.report(h200, doc)}[(1, 2048, 16384)]
    assert (taken.path, taken.basis) == ("kernel", "model") and taken.regret == pytest.approx(1.0)
    assert sweep.geomean([1.0, 4.0]) == pytest.approx(2.0) and sweep.geomean([]) == 1.0


def test_a_near_tie_at_a_measured_shape_goes_to_the_kernel_by_default(h200: hwprofile.Profile) -> None:
    """The noise rule calls a difference within the noise a tie; by default a sweep gives it to the kernel (fewer
    moving parts: no cuBLAS handle or workspace), so the decision does not rest on which side of one noisy median
    fell; ``ties="fallback"`` takes the faster median. One shape is a legitimate sweep: its decision is written, and
    no model (a fit needs two shapes)."""
    doc = sweep.run(h200, "gemv", [(1, 2048, 2048)], ShapeTimer(lambda *a: (10.0, 10.1)), date="2026-12-02")
    assert doc["measurements"][0]["verdict"] == "tie"  # within the noise
    assert "gemv.model" not in doc["thresholds"] and any("no gemv.model written" in n for n in doc["sweep"]["notes"])
    (row,) = sweep.report(h200, doc)
    assert row.path == "kernel" and row.regret == 1.0
    doc = sweep.run(h200, "gemv", [(1, 2048, 2048)], ShapeTimer(lambda *a: (10.1, 10.0)), date="2026-12-02")
    (row,) = sweep.report(h200, doc)
    assert row.path == "kernel" and row.regret == pytest.approx(1.01, abs=0.005)  # within the noise: the kernel
    doc = sweep.run(h200, "gemv", [(1, 2048, 2048)], ShapeTimer(lambda *a: (10.1, 10.0)), ties="fallback", date="2026-12-02")
    (row,) = sweep.report(h200, doc)
    assert row.path == "fallback" and row.regret == 1.0


def test_regret_plot_has_one_panel_per_op(h200: hwprofile.Profile, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    gemv = sweep.report(h200, gemv_doc(h200))
    router_doc = sweep.run(
        h200, "router_gemm", sweep.default_grid("router_gemm"), ShapeTimer(lambda *a: (3.0, 6.0)), box=sweep.box_grid("router_gemm")
    )
    router = sweep.report(h200, router_doc)
    out = tmp_path / "regret.png"
    sweep.plot_regret({"gemv": gemv, "router_gemm": router}, out, title="test")
    assert out.read_bytes()[:4] == b"\x89PNG"
    from matplotlib.image import imread

    h = imread(str(out)).shape[0]
    assert h > 2 * 2.8 * 90 * 0.9  # two panels stacked
    with pytest.raises(ValueError, match="no measured shape"):
        sweep.plot_regret({"gemv": []}, out)


def test_cli_report_prints_the_table(h200: hwprofile.Profile, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    from hwprofile._cli_sweep import _sweep_report

    _sweep_report(h200, gemv_doc(h200), tmp_path / "r.png")
    out = capsys.readouterr().out
    assert "path taken" in out and "regret" in out and "kernel (measured)" in out and "fallback (measured)" in out
    assert "geomean 1.0" in out and (tmp_path / "r.png").exists()


# --- command line --------------------------------------------------------------------------------


def grid_of(argv: list[str]) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    from hwprofile._cli_sweep import _sweep_grid
    from hwprofile.cli import build_parser

    return _sweep_grid(build_parser().parse_args(["sweep", *argv]))


def test_cli_grid_flags(tmp_path: Path) -> None:
    grid, box = grid_of(["gemv"])
    assert grid == sweep.default_grid("gemv") and box == sweep.box_grid("gemv")
    grid, box = grid_of(["gemv", "--models", "llama-3.1-8b"])
    assert set(grid) == set(sweep.model_grid("gemv", ["llama-3.1-8b"])) | set(box)
    grid, box = grid_of(["gemv", "--shapes", "2048x4096"])
    assert grid == box == [(1, 2048, 4096)]  # explicit shapes alone: no catalog
    mine = tmp_path / "mine.toml"
    mine.write_text(tomli_w.dumps({"my-model": {"source": "https://example.org/config.json", "hidden": 2560, "heads": 20,
                                                "intermediate": 6912, "vocab": 50000, "tp": [1]}}))
    grid, _ = grid_of(["gemv", "--shapes", "2048x4096", "--models-file", str(mine)])
    assert (1, 2560, 6912) in grid and (1, 2048, 4096) in grid and (1, 4096, 4096) not in grid


@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (["gemv", "--models", "llama-9"], "unknown model(s) llama-9"),
        (["gemv", "--models", ","], "--models names no model"),
        (["router_gemm", "--models", "llama-3.1-8b"], "give router_gemm no shape"),
        (["gemv", "--shapes", "4096by7168"], "--shapes '4096by7168'"),
        (["gemv", "--models-file", "/nonexistent/m.toml"], "model catalog /nonexistent/m.toml: file not found"),
    ],
)
def test_cli_refuses_bad_model_flags_on_any_machine(argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    from hwprofile.cli import main

    assert main(["sweep", *argv]) == 2
    assert msg in capsys.readouterr().err


def test_cli_explain_says_measured_model_or_limit(
    h200: hwprofile.Profile, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hwprofile.cli import main

    monkeypatch.setenv("HWPROFILE_GEMV_MEASURED", "1x2048x16384=kernel:3.1/7.2")
    monkeypatch.setenv("HWPROFILE_GEMV_MODEL", KERNEL_FASTER)
    hwprofile.reset()
    assert main(["explain", "gemv", "--shape", "1x2048x16384"]) == 0
    assert "measured at this shape (M=1, N=2048, K=16384): kernel 3.1 µs vs fallback 7.2 µs" in capsys.readouterr().out
    assert main(["explain", "gemv", "--shape", "1x2048x2048"]) == 0
    out = capsys.readouterr().out
    assert "kernel   (cost model)" in out and "predicted: kernel" in out and "HWPROFILE_GEMV_MODEL" in out
    assert main(["explain", "gemv", "--shape", "1x2048x2048", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["basis"] == "model"
    assert main(["explain", "gemv", "--shape", f"1x2048x{2 * GEMV_MAX_K}"]) == 0
    out = capsys.readouterr().out
    assert "fallback   (kernel limit)" in out and f"K={2 * GEMV_MAX_K} outside" in out
    assert main(["explain", "gemv.measured"]) == 0
    out = capsys.readouterr().out
    assert "<1 measured shape>" in out and "2048  16384  kernel" in out
    assert main(["explain", "gemv"]) == 2 and "needs --shape" in capsys.readouterr().err
    assert main(["explain", "gemv.max_n", "--shape", "1x1x1"]) == 2 and "give an op" in capsys.readouterr().err


def test_devices_says_how_to_add_a_model(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from hwprofile.cli import main

    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "--models-file" in out and str(models.SHIPPED) in out


def test_a_plugin_table_its_stamp_does_not_cover_is_refused(h200: hwprofile.Profile) -> None:
    """A plugin's shipped per-shape table is held to its stamp like a tuned file's."""
    from hwprofile.settings import Value

    stamp = tuning.Stamp("gemv", "NVIDIA H200 sm_90 141 GiB", (9, 0), "sm90", "0.1.0", "k", plan="p" * 64)
    table = tuning.parse_measured("gemv", "1x2048x12288=kernel:10/13", where="t")
    assert tuning.uncovered(table, stamp) == [(1, 2048, 12288)]
    assert tuning.uncovered(table, tuning.Stamp("gemv", "d", (9, 0), "sm90", "0.1.0", "k", plan="p", shapes=[(1, 2048, 12288)])) == []

    class Shipper:
        @hwprofile.hookimpl
        def hwprofile_settings(self, device: Any, resolved: Any) -> dict[str, Any]:
            return {"gemv.measured": Value("1x2048x12288=kernel:10/13", "measured", stamp)}

    reg = Registry(ENV).load_entry_points()
    reg.register(Shipper(), "shipper", distribution="shipper-dist", version="1.0")
    prof = build_profile(h200.device, reg, ENV)
    with pytest.raises(SettingError, match=r"1x2048x12288 that its stamp's launch plan .* does not cover"):
        decide("gemv", prof, m=1, n=2048, k=12288)


def test_gpu_timer_times_only_the_fallback_where_the_plan_refuses(h200: hwprofile.Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    """A catalog shape the plugin's planner refuses (ValueError from run_kernel) must not end a whole-catalog
    sweep: it gets no kernel time, and the fallback is still timed. Driven on the CPU: the graph replay is
    replaced by one call per copy."""
    torch = pytest.importorskip("torch")
    from hwprofile import ops

    def refuse(*a: Any, **kw: Any) -> bool:
        raise ValueError("the sm90 kernel does not plan this shape")

    monkeypatch.setattr(ops, "run_kernel", refuse)
    timer = sweep.GpuTimer(h200, reps=3, rotate_bytes=1 << 16)
    timer.dev = torch.device("cpu")
    calls: list[int] = []

    def graph(fn: Any, copies: int) -> list[float]:
        for i in range(copies):
            fn(i)
        calls.append(copies)
        return [2.0, 2.0, 2.0]

    monkeypatch.setattr(timer, "_graph", graph)
    p = timer.measure("gemv", 1, 64, 512)
    assert p.kernel_us == [] and p.fallback_us == [2.0] * 9 and sweep.verdict(p) == "fallback" and len(calls) == 3  # 3 passes
