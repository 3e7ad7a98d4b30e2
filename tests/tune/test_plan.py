"""Which ops tune re-measures, and why: staleness selection, planning, the estimate and the split across ranks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import hwprofile
from hwprofile import retune, sweep, tuning
from hwprofile.optable import OPS, TABLE

from .helpers import PREDICTED, SWEPT, stale_tuned_file


def status(prof: hwprofile.Profile) -> dict[str, str]:
    return {f.op: f.status for f in retune.findings(prof)}


def test_shipped_values_measured_here_are_fresh() -> None:
    """sm90's shipped sweeps are fresh on an H200; what it ships predicted is unmeasured, and only that is planned."""
    assert PREDICTED and SWEPT
    p = retune.plan(hwprofile.profile(0))
    assert {f.op: f.status for f in p.findings} == {op: "unmeasured" if op in PREDICTED else "fresh" for op in TABLE}
    assert all("unstamped" in f.reasons[0] for f in p.findings if f.op in PREDICTED)
    assert p.grids == {op: tuple(sweep.default_grid(op)) for op in PREDICTED}
    fresh = retune.plan(hwprofile.profile(0), ops=SWEPT)  # the swept ops alone: nothing to measure
    assert not fresh.grids and fresh.points() == [] and fresh.estimate_s() == 0


def test_a_tuned_file_against_another_fallback_function_is_changed() -> None:
    f = stale_tuned_file(hwprofile.profile(0))
    hwprofile.reset()
    p = retune.plan(hwprofile.profile(0))
    found = {x.op: x for x in p.findings}
    assert found["router_gemm"].status == "changed"
    assert "fallback function changed (torch.matmul (an older fallback) -> torch.mm" in found["router_gemm"].reasons[0]
    assert str(f) in found["router_gemm"].reasons[0] and "(ignored)" in found["router_gemm"].reasons[0]
    assert all(found[op].status == ("unmeasured" if op in PREDICTED else "fresh") for op in TABLE if op != "router_gemm")
    assert set(p.grids) == {"router_gemm", *PREDICTED} and p.grids["router_gemm"] == tuple(sweep.default_grid("router_gemm"))


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"kernel": "0" * 64}, "kernel source changed"),
        ({"plan": "1" * 64}, "launch plan changed"),
        ({"compute_capability": [10, 0]}, "measured on compute capability 10.0"),
        ({"plugin": "sm100"}, "measured with plugin 'sm100'"),
    ],
)
def test_every_kind_of_change_is_changed(change: dict[str, object], words: str) -> None:
    stale_tuned_file(hwprofile.profile(0), "gemv", **change)
    hwprofile.reset()
    found = {f.op: f for f in retune.findings(hwprofile.profile(0))}
    assert found["gemv"].status == "changed" and words in found["gemv"].reasons[0]


def test_cannot_tell_is_not_stale() -> None:
    """A stamp without a kernel digest or a plan ("cannot tell") is not re-measured."""
    f = stale_tuned_file(hwprofile.profile(0), kernel="", plan="", fallback_torch="unknown")
    hwprofile.reset()
    prof = hwprofile.profile(0)
    _, thresholds = tuning.read_tuned(f)
    assert prof["router_gemm.model"] == thresholds["router_gemm.model"]  # applied: not stale
    assert prof.explain("router_gemm.model").winner.source == f"tuned file {f}"
    assert status(prof)["router_gemm"] == "fresh"


def test_a_stale_shipped_stamp_is_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The seeds' case: hwprofile's fallback for an op changes under the plugin's shipped thresholds."""
    monkeypatch.setattr(OPS["router_gemm"], "fallback", "torch.nn.functional.linear + float()")
    hwprofile.reset()
    found = {f.op: f for f in retune.findings(hwprofile.profile(0))}
    assert found["router_gemm"].status == "changed" and "(applies)" in found["router_gemm"].reasons[0]
    assert found["linear_bf16_fp32"].status == "fresh"


def test_measured_on_another_card_is_unmeasured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h100")
    hwprofile.reset()
    found = retune.findings(hwprofile.profile(0))
    assert all(f.status == "unmeasured" for f in found)
    assert all("measured on NVIDIA H200" in f.reasons[0] for f in found if f.op not in PREDICTED)  # sm90's H200 sweeps
    assert all("unstamped" in f.reasons[0] for f in found if f.op in PREDICTED)  # predicted: measured nowhere


def test_defaults_only_are_unmeasured_and_no_kernel_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "b200")
    hwprofile.reset()
    assert all(f.status == "unmeasured" and "unstamped" in f.reasons[0] for f in retune.findings(hwprofile.profile(0)))
    monkeypatch.setenv("HWPROFILE_DISABLE_PLUGINS", "sm90,myengine")
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    p = retune.plan(hwprofile.profile(0), everything=True)
    assert {f.status for f in p.findings} == {"no kernel"} and not p.grids


