"""tune() with a fake timer: re-measures only what is stale, writes a stamped file, resolves again; the host lock;
HWPROFILE_TUNE at the first profile(); the command."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import pytest

import hwprofile
from hwprofile import retune, sweep, tuning
from hwprofile.cli import main
from hwprofile.optable import OPS, TABLE

from .helpers import PREDICTED, SWEPT, FakeTimer, shipped, stale_tuned_file

#: what tune measures by default on an H200 with a stale router_gemm file: that op, and what sm90 ships predicted
NEEDED = [op for op in TABLE if op == "router_gemm" or op in PREDICTED]


def swept(prof: hwprofile.Profile, op: str, wins_to: int = 10) -> dict[str, object]:
    """What ``hwprofile sweep OP`` writes from ``FakeTimer(wins_to)``: the values tune must write for ``op``."""
    return dict(sweep.run(prof, op, sweep.default_grid(op), FakeTimer(wins_to=wins_to), box=sweep.box_grid(op))["thresholds"])


def test_tune_re_measures_only_the_stale_op_and_the_profile_follows(caplog: pytest.LogCaptureFixture) -> None:
    """The stale op and the unmeasured (predicted) ones, each over its grid, once; the fresh ones not at all."""
    stale = stale_tuned_file(hwprofile.profile(0))
    hwprofile.reset()
    before = hwprofile.profile(0)
    assert before["router_gemm.model"] == shipped("router_gemm.model")  # the stale file is ignored: the shipped value applies
    assert PREDICTED and NEEDED != list(OPS)
    want = {op: swept(before, op) for op in NEEDED}
    timer = FakeTimer(wins_to=10)
    with caplog.at_level(logging.INFO, logger="hwprofile"):
        result = hwprofile.tune(0, timer=timer)
    assert sorted(timer.calls) == sorted((op, *g) for op in NEEDED for g in sweep.default_grid(op))  # those ops, their grids, once
    assert result.written == [stale.parent / f"{op}.toml" for op in NEEDED] and result.measured == len(timer.calls)
    for op in NEEDED:  # the model and the per-shape table, from what applied before to what the measurement decides
        assert result.changes[op] == {k: (before[k], v) for k, v in want[op].items()}
    assert result.changes["router_gemm"]["router_gemm.model"][0] == shipped("router_gemm.model")
    after = hwprofile.profile(0)
    assert after is result.profile and after is not before
    for op in NEEDED:
        path = stale.parent / f"{op}.toml"
        for key, value in want[op].items():
            assert after[key] == value and after.explain(key).winner.source == f"tuned file {path}"
        stamp, thresholds = tuning.read_tuned(path)
        assert stamp.fallback["function"] == TABLE[op].fallback and stamp.plan  # stamped against what runs now
        assert thresholds == want[op]
        assert (path.parent / tuning.SAMPLES_DIR / path.name).exists()  # raw measurements beside it, as sweep writes them
    old, new = want["router_gemm"]["router_gemm.model"], result.changes["router_gemm"]["router_gemm.model"][0]
    assert f"router_gemm.model {new} -> {old}" in caplog.text and "re-measured router_gemm (" in caplog.text
    assert all(f"; {op} (" in caplog.text for op in NEEDED[1:])  # one log line names every op measured
    assert retune.plan(after).grids == {}  # nothing stale or unmeasured any more: a second tune measures nothing
    again = FakeTimer()
    assert hwprofile.tune(0, timer=again).changes == {} and again.calls == []


def test_tune_gives_the_decision_a_full_sweep_gives() -> None:
    """The same points through sweep.run: the same values (tune adds no method of its own)."""
    stale_tuned_file(hwprofile.profile(0))
    hwprofile.reset()
    prof = hwprofile.profile(0)
    want = {op: swept(prof, op, wins_to=7) for op in NEEDED}
    result = hwprofile.tune(0, timer=FakeTimer(wins_to=7))
    assert [p.stem for p in result.written] == NEEDED
    for p in result.written:
        assert tuning.read_tuned(p)[1] == want[p.stem]


def test_a_simulated_device_needs_a_timer() -> None:
    with pytest.raises(retune.TuneError, match=r"simulated \(HWPROFILE_DEVICE\): there is no GPU to time"):
        hwprofile.tune(0, everything=True)


def test_a_failing_measurement_writes_nothing() -> None:
    stale = stale_tuned_file(hwprofile.profile(0))
    text = stale.read_text()
    hwprofile.reset()
    with pytest.raises(retune.TuneError, match="measuring failed: measuring on device 0 failed: RuntimeError: fake kernel failure"):
        hwprofile.tune(0, timer=FakeTimer(fail_at=("router_gemm", 3, 256, 7168)))
    assert stale.read_text() == text
    assert sorted(p.name for p in stale.parent.glob("*.toml")) == [stale.name]  # not the unmeasured ops' either


def test_tune_refuses_inside_graph_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retune, "capturing", lambda: True)
    with pytest.raises(retune.TuneError, match="while a CUDA graph is being captured"):
        hwprofile.tune(0, timer=FakeTimer())


def test_a_second_process_waits_for_the_first_and_then_finds_nothing_stale(monkeypatch: pytest.MonkeyPatch,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """Two tuners of one tuned directory (threads here, as two processes would be): one measures, the other waits for it,
    reads the fresh table and measures nothing."""
    import filelock

    prof = hwprofile.profile(0)
    stale_tuned_file(prof)
    hwprofile.reset()
    directory = tuning.tuned_dir(prof.device, os.environ)
    held = filelock.FileLock(str(directory / f".tune-{socket.gethostname()}.lock"), thread_local=False)  # released by the thread
    held.acquire()
    first = FakeTimer()
    released = threading.Event()

    def other_process() -> None:  # a tune of its own: what is stale and what is unmeasured
        time.sleep(0.5)
        for op in NEEDED:
            sweep.write(sweep.run(hwprofile.profile(0), op, sweep.default_grid(op), first), directory / f"{op}.toml")
        held.release()
        released.set()

    t = threading.Thread(target=other_process)
    t.start()
    second = FakeTimer()
    with caplog.at_level(logging.WARNING, logger="hwprofile"):
        result = hwprofile.tune(0, timer=second, lock_timeout=20)
    t.join()
    assert released.is_set() and "another process on this host is tuning" in caplog.text
    assert second.calls == [] and not result.skipped and result.plan.grids == {}
    assert first.calls and hwprofile.profile(0)["router_gemm.model"] == swept(prof, "router_gemm")["router_gemm.model"]


def test_a_waiter_gives_up_after_the_bound_and_keeps_the_values(caplog: pytest.LogCaptureFixture) -> None:
    import filelock

    prof = hwprofile.profile(0)
    stale_tuned_file(prof)
    hwprofile.reset()
    directory = tuning.tuned_dir(prof.device, os.environ)
    held = filelock.FileLock(str(directory / f".tune-{socket.gethostname()}.lock"))
    with held:
        timer = FakeTimer()
        result = hwprofile.tune(0, timer=timer, lock_timeout=0.3)
    assert timer.calls == [] and "still tuning after 0.3 s" in result.skipped
    assert hwprofile.profile(0)["router_gemm.model"] == shipped("router_gemm.model")


# --- HWPROFILE_TUNE=stale at the first profile() ----------------------------------------------------------------


@pytest.fixture
def real_gpu(monkeypatch: pytest.MonkeyPatch) -> list[FakeTimer]:
    """The hook's view of a real GPU on this CPU machine: a device not simulated, a timer that measures."""
    from hwprofile import profiles

    made: list[FakeTimer] = []
    real_tune = retune.tune

    def tune(device: object = None, **kw: object) -> retune.TuneResult:
        made.append(FakeTimer())
        return real_tune(device, timer=made[-1], **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(retune, "tune", tune)
    monkeypatch.setattr(retune, "cannot_measure", lambda prof: "")
    real_first = profiles._hand_over

    def first(prof: hwprofile.Profile) -> hwprofile.Profile:  # the hook skips simulated devices: pose as a real one
        object.__setattr__(prof.device, "simulated", False)
        try:
            return real_first(prof)
        finally:
            object.__setattr__(prof.device, "simulated", True)

    monkeypatch.setattr(profiles, "_hand_over", first)
    return made


def test_hwprofile_tune_stale_tunes_at_the_first_profile(real_gpu: list[FakeTimer], monkeypatch: pytest.MonkeyPatch) -> None:
    stale_tuned_file(hwprofile.profile(0))
    hwprofile.reset()
    before = hwprofile.profile(0)
    object.__setattr__(before.device, "simulated", False)  # as the hook sees it: on a real GPU the stamps' torch and
    try:  # cuBLAS count too, so the shipped sweeps may be stale on this machine's torch as well
        need = set(retune.plan(before).grids)
    finally:
        object.__setattr__(before.device, "simulated", True)
    assert set(NEEDED) <= need
    hwprofile.reset()
    monkeypatch.setenv("HWPROFILE_TUNE", "stale")
    prof = hwprofile.profile(0)
    assert len(real_gpu) == 1 and {c[0] for c in real_gpu[0].calls} == need  # once, no recursion through profiles
    assert prof["router_gemm.model"] == swept(prof, "router_gemm")["router_gemm.model"] and hwprofile.profile(0) is prof


def test_hwprofile_tune_off_or_unset_never_tunes(real_gpu: list[FakeTimer], monkeypatch: pytest.MonkeyPatch) -> None:
    stale_tuned_file(hwprofile.profile(0))
    for value in (None, "off", "0"):
        if value is None:
            monkeypatch.delenv("HWPROFILE_TUNE", raising=False)
        else:
            monkeypatch.setenv("HWPROFILE_TUNE", value)
        hwprofile.reset()
        assert hwprofile.profile(0)["router_gemm.model"] == shipped("router_gemm.model")
    assert real_gpu == []


def test_the_hook_skips_capture_and_simulated_devices(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    stale_tuned_file(hwprofile.profile(0))
    monkeypatch.setenv("HWPROFILE_TUNE", "stale")
    hwprofile.reset()
    calls: list[object] = []
    monkeypatch.setattr(retune, "tune", lambda *a, **k: calls.append(a))
    assert hwprofile.profile(0)["router_gemm.model"] == shipped("router_gemm.model") and calls == []  # simulated: never
    prof = hwprofile.profile(0)
    object.__setattr__(prof.device, "simulated", False)
    try:
        monkeypatch.setattr(retune, "capturing", lambda: True)
        with caplog.at_level(logging.WARNING, logger="hwprofile"):
            assert retune.at_first_profile(prof) is prof
        assert "inside CUDA-graph capture" in caplog.text and calls == []
        monkeypatch.setattr(retune, "capturing", lambda: False)
        monkeypatch.setattr(retune, "cannot_measure", lambda p: "torch sees no GPU")
        assert retune.at_first_profile(prof) is prof and "cannot tune device 0 (torch sees no GPU)" in caplog.text
    finally:
        object.__setattr__(prof.device, "simulated", True)


def test_a_failing_tune_at_the_first_profile_warns_and_keeps_the_values(real_gpu: list[FakeTimer], monkeypatch: pytest.MonkeyPatch,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    stale_tuned_file(hwprofile.profile(0))
    monkeypatch.setenv("HWPROFILE_TUNE", "stale")
    monkeypatch.setattr(retune, "tune", lambda *a, **k: (_ for _ in ()).throw(retune.TuneError("no luck")))
    hwprofile.reset()
    with caplog.at_level(logging.WARNING, logger="hwprofile"):
        prof = hwprofile.profile(0)
    assert prof["router_gemm.model"] == shipped("router_gemm.model") and "tuning device 0 failed (no luck)" in caplog.text


def test_importing_hwprofile_does_not_import_the_tuner() -> None:
    import subprocess
    import sys

    code = "import hwprofile, sys; hwprofile.profile(0); print('hwprofile.retune' in sys.modules)"
    env = {**os.environ, "HWPROFILE_DEVICE": "h200"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout.strip()
    assert out == "False"
    assert hwprofile.tune is retune.tune


# --- the command ------------------------------------------------------------------------------------------------


def test_dry_run_lists_what_would_be_measured(capsys: pytest.CaptureFixture[str]) -> None:
    stale_tuned_file(hwprofile.profile(0))
    hwprofile.reset()
    assert main(["tune", "--dry-run"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:3] for line in out.splitlines() if line.split()[:1] and line.split()[0] in TABLE}
    n = len(sweep.default_grid("router_gemm"))  # the catalog's routers and the box edges
    assert rows["router_gemm"] == ["changed", str(n)] and "fallback function changed" in out
    assert rows["gemv"] == ["fresh", "0"]
    for op in PREDICTED:  # predicted, not measured on this SKU
        assert rows[op] == ["unmeasured", str(len(sweep.default_grid(op)))]
    total = sum(len(sweep.default_grid(op)) for op in NEEDED)
    assert f"would measure {total} point(s), about" in out and "s of GPU time" in out


def test_dry_run_json(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["tune", "--dry-run", "--all", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["devices"][0]["points"] == sum(len(sweep.default_grid(op)) for op in TABLE) and doc["devices"][0]["estimate_s"] > 0


def test_tune_on_a_simulated_device_says_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--all"], []):  # by default too: what sm90 ships predicted is unmeasured here
        assert main(["tune", *args]) == 2
        err = capsys.readouterr().err
        assert "tune measures real kernels: device 0 (NVIDIA H200) is simulated" in err and "--dry-run" in err
    assert main(["tune", "--ops", ",".join(SWEPT)]) == 0 and "device 0: nothing stale" in capsys.readouterr().out


def test_the_command_prints_a_line_per_op_off_a_terminal(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    stale_tuned_file(hwprofile.profile(0))
    hwprofile.reset()
    real_tune = retune.tune
    monkeypatch.setattr(retune, "cannot_measure", lambda prof: "")
    monkeypatch.setattr(retune, "tune", lambda device=None, **kw: real_tune(device, timer=FakeTimer(), **kw))
    assert main(["tune"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"measured {op} ({len(sweep.default_grid(op))} points on this rank)" for op in NEEDED]
    shapes = len(shipped("router_gemm.measured").split(";"))
    grid = len(sweep.default_grid("router_gemm"))  # every measured shape gets its decision
    assert f"router_gemm.measured {shapes} measured shapes -> {grid} measured shapes" in captured.out
    assert "device 0: re-measured router_gemm (router_gemm.model " in captured.out
    directory = tuning.tuned_dir(hwprofile.profile(0).device, os.environ)
    assert all(f"wrote {directory / op}.toml" in captured.out for op in NEEDED)


_DEADLOCK = """
import os, sys, threading
import hwprofile
from hwprofile import profiles, retune
from hwprofile.ops import _dispatch

first = profiles._hand_over

def pose_real(prof):  # the hook skips simulated devices: pose as a real one
    object.__setattr__(prof.device, "simulated", False)
    try:
        return first(prof)
    finally:
        object.__setattr__(prof.device, "simulated", True)

profiles._hand_over = pose_real
in_hook, other_has_lock = threading.Event(), threading.Event()

def tune(device=None, **kw):
    in_hook.set()
    other_has_lock.wait(5)
    _dispatch.table(0)  # what measuring does (ops.run_kernel)
    prof = hwprofile.profile(0)
    return retune.TuneResult(0, retune.plan(prof), profile=prof)

retune.tune = tune
retune.cannot_measure = lambda prof: ""  # no GPU here: measuring is faked above

def other():
    in_hook.wait(5)
    with _dispatch._tables_lock:  # an op's first call on device 0, building its table
        other_has_lock.set()
        hwprofile.profile(0)

threads = [threading.Thread(target=hwprofile.profile, args=(0,), daemon=True), threading.Thread(target=other, daemon=True)]
for t in threads:
    t.start()
for t in threads:
    t.join(10)
print("deadlock" if any(t.is_alive() for t in threads) else "ok")
sys.stdout.flush()
os._exit(0)
"""


def test_an_op_in_another_thread_during_start_up_tuning_cannot_deadlock() -> None:
    """Measuring builds device 0's dispatch table (ops.run_kernel), whose lock another thread may hold while it asks
    profile() for the device: tuning at the first profile() must not hold profile()'s lock meanwhile (a process of
    its own: a deadlock would leave locks that no later test could take)."""
    import subprocess
    import sys

    env = {**os.environ, "HWPROFILE_TUNE": "stale"}
    out = subprocess.run([sys.executable, "-c", _DEADLOCK], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "ok", out.stdout + out.stderr
