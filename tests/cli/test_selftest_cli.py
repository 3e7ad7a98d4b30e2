"""``hwprofile selftest``, and the verdicts and unmeasured values ``explain`` and ``doctor`` show (CPU: a fake runner)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import hwprofile
from hwprofile import ops, selftest, tuning
from hwprofile.cli import main
from hwprofile.optable import OPS


def _fake(bad: tuple[str, ...] = ()) -> Any:
    def run(table: Any, case: selftest.Case) -> selftest.Outcome:
        if case.op in bad:
            return selftest.Outcome(False, 0.3, "relative error 0.3 above 0.01 against float64")
        return selftest.Outcome(True, 2e-6)

    return run


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_downstream: None) -> None:
    """A simulated B200 the self-test treats as the GPU in hand, a fake runner, a private config dir."""
    monkeypatch.setenv("HWPROFILE_DEVICE", "b200")
    monkeypatch.setenv("HWPROFILE_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setattr(selftest, "on_gpu", lambda prof: True)
    monkeypatch.setattr(selftest, "gpu_runner", _fake())
    hwprofile.reset()
    ops.reset_dispatch()


def test_selftest_refuses_a_simulated_device(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "b200")
    assert main(["selftest"]) == 2
    err = capsys.readouterr().err
    assert "simulated" in err and "unset HWPROFILE_DEVICE" in err and "Traceback" not in err


def test_selftest_passes_writes_verdicts_and_reuses_them(gpu: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["selftest"]) == 0
    out = capsys.readouterr().out
    assert "every instance passed" in out and "run now" in out
    assert all(op in out for op in OPS)
    assert main(["selftest", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["verdicts"] and not any(v["fresh"] for v in doc["verdicts"])  # stamps matched: reused
    assert Path(doc["path"]).is_file()
    assert main(["selftest", "--json", "--force"]) == 0
    assert all(v["fresh"] for v in json.loads(capsys.readouterr().out)["verdicts"])


def test_selftest_fails_naming_the_kernel(gpu: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(selftest, "gpu_runner", _fake(bad=("gemv",)))
    assert main(["selftest"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: gemv" in out and "FAIL" in out and "relative error 0.3" in out


def test_explain_shows_the_verdict_and_what_was_not_measured(gpu: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "gemv.max_n"]) == 0
    out = capsys.readouterr().out
    assert "not measured on this architecture (NVIDIA B200): no measurement for this SKU" in out
    assert "self-test of the gemv kernel on this device: not checked" in out
    main(["selftest"])
    capsys.readouterr()
    assert main(["explain", "gemv.max_n"]) == 0
    assert "self-test of the gemv kernel on this device: passed:" in capsys.readouterr().out
    assert main(["explain", "gemv.max_n", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["unmeasured"].startswith(tuning.NOT_MEASURED) and doc["selftest"].startswith("passed:")


def test_doctor_shows_the_verdicts(gpu: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(selftest, "gpu_runner", _fake(bad=("router_gemm",)))
    main(["selftest"])
    capsys.readouterr()
    main(["doctor"])
    out = capsys.readouterr().out
    assert "self-test verdicts" in out and "cuda:0 router_gemm: FAILED: hwp100_skinny_mma<" in out
    assert "cuda:0 gemv: passed:" in out
    main(["doctor", "--json"])
    rows = json.loads(capsys.readouterr().out)["devices"][0]["selftest"]
    assert {r["op"] for r in rows} == set(OPS) and sum(r["failed"] for r in rows) >= 1


def test_sm90_measured_thresholds_are_not_reported_unmeasured(no_downstream: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    un = tuning.unmeasured(hwprofile.profile(0))
    for key in ("router_gemm.max_tokens", "gemv.max_n", "gemv.max_k", "fp8_gemv.max_n", "linear_bf16_fp32.max_n"):
        assert key not in un


@pytest.mark.parametrize("sim", ["b200", "gb300", "rtx-pro-6000", "dgx-spark"])
def test_blackwell_thresholds_are_unmeasured_and_inside_the_h200_box(
    no_downstream: None, monkeypatch: pytest.MonkeyPatch, sim: str
) -> None:
    """Nothing was measured on SM100/SM120: every region bound says so, and none is wider than what the H200 sweep won."""
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    h200 = hwprofile.profile(0)
    monkeypatch.setenv("HWPROFILE_DEVICE", sim)
    hwprofile.reset()
    prof = hwprofile.profile(0)
    un = tuning.unmeasured(prof)
    for op in OPS:
        for bound in ("max_n", "max_k", "min_n", "min_k"):
            key = f"{op}.{bound}"
            assert key in un and "no measurement for this SKU" in un[key], key
            if bound.startswith("max"):
                assert prof[key] <= h200[key], key
            else:
                assert prof[key] >= h200[key], key
        r = prof.explain(f"{op}.max_n")
        assert r.winner.kind == "arch" and "not measured on SM1" in r.winner.reason, op
