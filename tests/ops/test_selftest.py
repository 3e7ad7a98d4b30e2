"""Self-test verdicts on the CPU (a fake runner stands in for the GPU): which instances run, the stamped
verdict file, reuse and re-run, disabling a failing kernel with one warning, the opt-in at first use,
and what ``explain`` and ``doctor`` show. The real runner runs on the GPU (tests/kernels/test_gpu_kernels.py).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hwprofile
from hwprofile import ops, selftest
from hwprofile.errors import KernelError
from hwprofile.optable import OPS


class FakeRunner:
    """Records each case; fails the ops in ``bad`` with a relative error, those in ``refuse`` as a launch the driver refused."""

    def __init__(self, bad: tuple[str, ...] = (), refuse: tuple[str, ...] = ()) -> None:
        self.bad, self.refuse = bad, refuse
        self.ran: list[selftest.Case] = []

    def __call__(self, table: Any, case: selftest.Case) -> selftest.Outcome:
        self.ran.append(case)
        if case.op in self.refuse:
            return selftest.Outcome(False, None, "launching ... failed: CUDA_ERROR_CLUSTER_OUT_OF_RESOURCES")
        if case.op in self.bad:
            return selftest.Outcome(False, 0.5, "relative error 0.5 above 0.01 against float64")
        return selftest.Outcome(True, 1e-6)


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_downstream: None) -> Iterator[Any]:
    """A simulated RTX PRO 6000 posing as real (the self-test skips simulated devices), its config dir private."""
    monkeypatch.setenv("HWPROFILE_DEVICE", "rtx-pro-6000")
    monkeypatch.setenv("HWPROFILE_CONFIG_DIR", str(tmp_path / "config"))
    hwprofile.reset()
    ops.reset_dispatch()
    prof = hwprofile.profile(0)
    yield prof
    ops.reset_dispatch()


def dispatched(prof: Any, op: str) -> bool:
    """Whether ``prof`` sends any shape of the op's grid or pre-built shapes to its kernel (the cost model decides inside the
    limits: the bandwidth rule of an unmeasured SKU never predicts a kernel that only ties, the bf16 GEMV's, faster)."""
    return any(ops.decide(op, prof, m=m, n=n, k=k).path == "kernel" for m, n, k in {*OPS[op].grid, *OPS[op].prebuilt})


def test_cases_are_every_distinct_dispatchable_instance(device: Any) -> None:
    cs = selftest.cases(device)
    with_kernel = {op for op in OPS if op in device.kernels}
    assert {c.op for c in cs} == {op for op in with_kernel if dispatched(device, op)}
    assert "gemv" in with_kernel - {c.op for c in cs}  # a kernel the profile never dispatches is not run
    assert len({(c.op, c.instance) for c in cs}) == len(cs)
    for c in cs:
        m, n, k = c.shape
        assert ops.decide(c.op, device, m=m, n=n, k=k).path == "kernel"  # only what the profile dispatches
        assert c.scale in OPS[c.op].scale_modes
    fp8 = {c.scale for c in cs if c.op == "fp8_gemv"}
    assert fp8 == set(OPS["fp8_gemv"].scale_modes)


def test_verdicts_are_stamped_written_and_reused(device: Any) -> None:
    run = FakeRunner()
    report = selftest.run(device, runner=run)
    assert report.ok and len(report.verdicts) == len(run.ran) == len(selftest.cases(device))
    path = selftest.verdict_path(device)
    assert path.parent == Path(hwprofile.tuning.config_dir({"HWPROFILE_CONFIG_DIR": str(path.parent.parent)})) / "selftest"
    doc = json.loads(path.read_text())
    assert doc["format"] == selftest.FORMAT
    st = doc["verdicts"][0]["stamp"]
    assert {"device", "driver", "kernel", "plan", "plugin", "compute_capability"} <= set(st)
    assert st["device"] == device.device.name and len(st["kernel"]) == 64
    again = FakeRunner()
    report2 = selftest.run(device, runner=again)
    assert again.ran == [] and not any(v.fresh for v in report2.verdicts)  # every stamp matched: nothing re-run
    forced = FakeRunner()
    selftest.run(device, runner=forced, force=True)
    assert len(forced.ran) == len(run.ran)


@pytest.mark.parametrize("field", ["driver", "kernel", "plan", "device"])
def test_a_verdict_whose_stamp_no_longer_matches_is_run_again(device: Any, field: str) -> None:
    selftest.run(device, runner=FakeRunner())
    path = selftest.verdict_path(device)
    doc = json.loads(path.read_text())
    doc["verdicts"][0]["stamp"][field] = "something else"
    doc["verdicts"][0]["ok"] = False  # a stale failure must not disable anything either
    path.write_text(json.dumps(doc))
    run = FakeRunner()
    report = selftest.run(device, runner=run)
    assert [(c.op, c.instance) for c in run.ran] == [(doc["verdicts"][0]["op"], doc["verdicts"][0]["instance"])]
    assert report.ok and not report.disabled


