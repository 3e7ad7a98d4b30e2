"""``hwprofile selftest``, and the verdicts and unmeasured values ``explain`` and ``doctor`` show (CPU: a fake runner)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import hwprofile
from hwprofile import costmodel, ops, selftest, tuning
from hwprofile.cli import main
from hwprofile.optable import OPS
from hwprofile.plugin import PREBUILT_SHAPES


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
    assert all(op in out for op in PREBUILT_SHAPES)  # the family's ops: the simulated device's plugin has their kernels
    assert main(["selftest", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["verdicts"] and not any(v["fresh"] for v in doc["verdicts"])  # stamps matched: reused
    assert Path(doc["path"]).is_file()
    assert main(["selftest", "--json", "--force"]) == 0
    assert all(v["fresh"] for v in json.loads(capsys.readouterr().out)["verdicts"])


def test_selftest_fails_naming_the_kernel(gpu: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(selftest, "gpu_runner", _fake(bad=("fp8_gemv",)))
    assert main(["selftest"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: fp8_gemv" in out and "FAIL" in out and "relative error 0.3" in out


def test_explain_shows_the_verdict_and_what_was_not_measured(gpu: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "fp8_gemv.model"]) == 0
    out = capsys.readouterr().out
    assert "not measured on this architecture (NVIDIA B200): no measurement for this SKU" in out
    assert "self-test of the fp8_gemv kernel on this device: not checked" in out
    assert main(["explain", "fp8_gemv.max_n"]) == 0  # the kernel's limit: what it takes, nothing a sweep measures
    assert tuning.NOT_MEASURED not in capsys.readouterr().out
    main(["selftest"])
    capsys.readouterr()
    assert main(["explain", "fp8_gemv.model"]) == 0
    assert "self-test of the fp8_gemv kernel on this device: passed:" in capsys.readouterr().out
    assert main(["explain", "fp8_gemv.model", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["unmeasured"].startswith(tuning.NOT_MEASURED) and doc["selftest"].startswith("passed:")


def test_doctor_shows_the_verdicts(gpu: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(selftest, "gpu_runner", _fake(bad=("router_gemm",)))
    main(["selftest"])
    capsys.readouterr()
    main(["doctor"])
    out = capsys.readouterr().out
    assert "self-test verdicts" in out and "cuda:0 router_gemm: FAILED: hwp100_skinny_mma<" in out
    assert "cuda:0 fp8_gemv: passed:" in out
    # the B200's bandwidth rule never predicts the bf16 GEMV faster (the same fixed cost and bandwidth: a tie is the
    # fallback's), so no shape of its grid routes to the kernel and there is nothing to check
    prof = hwprofile.profile(0)
    model = costmodel.parse("gemv", prof["gemv.model"], where="test")
    assert not any(costmodel.predict(model, {}, *shape).kernel for shape in OPS["gemv"].grid)
    assert "cuda:0 gemv: nothing to check" in out
    main(["doctor", "--json"])
    rows = json.loads(capsys.readouterr().out)["devices"][0]["selftest"]
    assert {r["op"] for r in rows} == set(OPS) and sum(r["failed"] for r in rows) >= 1


def test_sm90_measured_values_are_not_reported_unmeasured(no_downstream: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the H200 sweep measured (the per-shape tables and models it ships) is measured; what sm90 predicts
    (``hwprofile_sm90.predicted()``, the fused gate) is not; the kernels' limits are not measurements at all."""
    from hwprofile_sm90 import predicted

    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    prof = hwprofile.profile(0)
    un = tuning.unmeasured(prof)
    for op in OPS:
        for key in (f"{op}.measured", f"{op}.model"):
            assert (key in un) == (op in predicted()), key
            if key not in un:
                assert isinstance(prof.explain(key).winner.stamp, tuning.Stamp), key
    assert "moe_gate.model" in un
    for key in ("router_gemm.max_tokens", "gemv.max_n", "gemv.max_k", "fp8_gemv.max_n", "linear_bf16_fp32.max_n", "gemv.split_k"):
        assert key not in un


@pytest.mark.parametrize("sim", ["b200", "gb300", "rtx-pro-6000", "dgx-spark"])
def test_blackwell_models_are_unmeasured_and_take_the_h200_limits(
    no_downstream: None, monkeypatch: pytest.MonkeyPatch, sim: str
) -> None:
    """Nothing was measured on SM100/SM120: every op's model says so (the bandwidth rule, fitted on no sample), no
    per-shape table applies, and the kernels' limits are the op table's as on the H200 (what the kernels take)."""
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    h200 = hwprofile.profile(0)
    monkeypatch.setenv("HWPROFILE_DEVICE", sim)
    hwprofile.reset()
    prof = hwprofile.profile(0)
    un = tuning.unmeasured(prof)
    for op in OPS:
        for key in (f"{op}.model", f"{op}.measured"):
            assert key in un and "no measurement for this SKU" in un[key], key
        assert prof[f"{op}.measured"] == ""
        r = prof.explain(f"{op}.model")
        assert r.winner.kind == "arch" and "not measured on SM1" in r.winner.reason, op
        assert costmodel.parse(op, prof[f"{op}.model"], where="test").samples == 0, op
        for key in OPS[op].bound_keys():  # the bounds the op declares as settings
            assert key not in un and prof[key] == h200[key], key