def test_a_user_override_does_not_hide_a_stale_value(monkeypatch: pytest.MonkeyPatch) -> None:
    f = stale_tuned_file(hwprofile.profile(0))
    _, thresholds = tuning.read_tuned(f)
    monkeypatch.setenv("HWPROFILE_ROUTER_GEMM_MODEL", thresholds["router_gemm.model"])  # the user's model and table apply
    monkeypatch.setenv("HWPROFILE_ROUTER_GEMM_MEASURED", thresholds["router_gemm.measured"])
    hwprofile.reset()
    prof = hwprofile.profile(0)
    assert all(prof.explain(f"router_gemm.{k}").winner.kind == "env" for k in ("model", "measured"))
    assert status(prof)["router_gemm"] == "changed"


def test_a_stale_file_outside_the_tuned_directory_stays_a_leftover_once_a_fresh_one_wins(tmp_path: Path,
                                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    prof = hwprofile.profile(0)
    old = stale_tuned_file(prof, directory=tmp_path / "elsewhere")
    fresh = stale_tuned_file(prof, fallback_function=OPS["router_gemm"].fallback)  # in the tuned directory
    monkeypatch.setenv("HWPROFILE_TUNED_FILE", str(old))
    hwprofile.reset()
    found = {f.op: f for f in retune.findings(hwprofile.profile(0))}
    assert found["router_gemm"].status == "fresh", found["router_gemm"]
    assert str(old) in found["router_gemm"].leftovers[0] and "remove it" in found["router_gemm"].leftovers[0]
    assert fresh.exists()


def test_all_and_ops_choose_what_is_measured() -> None:
    prof = hwprofile.profile(0)
    p = retune.plan(prof, everything=True)
    assert list(p.grids) == list(TABLE)  # the fresh ones forced, the predicted ones unmeasured: every op is measured
    assert {f.op: f.status for f in p.findings} == {op: "unmeasured" if op in PREDICTED else "forced" for op in TABLE}
    assert list(retune.plan(prof, everything=True, ops=["gemv"]).grids) == ["gemv"]
    assert list(retune.plan(prof, ops=["gemv"]).grids) == []  # fresh, not forced
    assert set(retune.plan(prof, ops=PREDICTED).grids) == set(PREDICTED)  # unmeasured: measured unforced
    with pytest.raises(retune.TuneError, match="unknown op 'nope'; known ops: router_gemm"):
        retune.plan(prof, ops=["nope"])


def test_decided_keys_are_what_sweep_writes() -> None:
    """The model and the per-shape table: what a sweep writes; never the kernel's limits, which no sweep decides."""
    from .helpers import FakeTimer

    prof = hwprofile.profile(0)
    for op in OPS:
        doc = sweep.run(prof, op, sweep.box_grid(op), FakeTimer())
        assert set(retune.decided_keys(op)) == set(doc["thresholds"]) == {f"{op}.model", f"{op}.measured"}
    assert "router_gemm.max_tokens" not in retune.decided_keys("router_gemm") and "gemv.split_k" not in retune.decided_keys("gemv")


def test_the_estimate_follows_the_timer_and_the_device() -> None:
    prof = hwprofile.profile(0)
    bw = retune.bandwidth(prof.device)
    assert 4.5e12 < bw < 5.2e12  # H200: 6144-bit bus at 3201 MHz, double data rate (4.8 TB/s published)
    small = retune.point_seconds("router_gemm", 1, 256, 7168, bw)
    big = retune.point_seconds("gemv", 1, 28672, 16384, bw)
    assert 0 < small < big
    assert retune.point_seconds("router_gemm", 1, 256, 7168, bw, reps=30) > small
    p = retune.plan(prof, everything=True)
    assert p.estimate_s() == pytest.approx(sum(retune.point_seconds(*q, bw) for q in p.points()))


def test_the_split_covers_every_point_once_and_balances() -> None:
    prof = hwprofile.profile(0)
    p = retune.plan(prof, everything=True)
    pts = p.points()
    for size in (1, 2, 3, 8):
        shares = retune.split(pts, size, p.bandwidth)
        assert sorted(q for s in shares for q in s) == sorted(pts)
        loads = [sum(retune.point_seconds(*q, p.bandwidth) for q in s) for s in shares]
        biggest = max(retune.point_seconds(*q, p.bandwidth) for q in pts)
        assert max(loads) - min(loads) <= biggest + 1e-9  # greedy longest-first: within one point
        assert retune.split(pts, size, p.bandwidth) == shares  # the same answer on every rank
        for s in shares:  # op by op (one progress line per op)
            order = [list(TABLE).index(q[0]) for q in s]
            assert order == sorted(order)


def test_the_tuned_directory_is_the_one_profiles_read() -> None:
    prof = hwprofile.profile(0)
    assert tuning.tuned_dir(prof.device, os.environ).parent.parent == Path(os.environ["HWPROFILE_CONFIG_DIR"])