def test_an_unreadable_verdict_file_is_run_again(device: Any) -> None:
    path = selftest.verdict_path(device)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    run = FakeRunner()
    assert selftest.run(device, runner=run).ok and len(run.ran) == len(selftest.cases(device))
    assert json.loads(path.read_text())["format"] == selftest.FORMAT


@pytest.mark.parametrize("kind", ["bad", "refuse"])
def test_a_failing_kernel_is_disabled_with_one_warning_and_falls_back(device: Any, kind: str) -> None:
    assert ops.decide("fp8_gemv", device, m=1, n=4096, k=4096).path == "kernel"
    run = FakeRunner(**{kind: ("fp8_gemv",)})  # type: ignore[arg-type]
    with pytest.warns(RuntimeWarning, match=r"fp8_gemv kernel disabled on cuda:0 \(NVIDIA RTX PRO 6000") as got:
        report = selftest.run(device, runner=run)
    assert len(got) == 1 and "self-test of hwp120_gemv_simt<" in str(got[0].message)
    assert list(report.disabled) == ["fp8_gemv"] and not report.ok
    d = ops.decide("fp8_gemv", device, m=1, n=4096, k=4096)
    assert (d.path, d.gate) == ("fallback", "failed")
    assert "self-test" in ops._dispatch.table(0).errors["fp8_gemv"]
    assert ops.decide("router_gemm", device, m=4, n=256, k=7168).path == "kernel"
    # the stored failure disables again in a new process (table) without re-running, one warning again
    ops.reset_dispatch()
    again = FakeRunner()
    with pytest.warns(RuntimeWarning, match="fp8_gemv kernel disabled") as got2:
        selftest.run(device, runner=again)
    assert again.ran == [] and len(got2) == 1


def test_strict_mode_raises_for_a_failing_kernel(device: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_STRICT", "1")
    hwprofile.reset()
    ops.reset_dispatch()
    with pytest.raises(KernelError, match="fp8_gemv on cuda:0.*self-test of"):
        selftest.run(hwprofile.profile(0), runner=FakeRunner(bad=("fp8_gemv",)))


def test_opt_in_runs_at_the_first_dispatch_table_of_a_real_device(device: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run = FakeRunner(bad=("fp8_gemv",))
    monkeypatch.setattr(selftest, "gpu_runner", run)
    monkeypatch.setattr(selftest, "on_gpu", lambda prof: True)
    ops.reset_dispatch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ops._dispatch.table(0)  # off by default: nothing runs
    assert run.ran == []
    ops.reset_dispatch()
    monkeypatch.setenv("HWPROFILE_SELFTEST", "1")
    with pytest.warns(RuntimeWarning, match="fp8_gemv kernel disabled"):
        t = ops._dispatch.table(0)
    assert run.ran and "fp8_gemv" in t.failed


def test_opt_in_skips_a_simulated_device(device: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run = FakeRunner()
    monkeypatch.setattr(selftest, "gpu_runner", run)
    monkeypatch.setenv("HWPROFILE_SELFTEST", "1")
    ops._dispatch.table(0)
    assert run.ran == []


def test_summary_is_what_explain_and_doctor_show(device: Any) -> None:
    rows = {r["op"]: r for r in selftest.summary(device)}
    checked = {c.op for c in selftest.cases(device)}
    assert set(rows) == {op for op in OPS if op in device.kernels} and checked < set(rows)
    assert all("not checked" in r["state"] for op, r in rows.items() if op in checked)
    assert all(r["state"].startswith("nothing to check") for op, r in rows.items() if op not in checked)
    with pytest.warns(RuntimeWarning):
        selftest.run(device, runner=FakeRunner(bad=("router_gemm",)))
    rows = {r["op"]: r for r in selftest.summary(device)}
    assert rows["router_gemm"]["state"].startswith("FAILED: hwp120_skinny_mma<")
    assert rows["fp8_gemv"]["state"].startswith("passed:") and rows["fp8_gemv"]["failed"] == 0


def test_a_failing_kernel_is_disabled_even_when_its_verdict_cannot_be_written(device: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only config directory must not keep a kernel that failed its self-test in use."""
    from hwprofile import WriteError

    def cannot_write(path: Any, verdicts: Any) -> None:
        raise WriteError(f"could not write the self-test verdicts {path}: Read-only file system")

    monkeypatch.setattr(selftest, "write", cannot_write)
    with pytest.warns(RuntimeWarning, match="fp8_gemv kernel disabled"), pytest.raises(WriteError):
        selftest.run(device, runner=FakeRunner(bad=("fp8_gemv",)))
    assert ops.decide("fp8_gemv", device, m=1, n=4096, k=4096).gate == "failed"
